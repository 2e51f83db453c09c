// bench-onepass.mjs — speculation and batching across requests together (issue 27): 4 greedy
// completions of repetitive, code-like text, in the same run:
//   A. `k3 serve --parallel 4 --spec 3`, the 4 sent at once (verification rows share passes)
//   B. `k3 serve --parallel 4`, the 4 sent at once
//   C. `k3 serve --spec 3`, the 4 sent one after another
//   D. `k3 serve`, the 4 one after another: the one-stream decode rate, the reference
// and prints aggregate generated tokens/s (each mode's tokens over its wall time), the ratios
// against C and D, token rows per pass (/metrics k3_pass_rows) and whether every reply equals
// D's (greedy: it must).
//
// Environment: K3_BIN (default ./k3), MODEL_DIR (default the k3-tiny-kjv fixture: a trained
// model, so that drafts are accepted), ONEPASS_TOKENS (completion tokens per request, default
// 128), ONEPASS_REPEAT (runs of each mode, the median wall time kept; default 3), SERVE_ARGS
// (extra flags for k3 serve). Only 127.0.0.1 is contacted.
import { spawn } from 'node:child_process';
import path from 'node:path';
import os from 'node:os';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(here, '..', '..');
const K3 = path.resolve(ROOT, process.env.K3_BIN || 'k3');
const MODEL = path.resolve(ROOT, process.env.MODEL_DIR || 'tests/fixtures/k3-tiny-kjv');
const TOKENS = Number(process.env.ONEPASS_TOKENS || 128);
const REPEAT = Number(process.env.ONEPASS_REPEAT || 3);
const EXTRA = (process.env.SERVE_ARGS || '').split(/\s+/).filter(Boolean);

// Repetitive, code-like prompts, one per request.
const PROMPTS = ['i', 'j', 'k', 'n'].map((v) =>
  `for (${v} = 0; ${v} < len; ${v}++) { out[${v}] = in[${v}] + 1; }\n`.repeat(4) + `for (${v} = 0;`);

async function start(args) {
  const proc = spawn(K3, ['serve', MODEL, '--port', '0', '-q', '--no-reuse', ...EXTRA, ...args],
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

async function rows(url) {
  const t = await (await fetch(`${url}/metrics`)).text();
  const v = (n) => Number((t.match(new RegExp(`^${n} (\\S+)$`, 'm')) || [0, 0])[1]);
  return { sum: v('k3_pass_rows_sum'), count: v('k3_pass_rows_count') };
}

async function complete(url, i) {
  const r = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: PROMPTS[i], max_tokens: TOKENS, temperature: 0 }) });
  if (r.status !== 200) throw new Error(`request ${i}: HTTP ${r.status} ${await r.text()}`);
  const j = await r.json();
  return { text: j.choices[0].text, tokens: j.usage.completion_tokens };
}

async function mode(args, together) {
  const srv = await start(args);
  await complete(srv.url, 0); // warm-up: page cache, expert cache
  const r0 = await rows(srv.url);
  const walls = [];
  let res = [];
  for (let k = 0; k < REPEAT; k++) { /* the same replies each time (greedy) */
    const t0 = performance.now();
    res = [];
    if (together) res = await Promise.all(PROMPTS.map((_, i) => complete(srv.url, i)));
    else for (let i = 0; i < PROMPTS.length; i++) res.push(await complete(srv.url, i));
    walls.push((performance.now() - t0) / 1000);
  }
  const wall = walls.sort((a, b) => a - b)[Math.floor(REPEAT / 2)];
  const r1 = await rows(srv.url);
  await srv.stop();
  const tokens = res.reduce((a, r) => a + r.tokens, 0);
  return { res, wall, tokens, agg: tokens / wall, perPass: (r1.sum - r0.sum) / (r1.count - r0.count) };
}

const fmt = (x, d = 1) => x.toFixed(d);
console.log(`one pass: ${MODEL}, 4 requests x ${TOKENS} tokens, median of ${REPEAT} runs, load average ${os.loadavg().map((x) => fmt(x, 2)).join(' ')}`);
const D = await mode([], false);
const C = await mode(['--spec', '3'], false);
const B = await mode(['--parallel', '4'], true);
const A = await mode(['--parallel', '4', '--spec', '3'], true);
console.log('| mode | tokens | wall s | aggregate tok/s | vs --spec 3 one at a time | vs one stream | rows / pass | replies = one stream |');
console.log('|---|---|---|---|---|---|---|---|');
for (const [name, m] of [['--parallel 4 --spec 3, 4 at once', A], ['--parallel 4, 4 at once', B],
  ['--spec 3, one at a time', C], ['plain, one at a time (one stream)', D]]) {
  const same = m.res.every((r, i) => r.text === D.res[i].text);
  console.log(`| ${name} | ${m.tokens} | ${fmt(m.wall, 2)} | ${fmt(m.agg)} | ${fmt(m.agg / C.agg, 2)}x | ${fmt(m.agg / D.agg, 2)}x | ${fmt(m.perPass, 2)} | ${same ? 'yes' : 'NO'} |`);
  if (!same) process.exitCode = 1;
}
