// tools.test.mjs — tool calls through the official OpenAI client. The fixture's random weights
// never choose to call a tool, so each server here runs with K3_TEST_SCRIPTED_REPLY (a test-only
// switch, src/server/server.h): generation i emits the ids of script entry i instead of sampled
// ones. The prompt is still rendered and prefilled as usual; only sampling is replaced.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, client, k3, logMatch, MODEL_ID, MODEL } from './harness.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'k3-tools-'));
after(() => fs.rmSync(dir, { recursive: true, force: true }));

const servers = [];
after(async () => { for (const s of servers) await s.stop(); });

// A server whose generations are the given replies, in order.
async function scripted(replies) {
  const file = path.join(dir, `script${servers.length}.json`);
  fs.writeFileSync(file, JSON.stringify(replies));
  const srv = await startServer([], { K3_TEST_SCRIPTED_REPLY: file });
  servers.push(srv);
  return { srv, api: client(srv) };
}

// The model's side of the format (spec §12.4-12.5), as it generates after the prompt.
const THINK_END = '<|close|>think<|sep|><|open|>response<|sep|>';
const call = (name, index, args) =>
  `<|open|>call tool="${name}" index="${index}"<|sep|>` +
  args.map(([k, t, v]) => `<|open|>argument key="${k}" type="${t}"<|sep|>${v}<|close|>argument<|sep|>`).join('') +
  '<|close|>call<|sep|>';
const reply = (reasoning, content, calls) =>
  `${reasoning}${THINK_END}${content}<|close|>response<|sep|>` +
  (calls.length ? `<|open|>tools<|sep|>${calls.join('')}<|close|>tools<|sep|>` : '') +
  '<|close|>message<|sep|>';

const WEATHER = call('get_weather', 1, [['city', 'string', '東京 "quoted" & <b>'], ['days', 'number', '3'],
  ['opts', 'object', '{"unit": "celsius", "hourly": [true, null, 1.5]}']]);
const WEATHER_ARGS = { city: '東京 "quoted" & <b>', days: 3, opts: { unit: 'celsius', hourly: [true, null, 1.5] } };
const TIME = call('get_time', 2, [['tz', 'string', 'Asia/Tokyo']]);

const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] } } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: { tz: { type: 'string' } } } } },
];
const ask = [{ role: 'user', content: 'Weather and time in Tokyo?' }];

test('a tool call: message.tool_calls with id, type, name and JSON arguments; finish_reason tool_calls', async () => {
  const { api } = await scripted([reply('Need the weather.', '', [WEATHER])]);
  const r = await api.chat.completions.create({ model: MODEL_ID, messages: ask, tools, max_tokens: 400 });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.content, null);
  assert.equal(c.message.reasoning_content, 'Need the weather.');
  assert.equal(c.message.tool_calls.length, 1);
  const tc = c.message.tool_calls[0];
  assert.equal(tc.type, 'function');
  assert.match(tc.id, /^call_/);
  assert.equal(tc.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(tc.function.arguments), WEATHER_ARGS);
});

test('parallel calls, and parallel_tool_calls: false ends after the first', async () => {
  const script = reply('', 'Checking both.', [WEATHER, TIME]);
  const { api } = await scripted([script, script]);
  const r = await api.chat.completions.create({ model: MODEL_ID, messages: ask, tools, max_tokens: 400 });
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.content, 'Checking both.');
  assert.deepEqual(m.tool_calls.map((t) => t.function.name), ['get_weather', 'get_time']);
  assert.deepEqual(JSON.parse(m.tool_calls[1].function.arguments), { tz: 'Asia/Tokyo' });
  assert.notEqual(m.tool_calls[0].id, m.tool_calls[1].id);
  const one = await api.chat.completions.create({ model: MODEL_ID, messages: ask, tools, max_tokens: 400,
    parallel_tool_calls: false, tool_choice: 'required' });
  assert.equal(one.choices[0].finish_reason, 'tool_calls');
  assert.deepEqual(one.choices[0].message.tool_calls.map((t) => t.function.name), ['get_weather']);
});

test('streamed: delta.tool_calls (index, id, type, name first, then arguments in pieces) add up', async () => {
  const script = reply('Both.', '', [WEATHER, TIME]);
  const { api } = await scripted([script, script]);
  const stream = await api.chat.completions.create({ model: MODEL_ID, messages: ask, tools, max_tokens: 400, stream: true });
  const calls = [];
  let finish = null, reasoning = '', pieces = 0;
  for await (const ch of stream) {
    const c = ch.choices[0];
    if (!c) continue;
    if (c.finish_reason) finish = c.finish_reason;
    if (c.delta.reasoning_content) reasoning += c.delta.reasoning_content;
    for (const d of c.delta.tool_calls ?? []) {
      if (d.id) {
        assert.equal(calls.length, d.index, 'a new call has the next index');
        assert.equal(d.type, 'function');
        calls.push({ id: d.id, name: d.function.name, arguments: d.function.arguments });
      } else {
        assert.equal(d.function.name, undefined);
        calls[d.index].arguments += d.function.arguments;
        pieces++;
      }
    }
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(reasoning, 'Both.');
  assert.deepEqual(calls.map((c) => c.name), ['get_weather', 'get_time']);
  assert.deepEqual(JSON.parse(calls[0].arguments), WEATHER_ARGS);
  assert.ok(pieces >= 4, `${pieces} argument pieces`);
  // The SDK's own accumulator agrees.
  const final = await api.chat.completions.stream({ model: MODEL_ID, messages: ask, tools, max_tokens: 400 })
    .finalChatCompletion();
  const tc = final.choices[0].message.tool_calls;
  assert.deepEqual(tc.map((t) => t.function.name), ['get_weather', 'get_time']);
  assert.deepEqual(JSON.parse(tc[0].function.arguments), WEATHER_ARGS);
});

test('a malformed tools block comes back as content, finish_reason says so, the log names it', async () => {
  const bad = 'Sure.<|close|>response<|sep|><|open|>tools<|sep|>I will call get_weather now.<|close|>tools<|sep|><|close|>message<|sep|>';
  const { srv, api } = await scripted([`r${THINK_END}${bad}`, `r${THINK_END}${bad}`]);
  const r = await api.chat.completions.create({ model: MODEL_ID, messages: ask, tools, max_tokens: 400 });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'malformed_tool_call');
  assert.equal(c.message.tool_calls, undefined);
  assert.equal(c.message.content, 'Sure.I will call get_weather now.<|close|>tools<|sep|>');
  await logMatch(srv, /malformed tool call: text where a marker belongs/);
  const s = await api.chat.completions.create({ model: MODEL_ID, messages: ask, tools, max_tokens: 400, stream: true });
  let content = '', finish = null;
  for await (const ch of s) {
    if (ch.choices[0]?.delta.content) content += ch.choices[0].delta.content;
    if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
  }
  assert.equal(finish, 'malformed_tool_call');
  assert.equal(content, c.message.content);
});

test('a block cut by max_tokens: finish_reason length, the unfinished call as content', async () => {
  const { api } = await scripted([reply('', '', [WEATHER, TIME])]);
  const r = await api.chat.completions.create({ model: MODEL_ID, messages: ask, tools, max_tokens: 40 });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 40);
  assert.ok(c.message.content.startsWith('<|open|>call tool="'), c.message.content);
});

test('without tools offered a tools block is plain content', async () => {
  const { api } = await scripted([reply('', 'x', [TIME])]);
  const r = await api.chat.completions.create({ model: MODEL_ID, messages: ask, max_tokens: 400 });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].message.tool_calls, undefined);
  assert.equal(r.choices[0].message.content, 'x' + TIME);
});

test('a full round trip: the call, the tool result sent back, the answer; prompts match k3 render', async () => {
  const { api } = await scripted([reply('Need the weather.', '', [WEATHER]), reply('Got it.', 'Sunny, 21 °C.', [])]);
  const first = await api.chat.completions.create({ model: MODEL_ID, messages: ask, tools, max_tokens: 400 });
  const m = first.choices[0].message;
  const messages = [...ask, { role: 'assistant', content: m.content, reasoning_content: m.reasoning_content, tool_calls: m.tool_calls },
    { role: 'tool', tool_call_id: m.tool_calls[0].id, content: '{"temp": 21, "sky": "clear"}' }];
  const second = await api.chat.completions.create({ model: MODEL_ID, messages, tools, max_tokens: 400 });
  assert.equal(second.choices[0].finish_reason, 'stop');
  assert.equal(second.choices[0].message.content, 'Sunny, 21 °C.');
  assert.equal(second.choices[0].message.tool_calls, undefined);
  // The second prompt is what the official renderer would make of the conversation.
  const req = path.join(dir, 'roundtrip.json');
  fs.writeFileSync(req, JSON.stringify({ messages, tools }));
  const ids = k3(['render', MODEL, '--request', req, '--ids']).trim().split(',');
  assert.equal(second.usage.prompt_tokens, ids.length);
});
