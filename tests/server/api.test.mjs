// api.test.mjs — the endpoints through the official OpenAI client: models, completions and
// chat (plain and streamed), reasoning vs content, max_tokens, stop, seed, conversation reuse,
// and greedy output equal to the CLI's for the same prompt.
//
// The fixture model has random weights: its text is gibberish and it may never end a message,
// so every generation is bounded by max_tokens.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, client, k3, raw, logMatch, MODEL, MODEL_ID } from './harness.mjs';

let srv, api;
before(async () => { srv = await startServer(); api = client(srv); });
after(async () => { await srv?.stop(); });

const user = (content) => ({ role: 'user', content });

async function collectChat(stream) {
  const r = { reasoning: '', content: '', finish: null, usage: null, roles: [], chunks: 0 };
  for await (const ch of stream) {
    r.chunks++;
    assert.equal(ch.object, 'chat.completion.chunk');
    if (ch.usage) r.usage = ch.usage;
    for (const c of ch.choices) {
      if (c.delta.role) r.roles.push(c.delta.role);
      if (c.delta.reasoning_content) r.reasoning += c.delta.reasoning_content;
      if (c.delta.content) r.content += c.delta.content;
      if (c.finish_reason) r.finish = c.finish_reason;
    }
  }
  return r;
}

async function collectText(stream) {
  const r = { text: '', finish: null, usage: null };
  for await (const ch of stream) {
    if (ch.usage) r.usage = ch.usage;
    for (const c of ch.choices) {
      r.text += c.text;
      if (c.finish_reason) r.finish = c.finish_reason;
    }
  }
  return r;
}

test('GET /v1/models lists the served model; /health and /models answer too', async () => {
  const list = await api.models.list();
  assert.deepEqual(list.data.map((m) => m.id), [MODEL_ID]);
  assert.equal(list.data[0].object, 'model');
  assert.equal((await api.models.retrieve(MODEL_ID)).id, MODEL_ID);
  const h = await raw(srv, 'GET', '/health');
  assert.equal(h.status, 200);
  assert.equal(h.json.status, 'ok');
  assert.equal((await raw(srv, 'GET', '/models')).json.data[0].id, MODEL_ID);
  assert.equal((await raw(srv, 'GET', '/v1/health')).status, 200);
});

test('completions: greedy text equals k3 run for the same prompt; usage counts tokens', async () => {
  const prompt = 'The capital of France is';
  const r = await api.completions.create({ model: MODEL_ID, prompt, max_tokens: 12, temperature: 0 });
  const cli = k3(['run', MODEL, '--prompt', prompt, '--max-new', '12', '-q']);
  assert.equal(r.choices[0].text + '\n', cli);
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].finish_reason, 'length');
  const ids = k3(['tokenize', prompt]).trim().split(',');
  assert.equal(r.usage.prompt_tokens, ids.length);
  assert.equal(r.usage.completion_tokens, 12);
  assert.equal(r.usage.total_tokens, ids.length + 12);
});

test('completions: a prompt given as token ids is the same as its text', async () => {
  const ids = k3(['tokenize', 'Hello world']).trim().split(',').map(Number);
  const a = await api.completions.create({ model: MODEL_ID, prompt: ids, max_tokens: 6, temperature: 0 });
  const b = await api.completions.create({ model: MODEL_ID, prompt: 'Hello world', max_tokens: 6, temperature: 0 });
  assert.equal(a.choices[0].text, b.choices[0].text);
});

test('completions: streamed chunks add up to the non-streamed text, with usage last', async () => {
  const body = { model: MODEL_ID, prompt: 'Once upon a time', max_tokens: 16, temperature: 0 };
  const whole = await api.completions.create(body);
  const s = await collectText(await api.completions.create({ ...body, stream: true, stream_options: { include_usage: true } }));
  assert.equal(s.text, whole.choices[0].text);
  assert.equal(s.finish, 'length');
  assert.equal(s.usage.completion_tokens, 16);
  assert.equal(s.usage.prompt_tokens, whole.usage.prompt_tokens);
});

test('completions: max_tokens defaults to 256', async () => {
  const r = await api.completions.create({ model: MODEL_ID, prompt: 'Count: 1, 2, 3', temperature: 0 });
  const n = r.usage.completion_tokens;
  assert.ok(r.choices[0].finish_reason === 'length' ? n === 256 : n < 256, `${n} ${r.choices[0].finish_reason}`);
});

// Greedy: sampled, the random-weight model ends this reply before its 3rd token about 3 times
// in 1,000 (6 of 2,000 such requests), and the usage below counts 3.
test('SSE wire format: data: lines, chunk objects, data: [DONE] last', async () => {
  const r = await raw(srv, 'POST', '/v1/chat/completions', JSON.stringify({
    messages: [user('hi')], max_tokens: 3, temperature: 0, stream: true, stream_options: { include_usage: true },
  }), { 'Content-Type': 'application/json' });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^text\/event-stream/);
  const events = r.text.split('\n\n').filter((e) => e);
  assert.equal(events.at(-1), 'data: [DONE]');
  for (const e of events.slice(0, -1)) {
    assert.ok(e.startsWith('data: '), e);
    const c = JSON.parse(e.slice(6));
    assert.equal(c.object, 'chat.completion.chunk');
    assert.ok('usage' in c, 'include_usage puts "usage" in every chunk');
  }
  const last = JSON.parse(events.at(-2).slice(6));
  assert.deepEqual(last.choices, []);
  assert.equal(last.usage.completion_tokens, 3);
});

test('chat: thinking goes to reasoning_content, plain and streamed alike', async () => {
  const body = { model: MODEL_ID, messages: [user('Why is the sky blue?')], max_tokens: 10, temperature: 0 };
  const r = await api.chat.completions.create(body);
  const m = r.choices[0].message;
  assert.equal(r.object, 'chat.completion');
  assert.equal(m.role, 'assistant');
  assert.equal(typeof m.content, 'string');
  assert.equal(typeof m.reasoning_content, 'string');
  assert.ok(m.reasoning_content.length > 0, 'the reply starts in the thinking channel');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 10);
  if (m.content === '') assert.equal(r.usage.completion_tokens_details.reasoning_tokens, 10);
  const s = await collectChat(await api.chat.completions.create({ ...body, stream: true }));
  assert.deepEqual(s.roles, ['assistant']);
  assert.equal(s.reasoning, m.reasoning_content);
  assert.equal(s.content, m.content);
  assert.equal(s.finish, 'length');
});

test('chat: with thinking off the reply is content, and reasoning_content is null', async () => {
  for (const extra of [{ thinking: false }, { reasoning_effort: 'none' },
    { chat_template_kwargs: { thinking: false } }]) {
    const r = await api.chat.completions.create({ model: MODEL_ID, messages: [user('Hello')], max_tokens: 8, temperature: 0, ...extra });
    const m = r.choices[0].message;
    assert.ok(m.content.length > 0, JSON.stringify(extra));
    assert.equal(m.reasoning_content, null);
    assert.equal(r.usage.completion_tokens_details.reasoning_tokens, 0);
  }
});

test('chat: reasoning_effort and a system/developer message reach the prompt', async () => {
  const base = { model: MODEL_ID, messages: [user('Hi')], max_tokens: 1, temperature: 0 };
  const low = await api.chat.completions.create({ ...base, reasoning_effort: 'low' });
  const max = await api.chat.completions.create({ ...base, reasoning_effort: 'max' });
  const dflt = await api.chat.completions.create(base);
  assert.deepEqual(dflt.choices[0].message, max.choices[0].message); // max is the default
  // medium is not a K3 effort (spec §12.2): it is read as high, and the log says so
  const high = await api.chat.completions.create({ ...base, reasoning_effort: 'high' });
  const medium = await api.chat.completions.create({ ...base, reasoning_effort: 'medium' });
  assert.deepEqual(medium.choices[0].message, high.choices[0].message);
  assert.equal(medium.usage.prompt_tokens, high.usage.prompt_tokens);
  await logMatch(srv, /reasoning_effort medium read as high/);
  assert.ok(low.usage.prompt_tokens > 0);
  const sys = await api.chat.completions.create({ ...base, messages: [{ role: 'system', content: 'Be brief.' }, user('Hi')] });
  const dev = await api.chat.completions.create({ ...base, messages: [{ role: 'developer', content: 'Be brief.' }, user('Hi')] });
  assert.ok(sys.usage.prompt_tokens > max.usage.prompt_tokens);
  assert.equal(dev.usage.prompt_tokens, sys.usage.prompt_tokens);
  assert.equal(dev.choices[0].message.reasoning_content, sys.choices[0].message.reasoning_content);
});

test('max_tokens / max_completion_tokens give finish_reason "length" at exactly that count', async () => {
  for (const [key, n] of [['max_tokens', 1], ['max_tokens', 7], ['max_completion_tokens', 5]]) {
    const r = await api.chat.completions.create({ model: MODEL_ID, messages: [user('Go on')], [key]: n, temperature: 0 });
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, n);
  }
});

// A stop string cut from the greedy text: the reply must end just before its first match.
function pickStop(text) {
  const cps = [...text];
  for (let i = 3; i + 2 < cps.length; i++) {
    const s = cps.slice(i, i + 2).join('');
    if (!s.includes('\uFFFD') && s.trim()) return s;
  }
  return null;
}

test('stop: the text ends before the first stop string, finish_reason "stop" (plain and streamed)', async () => {
  const body = { model: MODEL_ID, prompt: 'Lorem ipsum dolor', max_tokens: 24, temperature: 0 };
  const full = (await api.completions.create(body)).choices[0].text;
  const stop = pickStop(full);
  assert.ok(stop, `no usable stop string in ${JSON.stringify(full)}`);
  const want = full.slice(0, full.indexOf(stop));
  const r = await api.completions.create({ ...body, stop: [stop, 'never-seen-xyz'] });
  assert.equal(r.choices[0].text, want);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const s = await collectText(await api.completions.create({ ...body, stop, stream: true }));
  assert.equal(s.text, want);
  assert.equal(s.finish, 'stop');

  const cbody = { model: MODEL_ID, messages: [user('Tell me')], max_tokens: 24, temperature: 0, thinking: false };
  const cfull = (await api.chat.completions.create(cbody)).choices[0].message.content;
  const cstop = pickStop(cfull);
  const c = await api.chat.completions.create({ ...cbody, stop: cstop });
  assert.equal(c.choices[0].message.content, cfull.slice(0, cfull.indexOf(cstop)));
  assert.equal(c.choices[0].finish_reason, 'stop');
  const cs = await collectChat(await api.chat.completions.create({ ...cbody, stop: cstop, stream: true }));
  assert.equal(cs.content, c.choices[0].message.content);
});

test('seed: the same request with the same seed gives the same text; another seed differs', async () => {
  const body = { model: MODEL_ID, messages: [user('Write a poem')], max_tokens: 16, temperature: 1, top_p: 0.95, seed: 1234, thinking: false };
  const a = await api.chat.completions.create(body);
  const b = await api.chat.completions.create(body);
  const c = await api.chat.completions.create({ ...body, seed: 4321 });
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  assert.notEqual(a.choices[0].message.content, c.choices[0].message.content);
  const s = await collectChat(await api.chat.completions.create({ ...body, stream: true }));
  assert.equal(s.content, a.choices[0].message.content);
});

test('greedy chat through the server equals k3 run --chat for the same conversation', async () => {
  // k3 run --chat prints the thinking, a blank line before the answer if there is one, then
  // a newline (src/cli/gen.c); --no-think starts in the answer.
  const prompt = 'What is 2 + 2?';
  const cases = [
    { cli: [], body: {} },
    { cli: ['--no-think'], body: { thinking: false } },
    { cli: ['--system', 'Answer in French.', '--effort', 'low'],
      body: { reasoning_effort: 'low' }, system: 'Answer in French.' },
  ];
  for (const c of cases) {
    const messages = [...(c.system ? [{ role: 'system', content: c.system }] : []), user(prompt)];
    const r = await api.chat.completions.create({ model: MODEL_ID, messages, max_tokens: 24, temperature: 0, ...c.body });
    const m = r.choices[0].message;
    const cli = k3(['run', MODEL, '--chat', '--prompt', prompt, '--max-new', '24', '-q', ...c.cli]);
    const thinking = m.reasoning_content ?? '';
    const want = thinking + (thinking && m.content ? '\n\n' : '') + m.content + '\n';
    assert.equal(cli, want, JSON.stringify(c.cli));
    assert.ok((thinking + m.content).length > 0);
  }
});

async function twoTurns(api2, extra = {}) {
  const base = { model: MODEL_ID, max_tokens: 6, temperature: 0, ...extra };
  const msgs = [{ role: 'system', content: 'Be brief.' }, user('Name a colour.')];
  const t1 = await api2.chat.completions.create({ ...base, messages: msgs });
  const m1 = t1.choices[0].message;
  const reply = { role: 'assistant', content: m1.content };
  if (m1.reasoning_content !== null) reply.reasoning_content = m1.reasoning_content;
  const msgs2 = [...msgs, reply, user('Another one?')];
  const t2 = await api2.chat.completions.create({ ...base, messages: msgs2 });
  const m2 = t2.choices[0].message;
  const reply2 = { role: 'assistant', content: m2.content };
  if (m2.reasoning_content !== null) reply2.reasoning_content = m2.reasoning_content;
  const t3 = await api2.chat.completions.create({ ...base, messages: [...msgs2, reply2, user('And a third?')] });
  return [t1, t2, t3];
}

test('conversation reuse: each turn prefills only its new tokens and gives the same text', async () => {
  const plain = await startServer(['--no-reuse']);
  try {
    for (const extra of [{}, { thinking: false }]) {
      const [t1, t2, t3] = await twoTurns(api, extra);
      assert.equal(t1.usage.prompt_tokens_details.cached_tokens, 0);
      // Everything the model saw in turn 1 except its last sampled token, which was never fed.
      assert.equal(t2.usage.prompt_tokens_details.cached_tokens,
        t1.usage.prompt_tokens + t1.usage.completion_tokens - 1);
      assert.equal(t3.usage.prompt_tokens_details.cached_tokens,
        t2.usage.prompt_tokens + t2.usage.completion_tokens - 1);
      const [p1, p2, p3] = await twoTurns(client(plain), extra);
      assert.equal(p2.usage.prompt_tokens_details.cached_tokens, 0);
      for (const [a, b] of [[t1, p1], [t2, p2], [t3, p3]]) {
        assert.equal(a.usage.prompt_tokens, b.usage.prompt_tokens);
        assert.deepEqual(a.choices[0].message, b.choices[0].message);
      }
    }
  } finally {
    await plain.stop();
  }
});

test('conversation reuse: an edited history or dropped thinking starts fresh', async () => {
  const msgs = [{ role: 'system', content: 'Be brief.' }, user('Name a colour.')];
  const base = { model: MODEL_ID, max_tokens: 4, temperature: 0 };
  const turn1 = async () => (await api.chat.completions.create({ ...base, messages: msgs })).choices[0].message;
  const m1 = await turn1();
  const kept = await api.chat.completions.create({ ...base,
    messages: [...msgs, { role: 'assistant', content: m1.content, reasoning_content: m1.reasoning_content }, user('?')] });
  assert.ok(kept.usage.prompt_tokens_details.cached_tokens > 0);
  await turn1();
  const edited = await api.chat.completions.create({ ...base,
    messages: [...msgs, { role: 'assistant', content: m1.content + 'x', reasoning_content: m1.reasoning_content }, user('?')] });
  assert.equal(edited.usage.prompt_tokens_details.cached_tokens, 0);
  await turn1();
  const dropped = await api.chat.completions.create({ ...base,
    messages: [...msgs, { role: 'assistant', content: m1.content }, user('?')] });
  assert.equal(dropped.usage.prompt_tokens_details.cached_tokens, 0);
  await turn1();
  const other = await api.chat.completions.create({ ...base, messages: [user('Something else')] });
  assert.equal(other.usage.prompt_tokens_details.cached_tokens, 0);
});
