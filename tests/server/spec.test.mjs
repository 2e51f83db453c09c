// spec.test.mjs — `k3 serve --spec N` (speculative decoding, src/engine/spec.h): greedy
// completions are token for token those of a server without --spec and of `k3 run --spec`,
// over a long reply to a repetitive prompt (drafts proposed and accepted on k3-nano), streamed
// and not, with max_tokens ending inside a verification pass.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, client, k3, MODEL, MODEL_ID } from './harness.mjs';

// a phrase, k3-nano's greedy continuation of it, the phrase again: the drafter proposes the
// continuation and the model follows it for a while
const phrase = [300, 1201, 45, 1777, 902, 66];
let plain, spec, a, b, prompt;
before(async () => {
  plain = await startServer();
  spec = await startServer(['--spec', '4']);
  a = client(plain);
  b = client(spec);
  const ids = k3(['run', MODEL, '--prompt-ids', phrase.join(','), '--max-new', '16', '--ids', '-q']);
  prompt = [...phrase, ...ids.trim().split(',').map(Number), ...phrase];
});
after(async () => { await plain?.stop(); await spec?.stop(); });

test('greedy completions with --spec equal those without, for several max_tokens', async () => {
  for (const max_tokens of [1, 3, 7, 40, 300]) {
    const x = await a.completions.create({ model: MODEL_ID, prompt, max_tokens, temperature: 0 });
    const y = await b.completions.create({ model: MODEL_ID, prompt, max_tokens, temperature: 0 });
    assert.equal(y.choices[0].text, x.choices[0].text, `max_tokens ${max_tokens}`);
    assert.equal(y.choices[0].finish_reason, x.choices[0].finish_reason);
    assert.deepEqual(y.usage, x.usage);
  }
});

test('streamed --spec output equals the non-streamed one and k3 run --spec', async () => {
  const y = await b.completions.create({ model: MODEL_ID, prompt, max_tokens: 60, temperature: 0 });
  let text = '';
  const stream = await b.completions.create({ model: MODEL_ID, prompt, max_tokens: 60, temperature: 0, stream: true });
  for await (const c of stream) text += c.choices[0]?.text ?? '';
  assert.equal(text, y.choices[0].text);
  const cli = k3(['run', MODEL, '--prompt-ids', prompt.join(','), '--max-new', '60', '--spec', '4', '-q']);
  assert.equal(y.choices[0].text + '\n', cli);
});

test('chat with --spec: the same reply as without', async () => {
  const messages = [{ role: 'user', content: 'list: apple, pear, apple, pear, apple, pear, apple' }];
  const x = await a.chat.completions.create({ model: MODEL_ID, messages, max_tokens: 80, temperature: 0 });
  const y = await b.chat.completions.create({ model: MODEL_ID, messages, max_tokens: 80, temperature: 0 });
  assert.equal(y.choices[0].message.content, x.choices[0].message.content);
  assert.deepEqual(y.usage, x.usage);
});
