// browser.mjs — starts `k3 serve` on the fixture model (--port 0, the URL read from the
// startup line, as tests/server/harness.mjs does) and a headless Chromium driven by
// puppeteer-core; saves screenshots under build/web-artifacts/.
//
// K3_BIN names the k3 binary (make test-web sets it); CHROMIUM the browser (default
// /usr/bin/chromium, Debian's package). As root Chromium needs --no-sandbox.
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import fs from 'node:fs';
import path from 'node:path';
import puppeteer from 'puppeteer-core';

const here = path.dirname(fileURLToPath(import.meta.url));
export const ROOT = path.resolve(here, '..', '..');
export const K3 = path.resolve(ROOT, process.env.K3_BIN || 'k3');
export const MODEL = path.join(ROOT, 'tests', 'fixtures', 'k3-nano');
export const ARTIFACTS = path.join(ROOT, 'build', 'web-artifacts');

const running = new Set();
process.on('exit', () => { for (const p of running) p.kill('SIGKILL'); });

// Starts a server; resolves to {url, proc, log(), stop()} once it prints its URL. `env` adds
// variables (K3_TEST_TOKEN_DELAY_MS: the test-only pause after each token, server.h).
export async function startServer(args = [], env = {}) {
  const proc = spawn(K3, ['serve', MODEL, '--port', '0', ...args], {
    cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'],
  });
  running.add(proc);
  let out = '', err = '';
  proc.stderr.on('data', (d) => { err += d; });
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`k3 serve did not start:\n${out}${err}`)), 20000);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/\S+)\/v1 /);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`k3 serve exited ${code}:\n${out}${err}`)); });
    proc.on('error', (e) => { clearTimeout(timer); reject(new Error(`cannot run ${K3}: ${e.message}`)); });
  });
  const exited = new Promise((resolve) => proc.on('exit', (code, sig) => resolve({ code, sig })));
  return {
    url, proc, log: () => err,
    // Stops the server; throws when a sanitizer build reported errors.
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill('SIGTERM');
        const t = setTimeout(() => proc.kill('SIGKILL'), 10000);
        await exited;
        clearTimeout(t);
      }
      running.delete(proc);
      // A sanitizer build (K3_BIN=build-asan/k3) reports its findings on stderr.
      if (/Sanitizer|runtime error:/.test(err)) throw new Error(`k3 serve reported:\n${err}`);
      return exited;
    },
  };
}

export async function health(srv) {
  const r = await fetch(`${srv.url}/health`);
  return r.json();
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function launch() {
  const args = ['--disable-gpu', '--disable-dev-shm-usage', '--no-first-run',
                '--no-default-browser-check', '--window-size=1280,860'];
  if (process.getuid && process.getuid() === 0) args.push('--no-sandbox');
  return puppeteer.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args,
    defaultViewport: { width: 1280, height: 860 },
    protocolTimeout: 60000,
  });
}

// Saves a PNG of the page under build/web-artifacts/NAME.png; returns its path.
export async function shot(page, name) {
  fs.mkdirSync(ARTIFACTS, { recursive: true });
  const file = path.join(ARTIFACTS, `${name}.png`);
  await page.screenshot({ path: file });
  return file;
}

// A canned streamed chat reply: SSE chunks with reasoning_content, content and tool_calls
// deltas as k3 serve sends them (src/server/emit.c), then usage and [DONE].
export function sseBody({ reasoning = [], content = [], toolCalls = [], usage = null }) {
  const base = { id: 'chatcmpl-scripted', object: 'chat.completion.chunk', created: 1,
                 model: 'k3-nano' };
  const chunk = (delta, finish = null) => `data: ${JSON.stringify({
    ...base, choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }] })}\n\n`;
  let s = chunk({ role: 'assistant', content: '' });
  for (const r of reasoning) s += chunk({ reasoning_content: r });
  for (const c of content) s += chunk({ content: c });
  for (const t of toolCalls) s += chunk({ tool_calls: [t] });
  s += chunk({}, toolCalls.length ? 'tool_calls' : 'stop');
  if (usage) s += `data: ${JSON.stringify({ ...base, choices: [], usage })}\n\n`;
  return `${s}data: [DONE]\n\n`;
}
