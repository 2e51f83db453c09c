// logprobs.test.mjs — chat logprobs / top_logprobs and completions logprobs / echo against an
// independent computation: log_softmax (in double, here in JS) of the float32 logits that
// `k3 run --dump-logits` writes for the same ids. Values must agree within 1e-4.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, client, k3, MODEL, MODEL_ID } from './harness.mjs';

let srv, api;
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'k3-lp-'));
before(async () => { srv = await startServer(); api = client(srv); });
after(async () => { await srv?.stop(); fs.rmSync(dir, { recursive: true, force: true }); });

// Rows of log_softmax of the logits k3 run writes for prompt ids + n generated (greedy).
function referenceRows(ids, n) {
  const file = path.join(dir, 'logits.bin');
  const gen = k3(['run', MODEL, '--prompt-ids', ids.join(','), '--max-new', String(n), '--ids',
    '--dump-logits', file]).trim().split(',').map(Number);
  const buf = fs.readFileSync(file);
  const f = new Float32Array(buf.buffer, buf.byteOffset, buf.length / 4);
  const rows = f.length / VOCAB;
  const out = [];
  for (let r = 0; r < rows; r++) {
    const row = f.subarray(r * VOCAB, (r + 1) * VOCAB);
    let m = -Infinity;
    for (const v of row) m = Math.max(m, v);
    let s = 0;
    for (const v of row) s += Math.exp(v - m);
    const norm = m + Math.log(s);
    out.push(Array.from(row, (v) => v - norm));
  }
  return { rows: out, gen };
}
const CONFIG = JSON.parse(fs.readFileSync(path.join(MODEL, 'config.json'), 'utf8'));
const VOCAB = (CONFIG.text_config ?? CONFIG).vocab_size;
const near = (a, b, what) => assert.ok(Math.abs(a - b) <= 1e-4, `${what}: ${a} vs ${b}`);
const topValues = (row, k) => [...row].sort((a, b) => b - a).slice(0, k);

test('completions: echo + logprobs give the prompt tokens\' and the generated tokens\' log_softmax', async () => {
  const ids = k3(['tokenize', MODEL, 'The quick brown fox jumps']).trim().split(',').map(Number);
  const n = 4;
  const r = await api.completions.create({ model: MODEL_ID, prompt: ids, max_tokens: n, temperature: 0,
    logprobs: 5, echo: true });
  const lp = r.choices[0].logprobs;
  const { rows, gen } = referenceRows(ids, n);
  assert.equal(lp.tokens.length, ids.length + n);
  assert.equal(lp.token_logprobs[0], null);
  assert.equal(lp.top_logprobs[0], null);
  for (let i = 1; i < ids.length; i++) near(lp.token_logprobs[i], rows[i - 1][ids[i]], `prompt token ${i}`);
  for (let k = 0; k < n; k++) {
    const row = rows[ids.length - 1 + k], at = ids.length + k;
    near(lp.token_logprobs[at], row[gen[k]], `generated token ${k}`);
    const top = Object.values(lp.top_logprobs[at]).sort((a, b) => b - a);
    assert.equal(top.length, 5);
    topValues(row, 5).forEach((v, q) => near(top[q], v, `top ${q} of generated ${k}`));
  }
  // echo: the text starts with the prompt; text_offset walks the returned text's bytes.
  const prompt = await api.completions.create({ model: MODEL_ID, prompt: 'The quick brown fox jumps', max_tokens: 1,
    temperature: 0, echo: true });
  assert.ok(prompt.choices[0].text.startsWith('The quick brown fox jumps'), prompt.choices[0].text);
  assert.equal(lp.text_offset[0], 0);
  assert.equal(lp.text_offset[1], Buffer.byteLength(lp.tokens[0]));
});

test('chat: logprobs.content per generated token with bytes and top_logprobs', async () => {
  const body = { messages: [{ role: 'user', content: 'Hello' }], thinking: false };
  const req = path.join(dir, 'chat.json');
  fs.writeFileSync(req, JSON.stringify(body));
  const ids = k3(['render', MODEL, '--request', req, '--ids']).trim().split(',').map(Number);
  const n = 3;
  const r = await api.chat.completions.create({ model: MODEL_ID, ...body, max_tokens: n, temperature: 0,
    logprobs: true, top_logprobs: 3 });
  const content = r.choices[0].logprobs.content;
  const { rows, gen } = referenceRows(ids, n);
  assert.equal(content.length, n);
  for (let k = 0; k < n; k++) {
    const row = rows[ids.length - 1 + k];
    near(content[k].logprob, row[gen[k]], `token ${k}`);
    assert.equal(content[k].top_logprobs.length, 3);
    topValues(row, 3).forEach((v, q) => near(content[k].top_logprobs[q].logprob, v, `top ${q} of ${k}`));
    assert.ok(Array.isArray(content[k].bytes));
    if (!content[k].token.startsWith('bytes:')) assert.deepEqual(content[k].bytes, [...Buffer.from(content[k].token)]);
  }
  // Streamed: each token's entry comes in a chunk of its own; together they are the same.
  const stream = await api.chat.completions.create({ model: MODEL_ID, ...body, max_tokens: n, temperature: 0,
    logprobs: true, top_logprobs: 3, stream: true });
  const streamed = [];
  for await (const ch of stream) streamed.push(...(ch.choices[0]?.logprobs?.content ?? []));
  assert.deepEqual(streamed, content);
  // Sampling at a temperature does not change the values: they are the model's distribution.
  const hot = await api.chat.completions.create({ model: MODEL_ID, ...body, max_tokens: 1, temperature: 1.5,
    seed: 7, logprobs: true });
  const first = hot.choices[0].logprobs.content[0];
  const want = rows[ids.length - 1];
  assert.ok(want.some((v) => Math.abs(v - first.logprob) <= 1e-4), `${first.logprob} is a logprob of the row`);
});
