// statefiles.test.mjs — issue 32, D12: a spilled conversation state (--state-dir) is read back
// only when its file holds that conversation's ids. Two servers sharing the folder, each k3 as
// pid 1 of its own pid namespace (two containers), wrote the same file names before; and a
// file replaced by another conversation's state (same model, valid checksum) is skipped with a
// log line and the prompt prefilled, so the reply is a fresh run's.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { serverPool, client, MODEL_ID } from './harness.mjs';

const server = serverPool();
const CACHE = ['--state-cache', '1', '--state-files', '1'];

const first = (who) => [{ role: 'user', content: `${who}: tell me about the garden.` }];
const ask = (api, messages, extra = {}) => api.chat.completions.create({
  model: MODEL_ID, messages, max_tokens: 8, temperature: 0, reasoning_effort: 'none', ...extra });
const second = (who, reply) => [...first(who), { role: 'assistant', content: reply.choices[0].message.content },
  { role: 'user', content: 'And then?' }];

// Anna's second turn on a fresh server with nothing between: the reply to expect.
async function freshSecond(who) {
  const api = client(await server([]));
  const r1 = await ask(api, first(who));
  return ask(api, second(who, r1), { logprobs: true });
}

function tmpdir() { return fs.mkdtempSync(path.join(os.tmpdir(), 'k3-statefiles-')); }

// unshare -rpf: a user and pid namespace, so that k3 runs as pid 1 (needs user namespaces).
function canUnshare() {
  try { execFileSync('unshare', ['-rpf', 'true'], { stdio: 'ignore' }); return true; } catch { return false; }
}

test('D12: two servers sharing --state-dir, both pid 1, never answer from each other\'s state', async (t) => {
  if (!canUnshare()) return t.skip('unshare -rpf is not allowed here (no user namespaces)');
  const dir = tmpdir();
  try {
    const a = await server(['--state-dir', dir, ...CACHE], ['unshare', '-rpf', '--kill-child=SIGTERM']);
    const b = await server(['--state-dir', dir, ...CACHE], ['unshare', '-rpf', '--kill-child=SIGTERM']);
    const apiA = client(a), apiB = client(b);
    const anna1 = await ask(apiA, first('Anna'));
    await ask(apiA, first('Boris'));            // A spills Anna
    const carl1 = await ask(apiB, first('Carl'));
    await ask(apiB, first('Dora'));             // B spills Carl
    const files = fs.readdirSync(dir);
    const anna2 = await ask(apiA, second('Anna', anna1), { logprobs: true });
    const carl2 = await ask(apiB, second('Carl', carl1), { logprobs: true });
    const [fa, fc] = [await freshSecond('Anna'), await freshSecond('Carl')];
    assert.deepEqual(anna2.choices[0], fa.choices[0], 'Anna on A = Anna on a fresh server');
    assert.deepEqual(carl2.choices[0], fc.choices[0], 'Carl on B = Carl on a fresh server');
    assert.equal(anna2.usage.prompt_tokens_details.cached_tokens, fa.usage.prompt_tokens_details.cached_tokens);
    assert.equal(files.length, 2, `one file each: ${files}`);
    assert.ok(files.every((f) => !/-1-\d+\.state$/.test(f)), `names made of the pid: ${files}`);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('D12: a state file replaced by another conversation\'s is skipped, logged, and redone', async () => {
  const dir = tmpdir();
  try {
    const srv = await server(['--state-dir', dir, ...CACHE]);
    const api = client(srv);
    const anna1 = await ask(api, first('Anna'));
    await ask(api, first('Bert'));               // Anna's state goes to the one file
    const [annaFile] = fs.readdirSync(dir);
    const annaBytes = fs.readFileSync(path.join(dir, annaFile));
    await ask(api, first('Cleo'));               // Bert's state overwrites it
    const bertBytes = fs.readFileSync(path.join(dir, annaFile));
    assert.notDeepEqual(bertBytes, annaBytes);
    // put Bert's (valid, same model) state where the server expects... Bert's: now ask for
    // Bert while the file holds Anna's
    fs.writeFileSync(path.join(dir, annaFile), annaBytes);
    const bert2 = await ask(api, second('Bert', await freshFirst('Bert')), { logprobs: true });
    const fb = await freshSecond('Bert');
    assert.deepEqual(bert2.choices[0], fb.choices[0], 'Bert\'s reply is a fresh run\'s, not one from Anna\'s state');
    assert.equal(bert2.usage.prompt_tokens_details.cached_tokens, 0, 'nothing reused from a file of another conversation');
    assert.match(srv.log(), /could not be read back \(prefilled instead\): .*another token prefix/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

async function freshFirst(who) { return ask(client(await server([])), first(who)); }
