// slowclient.test.mjs — a streaming client that stops reading (connected, its socket paused)
// costs only its own generation: on a --parallel 2 server its slot sits out the passes once
// its unread backlog is over the limit (1 MiB, K3_STREAM_BACKLOG_BYTES in src/server/srv.h;
// 64 KiB here through the test-only K3_TEST_STREAM_BACKLOG_BYTES), and another request runs to
// the end meanwhile with the text and logprobs it gets alone. When the stalled client goes, its
// job ends (cancelled); one that reads again gets the rest of its reply, byte for byte what an
// uninterrupted read gets.
//
// The stalled reply must outgrow the loopback socket buffers (the server's send buffer grows
// up to tcp_wmem's 4 MB; ~3 MB were taken here) plus the backlog long before it ends. The
// fixture's random weights end a reply after a few hundred tokens, so its ids are scripted
// (K3_TEST_SCRIPTED_REPLY, server.h: the ids of a long text; every generation here takes them,
// cut by its max_tokens) while its logprobs are still the model's: with top_logprobs 20 each
// token's SSE event is ~2 KB, ~7 MB for the 3600 tokens asked (A stalls after ~1600).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { startServer, client, raw, sleep, MODEL_ID } from './harness.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'k3-slow-'));
after(() => fs.rmSync(dir, { recursive: true, force: true }));
const servers = [];
after(async () => { for (const s of servers) await s.stop(); });

const WORDS = 'the fox ran over hills and rivers while a heron watched from tall reeds by the'.split(' ');
const LONG = Array.from({ length: 6000 }, (_, i) => `${WORDS[i % WORDS.length]}${i % 9 ? '' : ','}`).join(' ');
const BACKLOG = 64 << 10;
const A_MAX = 3600; // the nano fixture's context is 4096; the prompt is short

async function server() {
  const file = path.join(dir, 'script.json');
  fs.writeFileSync(file, JSON.stringify([LONG]));
  const srv = await startServer(['--parallel', '2', '--queue', '2'],
    { K3_TEST_SCRIPTED_REPLY: file, K3_TEST_STREAM_BACKLOG_BYTES: String(BACKLOG) });
  servers.push(srv);
  return srv;
}

async function metrics(srv) {
  const r = await raw(srv, 'GET', '/metrics');
  assert.equal(r.status, 200);
  const get = (name) => {
    const m = r.text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
    return m ? Number(m[1]) : undefined;
  };
  return { passes: get('k3_pass_rows_count'), active: get('k3_requests_active'),
    waiting: get('k3_streams_waiting'), peak: get('k3_stream_backlog_peak_bytes') };
}

const A_BODY = JSON.stringify({ model: MODEL_ID, stream: true, max_tokens: A_MAX, temperature: 0,
  reasoning_effort: 'none', logprobs: true, top_logprobs: 20,
  messages: [{ role: 'user', content: 'Tell a very long story.' }] });

// Client A over a raw socket: sends the streamed request, reads until the first SSE event,
// then pauses the socket (reads nothing more) unless told to read all. Resolves the socket
// with .text (what was read so far) and .ended (a promise of the whole text once it ends).
function streamA(srv, { pause = true } = {}) {
  const { hostname, port } = new URL(srv.url);
  const sock = net.connect(Number(port), hostname);
  sock.setEncoding('latin1'); // bytes as they are; the SSE is compared byte for byte
  sock.text = '';
  sock.ended = new Promise((resolve, reject) => {
    sock.on('end', () => resolve(sock.text));
    sock.on('error', reject);
  });
  return new Promise((resolve, reject) => {
    sock.on('error', reject);
    let started = false;
    sock.on('data', (d) => {
      sock.text += d;
      if (started || !/\r\n\r\n[\s\S]*data: /.test(sock.text)) return;
      started = true;
      assert.match(sock.text, /^HTTP\/1\.1 200 /);
      if (pause) sock.pause();
      resolve(sock);
    });
    sock.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: ${hostname}\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${Buffer.byteLength(A_BODY)}\r\nConnection: close\r\n\r\n${A_BODY}`);
  });
}

// The body of a chunked HTTP/1.1 response (chunk sizes depend on when the socket was read).
function dechunk(t) {
  let at = t.indexOf('\r\n\r\n') + 4, out = '';
  assert.match(t.slice(0, at), /transfer-encoding: chunked/i);
  for (;;) {
    const eol = t.indexOf('\r\n', at), n = parseInt(t.slice(at, eol), 16);
    if (!n) return out;
    out += t.slice(eol + 2, eol + 2 + n);
    at = eol + 2 + n + 2;
  }
}

// Resolves once A's generation has stopped advancing: no pass for a second while it still
// runs and its slot is counted as sitting out (k3_streams_waiting). A server whose worker
// waits for A's client instead (the defect; no such gauge, or it stays 0) qualifies after 3 s
// without a pass, so that the test goes on to show B stuck behind A there.
async function waitStalled(srv, limitMs = 20000) {
  const t0 = Date.now();
  let last = -1, since = Date.now();
  for (;;) {
    const m = await metrics(srv);
    assert.equal(m.active, 1, 'A ended before its client fell behind: make its reply longer');
    if (m.passes !== last) { last = m.passes; since = Date.now(); }
    const still = Date.now() - since;
    if ((still >= 1000 && m.waiting === 1) || still >= 3000) return m;
    if (Date.now() - t0 > limitMs) throw new Error(`A never stalled: ${JSON.stringify(m)}`);
    await sleep(50);
  }
}

// Polls /metrics until pred holds (20 s at most: a bound for a loaded machine); returns the
// metrics that satisfied it.
async function until(srv, pred, what) {
  const t0 = Date.now();
  for (;;) {
    const m = await metrics(srv);
    if (pred(m)) return m;
    if (Date.now() - t0 > 20000) assert.fail(`${what}: not within 20 s: ${JSON.stringify(m)}`);
    await sleep(20);
  }
}

// CPU seconds the server used in a second without a pass. (The kernel may still take some of
// a stalled client's bytes now and then, letting its generation run on a little: such a second
// is tried again.)
async function idleCpu(srv) {
  for (let i = 0; i < 5; i++) {
    const p0 = (await metrics(srv)).passes, c0 = cpuSeconds(srv);
    await sleep(1000);
    const c = cpuSeconds(srv) - c0;
    if ((await metrics(srv)).passes === p0) return c;
  }
  return assert.fail('no second without a pass in 5');
}

// CPU seconds the server process has used (Linux: utime + stime of /proc/PID/stat).
function cpuSeconds(srv) {
  const stat = fs.readFileSync(`/proc/${srv.proc.pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' '); // f[0] is field 3 (state)
  return (Number(f[11]) + Number(f[12])) / 100; // fields 14 and 15, in ticks of 1/100 s
}

// B: a streamed chat through the official client, with the model's logprobs of each token;
// aborted after B_LIMIT_MS (the client's own timeout covers only the wait for the headers):
// 40 tokens take well under a second; stuck behind A (the defect) B never ends.
const B_LIMIT_MS = 30000;
async function requestB(api) {
  const signal = AbortSignal.timeout(B_LIMIT_MS);
  const stream = await api.chat.completions.create({ model: MODEL_ID, stream: true, max_tokens: 40,
    temperature: 0, reasoning_effort: 'none', logprobs: true, top_logprobs: 3,
    messages: [{ role: 'user', content: 'Say something short.' }] }, { signal });
  let text = '', finish = null;
  const lp = [];
  for await (const ch of stream) {
    const c = ch.choices[0];
    if (!c) continue;
    text += c.delta?.content ?? '';
    for (const t of c.logprobs?.content ?? []) lp.push([t.token, t.logprob, t.top_logprobs.map((x) => x.token)]);
    finish = c.finish_reason ?? finish;
  }
  if (signal.aborted) throw new Error(`B did not end within ${B_LIMIT_MS} ms`); // (ends the loop quietly)
  return { text, finish, lp };
}

test('a stalled streaming client does not stop another generation; when it goes its job ends', async (t) => {
  const srv = await server();
  const api = client(srv, { timeout: 20000 });
  const alone = await requestB(api);
  assert.equal(alone.finish, 'length');
  assert.ok(alone.text.length > 40 && LONG.startsWith(alone.text), `scripted text: ${alone.text}`);
  assert.equal(alone.lp.length, 40);

  const a = await streamA(srv);
  const stalled = await waitStalled(srv);
  const idle = await idleCpu(srv); // nothing to run: the worker waits instead of spinning
  assert.ok(idle < 0.25, `the server used ${idle} s of CPU in 1 s with every generation stalled`);
  const t0 = Date.now();
  // On a worker stuck behind A (the defect) B never ends: aborted, it fails the test here.
  const b = await requestB(api).catch((e) => assert.fail(`B beside the stalled A: ${e.message}`));
  const ms = Date.now() - t0;
  assert.deepEqual(b, alone, 'B beside the stalled A differs from B alone');
  // A still holds its slot, sitting out (its client has read nothing), and its backlog stayed
  // bounded: the limit plus one token's events (each ~2 KB here).
  const m = await until(srv, (x) => x.waiting === 1, 'A sitting out after B');
  assert.equal(m.active, 1);
  assert.ok(m.passes > stalled.passes, 'B ran passes');
  assert.ok(m.peak > BACKLOG && m.peak < BACKLOG + 16384, `backlog peak ${m.peak}`);
  t.diagnostic(`A stalled after ${stalled.passes} passes (of ~${A_MAX + 40}); B took ${ms} ms beside it; ` +
    `backlog peak ${m.peak} bytes; ${idle.toFixed(2)} s CPU in 1 s stalled`);

  a.destroy(); // unread bytes in its socket: the server sees a reset
  await until(srv, (x) => x.active === 0 && x.waiting === 0, "A's job ending");
  for (let t = Date.now(); !/POST \/v1\/chat\/completions 499 stream .* cancelled/.test(srv.log()); await sleep(20))
    assert.ok(Date.now() - t < 20000, `no cancelled line in the log:\n${srv.log()}`);
  const h = await raw(srv, 'GET', '/health');
  assert.equal(h.status, 200);
  assert.deepEqual(await requestB(api), alone, 'the server after A is gone');
});

test('a stalled stream that is read again gets the rest of its reply, as if never paused', async () => {
  const srv = await server();
  const ref = await (await streamA(srv, { pause: false })).ended;
  assert.match(ref, /"finish_reason":"length"[\s\S]*data: \[DONE\]\r?\n/);
  const a = await streamA(srv);
  await waitStalled(srv);
  a.resume();
  const got = await a.ended;
  const body = (t) => dechunk(t).replace(/chatcmpl-k3[0-9a-f]+/g, 'ID').replace(/"created":\d+/g, '"created":0');
  assert.ok(ref.length > 5e6, `${ref.length} bytes: more than the socket buffers take`);
  assert.equal(body(got), body(ref));
  assert.equal((await metrics(srv)).waiting, 0);
});
