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
import os from 'node:os';
import { complete as completion, median, metrics, modelDir, serveArgs, startServe } from './bench-lib.mjs';

const MODEL = modelDir('tests/fixtures/k3-tiny-kjv');
const TOKENS = Number(process.env.ONEPASS_TOKENS || 128);
const REPEAT = Number(process.env.ONEPASS_REPEAT || 3);
const EXTRA = serveArgs();

// Repetitive, code-like prompts, one per request.
const PROMPTS = ['i', 'j', 'k', 'n'].map((v) =>
  `for (${v} = 0; ${v} < len; ${v}++) { out[${v}] = in[${v}] + 1; }\n`.repeat(4) + `for (${v} = 0;`);

const start = (args) => startServe(MODEL, ['--no-reuse', ...EXTRA, ...args]);

async function rows(url) {
  const m = await metrics(url, 'k3_');
  return { sum: m.pass_rows_sum ?? 0, count: m.pass_rows_count ?? 0 };
}

const complete = (url, i) => completion(url, PROMPTS[i], TOKENS);

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
  const wall = median(walls);
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
