// clients.test.mjs — issue 32's clients that stall or vanish:
//  - D21: with the default --parallel 1, a streaming client that stops reading held the only
//    slot until it disconnected (every other request a 429). Now it is cancelled after
//    --stall-timeout seconds of reading nothing (1 s here) and the next request runs.
//  - D19: a non-streamed HTTP/1.0 request whose client closed its socket ran to max_tokens
//    (HTTP/1.0 has no half-close; nginx speaks it to upstreams). Now the FIN cancels it.
// Replies are slowed by the test-only K3_TEST_TOKEN_DELAY_MS or made long by a scripted reply
// (server.h), so that no outcome depends on how fast this machine is.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { serverPool, raw, sleep, waitIdle, MODEL_ID } from './harness.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'k3-clients-'));
after(() => fs.rmSync(dir, { recursive: true, force: true }));
const JSONH = { 'Content-Type': 'application/json' };

const WORDS = 'the fox ran over hills and rivers while a heron watched from tall reeds by the'.split(' ');
const LONG = Array.from({ length: 6000 }, (_, i) => `${WORDS[i % WORDS.length]}${i % 9 ? '' : ','}`).join(' ');

function request(port, version, body) {
  return `POST /v1/chat/completions HTTP/${version}\r\nHost: 127.0.0.1:${port}\r\n` +
    `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
}

test('D21: a streaming client that reads nothing is cancelled after --stall-timeout; the slot frees', async () => {
  const script = path.join(dir, 'script.json');
  fs.writeFileSync(script, JSON.stringify([LONG]));
  const srv = await serverPool({ K3_TEST_SCRIPTED_REPLY: script, K3_TEST_STREAM_BACKLOG_BYTES: '65536' })(
    ['--stall-timeout', '1']);
  const port = Number(new URL(srv.url).port);
  const body = JSON.stringify({ model: MODEL_ID, stream: true, max_tokens: 3600, temperature: 0,
    reasoning_effort: 'none', logprobs: true, top_logprobs: 20,
    messages: [{ role: 'user', content: 'Tell a very long story.' }] });
  const sock = net.connect(port, '127.0.0.1');
  sock.on('error', () => {});
  const closed = new Promise((r) => sock.on('close', r));
  await new Promise((r) => sock.on('connect', r));
  sock.pause(); // reads nothing, ever
  sock.write(request(port, '1.1', body));
  try {
    // another client: 429 while the stalled one holds the slot, then 200 (before: 429 forever)
    const t0 = Date.now();
    let r;
    for (;;) {
      r = await raw(srv, 'POST', '/v1/chat/completions', JSON.stringify({
        messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }), JSONH);
      if (r.status !== 429) break;
      assert.ok(Date.now() - t0 < 30000, 'still 429 30 s after the client stopped reading (D21)');
      await sleep(200);
    }
    assert.equal(r.status, 200, r.text);
    sock.resume(); // what was sent before the shutdown, then the end of the connection
    await Promise.race([closed, sleep(10000).then(() => assert.fail('the stalled connection was left open'))]);
    assert.match(srv.log(), /POST \/v1\/chat\/completions 499 stream .*cancelled: the client read nothing for --stall-timeout/);
  } finally {
    sock.destroy();
  }
});

test('D19: an HTTP/1.0 client that closes its socket cancels its non-streamed generation', async () => {
  // 50 ms per token: 340 tokens would take 17 s; the client leaves after ~0.3 s
  const srv = await serverPool({ K3_TEST_TOKEN_DELAY_MS: '50' })(['--ctx', '512']);
  const port = Number(new URL(srv.url).port);
  for (const stream of [false, true]) {
    const body = JSON.stringify({ messages: [{ role: 'user', content: 'write a long story' }],
      max_tokens: 340, temperature: 0, stream });
    const sock = net.connect(port, '127.0.0.1');
    sock.on('error', () => {});
    await new Promise((r) => sock.on('connect', r));
    sock.write(request(port, '1.0', body));
    for (let t0 = Date.now(); ;) { // until it generates
      const h = await raw(srv, 'GET', '/health');
      if (h.json.generating) break;
      assert.ok(Date.now() - t0 < 30000, 'never started');
      await sleep(20);
    }
    await sleep(300);
    sock.destroy(); // FIN (nothing was sent back to reset)
    const t1 = Date.now();
    for (;;) {
      const h = await raw(srv, 'GET', '/health');
      if (!h.json.generating) break;
      assert.ok(Date.now() - t1 < 10000, `stream=${stream}: still generating 10 s after the HTTP/1.0 client left (D19)`);
      await sleep(20);
    }
  }
  const posts = () => srv.log().split('\n').filter((l) => /POST \/v1\/chat\/completions/.test(l));
  for (const t0 = Date.now(); posts().length < 2 && Date.now() - t0 < 10000;) await sleep(20); // the log lines
  const lines = posts();
  assert.equal(lines.length, 2, lines.join('\n'));
  for (const l of lines) assert.match(l, /cancelled/, l);
});

test('--stall-timeout counts only time the client does not read: a stream that waits longer in the queue is served', async () => {
  // 100 ms per token: A holds the slot ~3 s while B (streamed, read at once) waits in the
  // queue, three times --stall-timeout; then B is served whole
  const srv = await serverPool({ K3_TEST_TOKEN_DELAY_MS: '100' })(['--stall-timeout', '1', '--queue', '2']);
  const body = (n) => JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: n,
    temperature: 0, stream: true });
  const go = async (n) => {
    const r = await raw(srv, 'POST', '/v1/chat/completions', body(n), JSONH);
    return { status: r.status, done: /data: \[DONE\]/.test(r.text) };
  };
  const a = go(30);
  for (const t0 = Date.now(); !(await raw(srv, 'GET', '/health')).json.generating; await sleep(5))
    assert.ok(Date.now() - t0 < 30000, 'A never started'); // B comes second, whatever the load
  const b = go(5);
  assert.deepEqual(await a, { status: 200, done: true });
  assert.deepEqual(await b, { status: 200, done: true });
});

// Issue 31: the server prefills a prompt in the memory plan's prompt passes (each expert its ids
// chose read once per pass), not in passes of 32 ids, and a client that leaves during such a
// pass stops it within a layer (k3_sched_pass_unwanted), not at its end.
const PROMPT_BODY = (extra = {}) => JSON.stringify({ temperature: 0, max_tokens: 2, stream: true,
  messages: [{ role: 'user', content: LONG.split(' ').slice(0, 1900).join(' ') }], ...extra }); // ~3,930 ids

// The log line of the n-th chat completion once written (after the reply, so poll for it).
async function logLine(srv, n) {
  for (const t0 = Date.now(); ; await sleep(20)) {
    const lines = srv.log().split('\n').filter((l) => /POST \/v1\/chat\/completions/.test(l));
    if (lines.length > n) return lines[n];
    assert.ok(Date.now() - t0 < 10000, `no log line ${n}: ${lines.join('\n')}`);
  }
}

// A server whose first prompt pass holds after its first layer while its client stays (the
// test build's K3_TEST_PASS_HOLD_S, server.h), and the wait for that hold: then the request is
// inside its one prompt pass, and stays there until it leaves, on a machine of any speed (a
// pause of a quarter of a first run's time could outlast a second, faster run's pass).
const HOLD = { K3_TEST_PASS_HOLD_S: '120' };
async function intoThePass(srv) {
  for (const t0 = Date.now(); !/k3 serve: test: a pass of \d+ ids holds after layer 1/.test(srv.log()); await sleep(5))
    assert.ok(Date.now() - t0 < 30000, `the request's pass never held:\n${srv.log()}`);
}

test('a long prompt is one prompt pass, and a client that leaves stops that pass within a layer', async () => {
  const srv = await serverPool({})([]);
  const passes = async () => Number((await raw(srv, 'GET', '/metrics')).text
    .match(/^k3_pass_rows_count (\d+)/m)[1]);
  const p0 = await passes();
  const full = await raw(srv, 'POST', '/v1/chat/completions', PROMPT_BODY(), JSONH);
  assert.equal(full.status, 200, full.text);
  const first = await logLine(srv, 0);
  const ran = await passes() - p0; // the prompt's pass, then the second reply token's
  assert.ok(ran <= 3, `the prompt and 2 tokens took ${ran} passes (passes of 32 ids: 120+)`);
  assert.match(first, / 200 stream prompt \d+ .*length/);
  // the same prompt on a server that holds its pass after layer 1 (HOLD), the client gone
  // inside the pass: the pass stops at the next layer's end, here the first's
  const held = await serverPool(HOLD)([]);
  const ac = new AbortController();
  const gone = fetch(held.url + '/v1/chat/completions', { method: 'POST', body: PROMPT_BODY(),
    headers: JSONH, signal: ac.signal }).then((r) => r.text()).catch(() => 'aborted');
  await intoThePass(held);
  ac.abort();
  assert.equal(await gone, 'aborted');
  const second = await logLine(held, 0);
  const m = second.match(/ 499 stream .*cancelled: stopped after layer (\d+) of (\d+) of a pass of (\d+) ids/);
  assert.ok(m && m[1] === '1' && Number(m[2]) === 9 && Number(m[3]) > 3000, second);
});

// ... unless the same request waits in the queue: a client that gave up and re-sent it (Claude
// Code does after 300 s without a byte). The pass then runs to its end and the re-sent copy
// starts from the state the first one built (before: a stopped pass dropped it).
test('a pass whose client left runs on when the same request, re-sent, waits in the queue', async () => {
  const srv = await serverPool(HOLD)([]);
  const other = PROMPT_BODY({ stream_options: { include_usage: true } }).replace('the fox', 'a fox');
  const ac = new AbortController();
  const first = fetch(srv.url + '/v1/chat/completions', { method: 'POST', body: other, headers: JSONH,
    signal: ac.signal }).then((r) => r.text()).catch(() => 'aborted');
  await intoThePass(srv);
  const again = raw(srv, 'POST', '/v1/chat/completions', other, JSONH); // queued behind it
  for (const t0 = Date.now(); (await raw(srv, 'GET', '/health')).json.queued < 1; await sleep(5))
    assert.ok(Date.now() - t0 < 30000, 'the re-sent request never queued');
  ac.abort();
  assert.equal(await first, 'aborted');
  const r = await again;
  assert.equal(r.status, 200, r.text);
  const usage = JSON.parse(r.text.split('\n').filter((l) => l.startsWith('data: {')).at(-1).slice(6)).usage;
  assert.ok(usage.prompt_tokens_details.cached_tokens >= usage.prompt_tokens - 2,
    `the re-sent copy reused ${usage.prompt_tokens_details.cached_tokens} of ${usage.prompt_tokens} prompt tokens`);
  assert.match(await logLine(srv, 0), / 499 stream prompt \d+ .*cancelled, /); // not stopped
});

// A stopped pass no longer drops the passes before it (issue 31): the session goes back to where
// the stopped pass began and stays in its conversation, so the same request re-sent (Claude Code
// re-sends the whole conversation) goes on from there, and its reply is a fresh server's. The
// prompt goes in passes of 512 ids; the third (from position 1,024) holds after its first layer
// (K3_TEST_PASS_HOLD_POS) until the client leaves, which then stops it.
test('a stopped prompt pass keeps the passes before it: the same request re-sent goes on from there', async () => {
  const CHUNK = 512; // ~3,930 ids: 8 prompt passes
  const srv = await serverPool({ ...HOLD, K3_TEST_PASS_HOLD_POS: String(2 * CHUNK) })(['--chunk', String(CHUNK)]);
  const body = PROMPT_BODY({ stream_options: { include_usage: true } });
  const ac = new AbortController();
  const gone = fetch(srv.url + '/v1/chat/completions', { method: 'POST', body, headers: JSONH,
    signal: ac.signal }).then((r) => r.text()).catch(() => 'aborted');
  await intoThePass(srv);
  assert.match(srv.log(), /a pass of 512 ids holds after layer 1 \(position 1024\)/);
  ac.abort();
  assert.equal(await gone, 'aborted');
  const line = await logLine(srv, 0);
  const m = line.match(/ 499 stream .*cancelled: stopped after layer 1 of 9 of a pass of 512 ids; (\d+) ids kept/);
  assert.ok(m && Number(m[1]) === 2 * CHUNK, line);
  const usageOf = (text) => JSON.parse(text.split('\n').filter((l) => l.startsWith('data: {')).at(-1).slice(6)).usage;
  const replyOf = (text) => text.split('\n').filter((l) => l.startsWith('data: {'))
    .map((l) => JSON.parse(l.slice(6)).choices?.[0]?.delta).filter(Boolean)
    .map((d) => (d.reasoning_content ?? '') + (d.content ?? '')).join('');
  const again = await raw(srv, 'POST', '/v1/chat/completions', body, JSONH);
  assert.equal(again.status, 200, again.text);
  const usage = usageOf(again.text);
  assert.ok(usage.prompt_tokens_details.cached_tokens >= 2 * CHUNK,
    `the re-sent request reused ${usage.prompt_tokens_details.cached_tokens} ids, ${2 * CHUNK} kept`);
  const fresh = await raw(await serverPool({})(['--chunk', String(CHUNK)]), 'POST',
    '/v1/chat/completions', body, JSONH);
  assert.equal(fresh.status, 200, fresh.text);
  assert.equal(usageOf(fresh.text).prompt_tokens_details.cached_tokens, 0);
  assert.ok(replyOf(fresh.text).length > 0, fresh.text);
  assert.equal(replyOf(again.text), replyOf(fresh.text));
});
