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
import { complete as completion, metrics, modelDir, serveArgs, startServe } from './bench-lib.mjs';

const MODEL = modelDir('tests/fixtures/k3-nano');
const NS = (process.env.BATCH_NS || '1 2 4 8').split(/\s+/).filter(Boolean).map(Number);
const TOKENS = Number(process.env.BATCH_TOKENS || 64);
const EXTRA = serveArgs();

const start = (args) => startServe(MODEL, [...EXTRA, ...args]);

async function bytesRead(url) {
  const m = await metrics(url, 'k3_');
  return (m.expert_read_bytes_total ?? 0) + (m.spine_read_bytes_total ?? 0);
}

// Request i: a different prompt per request, greedy, exactly TOKENS tokens unless it stops.
const complete = (url, i) => completion(url, `Request ${i}: in the beginning`, TOKENS);

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
