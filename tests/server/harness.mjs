// harness.mjs — `k3 serve` on the fixture model (serve.mjs) and an OpenAI client for it.
//
// K3_BIN names the k3 binary (make test-server sets it); default: build/k3-test (serve.mjs).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { after } from 'node:test';
import OpenAI from 'openai';

import { ROOT, K3, MODEL, startServer } from './serve.mjs';

export { ROOT, K3, MODEL, startServer };
export const MODEL_ID = 'k3-nano';

// A startServer(args, env) for one test file: every server it starts is stopped after the
// file's tests. env: the environment every one of them gets; wrap: as startServer's.
export function serverPool(env = {}) {
  const servers = [];
  after(async () => { await Promise.all(servers.map((s) => s.stop())); });
  return async (args, wrap = []) => {
    const s = await startServer(args, env, wrap);
    servers.push(s);
    return s;
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

// Raw HTTP for cases the client would not send: returns {status, headers, json, text}. A body
// goes as application/json unless headers name another Content-Type (fetch's own default,
// text/plain, is what k3 refuses from browsers: issue 32, D20).
export async function raw(srv, method, p, body, headers = {}) {
  if (body !== undefined && !Object.keys(headers).some((h) => h.toLowerCase() === 'content-type'))
    headers = { ...headers, 'Content-Type': 'application/json' };
  const res = await fetch(srv.url + p, { method, body, headers, duplex: 'half' });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, headers: res.headers, json, text };
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Asserts that the server's log (stderr) comes to match re: its lines reach us on a pipe of
// their own, maybe after the reply that a line is about, so they are waited for (10 s at most).
export async function logMatch(srv, re, what = undefined, limitMs = 10000) {
  for (const t0 = Date.now(); !re.test(srv.log()) && Date.now() - t0 < limitMs;) await sleep(10);
  assert.match(srv.log(), re, what);
}

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
