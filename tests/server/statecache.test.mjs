// statecache.test.mjs — the multi-conversation state cache (--state-cache K): a conversation
// that comes back after others came between is prefilled from its kept state
// (usage.prompt_tokens_details.cached_tokens covers its previous prompt), and its reply is
// the one a fresh server gives the same conversation with nothing between (greedy: same
// text, same token count, same logprobs), or, for raw completions, with no reuse at all.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { serverPool, startServer, client, raw, MODEL_ID } from './harness.mjs';

const server = serverPool();

const first = (who) => [{ role: 'user', content: `${who}: tell me about the garden.` }];
const ask = (api, messages, extra = {}) => api.chat.completions.create({
  model: MODEL_ID, messages, max_tokens: 8, temperature: 0, reasoning_effort: 'none', ...extra });

// The conversation's second turn: its first turn, our reply verbatim, one more question.
const second = (who, reply) => [...first(who), { role: 'assistant', content: reply.choices[0].message.content },
  { role: 'user', content: 'And then?' }];

async function metric(srv, name) {
  const r = await raw(srv, 'GET', '/metrics');
  const m = r.text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
  assert.ok(m, `${name} in /metrics`);
  return Number(m[1]);
}

test('A, B, C, then A again: A resumes from its kept state, identical to a fresh run', async () => {
  const srv = await server(['--state-cache', '4']);
  const api = client(srv);
  const a1 = await ask(api, first('Anna'));
  const b1 = await ask(api, first('Boris'));
  const c1 = await ask(api, first('Chen'));
  for (const r of [a1, b1, c1]) assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
  const a2 = await ask(api, second('Anna', a1), { logprobs: true });
  const cached = a2.usage.prompt_tokens_details.cached_tokens;
  // the state holds A's first prompt and the reply's ids: at least the first prompt is reused
  assert.ok(cached >= a1.usage.prompt_tokens, `cached ${cached} < first prompt ${a1.usage.prompt_tokens}`);
  assert.ok(cached < a2.usage.prompt_tokens, 'the new question is prefilled');
  assert.equal(await metric(srv, 'k3_state_cache_hits_total'), 1);
  assert.equal(await metric(srv, 'k3_state_cache_entries'), 3);
  // B and C come back too (their states were kept beside A's)
  const b2 = await ask(api, second('Boris', b1));
  assert.ok(b2.usage.prompt_tokens_details.cached_tokens >= b1.usage.prompt_tokens);

  // The same two turns with nothing between, on a fresh server, give the same second turn
  // bit for bit (the reply's own ids are spliced in the same way: cached counts the same)
  const fresh = await server([]);
  const fapi = client(fresh);
  const f1 = await ask(fapi, first('Anna'));
  assert.equal(f1.choices[0].message.content, a1.choices[0].message.content);
  const f2 = await ask(fapi, second('Anna', f1), { logprobs: true });
  assert.equal(f2.usage.prompt_tokens_details.cached_tokens, cached);
  assert.equal(f2.usage.prompt_tokens, a2.usage.prompt_tokens);
  assert.equal(f2.choices[0].message.content, a2.choices[0].message.content);
  assert.equal(f2.usage.completion_tokens, a2.usage.completion_tokens);
  assert.deepEqual(f2.choices[0].logprobs, a2.choices[0].logprobs, 'the same logits, bit for bit');
});

test('raw completions: a returning prompt reuses its own kept state, not the last one', async () => {
  const srv = await server(['--state-cache', '3']);
  const api = client(srv);
  // max_tokens 1: the one id sampled is never fed, so the kept state is the prompt's alone
  const done = async (prompt, max = 1) => api.completions.create({ model: MODEL_ID, prompt, max_tokens: max, temperature: 0 });
  const pa = 'And God said, Let there be light.';
  const a = await done(pa);
  await done('In the beginning was the Word.');
  const longer = pa + ' And there was light.';
  const a2 = await done(longer, 6);
  assert.equal(a2.usage.prompt_tokens_details.cached_tokens, a.usage.prompt_tokens);
  const fresh = await server(['--no-reuse']);
  const f = await client(fresh).completions.create({ model: MODEL_ID, prompt: longer, max_tokens: 6, temperature: 0 });
  assert.equal(f.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(f.choices[0].text, a2.choices[0].text);
});

test('the least recently used conversation is the one dropped when the cache is full', async () => {
  const srv = await server(['--state-cache', '2']);
  const api = client(srv);
  const a1 = await ask(api, first('Anna'));
  const b1 = await ask(api, first('Boris'));
  await ask(api, first('Chen'));      // the cache holds 2: Anna's state (oldest) goes
  const a2 = await ask(api, second('Anna', a1));
  assert.equal(a2.usage.prompt_tokens_details.cached_tokens, 0);
  // Anna's return took the slot of the least recently used (Boris): Chen's state is kept
  const b2 = await ask(api, second('Boris', b1));
  assert.equal(b2.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(await metric(srv, 'k3_state_cache_capacity'), 2);
});

test('with the default (one kept conversation) a conversation coming back after another is prefilled again', async () => {
  const srv = await server([]);
  const api = client(srv);
  const a1 = await ask(api, first('Anna'));
  await ask(api, first('Boris'));
  const a2 = await ask(api, second('Anna', a1));
  assert.equal(a2.usage.prompt_tokens_details.cached_tokens, 0);
});

