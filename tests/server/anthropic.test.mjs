// anthropic.test.mjs — POST /v1/messages and /v1/messages/count_tokens through the official
// @anthropic-ai/sdk client: text and thinking blocks, tool_use (streamed and not), a tool_result
// round trip, stop_sequences, max_tokens, streaming events, errors in Anthropic's shape, x-api-key.
// Replies are scripted (K3_TEST_SCRIPTED_REPLY, see tools.test.mjs) so that they are known.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, k3, raw, MODEL, MODEL_ID } from './harness.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'k3-anth-'));
const servers = [];
after(async () => {
  for (const s of servers) await s.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

const KEY = 'k3-test-key';
async function scripted(replies) {
  const file = path.join(dir, `script${servers.length}.json`);
  fs.writeFileSync(file, JSON.stringify(replies));
  const srv = await startServer(['--api-key', KEY], { K3_TEST_SCRIPTED_REPLY: file });
  servers.push(srv);
  return { srv, api: new Anthropic({ baseURL: srv.url, apiKey: KEY, maxRetries: 0, timeout: 60000 }) };
}

// The model's output after the generation prompt (spec §12.4): thinking on starts in the think
// block, thinking off (Anthropic's default) in the response block.
const thought = (t, answer, tools = '') => `${t}<|close|>think<|sep|><|open|>response<|sep|>${answer}<|close|>response<|sep|>${tools}<|close|>message<|sep|>`;
const plain = (answer, tools = '') => `${answer}<|close|>response<|sep|>${tools}<|close|>message<|sep|>`;
const arg = (k, t, v) => `<|open|>argument key="${k}" type="${t}"<|sep|>${v}<|close|>argument<|sep|>`;
const block = (...calls) => `<|open|>tools<|sep|>${calls.join('')}<|close|>tools<|sep|>`;
const call = (name, i, ...args) => `<|open|>call tool="${name}" index="${i}"<|sep|>${args.join('')}<|close|>call<|sep|>`;

const tools = [{ name: 'get_weather', description: 'Weather for a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] } }];
const WEATHER = call('get_weather', 1, arg('city', 'string', 'Paris'), arg('days', 'number', '2'));
const ask = [{ role: 'user', content: 'Weather in Paris?' }];

test('text and thinking blocks; stop_reason end_turn; usage', async () => {
  const { api } = await scripted([thought('Easy one.', 'Hello there.'), plain('Hi.')]);
  const r = await api.messages.create({ model: MODEL_ID, max_tokens: 200, messages: [{ role: 'user', content: 'Hi' }],
    thinking: { type: 'enabled', budget_tokens: 2048 }, system: 'Be brief.', metadata: { user_id: 'u1' } });
  assert.equal(r.type, 'message');
  assert.equal(r.role, 'assistant');
  assert.match(r.id, /^msg_/);
  assert.deepEqual(r.content.map((b) => b.type), ['thinking', 'text']);
  assert.equal(r.content[0].thinking, 'Easy one.');
  assert.equal(r.content[1].text, 'Hello there.');
  assert.equal(r.stop_reason, 'end_turn');
  assert.equal(r.stop_sequence, null);
  assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens > 0, JSON.stringify(r.usage));
  // Thinking off by default, as in Anthropic's API.
  const p = await api.messages.create({ model: MODEL_ID, max_tokens: 200, messages: [{ role: 'user', content: 'Hi' }] });
  assert.deepEqual(p.content, [{ type: 'text', text: 'Hi.' }]);
});

test('tool_use blocks, plain and streamed; stop_reason tool_use', async () => {
  const reply = plain('Let me look.', block(WEATHER, call('get_weather', 2, arg('city', 'string', 'Lyon'))));
  const { api } = await scripted([reply, reply]);
  const r = await api.messages.create({ model: MODEL_ID, max_tokens: 300, messages: ask, tools });
  assert.equal(r.stop_reason, 'tool_use');
  assert.deepEqual(r.content.map((b) => b.type), ['text', 'tool_use', 'tool_use']);
  assert.equal(r.content[0].text, 'Let me look.');
  assert.equal(r.content[1].name, 'get_weather');
  assert.deepEqual(r.content[1].input, { city: 'Paris', days: 2 });
  assert.deepEqual(r.content[2].input, { city: 'Lyon' });
  assert.match(r.content[1].id, /^toolu_/);
  const events = [];
  const stream = api.messages.stream({ model: MODEL_ID, max_tokens: 300, messages: ask, tools });
  stream.on('streamEvent', (e) => events.push(e.type === 'content_block_delta' ? e.delta.type : e.type));
  const m = await stream.finalMessage();
  assert.equal(m.stop_reason, 'tool_use');
  assert.deepEqual(m.content.map((b) => b.type), ['text', 'tool_use', 'tool_use']);
  assert.deepEqual(m.content[1].input, { city: 'Paris', days: 2 });
  assert.equal(events[0], 'message_start');
  assert.ok(events.includes('input_json_delta') && events.includes('text_delta'), events.join());
  assert.deepEqual(events.slice(-2), ['message_delta', 'message_stop']);
});

test('a tool_result round trip; the prompt is the equivalent chat request; count_tokens agrees', async () => {
  const { api } = await scripted([plain('', block(WEATHER)), plain('Sunny in Paris.')]);
  const first = await api.messages.create({ model: MODEL_ID, max_tokens: 300, messages: ask, tools });
  const use = first.content.find((b) => b.type === 'tool_use');
  const messages = [...ask, { role: 'assistant', content: first.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: [{ type: 'text', text: '22 C, clear' }] },
      { type: 'text', text: 'Thanks!' }] }];
  const second = await api.messages.create({ model: MODEL_ID, max_tokens: 300, messages, tools });
  assert.equal(second.stop_reason, 'end_turn');
  assert.deepEqual(second.content, [{ type: 'text', text: 'Sunny in Paris.' }]);
  const counted = await api.messages.countTokens({ model: MODEL_ID, messages, tools });
  assert.equal(counted.input_tokens, second.usage.input_tokens + second.usage.cache_read_input_tokens);
  // The same conversation as an OpenAI chat body, written by hand, renders to as many ids.
  const chat = { reasoning_effort: 'none', tools: [{ type: 'function', function: { name: 'get_weather',
    description: 'Weather for a city', parameters: tools[0].input_schema } }],
  messages: [...ask, { role: 'assistant', content: '', tool_calls: [{ id: use.id, type: 'function',
    function: { name: 'get_weather', arguments: '{"city": "Paris", "days": 2}' } }] },
  { role: 'tool', tool_call_id: use.id, content: '22 C, clear' }, { role: 'user', content: 'Thanks!' }] };
  const req = path.join(dir, 'chat.json');
  fs.writeFileSync(req, JSON.stringify(chat));
  assert.equal(counted.input_tokens, k3(['render', MODEL, '--request', req, '--ids']).trim().split(',').length);
});

test('stop_sequences and max_tokens', async () => {
  const { api } = await scripted([plain('Hello. STOP more text'), plain('a b c d e f g h i j k l m n o p')]);
  const r = await api.messages.create({ model: MODEL_ID, max_tokens: 100, messages: ask, stop_sequences: ['STOP'] });
  assert.equal(r.stop_reason, 'stop_sequence');
  assert.equal(r.stop_sequence, 'STOP');
  assert.deepEqual(r.content, [{ type: 'text', text: 'Hello. ' }]);
  const cut = await api.messages.create({ model: MODEL_ID, max_tokens: 3, messages: ask, temperature: 0.5, top_p: 0.9, top_k: 5 });
  assert.equal(cut.stop_reason, 'max_tokens');
  assert.equal(cut.usage.output_tokens, 3);
});

test('errors in Anthropic\'s shape: unsupported fields named, x-api-key checked', async () => {
  const { srv, api } = await scripted([plain('x')]);
  const cases = [
    [{ container: 'c' }, 'container'],
    [{ tool_choice: { type: 'tool', name: 'get_weather' }, tools }, 'tool_choice'],
    [{ tools: [{ type: 'web_search_20250305', name: 'web_search' }] }, 'tools[0].type'],
    [{ messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }] },
      'messages[0].content[0].type'],
    [{ messages: [...ask, { role: 'assistant', content: 'Prefill' }] }, 'messages[1]'],
    [{ thinking: { type: 'enabled', budget_tokens: 10 } }, 'thinking.budget_tokens'],
    [{ stop_sequences: ['a', 'b', 'c', 'd', 'e'] }, 'stop_sequences'],
  ];
  for (const [extra, param] of cases) {
    await assert.rejects(api.messages.create({ model: MODEL_ID, max_tokens: 10, messages: ask, ...extra }), (e) => {
      assert.ok(e instanceof Anthropic.BadRequestError, String(e));
      assert.equal(e.error.type, 'error');
      assert.equal(e.error.error.type, 'invalid_request_error');
      assert.ok(e.error.error.message.includes(param), `${param}: ${e.error.error.message}`);
      return true;
    });
  }
  const noMax = await raw(srv, 'POST', '/v1/messages', JSON.stringify({ model: MODEL_ID, messages: ask }), { 'x-api-key': KEY });
  assert.equal(noMax.status, 400);
  assert.match(noMax.json.error.message, /max_tokens/);
  const bad = new Anthropic({ baseURL: srv.url, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.messages.create({ model: MODEL_ID, max_tokens: 5, messages: ask }),
    (e) => e instanceof Anthropic.AuthenticationError && e.error.error.type === 'authentication_error');
  const bearer = await raw(srv, 'POST', '/v1/messages/count_tokens', JSON.stringify({ model: MODEL_ID, messages: ask }),
    { Authorization: `Bearer ${KEY}` });
  assert.equal(bearer.status, 200);
  assert.ok(bearer.json.input_tokens > 0);
});

// Greedy: sampled at temperature 1 the random-weight model sometimes ends its message on the
// first token (about 1 request in 2,000), which leaves no content block to check.
test('the random-weight model streams a well-formed event sequence', async () => {
  const srv = await startServer(['--api-key', KEY]);
  servers.push(srv);
  const res = await fetch(`${srv.url}/v1/messages`, { method: 'POST', headers: { 'x-api-key': KEY, 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL_ID, max_tokens: 12, temperature: 0, stream: true, messages: ask, thinking: { type: 'enabled', budget_tokens: 1024 } }) });
  const text = await res.text();
  const names = [...text.matchAll(/^event: (\S+)$/gm)].map((m) => m[1]);
  assert.deepEqual(names.slice(0, 3), ['message_start', 'ping', 'content_block_start']);
  assert.deepEqual(names.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
  const delta = JSON.parse(text.match(/^event: message_delta\ndata: (.*)$/m)[1]);
  assert.equal(delta.delta.stop_reason, 'max_tokens');
  assert.equal(delta.usage.output_tokens, 12);
  assert.ok(!text.includes('[DONE]'));
});
