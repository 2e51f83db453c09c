// browser.mjs — `k3 serve` on the fixture model (tests/server/serve.mjs) and a headless
// Chromium driven by puppeteer-core; saves screenshots under build/web-artifacts/.
//
// K3_BIN names the k3 binary (make test-web sets it); CHROMIUM the browser (default
// /usr/bin/chromium, Debian's package). As root Chromium needs --no-sandbox.
import fs from 'node:fs';
import path from 'node:path';
import puppeteer from 'puppeteer-core';

import { ROOT, K3, MODEL, startServer } from '../server/serve.mjs';

export { ROOT, K3, MODEL, startServer };
export const ARTIFACTS = path.join(ROOT, 'build', 'web-artifacts');

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
