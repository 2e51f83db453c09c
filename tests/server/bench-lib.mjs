// bench-lib.mjs — what the server benchmarks (bench-batched.mjs, bench-onepass.mjs,
// bench-pcache.mjs) share: the k3 binary and model from the environment, `k3 serve` started on
// a free loopback port and stopped, a greedy completion, and /metrics values. No npm
// dependency. (tests/server/serve.mjs is the tests' launcher: the test build, k3-nano only.)
//
// Environment: K3_BIN (default ./k3, the release build), MODEL_DIR (default: each benchmark's
// own), SERVE_ARGS (extra flags for k3 serve, where a benchmark passes serveArgs() on). Only
// 127.0.0.1 is contacted.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const ROOT = path.resolve(here, '..', '..');
export const K3 = path.resolve(ROOT, process.env.K3_BIN || 'k3');

// MODEL_DIR, else the benchmark's default (a path relative to the repository root).
export const modelDir = (fallback) => path.resolve(ROOT, process.env.MODEL_DIR || fallback);
// SERVE_ARGS as a list of flags.
export const serveArgs = () => (process.env.SERVE_ARGS || '').split(/\s+/).filter(Boolean);
export const median = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];

// Starts `k3 serve MODEL --port 0 -q ARGS` and resolves to {url, log(), stop()} once it
// prints its loopback URL; a full-size model may take minutes to load, hence the long wait.
export async function startServe(model, args) {
  const proc = spawn(K3, ['serve', model, '--port', '0', '-q', ...args],
    { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '', err = '';
  proc.stderr.on('data', (d) => { err += d; });
  const url = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`k3 serve did not start:\n${out}${err}`)), 600000);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/127\.0\.0\.1:\d+)\/v1 /);
      if (m) { clearTimeout(t); resolve(m[1]); }
    });
    proc.on('close', (code) => { clearTimeout(t); reject(new Error(`k3 serve exited ${code}:\n${err}`)); });
  });
  const exited = new Promise((r) => proc.on('exit', r));
  return { url, log: () => err, stop: async () => { proc.kill('SIGTERM'); await exited; } };
}

// The /metrics samples named prefix + NAME (no labels) as {NAME: number}.
export async function metrics(url, prefix) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = {};
  for (const [, k, v] of text.matchAll(new RegExp(`^${prefix}(\\w+) (\\S+)$`, 'gm'))) m[k] = Number(v);
  return m;
}

// A greedy completion of at most `tokens` tokens: {text, tokens (generated), s (wall time)}.
export async function complete(url, prompt, tokens) {
  const t0 = performance.now();
  const r = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: tokens, temperature: 0 }) });
  if (r.status !== 200) throw new Error(`${JSON.stringify(prompt.slice(0, 40))}: HTTP ${r.status} ${await r.text()}`);
  const j = await r.json();
  return { text: j.choices[0].text, tokens: j.usage.completion_tokens, s: (performance.now() - t0) / 1000 };
}
