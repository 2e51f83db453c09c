// onepass.test.mjs — one server path (issue 27): with --parallel 4 --spec 3, every round is ONE
// pass holding the decoding slots' rows, their speculative verification rows (an id and its
// drafts, rewound where K3 disagrees), prefill chunks and an echo prompt's rows. Four requests
// at once (greedy, seeded sampling with speculation, an echo + logprobs completion, a greedy
// chat) run >= 2 token rows per pass on average (/metrics k3_pass_rows: before, speculating
// slots stepped alone, ~1.3 rows per pass here) and each reply is identical, text, ids and
// logprobs, to the same request sent alone. "Identical" holds for the seeded sampled request
// too, whatever drafts were verified or whether --spec's pays-off rule (which measures time)
// switched speculation off: each id is drawn at its own row as without --spec (spec.h).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { serverPool, raw, MODEL_ID } from './harness.mjs';

const server = serverPool();

// Short, repetitive (code-like) prompts and long replies: the decode rows dominate the passes.
const CODE = 'for (i = 0; i < n; i++) { a[i] = b[i]; }\n'.repeat(3);
const REQS = [
  ['/v1/completions', { prompt: CODE, max_tokens: 120, temperature: 0 }],
  ['/v1/completions', { prompt: CODE + 'while (x) {', max_tokens: 120, temperature: 0.8, seed: 5 }],
  ['/v1/completions', { prompt: 'int main(void) { return 0; } int main(void) {', max_tokens: 60,
    temperature: 0, echo: true, logprobs: 3 }],
  ['/v1/chat/completions', { messages: [{ role: 'user', content: CODE }], max_tokens: 120,
    temperature: 0, reasoning_effort: 'none' }],
];

async function send(srv, [p, body]) {
  const r = await raw(srv, 'POST', p, JSON.stringify({ model: MODEL_ID, ...body }),
    { 'content-type': 'application/json' });
  assert.equal(r.status, 200, r.text);
  return { choices: r.json.choices, usage: r.json.usage };
}

async function rows(srv) {
  const t = (await raw(srv, 'GET', '/metrics')).text;
  const sum = Number(t.match(/^k3_pass_rows_sum (\S+)$/m)[1]);
  const count = Number(t.match(/^k3_pass_rows_count (\S+)$/m)[1]);
  return { sum, count };
}

test('--parallel 4 --spec 3: 4 requests at once run >= 2 rows per pass, each reply as alone', async (t) => {
  const srv = await server(['--parallel', '4', '--spec', '3', '--state-cache', '4', '--no-reuse']);
  const r0 = await rows(srv);
  const together = await Promise.all(REQS.map((r) => send(srv, r)));
  const r1 = await rows(srv);
  const perPass = (r1.sum - r0.sum) / (r1.count - r0.count);
  assert.ok(perPass >= 2, `${perPass.toFixed(2)} token rows per pass (${r1.sum - r0.sum} rows in ` +
    `${r1.count - r0.count} passes); the verification, echo and decode rows share passes`);
  t.diagnostic(`${perPass.toFixed(2)} token rows per pass (${r1.sum - r0.sum} rows, ${r1.count - r0.count} passes)`);
  for (const g of together) assert.ok(g.usage.completion_tokens >= 40, 'long enough to overlap');
  const echo = together[2].choices[0];
  assert.ok(echo.text.startsWith('int main(void)') && echo.logprobs.token_logprobs[0] === null &&
    echo.logprobs.token_logprobs.length > 20, 'the echo reply gives the prompt back with logprobs');
  for (let i = 0; i < REQS.length; i++) {
    const alone = await send(srv, REQS[i]);
    assert.deepEqual(together[i].choices, alone.choices, `request ${i} differs from it alone`);
    assert.equal(together[i].usage.completion_tokens, alone.usage.completion_tokens);
  }
});
