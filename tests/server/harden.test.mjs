// harden.test.mjs — issue 20's attacks on the server: slowloris (D5), a client that
// half-closes after its request (D6), NUL inside a JSON string (D7), log injection (D8), and
// a request of many messages refused at the context without rendering them all (D1).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startServer, raw, sleep } from './harness.mjs';

let srv, port;
before(async () => {
  srv = await startServer(['--ctx', '512']);
  port = Number(new URL(srv.url).port);
});
after(async () => { await srv?.stop(); });

const JSONH = { 'Content-Type': 'application/json' };
const chat = (body) => raw(srv, 'POST', '/v1/chat/completions', JSON.stringify(body), JSONH);

// Raw HTTP/1.1 over a socket; resolves to everything the server sent until it closed.
function rawExchange(request, { halfClose }) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    let got = '';
    sock.setEncoding('latin1');
    sock.on('data', (d) => { got += d; });
    sock.on('error', reject);
    sock.on('close', () => resolve(got));
    sock.on('connect', () => {
      sock.write(request);
      if (halfClose) sock.end(); // shutdown(SHUT_WR): still reading
    });
    setTimeout(() => { sock.destroy(); resolve(got); }, 20000);
  });
}

function post(body) {
  const b = JSON.stringify(body);
  return `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n` +
    `Content-Length: ${Buffer.byteLength(b)}\r\nConnection: close\r\n\r\n${b}`;
}

test('D6: a client that half-closes after a non-streamed request gets its answer', async () => {
  const got = await rawExchange(post({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 }),
    { halfClose: true });
  const final = got.replace(/^HTTP\/1\.1 100 Continue\r\n\r\n/, '');
  assert.match(final, /^HTTP\/1\.1 200 /, got.slice(0, 300));
  assert.match(final, /"finish_reason":"(length|stop)"/);
});

test('D6: ... and a streamed one', async () => {
  const got = await rawExchange(post({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 3,
    stream: true }), { halfClose: true });
  assert.match(got, /^HTTP\/1\.1 200 /, got.slice(0, 300));
  assert.match(got, /data: \[DONE\]/, got.slice(0, 600));
});

test('D6: a client that really leaves still cancels its generation', async () => {
  // greedy: k3-nano writes 385 ids before its end of message (340 fit this --ctx 512); the
  // test build's pause of 5 ms per token (K3_TEST_TOKEN_DELAY_MS) makes that >= 1.7 s, so the
  // reply cannot end before the hang-up is seen however slow a loaded machine is (~0.2 s
  // without the pause: on 2 busy cores the whole reply sometimes beat the RST)
  // The hang-up comes once the generation runs (polled: a fixed pause could end before the
  // server read the request on a loaded machine), and the log line is polled for too.
  const slow = await startServer(['--ctx', '512'], { K3_TEST_TOKEN_DELAY_MS: '5' });
  const sock = net.connect(Number(new URL(slow.url).port), '127.0.0.1');
  await new Promise((r) => sock.on('connect', r));
  sock.write(post({ messages: [{ role: 'user', content: 'write a long story' }], max_tokens: 340,
    temperature: 0 }));
  for (const t0 = Date.now(); !(await raw(slow, 'GET', '/health')).json.generating; await sleep(5))
    assert.ok(Date.now() - t0 < 30000, 'the request never started');
  sock.destroy();
  const t0 = Date.now();
  for (;;) {
    const h = await raw(slow, 'GET', '/health');
    if (!h.json.generating) break;
    assert.ok(Date.now() - t0 < 30000, `still generating 30 s after the client left: ${h.text}`);
    await sleep(20);
  }
  for (const t1 = Date.now(); !/POST \/v1\/chat\/completions 499 .*cancelled/.test(slow.log()); await sleep(20))
    assert.ok(Date.now() - t1 < 10000, `no cancelled line in the log:\n${slow.log()}`);
  await slow.stop();
});

test('D7: \\u0000 inside a string is a 400 naming the field', async () => {
  const r = await raw(srv, 'POST', '/v1/chat/completions',
    '{"messages":[{"role":"user","content":"a\\u0000b"}],"max_tokens":1}', JSONH);
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.param, 'messages[0].content');
  assert.match(r.json.error.message, /NUL/);
  const ok = await raw(srv, 'POST', '/v1/chat/completions',
    '{"messages":[{"role":"user","content":"a\\\\u0000b"}],"max_tokens":1}', JSONH);
  assert.equal(ok.status, 200, ok.text); // an escaped backslash, then plain text
});

test('D8: control characters from a request are escaped in the log', async () => {
  const forged = 'x\nk3 serve: POST /v1/chat/completions 200 forged\u001b[2J';
  const r = await chat({ messages: [{ role: 'user', content: 'hi' }], [forged]: 1 });
  assert.equal(r.status, 400, r.text);
  // the log line comes on another pipe than the answer, maybe later: wait for it
  const escaped = /x\\x0ak3 serve: POST \/v1\/chat\/completions 200 forged\\x1b\[2J/;
  for (const t0 = Date.now(); !escaped.test(srv.log()) && Date.now() - t0 < 10000;) await sleep(20);
  const log = srv.log();
  assert.ok(!/^k3 serve: POST \/v1\/chat\/completions 200 forged/m.test(log), log);
  assert.ok(!log.includes('\u001b'), 'an escape byte reached the log');
  assert.match(log, escaped);
});

test('D1: 200k messages are refused at the context, fast, and /health answers meanwhile', async () => {
  const messages = Array.from({ length: 200000 }, () => ({ role: 'user', content: 'm' }));
  const body = JSON.stringify({ messages, max_tokens: 1 }); // ~6.8 MB, under the 8 MiB limit
  const t0 = Date.now();
  const pending = raw(srv, 'POST', '/v1/chat/completions', body, JSONH);
  await sleep(50);
  const h0 = Date.now();
  const h = await raw(srv, 'GET', '/health');
  const healthMs = Date.now() - h0;
  const r = await pending;
  const ms = Date.now() - t0;
  assert.equal(h.status, 200);
  // Bounds for a loaded 2-core machine (an ASan build too), far below the defect's: the
  // quadratic renderer held a core for minutes, and /health waited as long.
  assert.ok(healthMs < 5000, `/health took ${healthMs} ms`);
  assert.equal(r.status, 400, r.text.slice(0, 300));
  assert.equal(r.json.error.code, 'context_length_exceeded');
  assert.ok(ms < 30000, `refused after ${ms} ms`);
});

test('D5: 70 slowloris connections leave /health answering at once', async () => {
  // From another loopback address, so that the per-address limit is what keeps /health open.
  const socks = [];
  for (let i = 0; i < 70; i++) {
    const s = net.connect({ port, host: '127.0.0.1', localAddress: '127.0.0.2' });
    s.on('error', () => {});
    s.on('connect', () => s.write('GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: '));
    socks.push(s);
  }
  const drip = setInterval(() => { for (const s of socks) if (!s.destroyed) s.write('a'); }, 1000);
  try {
    await sleep(1500);
    for (let round = 0; round < 3; round++) {
      const t0 = Date.now();
      const h = await raw(srv, 'GET', '/health');
      const ms = Date.now() - t0;
      assert.equal(h.status, 200);
      // the defect locked /health out for good; 5 s is room for a loaded machine
      assert.ok(ms < 5000, `/health took ${ms} ms under slowloris`);
      const r = await chat({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 });
      assert.equal(r.status, 200, r.text);
      await sleep(1000);
    }
  } finally {
    clearInterval(drip);
    for (const s of socks) s.destroy();
  }
});
