// hygiene.test.mjs — issue 32, D20: without an API key (the default) any web page the user
// opened could drive the server. A cross-site POST with Content-Type: text/plain (a "simple"
// request, sent without a preflight) started a generation, and a DNS-rebinding page (Host:
// rebind.evil.example:PORT) became same-origin and read replies, /v1/models and /metrics.
// Now the Host must name the server (--allow-host adds names), a foreign Origin is refused
// unless --allow-origin lists it, and bodies must be application/json (415). The page k3
// serves itself keeps working (its Origin is the server's own; tests/web drives it).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { serverPool } from './harness.mjs';

const server = serverPool();

// One request with exactly these headers (node:http lets Host be set); resolves {status, text}.
function send(srv, method, p, headers, body) {
  const { hostname, port } = new URL(srv.url);
  return new Promise((resolve, reject) => {
    const req = http.request({ host: hostname, port, method, path: p, headers, setHost: false }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { text += d; });
      res.on('end', () => resolve({ status: res.statusCode, text }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

const BODY = JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });

test('D20: a cross-site text/plain POST is refused (415), and a foreign Origin too (403)', async () => {
  const srv = await server([]);
  const port = new URL(srv.url).port;
  const host = `127.0.0.1:${port}`;
  const simple = await send(srv, 'POST', '/v1/chat/completions',
    { Host: host, Origin: 'http://evil.example', 'Content-Type': 'text/plain;charset=UTF-8' }, BODY);
  assert.equal(simple.status, 403, simple.text);
  assert.match(simple.text, /origin_not_allowed/);
  // the same simple request without an Origin (a non-browser tool): still not JSON
  const plain = await send(srv, 'POST', '/v1/chat/completions',
    { Host: host, 'Content-Type': 'text/plain' }, BODY);
  assert.equal(plain.status, 415, plain.text);
  const form = await send(srv, 'POST', '/v1/completions',
    { Host: host, 'Content-Type': 'application/x-www-form-urlencoded' }, '{"prompt":"a"}');
  assert.equal(form.status, 415, form.text);
  for (const p of ['/v1/models', '/metrics']) {
    const r = await send(srv, 'GET', p, { Host: host, Origin: 'https://evil.example' });
    assert.equal(r.status, 403, `${p}: ${r.text}`);
  }
  // k3's own page: its Origin is the server's; the page itself is served to anyone
  const own = await send(srv, 'POST', '/v1/chat/completions',
    { Host: host, Origin: `http://${host}`, 'Content-Type': 'application/json' }, BODY);
  assert.equal(own.status, 200, own.text);
  assert.equal((await send(srv, 'GET', '/', { Host: host, Origin: 'http://evil.example' })).status, 200);
});

test('D20: a DNS-rebinding Host is refused on every route; names can be allowed', async () => {
  const srv = await server([]);
  const port = new URL(srv.url).port;
  const evil = `rebind.evil.example:${port}`;
  for (const [m, p, body] of [['GET', '/v1/models'], ['GET', '/metrics'], ['GET', '/health'], ['GET', '/'],
    ['POST', '/v1/chat/completions', BODY]]) {
    const r = await send(srv, m, p, { Host: evil, Origin: `http://${evil}`, 'Content-Type': 'application/json' }, body);
    assert.equal(r.status, 403, `${m} ${p}: ${r.text}`);
    if (p !== '/') assert.match(r.text, /host_not_allowed/);
  }
  for (const h of [`localhost:${port}`, `127.0.0.1:${port}`, `[::1]:${port}`, 'LOCALHOST']) {
    const r = await send(srv, 'GET', '/v1/models', { Host: h });
    assert.equal(r.status, 200, `${h}: ${r.text}`);
  }
  const named = await server(['--allow-host', 'k3.lan,box', '--allow-origin', 'http://app.lan:3000']);
  const np = new URL(named.url).port;
  assert.equal((await send(named, 'GET', '/v1/models', { Host: `k3.lan:${np}` })).status, 200);
  assert.equal((await send(named, 'GET', '/v1/models', { Host: `box` })).status, 200);
  assert.equal((await send(named, 'GET', '/v1/models', { Host: `evil.lan:${np}` })).status, 403);
  const allowed = await send(named, 'POST', '/v1/chat/completions',
    { Host: `k3.lan:${np}`, Origin: 'http://app.lan:3000', 'Content-Type': 'application/json' }, BODY);
  assert.equal(allowed.status, 200, allowed.text);
  const other = await send(named, 'POST', '/v1/chat/completions',
    { Host: `k3.lan:${np}`, Origin: 'http://app.lan:3001', 'Content-Type': 'application/json' }, BODY);
  assert.equal(other.status, 403, other.text);
});
