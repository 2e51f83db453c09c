// parallel.test.mjs — k3 serve --parallel N: N generations at once, their tokens in shared
// passes (k3_multistep), each reply exactly what the same request gets alone (greedy and
// seeded sampling: same text, same token ids through their logprobs); a request cancelled
// mid-stream or one that fails leaves the others unchanged; --queue 0 answers 429 beyond N.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { serverPool, client, raw, waitIdle, MODEL_ID } from './harness.mjs';

const server = serverPool();
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'k3-parallel-'));
after(() => fs.rmSync(dir, { recursive: true, force: true }));

// Four different requests: greedy and seeded sampling, chat and raw completions; long enough
// (200 tokens) that they run side by side.
const REQS = [
  { kind: 'chat', body: { messages: [{ role: 'user', content: 'Tell a long story about a fox.' }], temperature: 0, reasoning_effort: 'none' } },
  { kind: 'chat', body: { messages: [{ role: 'user', content: 'Describe the sea.' }], temperature: 1, seed: 7, reasoning_effort: 'low' } },
  { kind: 'text', body: { prompt: 'In the beginning God created', temperature: 0 } },
  { kind: 'text', body: { prompt: 'And the earth was without form', temperature: 0.8, top_p: 0.9, seed: 42 } },
];
const MAX = 200;

// One request; returns what must match: finish, usage, text and the ids (as logprob tokens).
async function run(api, r, extra = {}) {
  const body = { model: MODEL_ID, max_tokens: MAX, ...r.body, ...extra };
  if (r.kind === 'chat') {
    const c = await api.chat.completions.create({ ...body, logprobs: true });
    const ch = c.choices[0];
    return { finish: ch.finish_reason, usage: c.usage, text: [ch.message.content, ch.message.reasoning_content],
      ids: ch.logprobs.content.map((t) => [t.token, t.logprob]) };
  }
  const c = await api.completions.create({ ...body, logprobs: 0 });
  const ch = c.choices[0];
  return { finish: ch.finish_reason, usage: c.usage, text: [ch.text], ids: ch.logprobs.tokens.map((t, i) => [t, ch.logprobs.token_logprobs[i]]) };
}

async function metric(srv, name) {
  const r = await raw(srv, 'GET', '/metrics');
  const m = r.text.match(new RegExp(`^${name.replace(/[{}"+]/g, (c) => `\\${c}`)} (\\S+)$`, 'm'));
  assert.ok(m, `${name} in /metrics`);
  return Number(m[1]);
}

let alone = null; // REQS run one by one on a server without --parallel
async function aloneResults() {
  if (alone) return alone;
  const srv = await server(['--state-cache', '1']);
  const api = client(srv);
  alone = [];
  for (const r of REQS) alone.push(await run(api, r));
  for (const a of alone) assert.ok(a.usage.completion_tokens > 20, 'long enough to overlap');
  await srv.stop();
  return alone;
}

test('--parallel 4 --queue 0: 4 simultaneous requests all 200, each identical to running alone', async () => {
  const ref = await aloneResults();
  const srv = await server(['--parallel', '4', '--queue', '0']);
  assert.match(srv.banner(), /up to 4 generations at once/);
  const api = client(srv);
  const got = await Promise.all(REQS.map((r) => run(api, r)));
  for (let i = 0; i < REQS.length; i++) {
    assert.equal(got[i].usage.prompt_tokens_details.cached_tokens, 0);
    assert.deepEqual(got[i], ref[i], `request ${i} differs from alone`);
  }
  // They shared passes: far fewer passes than feeding each request alone would take (each
  // prompt in one chunk, then one pass per completion token but the last).
  const passes = await metric(srv, 'k3_pass_rows_count');
  const aloneP = ref.reduce((n, r) => n + 1 + r.usage.completion_tokens - 1, 0);
  const rows = await metric(srv, 'k3_pass_rows_sum');
  assert.equal(rows, ref.reduce((n, r) => n + r.usage.prompt_tokens + r.usage.completion_tokens - 1, 0),
    'every prompt id and every fed completion id is one row');
  assert.ok(passes < aloneP * 0.75, `${passes} passes for ${aloneP} alone: not batched`);
  assert.ok(await metric(srv, 'k3_pass_rows_bucket{le="1"}') < passes);
  // alone on this server (nothing else running) they are the same too
  assert.deepEqual(await run(api, REQS[1]), ref[1]);
});

// The four must still run when the fifth comes: sampled, one of them sometimes ended first (1
// round in 40 here; the random-weight model ends a sampled reply about once in 1,000 tokens).
// So their replies are scripted (K3_TEST_SCRIPTED_REPLY: no end of message before max_tokens)
// and slowed (K3_TEST_TOKEN_DELAY_MS: 3000 tokens take minutes); they are aborted at the end.
test('--queue 0 beyond N: the fifth request gets 429 while four run', async () => {
  const script = path.join(dir, 'long.json');
  fs.writeFileSync(script, JSON.stringify(['the fox ran over the hills, '.repeat(1000)]));
  const srv = await serverPool({ K3_TEST_SCRIPTED_REPLY: script, K3_TEST_TOKEN_DELAY_MS: '10' })(
    ['--parallel', '4', '--queue', '0']);
  const api = client(srv);
  const streams = [];
  for (let i = 0; i < 4; i++) {
    const ac = new AbortController();
    const s = await api.chat.completions.create({ model: MODEL_ID, max_tokens: 3000, stream: true,
      temperature: 0, messages: [{ role: 'user', content: `Talk for a long time, ${i}.` }] }, { signal: ac.signal });
    const it = s[Symbol.asyncIterator]();
    await it.next(); // the role chunk: sent as soon as the request is accepted
    await it.next(); // the first generated piece: it runs
    streams.push({ ac, it });
  }
  assert.equal((await raw(srv, 'GET', '/health')).json.generating, true);
  assert.equal(await metric(srv, 'k3_requests_active'), 4);
  await assert.rejects(api.completions.create({ model: MODEL_ID, prompt: 'x', max_tokens: 1 }),
    (e) => e instanceof OpenAI.APIError && e.status === 429 && /--parallel 4/.test(e.message));
  for (const s of streams) s.ac.abort();
  await waitIdle(srv, 30000);
  const ok = await api.completions.create({ model: MODEL_ID, prompt: 'x', max_tokens: 2, temperature: 0 });
  assert.equal(ok.usage.completion_tokens, 2);
});

test('a request cancelled mid-pass leaves the others unchanged', async () => {
  const ref = await aloneResults();
  const srv = await server(['--parallel', '4', '--queue', '0']);
  const api = client(srv);
  const ac = new AbortController();
  const doomed = await api.chat.completions.create({ model: MODEL_ID, max_tokens: 3000, stream: true,
    messages: [{ role: 'user', content: 'Talk for a long time.' }] }, { signal: ac.signal });
  const it = doomed[Symbol.asyncIterator]();
  await it.next();
  const others = Promise.all(REQS.slice(0, 3).map((r) => run(api, r)));
  await it.next();
  ac.abort();
  const got = await others;
  for (let i = 0; i < 3; i++) assert.deepEqual(got[i], ref[i], `request ${i} changed by the cancel`);
  await waitIdle(srv, 30000);
  const spent = (await raw(srv, 'GET', '/health')).json.completion_tokens
    - got.reduce((n, r) => n + r.usage.completion_tokens, 0);
  assert.ok(spent < 3000, `the cancelled request ran on: ${spent} tokens`);
});

test('requests that fail or hit the context end fail alone', async () => {
  const ref = await aloneResults();
  const srv = await server(['--parallel', '4', '--queue', '0', '--ctx', '256']);
  const api = client(srv);
  const big = 'word '.repeat(400); // its prompt alone is past the context: 400
  const fails = api.completions.create({ model: MODEL_ID, prompt: big, max_tokens: 4 }).then(
    () => assert.fail('a prompt past the context must fail'),
    (e) => { assert.equal(e.status, 400); assert.equal(e.error?.code, 'context_length_exceeded'); });
  // a chat without max_tokens that runs into the end of the context: cut with "length"
  const full = run(api, { kind: 'chat', body: { messages: [{ role: 'user', content: 'Talk until the end.' }],
    temperature: 0, reasoning_effort: 'none' } }, { max_tokens: undefined });
  const got = await Promise.all([run(api, REQS[0], { max_tokens: 40 }), run(api, REQS[2], { max_tokens: 40 }), fails, full]);
  const cut = got[3];
  assert.equal(cut.finish, 'length');
  assert.equal(cut.usage.prompt_tokens + cut.usage.completion_tokens, 256 + 1, 'ran to the last position');
  // the two others are the alone ones, cut at 40 tokens
  for (const [g, r] of [[got[0], ref[0]], [got[1], ref[2]]]) {
    assert.deepEqual(g.ids, r.ids.slice(0, 40));
    assert.equal(g.usage.completion_tokens, Math.min(40, r.usage.completion_tokens));
  }
});

test('--parallel 2 --queue 4: six at once, two run and four wait, all 200 and identical to alone', async () => {
  const ref = await aloneResults();
  const srv = await server(['--parallel', '2', '--queue', '4']);
  const api = client(srv);
  const six = [...REQS, REQS[0], REQS[3]];
  const got = await Promise.all(six.map((r) => run(api, r, { max_tokens: 30 })));
  six.forEach((r, i) => {
    const want = ref[REQS.indexOf(r)];
    assert.deepEqual(got[i].ids, want.ids.slice(0, 30), `request ${i}`);
  });
  const m = (await raw(srv, 'GET', '/metrics')).text;
  assert.match(m, /^k3_requests_total\{endpoint="\/v1\/chat\/completions",code="200"\} 3$/m);
  assert.match(m, /^k3_requests_total\{endpoint="\/v1\/completions",code="200"\} 3$/m);
});
