// metrics.test.mjs — GET /metrics: Prometheus text exposition (format 0.0.4) that a small
// parser written here (independent of the server's code) accepts line by line, with values
// that move by exactly what a known request did (its usage object says how many tokens).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { serverPool, client, raw, sleep, MODEL_ID } from './harness.mjs';

const server = serverPool();

// Parses the exposition: every line is a comment (# HELP / # TYPE name type) or a sample
// `name{label="value",...} number`. Returns {types, samples: Map(key -> value)} where key is
// name plus its labels sorted, e.g. 'k3_requests_total{code="200",endpoint="/health"}'.
// Throws on any line that is neither.
function parseProm(text) {
  assert.ok(text.endsWith('\n'), 'the exposition ends with a newline');
  const types = new Map();
  const samples = new Map();
  const name = '[a-zA-Z_:][a-zA-Z0-9_:]*';
  const sampleRe = new RegExp(`^(${name})(?:\\{(.*)\\})? (\\S+)$`);
  const labelRe = /^([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(?:,|$)/;
  for (const line of text.slice(0, -1).split('\n')) {
    if (line.startsWith('#')) {
      const m = line.match(new RegExp(`^# (HELP|TYPE) (${name}) (.*)$`));
      assert.ok(m, `bad comment line: ${line}`);
      if (m[1] === 'TYPE') {
        assert.ok(['counter', 'gauge', 'histogram', 'summary', 'untyped'].includes(m[3]), line);
        assert.ok(!types.has(m[2]), `TYPE given twice for ${m[2]}`);
        types.set(m[2], m[3]);
      }
      continue;
    }
    const m = line.match(sampleRe);
    assert.ok(m, `bad sample line: ${JSON.stringify(line)}`);
    const labels = [];
    let rest = m[2] ?? '';
    while (rest.length) {
      const l = rest.match(labelRe);
      assert.ok(l, `bad labels in: ${line}`);
      labels.push(`${l[1]}="${l[2]}"`);
      rest = rest.slice(l[0].length);
    }
    let v;
    if (m[3] === 'NaN') v = NaN;
    else if (m[3] === '+Inf') v = Infinity;
    else if (m[3] === '-Inf') v = -Infinity;
    else {
      assert.match(m[3], /^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$/, `bad value in: ${line}`);
      v = Number(m[3]);
    }
    const key = labels.length ? `${m[1]}{${labels.sort().join(',')}}` : m[1];
    assert.ok(!samples.has(key), `sample given twice: ${key}`);
    // every sample belongs to a declared family (histograms: _bucket, _sum, _count)
    const family = m[1].replace(/_(bucket|sum|count)$/, '');
    assert.ok(types.has(m[1]) || types.get(family) === 'histogram', `no TYPE for ${m[1]}`);
    samples.set(key, v);
  }
  return { types, samples };
}

async function scrape(srv, headers = {}) {
  const r = await raw(srv, 'GET', '/metrics', undefined, headers);
  assert.equal(r.status, 200, r.text);
  assert.match(r.headers.get('content-type'), /^text\/plain; version=0\.0\.4/);
  return parseProm(r.text);
}

const get = (m, key) => m.samples.get(key) ?? 0;
const req = (endpoint, code) => `k3_requests_total{code="${code}",endpoint="${endpoint}"}`;

test('the parser refuses what is not the exposition format', () => {
  assert.throws(() => parseProm('k3_x 1'));                       // no final newline
  assert.throws(() => parseProm('k3_x one\n'));                   // not a number
  assert.throws(() => parseProm('# TYPE k3_x counter\nk3_x{a=b} 1\n')); // unquoted label
  assert.throws(() => parseProm('k3_x 1\n'));                     // no TYPE
  const ok = parseProm('# HELP k3_x h\n# TYPE k3_x counter\nk3_x{b="2",a="1"} 3\n');
  assert.equal(ok.samples.get('k3_x{a="1",b="2"}'), 3);
});

test('GET /metrics parses, and counters move by exactly one known request', async () => {
  const srv = await server([]);
  const api = client(srv);
  const m0 = await scrape(srv);
  assert.equal(m0.types.get('k3_requests_total'), 'counter');
  assert.equal(m0.types.get('k3_pass_rows'), 'histogram');
  assert.equal(get(m0, 'k3_requests_active'), 0);
  assert.equal(get(m0, 'k3_parallel_slots'), 1);
  assert.ok(Number.isNaN(m0.samples.get('k3_expert_hit_rate')), 'no expert asked yet');

  const r = await api.completions.create({ model: MODEL_ID, prompt: 'In the beginning', max_tokens: 6, temperature: 0 });
  const u = r.usage;
  assert.equal(u.completion_tokens, 6);
  const m1 = await scrape(srv);
  assert.equal(get(m1, req('/v1/completions', 200)) - get(m0, req('/v1/completions', 200)), 1);
  assert.equal(get(m1, req('/metrics', 200)) - get(m0, req('/metrics', 200)), 1, 'the first scrape');
  assert.equal(get(m1, 'k3_completion_tokens_total') - get(m0, 'k3_completion_tokens_total'), u.completion_tokens);
  const cached = u.prompt_tokens_details.cached_tokens;
  assert.equal(get(m1, 'k3_prompt_tokens_total') - get(m0, 'k3_prompt_tokens_total'), u.prompt_tokens - cached);
  assert.equal(get(m1, 'k3_cached_prompt_tokens_total') - get(m0, 'k3_cached_prompt_tokens_total'), cached);
  assert.equal(get(m1, 'k3_state_cache_misses_total'), 1);
  // one prefill pass of the whole prompt (it fits one chunk), then one decode pass per
  // generated token but the last (it is never fed)
  assert.equal(get(m1, 'k3_pass_rows_count'), 1 + (u.completion_tokens - 1));
  assert.equal(get(m1, 'k3_pass_rows_sum'), u.prompt_tokens + (u.completion_tokens - 1));
  assert.equal(get(m1, 'k3_pass_rows_bucket{le="1"}'), u.completion_tokens - 1);
  assert.equal(get(m1, 'k3_pass_rows_bucket{le="+Inf"}'), get(m1, 'k3_pass_rows_count'));
  // the expert store was asked for experts: hits + misses account for every request
  const asked = get(m1, 'k3_expert_requests_total');
  assert.ok(asked > 0);
  assert.equal(get(m1, 'k3_expert_hits_total') + get(m1, 'k3_expert_misses_total'), asked);
  assert.ok(Math.abs(get(m1, 'k3_expert_hit_rate') - get(m1, 'k3_expert_hits_total') / asked) < 1e-6);
  assert.ok(get(m1, 'k3_expert_read_bytes_total') > 0, 'the fixture reads its experts through the cache');

  // the same prompt again, longer: its first prompt is reused from the kept state
  const r2 = await api.completions.create({ model: MODEL_ID, prompt: 'In the beginning God', max_tokens: 2, temperature: 0 });
  const m2 = await scrape(srv);
  assert.equal(get(m2, 'k3_state_cache_hits_total') - get(m1, 'k3_state_cache_hits_total'),
    r2.usage.prompt_tokens_details.cached_tokens > 0 ? 1 : 0);
  assert.equal(get(m2, 'k3_cached_prompt_tokens_total') - get(m1, 'k3_cached_prompt_tokens_total'),
    r2.usage.prompt_tokens_details.cached_tokens);

  // a bad request and an unknown URL are counted under their status; URLs do not grow labels
  await raw(srv, 'POST', '/v1/completions', '{"prompt": 1}');
  await raw(srv, 'GET', '/no/such/path');
  await raw(srv, 'GET', '/health');
  const m3 = await scrape(srv);
  assert.equal(get(m3, req('/v1/completions', 400)), 1);
  assert.equal(get(m3, req('other', 404)), 1);
  assert.equal(get(m3, req('/health', 200)) - get(m2, req('/health', 200)), 1);
  for (const k of m3.samples.keys()) assert.ok(!k.includes('/no/such'), k);
});

test('with --api-key, /metrics needs the key like the API (/health does not)', async () => {
  const srv = await server(['--api-key', 'sesame']);
  const r = await raw(srv, 'GET', '/metrics');
  assert.equal(r.status, 401);
  assert.equal((await raw(srv, 'GET', '/health')).status, 200);
  const m = await scrape(srv, { Authorization: 'Bearer sesame' });
  assert.equal(get(m, req('/metrics', 401)), 1);
});

// issue 32, D16: a stream whose client hung up (here before its first token) was counted as
// code="200", like a served one. It is code="499" now (nginx's "client closed request"), and
// so is a non-streamed one whose client left; served and abandoned are told apart.
test('D16: requests whose client left are counted as 499, not 200', async () => {
  const srv = await serverPool({ K3_TEST_TOKEN_DELAY_MS: '50' })(['--ctx', '512']);
  const { hostname, port } = new URL(srv.url);
  for (const stream of [true, false]) {
    // greedy: k3-nano's reply runs to max_tokens (sampled, it may end before the hang-up)
    const body = JSON.stringify({ messages: [{ role: 'user', content: 'a long story' }], max_tokens: 300,
      temperature: 0, stream });
    const sock = net.connect(Number(port), hostname);
    sock.on('error', () => {});
    await new Promise((r) => sock.on('connect', r));
    sock.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: ${hostname}:${port}\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    for (let t0 = Date.now(); !(await raw(srv, 'GET', '/health')).json.generating;) {
      assert.ok(Date.now() - t0 < 30000, 'never started');
      await sleep(10);
    }
    sock.destroy();
    for (let t0 = Date.now(); (await raw(srv, 'GET', '/health')).json.generating;) {
      assert.ok(Date.now() - t0 < 30000, 'still generating');
      await sleep(10);
    }
  }
  // the request is counted when its job is filed: poll rather than guess how long that takes
  let m;
  for (const t0 = Date.now(); get(m = await scrape(srv), req('/v1/chat/completions', 499)) < 2 &&
    Date.now() - t0 < 30000;) await sleep(20);
  assert.equal(get(m, req('/v1/chat/completions', 499)), 2, [...m.samples.keys()].join('\n'));
  assert.equal(m.samples.get(req('/v1/chat/completions', 200)), undefined, 'an abandoned request counted as served');
});
