// harness.mjs — starts `k3 serve` on the fixture model on a free loopback port (--port 0; the
// URL is read from the startup line) and gives tests an OpenAI client for it.
//
// K3_BIN names the k3 binary (make test-server sets it); default: ../../k3 from this folder.
// Every server is stopped (SIGTERM, then SIGKILL) when its test file ends.
import { spawn, execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import OpenAI from 'openai';

const here = path.dirname(fileURLToPath(import.meta.url));
export const ROOT = path.resolve(here, '..', '..');
export const K3 = path.resolve(ROOT, process.env.K3_BIN || 'k3');
export const MODEL = path.join(ROOT, 'tests', 'fixtures', 'k3-nano');
export const MODEL_ID = 'k3-nano';

const running = new Set();
process.on('exit', () => { for (const p of running) p.kill('SIGKILL'); });

// Starts a server; resolves to {url, base, proc, log(), stop()} once it prints its URL.
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
  });
  const exited = new Promise((resolve) => proc.on('exit', (code, sig) => resolve({ code, sig })));
  return {
    url, base: `${url}/v1`, proc, banner: () => out, log: () => err, exited,
    // Stops the server; throws when a sanitizer build (K3_BIN=build-asan/k3) reported errors.
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill('SIGTERM');
        const t = setTimeout(() => proc.kill('SIGKILL'), 10000);
        await exited;
        clearTimeout(t);
      }
      running.delete(proc);
      if (/Sanitizer|runtime error:/.test(err)) throw new Error(`k3 serve reported:\n${err}`);
      return exited;
    },
  };
}

// The official client pointed at a server; no retries, so 429s are seen as they are.
export function client(srv, opts = {}) {
  return new OpenAI({ baseURL: srv.base, apiKey: 'unused', maxRetries: 0, timeout: 60000, ...opts });
}

// Runs the k3 binary with arguments (e.g. `k3 run`) and returns stdout.
export function k3(args) {
  return execFileSync(K3, args, { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

// Raw HTTP for cases the client would not send: returns {status, headers, json, text}.
export async function raw(srv, method, p, body, headers = {}) {
  const res = await fetch(srv.url + p, { method, body, headers, duplex: 'half' });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, headers: res.headers, json, text };
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Polls /health until it says nothing is generating; returns the milliseconds it took.
export async function waitIdle(srv, limitMs = 5000) {
  const t0 = Date.now();
  for (;;) {
    const h = await raw(srv, 'GET', '/health');
    if (h.json && !h.json.generating && h.json.queued === 0) return Date.now() - t0;
    if (Date.now() - t0 > limitMs) throw new Error(`still generating after ${limitMs} ms: ${h.text}`);
    await sleep(10);
  }
}
