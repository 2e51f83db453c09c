// bench-batched.mjs — batched decoding across requests (make bench-server; issue 18): for
// N = 1, 2, 4, 8 (BATCH_NS) it starts `k3 serve --parallel N --queue 0` and sends N requests at
// once, then the same N requests one after another (to --parallel 1), and prints a table:
// aggregate generated tokens/s, mean per-request tokens/s and latency, and storage bytes read
// per generated token (experts + streamed spine, from /metrics), plus whether every batched
// reply equals its sequential twin (it must: each row of a pass is bit-identical).
//
// Environment: K3_BIN (default ./k3), MODEL_DIR (default the k3-nano fixture), BATCH_NS
// ("1 2 4 8"), BATCH_TOKENS (completion tokens per request, default 64), SERVE_ARGS (extra
// flags for k3 serve, e.g. "--spine-gb 0" to stream the spine). Only 127.0.0.1 is contacted.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(here, '..', '..');
const K3 = path.resolve(ROOT, process.env.K3_BIN || 'k3');
const MODEL = path.resolve(ROOT, process.env.MODEL_DIR || 'tests/fixtures/k3-nano');
const NS = (process.env.BATCH_NS || '1 2 4 8').split(/\s+/).filter(Boolean).map(Number);
const TOKENS = Number(process.env.BATCH_TOKENS || 64);
const EXTRA = (process.env.SERVE_ARGS || '').split(/\s+/).filter(Boolean);

async function start(args) {
  const proc = spawn(K3, ['serve', MODEL, '--port', '0', '-q', ...EXTRA, ...args],
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
    proc.on('exit', (code) => { clearTimeout(t); reject(new Error(`k3 serve exited ${code}:\n${err}`)); });
  });
  return { url, stop: () => new Promise((r) => { proc.on('exit', r); proc.kill('SIGTERM'); }) };
}

async function bytesRead(url) {
  const t = await (await fetch(`${url}/metrics`)).text();
  const v = (n) => Number((t.match(new RegExp(`^${n} (\\S+)$`, 'm')) || [0, 0])[1]);
  return v('k3_expert_read_bytes_total') + v('k3_spine_read_bytes_total');
}

// Request i: a different prompt per request, greedy, exactly TOKENS tokens unless it stops.
async function complete(url, i) {
  const t0 = performance.now();
  const r = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: `Request ${i}: in the beginning`, max_tokens: TOKENS, temperature: 0 }) });
  if (r.status !== 200) throw new Error(`request ${i}: HTTP ${r.status} ${await r.text()}`);
  const j = await r.json();
  return { text: j.choices[0].text, tokens: j.usage.completion_tokens, s: (performance.now() - t0) / 1000 };
}

async function measure(url, n, together) {
  const b0 = await bytesRead(url);
  const t0 = performance.now();
  let res = [];
  if (together) res = await Promise.all([...Array(n).keys()].map((i) => complete(url, i)));
  else for (let i = 0; i < n; i++) res.push(await complete(url, i));
  const wall = (performance.now() - t0) / 1000;
  const tokens = res.reduce((a, r) => a + r.tokens, 0);
  const bytes = (await bytesRead(url)) - b0;
  return { res, wall, tokens, agg: tokens / wall, per: res.reduce((a, r) => a + r.tokens / r.s, 0) / n,
    lat: res.reduce((a, r) => a + r.s, 0) / n, bpt: bytes / tokens };
}

const fmt = (x, d = 1) => x.toFixed(d);
console.log(`batched decoding: ${MODEL}, ${TOKENS} tokens per request${EXTRA.length ? `, serve ${EXTRA.join(' ')}` : ''}`);
console.log('| N | mode | tokens | wall s | aggregate tok/s | per-request tok/s | mean latency s | MB read / token | same replies |');
console.log('|---|---|---|---|---|---|---|---|---|');
const seqSrv = await start(['--parallel', '1']);
await complete(seqSrv.url, 0); // warm-up: page cache, expert cache
let base = null;
for (const n of NS) {
  const seq = await measure(seqSrv.url, n, false);
  const srv = await start(['--parallel', String(n), '--queue', '0']);
  await complete(srv.url, 0);
  const bat = await measure(srv.url, n, true);
  await srv.stop();
  const same = bat.res.every((r, i) => r.text === seq.res[i].text);
  if (n === 1) base = bat.agg;
  console.log(`| ${n} | one after another | ${seq.tokens} | ${fmt(seq.wall, 2)} | ${fmt(seq.agg)} | ${fmt(seq.per)} | ${fmt(seq.lat, 2)} | ${fmt(seq.bpt / 1e6, 3)} | |`);
  console.log(`| ${n} | --parallel ${n} | ${bat.tokens} | ${fmt(bat.wall, 2)} | ${fmt(bat.agg)}${base ? ` (${fmt(bat.agg / base, 2)}x N=1)` : ''} | ${fmt(bat.per)} | ${fmt(bat.lat, 2)} | ${fmt(bat.bpt / 1e6, 3)} | ${same ? 'yes' : 'NO'} |`);
  if (!same) process.exitCode = 1;
}
await seqSrv.stop();
