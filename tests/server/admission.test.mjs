// admission.test.mjs — one generation at a time: a second request gets 429 + Retry-After (or
// waits with --queue 1), /v1/models and /health answer while generating, and a client that
// hangs up stops its generation so the next request runs at once.
//
// A "long" generation is the fixture's greedy reply to LONG (319 tokens, then end-of-message)
// from a server that pauses 30 ms after each token (the test-only K3_TEST_TOKEN_DELAY_MS):
// over 9 s of generating on any machine (every test here aborts it), where sampling could end
// it at any token and a fast machine finishes k3-nano's whole reply in a fraction of a second;
// what a test does while it runs (requests, polls) has seconds to spare on a loaded machine,
// and an abandoned one is told apart by its token count, not by a clock. /health counts the
// completion tokens generated, so a test can tell that an abandoned generation stopped early
// rather than ran to its end.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { serverPool, client, raw, waitIdle, MODEL_ID } from './harness.mjs';

const server = serverPool({ K3_TEST_TOKEN_DELAY_MS: '30' });

const LONG = { model: MODEL_ID, messages: [{ role: 'user', content: 'Talk for a long time.' }], max_tokens: 3900, temperature: 0 };
const STOPPED_EARLY = 150; // tokens: an abandoned LONG (319 tokens to its end) stops within a few
// How long an abandoned LONG may take to end: a bound for a loaded machine, not a measurement
// (it ends within a token or two: STOPPED_EARLY is what tells it stopped).
const IDLE_MS = 20000;

// Starts a long streamed chat and resolves once its first chunk has arrived (it is running).
async function startLong(api) {
  const ac = new AbortController();
  const stream = await api.chat.completions.create({ ...LONG, stream: true }, { signal: ac.signal });
  const it = stream[Symbol.asyncIterator]();
  await it.next();
  await it.next(); // the role chunk, then the first generated piece
  const drain = (async () => {
    try { for (;;) { if ((await it.next()).done) break; } } catch { /* aborted */ }
  })();
  return { abort: () => ac.abort(), drain };
}

test('--queue 0: a second request while one generates gets 429 with Retry-After; models/health still answer', async () => {
  const srv = await server(['--queue', '0']);
  const api = client(srv);
  const long = await startLong(api);
  await assert.rejects(
    api.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }),
    (e) => e instanceof OpenAI.APIError && e.status === 429 && Number(e.headers.get('retry-after')) >= 1
      && e.error?.code === 'rate_limit_exceeded');
  const r = await raw(srv, 'POST', '/v1/completions', JSON.stringify({ prompt: 'x', max_tokens: 1 }));
  assert.equal(r.status, 429);
  assert.equal(r.json.error.type, 'rate_limit_error');
  const models = await api.models.list();
  assert.equal(models.data[0].id, MODEL_ID);
  // answered without waiting for the generation: it still runs (no clock needed: had they
  // waited for it, the 429s above would have been 200s)
  const h = await raw(srv, 'GET', '/health');
  assert.equal(h.json.generating, true);
  long.abort();
  await long.drain;
  await waitIdle(srv, IDLE_MS);
  const ok = await api.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, temperature: 0 });
  assert.equal(ok.choices[0].finish_reason, 'length');
});

const health = async (srv) => (await raw(srv, 'GET', '/health')).json;

test('a client abort mid-stream stops the generation and frees the server at once', async () => {
  const srv = await server([]);
  const api = client(srv);
  let before = 0;
  for (let round = 0; round < 3; round++) {
    const long = await startLong(api);
    long.abort();
    await long.drain;
    await waitIdle(srv, IDLE_MS);
    const spent = (await health(srv)).completion_tokens - before;
    assert.ok(spent < STOPPED_EARLY, `the abandoned generation ran on: ${spent} tokens`);
    const r = await api.completions.create({ model: MODEL_ID, prompt: 'next', max_tokens: 3, temperature: 0 });
    assert.equal(r.usage.completion_tokens, 3);
    before = (await health(srv)).completion_tokens;
  }
  assert.equal((await health(srv)).generations, 6);
});

test('a non-streamed request whose client gives up stops its generation too', async () => {
  const srv = await server([]);
  const api = client(srv);
  const ac = new AbortController();
  const p = api.chat.completions.create(LONG, { signal: ac.signal });
  for (const t0 = Date.now(); !(await raw(srv, 'GET', '/health')).json.generating && Date.now() - t0 < 30000;)
    await new Promise((r) => setTimeout(r, 10));
  ac.abort();
  await assert.rejects(p);
  await waitIdle(srv, IDLE_MS);
  assert.ok((await health(srv)).completion_tokens < STOPPED_EARLY);
});

test('by default (--queue 64) a second request waits for the first instead of a 429', async () => {
  const srv = await server([]);
  assert.match(srv.banner(), /up to 64 more wait in a FIFO/);
  const api = client(srv);
  const long = await startLong(api);
  const second = api.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: 'title?' }], max_tokens: 2, temperature: 0 });
  for (const t0 = Date.now(); (await raw(srv, 'GET', '/health')).json.queued !== 1 && Date.now() - t0 < 30000;)
    await new Promise((r) => setTimeout(r, 10));
  assert.equal((await raw(srv, 'GET', '/health')).json.queued, 1);
  long.abort();
  await long.drain;
  const r = await second;
  assert.equal(r.choices[0].finish_reason, 'length');
});

test('with --queue 1 a second request waits and succeeds; a third gets 429', async () => {
  const srv = await server(['--queue', '1']);
  assert.match(srv.banner(), /up to 1 more wait in a FIFO/);
  const api = client(srv);
  const long = await startLong(api);
  const second = api.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: 'queued' }], max_tokens: 4, temperature: 0 });
  for (const t0 = Date.now(); (await raw(srv, 'GET', '/health')).json.queued !== 1 && Date.now() - t0 < 30000;)
    await new Promise((r) => setTimeout(r, 10));
  assert.equal((await raw(srv, 'GET', '/health')).json.queued, 1);
  await assert.rejects(
    api.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: 'third' }], max_tokens: 1 }),
    (e) => e.status === 429);
  long.abort();
  await long.drain;
  const r = await second;
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 4);
});

test('a queued request whose client leaves is dropped from the queue', async () => {
  const srv = await server(['--queue', '1']);
  const api = client(srv);
  const long = await startLong(api);
  const ac = new AbortController();
  const queued = api.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: 'q' }], max_tokens: 2 }, { signal: ac.signal });
  for (const t0 = Date.now(); (await raw(srv, 'GET', '/health')).json.queued !== 1 && Date.now() - t0 < 30000;)
    await new Promise((r) => setTimeout(r, 10));
  ac.abort();
  await assert.rejects(queued);
  let q = 1;
  for (const t0 = Date.now(); q && Date.now() - t0 < 30000;) {
    q = (await raw(srv, 'GET', '/health')).json.queued;
    await new Promise((r) => setTimeout(r, 10));
  }
  assert.equal(q, 0);
  long.abort();
  await long.drain;
  await waitIdle(srv, IDLE_MS);
});
