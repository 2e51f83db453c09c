// agents.test.mjs — what coding agents send and need (issue 29), through the official SDKs:
// POST /v1/responses with the openai client (responses.create, responses.stream: text,
// reasoning, function and custom tools, input items, previous_response_id, errors), the
// Anthropic request Claude Code sends (hints accepted, the billing line dropped, system-role
// messages, tool_reference in tool results), --max-tokens cutting instead of refusing, a
// stream's first event and keep-alives while it waits, and /v1/models' limits.
// Replies are scripted (K3_TEST_SCRIPTED_REPLY, see tools.test.mjs) so that they are known.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { startServer, client, raw, logMatch, MODEL_ID } from './harness.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'k3-agents-'));
const servers = [];
after(async () => {
  for (const s of servers) await s.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

async function scripted(replies, args = [], env = {}) {
  const file = path.join(dir, `script${servers.length}.json`);
  fs.writeFileSync(file, JSON.stringify(replies));
  const srv = await startServer(args, { K3_TEST_SCRIPTED_REPLY: file, ...env });
  servers.push(srv);
  return { srv, api: client(srv),
    anth: new Anthropic({ baseURL: srv.url, apiKey: 'unused', maxRetries: 0, timeout: 60000 }) };
}

const plain = (answer) => `${answer}<|close|>response<|sep|><|close|>message<|sep|>`; // thinking off
const thought = (t, answer, tools = '') => `${t}<|close|>think<|sep|><|open|>response<|sep|>${answer}<|close|>response<|sep|>${tools}<|close|>message<|sep|>`;
const arg = (k, t, v) => `<|open|>argument key="${k}" type="${t}"<|sep|>${v}<|close|>argument<|sep|>`;
const block = (...calls) => `<|open|>tools<|sep|>${calls.join('')}<|close|>tools<|sep|>`;
const call = (name, i, ...args) => `<|open|>call tool="${name}" index="${i}"<|sep|>${args.join('')}<|close|>call<|sep|>`;

const PATCH = '*** Begin Patch\n*** Add File: a.txt\n+hi "there"\n*** End Patch';
const tools = [
  { type: 'function', name: 'get_weather', description: 'Weather for a city', strict: false,
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } },
  { type: 'custom', name: 'apply_patch', description: 'Apply a patch',
    format: { type: 'grammar', syntax: 'lark', definition: 'start: "*** Begin Patch" /(.|\\n)*/' } },
  { type: 'web_search' }, // hosted: not offered to the model, not refused (Codex sends it)
];
const CALLS = thought('Two tools.', '', block(call('get_weather', 1, arg('city', 'string', 'Paris')),
  call('apply_patch', 2, arg('input', 'string', PATCH))));

test('responses.create: reasoning and message items, output_text, usage', async () => {
  const { api } = await scripted([thought('Think.', 'Hello there.')]);
  const r = await api.responses.create({ model: MODEL_ID, input: 'Hi', instructions: 'Be brief.',
    max_output_tokens: 100, reasoning: { effort: 'medium', summary: 'auto' }, store: false,
    include: ['reasoning.encrypted_content'], prompt_cache_key: 'k', metadata: { a: 'b' } });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.equal(r.status, 'completed');
  assert.equal(r.output_text, 'Hello there.');
  assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'message']);
  assert.equal(r.output[0].content[0].text, 'Think.');
  assert.equal(r.output[1].content[0].type, 'output_text');
  assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.equal(r.instructions, 'Be brief.');
});

test('function and custom tools: function_call with JSON arguments, custom_tool_call with the raw input', async () => {
  const { api } = await scripted([CALLS, CALLS]);
  const check = (r) => {
    const fc = r.output.find((o) => o.type === 'function_call');
    const cc = r.output.find((o) => o.type === 'custom_tool_call');
    assert.equal(fc.name, 'get_weather');
    assert.deepEqual(JSON.parse(fc.arguments), { city: 'Paris' });
    assert.match(fc.call_id, /^call_/);
    assert.equal(cc.name, 'apply_patch');
    assert.equal(cc.input, PATCH);
    assert.notEqual(fc.call_id, cc.call_id);
  };
  const body = { model: MODEL_ID, input: [{ role: 'user', content: 'Weather, then patch' }], tools,
    tool_choice: 'auto', parallel_tool_calls: true, max_output_tokens: 400 };
  check(await api.responses.create(body));
  // the same through responses.stream: the SDK rebuilds the Response from the events
  const stream = api.responses.stream(body);
  const types = [];
  const seqs = [];
  for await (const ev of stream) { types.push(ev.type); seqs.push(ev.sequence_number); }
  const fin = await stream.finalResponse();
  check(fin);
  assert.equal(types[0], 'response.created');
  assert.equal(types[1], 'response.in_progress');
  assert.equal(types.at(-1), 'response.completed');
  assert.deepEqual(seqs, seqs.map((_, i) => i), 'sequence numbers 0, 1, 2, ...');
  for (const t of ['response.output_item.added', 'response.reasoning_text.delta',
    'response.function_call_arguments.delta', 'response.function_call_arguments.done',
    'response.custom_tool_call_input.delta', 'response.custom_tool_call_input.done',
    'response.output_item.done'])
    assert.ok(types.includes(t), `${t} in ${types.join(' ')}`);
});

test('input items round trip: reasoning, calls and their outputs; previous_response_id reuses the state', async () => {
  const { api } = await scripted([CALLS, thought('Done.', 'Sunny; patched.'), thought('Ok.', 'Bye.')]);
  const first = await api.responses.create({ model: MODEL_ID, input: 'Weather, then patch', tools, max_output_tokens: 400 });
  const fc = first.output.find((o) => o.type === 'function_call');
  const cc = first.output.find((o) => o.type === 'custom_tool_call');
  // stateless (what Codex does): the whole conversation as items, our output verbatim
  const second = await api.responses.create({ model: MODEL_ID, tools, max_output_tokens: 400, input: [
    { role: 'user', content: 'Weather, then patch' }, ...first.output,
    { type: 'function_call_output', call_id: fc.call_id, output: 'sunny' },
    { type: 'custom_tool_call_output', call_id: cc.call_id, output: 'Done!' }] });
  assert.equal(second.output_text, 'Sunny; patched.');
  assert.ok(second.usage.input_tokens_details.cached_tokens > 0, 'the state of the first turn was reused');
  // stored: only the new items, after previous_response_id
  const third = await api.responses.create({ model: MODEL_ID, previous_response_id: second.id,
    input: [{ role: 'user', content: 'Thanks' }], tools, max_output_tokens: 400 });
  assert.equal(third.output_text, 'Bye.');
  assert.ok(third.usage.input_tokens_details.cached_tokens > second.usage.input_tokens_details.cached_tokens,
    `previous_response_id rebuilt the same conversation (cached ${third.usage.input_tokens_details.cached_tokens})`);
});

test('Responses errors: unknown previous_response_id, JSON output, background, images', async () => {
  const { api } = await scripted([thought('x', 'y')]);
  const fails = async (body, param, code) => assert.rejects(api.responses.create({ model: MODEL_ID, ...body }),
    (e) => e instanceof OpenAI.APIError && e.status === 400 && e.param === param && (!code || e.code === code));
  await fails({ input: 'a', previous_response_id: 'resp_nope' }, 'previous_response_id', 'previous_response_not_found');
  await fails({ input: 'a', text: { format: { type: 'json_object' } } }, 'text.format');
  await fails({ input: 'a', background: true }, 'background');
  await fails({ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'data:,' }] }] }, 'input[0].content[0].type');
  await fails({ input: 'a', frequency_penalty: 1 }, 'frequency_penalty');
});

// What Claude Code 2.1 sends (captured), trimmed: every field of it is accepted.
const claudeBody = (billing, extra = {}) => ({
  model: MODEL_ID, max_tokens: 32000, stream: false,
  system: [{ type: 'text', text: `x-anthropic-billing-header: cc_version=2.1.332.1c9; cc_entrypoint=sdk-cli; cch=${billing};` },
    { type: 'text', text: 'You are a test agent.', cache_control: { type: 'ephemeral' } }],
  messages: [{ role: 'user', content: [{ type: 'text', text: 'Hi', cache_control: { type: 'ephemeral' } }] },
    { role: 'system', content: [{ type: 'text', text: '# Environment\nPlatform: linux' }] }],
  tools: [{ name: 'Write', description: 'Write a file', input_schema: { type: 'object', properties: { file_path: { type: 'string' } } } },
    { name: 'Later', description: 'Deferred', input_schema: { type: 'object' }, defer_loading: true }],
  metadata: { user_id: '{"device_id":"d"}' }, thinking: { type: 'adaptive', display: 'omitted' },
  context_management: { edits: [{ type: 'clear_thinking_20251015', keep: 'all' }] },
  output_config: { effort: 'high' }, ...extra,
});

test("Claude Code's request: hints accepted, thinking adaptive is on, max_tokens cut to --max-tokens", async () => {
  const { srv } = await scripted([thought('Hmm.', 'Hello.')], ['--max-tokens', '64']);
  const r = await raw(srv, 'POST', '/v1/messages?beta=true', JSON.stringify(claudeBody('aaaa')), {
    'content-type': 'application/json', 'anthropic-version': '2023-06-01',
    'anthropic-beta': 'claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27' });
  assert.equal(r.status, 200, r.text);
  assert.deepEqual(r.json.content.map((c) => c.type), ['thinking', 'text']);
  assert.equal(r.json.content[1].text, 'Hello.');
  await logMatch(srv, /max_tokens 32000 cut to --max-tokens 64/);
  // a reply longer than the ceiling stops there and says so
  const long = await scripted([thought('a b c d e f g h i j k l m n o p q r s t u v w x y z '.repeat(8), 'x')], ['--max-tokens', '20']);
  const l = (await raw(long.srv, 'POST', '/v1/messages', JSON.stringify(claudeBody('b')))).json;
  assert.equal(l.stop_reason, 'max_tokens');
  assert.equal(l.usage.output_tokens, 20);
  // semantics k3 cannot honour are still refused by name
  const bad = await raw(srv, 'POST', '/v1/messages', JSON.stringify(claudeBody('c', { output_config: { format: { type: 'json_schema' } } })));
  assert.equal(bad.status, 400);
  assert.match(bad.json.error.message, /output_config\.format/);
});

test('the billing line is dropped: requests differing only in it are the same prompt', async () => {
  const { srv } = await scripted([thought('x', 'y')]);
  const count = async (billing) => (await raw(srv, 'POST', '/v1/messages/count_tokens', JSON.stringify(
    (({ max_tokens, stream, metadata, ...b }) => b)(claudeBody(billing))))).json.input_tokens;
  const a = await count('1111'), b = await count('2222222222');
  assert.ok(a > 0);
  assert.equal(a, b);
  const body = claudeBody('x');
  body.system = body.system.slice(1);
  assert.equal(await count('1111'), (await raw(srv, 'POST', '/v1/messages/count_tokens', JSON.stringify(
    (({ max_tokens, stream, metadata, ...b }) => b)(body)))).json.input_tokens, 'as if it were not there');
});

test('tool results with tool_reference, images and unknown blocks are text, never a 400', async () => {
  const { anth } = await scripted([plain('Fine.')]);
  const r = await anth.messages.create({ model: MODEL_ID, max_tokens: 50, messages: [
    { role: 'user', content: 'Load a tool' },
    { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'ToolSearch', input: { q: 'x' } }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: [
      { type: 'tool_reference', tool_name: 'Write' },
      { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'iVBORw0KGgo=' } },
      { type: 'search_result', title: 't', source: 's', content: [{ type: 'text', text: 'r' }] },
      { type: 'text', text: 'ok' }] }] }] });
  assert.equal(r.content.at(-1).text, 'Fine.');
});

test('/v1/models gives the context and the largest reply under the names clients read', async () => {
  const { srv } = await scripted([thought('x', 'y')], ['--max-tokens', '64', '--ctx', '2048']);
  const m = (await raw(srv, 'GET', '/v1/models')).json.data[0];
  assert.equal(m.context_length, 2048);
  assert.equal(m.max_model_len, 2048);
  assert.equal(m.max_input_tokens, 2048);
  assert.equal(m.max_tokens, 64);
});

// Reads a raw SSE response until pred(text so far) holds; returns the text.
async function readUntil(reader, text, pred) {
  const dec = new TextDecoder();
  while (!pred(text.s)) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`stream ended before the expected event:\n${text.s}`);
    text.s += dec.decode(value);
  }
  return text.s;
}

test('a queued stream gets its first event at once, then keep-alives while it waits', async () => {
  // A scripted reply of ~1,000 tokens at 30 ms each keeps the one slot busy for 30 s (it is
  // aborted once the checks are done): the keep-alives come after 5 s of silence, and a loaded
  // machine may be slow to send the queued requests (at ~300 tokens, 9 s, that left 4 s).
  const long = thought('w '.repeat(1000), 'done');
  const { srv } = await scripted([long, plain('Short.'), plain('Chat.')], [], { K3_TEST_TOKEN_DELAY_MS: '30' });
  const busy = new AbortController();
  const first = await fetch(`${srv.url}/v1/chat/completions`, { method: 'POST', signal: busy.signal,
    headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL_ID, messages: [{ role: 'user', content: 'long' }], stream: true }) });
  const r1 = first.body.getReader();
  await readUntil(r1, { s: '' }, (s) => s.includes('reasoning_content'));
  const res = await fetch(`${srv.url}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL_ID, max_tokens: 50, stream: true, messages: [{ role: 'user', content: 'Hi' }] }) });
  assert.equal(res.status, 200);
  const rd = res.body.getReader();
  const text = { s: '' };
  await readUntil(rd, text, (s) => s.includes('event: message_start'));
  assert.equal((await raw(srv, 'GET', '/health')).json.queued, 1, 'message_start came while still queued');
  // OpenAI chat, queued behind both: its role chunk at once, then SSE comments
  const chat = await fetch(`${srv.url}/v1/chat/completions`, { method: 'POST',
    headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL_ID, messages: [{ role: 'user', content: 'Hi' }], stream: true, max_tokens: 3 }) });
  const rc = chat.body.getReader();
  const ctext = { s: '' };
  await readUntil(rc, ctext, (s) => s.includes('"role":"assistant"'));
  await readUntil(rd, text, (s) => (s.match(/event: ping/g) || []).length >= 2); // message_start's, then a keep-alive
  await readUntil(rc, ctext, (s) => s.includes(': keep-alive'));
  assert.equal((await raw(srv, 'GET', '/health')).json.queued, 2, 'the keep-alives came while still queued');
  assert.ok(!text.s.includes('content_block_start'));
  busy.abort();
  await readUntil(rc, ctext, (s) => s.includes('data: [DONE]'));
  await readUntil(rd, text, (s) => s.includes('event: message_stop'));
  const said = [...text.s.matchAll(/"text_delta","text":"([^"]*)"/g)].map((m) => m[1]).join('');
  assert.equal(said, 'Short.');
});
