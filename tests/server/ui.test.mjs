// ui.test.mjs — the chat page's routes (GET /, /ui, /ui/FILE: the files of src/server/ui/
// byte for byte, served without the API key, which the API still needs), the figures /health
// adds for the page's status panel, and the warning for a --host that is not loopback.
// The page itself is tested in a browser by tests/web (make test-web).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { startServer, client, raw, ROOT, sleep } from './harness.mjs';

const UI = path.join(ROOT, 'src', 'server', 'ui');
let srv;
before(async () => { srv = await startServer(['--api-key', 'sekret']); });
after(async () => { await srv?.stop(); });

test('/, /ui and /ui/FILE serve the embedded page, without the API key', async () => {
  const html = fs.readFileSync(path.join(UI, 'index.html'), 'utf8');
  for (const p of ['/', '/ui', '/ui/', '/ui/index.html']) {
    const r = await raw(srv, 'GET', p);
    assert.equal(r.status, 200, p);
    assert.equal(r.headers.get('content-type'), 'text/html; charset=utf-8');
    assert.match(r.headers.get('content-security-policy'), /script-src 'self';/);
    assert.equal(r.headers.get('x-content-type-options'), 'nosniff');
    assert.equal(r.text, html, p);
  }
  for (const [f, type] of [['ui.js', 'text/javascript'], ['ui.css', 'text/css']]) {
    const r = await raw(srv, 'GET', `/ui/${f}`);
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('content-type'), `${type}; charset=utf-8`);
    assert.equal(r.text, fs.readFileSync(path.join(UI, f), 'utf8'));
  }
  // Each script and style the page names is one of these files: nothing from outside.
  for (const m of html.matchAll(/(?:src|href)="([^"]+)"/g)) assert.match(m[1], /^\/ui\/ui\.(js|css)$/);
});

test('the API still needs the key; unknown page files are 404, other methods 405', async () => {
  assert.equal((await raw(srv, 'GET', '/v1/models')).status, 401);
  assert.equal((await raw(srv, 'GET', '/ui/secret.txt')).status, 404);
  assert.equal((await raw(srv, 'GET', '/ui/ui.js/x')).status, 404);
  assert.equal((await raw(srv, 'GET', '/uix')).status, 404);
  const r = await raw(srv, 'POST', '/', '{}');
  assert.equal(r.status, 405);
  assert.equal(r.headers.get('allow'), 'GET');
});

test('/health: the memory plan, then the last generation as usage reported it', async () => {
  const h0 = (await raw(srv, 'GET', '/health')).json;
  assert.equal(h0.status, 'ok');
  assert.match(h0.memory_plan, /^memory plan: /);
  assert.match(h0.device, /^device: /);
  assert.equal(h0.context_tokens, 4096);
  assert.equal(h0.last_generation, null);
  assert.equal(h0.expert_hit_rate, null);
  const api = client(srv, { apiKey: 'sekret' });
  const r = await api.chat.completions.create({
    model: 'k3-nano', messages: [{ role: 'user', content: 'hi' }], max_tokens: 12, seed: 5,
  });
  // the worker files the figures right after the reply: wait for them rather than guess how long
  let h = (await raw(srv, 'GET', '/health')).json;
  for (const t0 = Date.now(); h.generations === h0.generations && Date.now() - t0 < 10000; await sleep(10))
    h = (await raw(srv, 'GET', '/health')).json;
  const g = h.last_generation;
  assert.equal(g.completion_tokens, r.usage.completion_tokens);
  assert.equal(g.completion_tokens, 12);
  assert.equal(g.prompt_tokens, r.usage.prompt_tokens);
  assert.equal(g.cached_tokens, r.usage.prompt_tokens_details.cached_tokens);
  assert.ok(g.prefill_s > 0 && g.decode_s > 0, JSON.stringify(g));
  // 11 tokens after the first in decode_s seconds (status.c); decode_s is printed to 1 ms.
  assert.ok(g.tokens_per_s >= 11 / (g.decode_s + 0.0005) - 0.005 &&
            g.tokens_per_s <= 11 / (g.decode_s - 0.0005) + 0.005, JSON.stringify(g));
  assert.ok(g.gb_per_token >= 0);
  assert.ok(h.expert_requests > 0);
  assert.ok(h.expert_hit_rate >= 0 && h.expert_hit_rate <= 1);
  assert.equal(h.generations, h0.generations + 1);
});

// Everything the server wrote to stderr: the warning follows the URL line, before the server
// waits for a signal, and stop() returns once stderr is read to its end.
async function stderrOf(args) {
  const s = await startServer(args);
  await s.stop();
  return s.log();
}

test('a --host that is not loopback warns that the page and API are exposed', async () => {
  const open = await stderrOf(['--host', '0.0.0.0', '--max-tokens', '1']);
  assert.match(open, /warning: --host 0\.0\.0\.0 is not a loopback address: the chat page \(http:\/\/0\.0\.0\.0:\d+\/\) and the API are open to other machines; .*set --api-key KEY/);
  const keyed = await stderrOf(['--host', '0.0.0.0', '--max-tokens', '1', '--api-key', 'k']);
  assert.match(keyed, /is not a loopback address/);
  assert.doesNotMatch(keyed, /set --api-key/);
  for (const host of ['127.0.0.1', '127.0.0.2', 'localhost']) {
    assert.doesNotMatch(await stderrOf(['--host', host]), /warning/, host);
  }
});
