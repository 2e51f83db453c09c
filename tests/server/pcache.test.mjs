// pcache.test.mjs — the prompt cache (--prompt-cache DIR, src/server/pcache.h): a new
// conversation that shares a system prompt with an earlier one, on a server started after
// the first one stopped, resumes from the stored prefix (>= 80% of the shared prefix reported
// as cached) and its reply is the one a server without the cache gives, bit for bit (greedy,
// logprobs). Damaged, truncated, foreign, linked or FIFO files are skipped (200, same reply);
// the disk budget holds; a full disk (a small tmpfs) evicts and fails no request; two servers
// share one folder.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, client, raw, logMatch, MODEL_ID, K3, ROOT, MODEL } from './harness.mjs';

const KJV = path.join(ROOT, 'tests', 'fixtures', 'k3-tiny-kjv');
const servers = [];
after(async () => { await Promise.all(servers.map((s) => s.stop())); });
// A server on k3-nano (startServer), or on another model / under a wrapper command (spawned
// here: startServer's model is the harness's).
async function server(args, model, wrap = []) {
  const s = model || wrap.length ? await spawnServer(model || MODEL, args, wrap) : await startServer(args);
  servers.push(s);
  return s;
}
async function spawnServer(model, args, wrap) {
  const argv = [...wrap, K3, 'serve', model, '--port', '0', ...args];
  const proc = spawn(argv[0], argv.slice(1), { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '', err = '';
  proc.stderr.on('data', (d) => { err += d; });
  const exited = new Promise((r) => proc.on('close', r)); // exited, its pipes read to the end
  const url = await new Promise((resolve, reject) => {
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/\S+)\/v1 /);
      if (m) resolve(m[1]);
    });
    proc.on('close', (c) => reject(new Error(`k3 serve exited ${c}: ${err}`)));
  });
  return { url, base: `${url}/v1`, banner: () => out, log: () => err,
    stop: async () => { if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM'); await exited; } };
}
const dirs = [];
after(() => { for (const d of dirs) fs.rmSync(d, { recursive: true, force: true }); });
function tmp() {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'k3-pcache-'));
  dirs.push(d);
  return d;
}

const SYSTEM = 'You are the keeper of a walled garden. ' + Array.from({ length: 12 }, (_, i) =>
  `Rule ${i + 1}: the ${['roses', 'lilies', 'oaks', 'ferns'][i % 4]} of bed ${i + 1} are watered at ` +
  `${i + 5} o'clock and never after dusk.`).join(' ');
const conv = (who) => [{ role: 'system', content: SYSTEM }, { role: 'user', content: `${who}: what is watered first?` }];
const ask = (api, messages, extra = {}) => api.chat.completions.create({
  model: MODEL_ID, messages, max_tokens: 8, temperature: 0, reasoning_effort: 'none', logprobs: true, ...extra });

// The prompt ids as the server renders them (k3 render --ids, the same renderer).
function ids(messages) {
  const f = path.join(tmp(), 'req.json');
  fs.writeFileSync(f, JSON.stringify({ messages, reasoning_effort: 'none' }));
  return execFileSync(K3, ['render', '--request', f, '--ids'], { cwd: ROOT, encoding: 'utf8' })
    .trim().split(',').map(Number);
}
function shared(a, b) {
  let n = 0;
  while (n < a.length && n < b.length && a[n] === b[n]) n++;
  return n;
}
async function metric(srv, name) {
  const r = await raw(srv, 'GET', '/metrics');
  const m = r.text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
  assert.ok(m, `${name} in /metrics`);
  return Number(m[1]);
}
const files = (dir) => fs.readdirSync(dir).filter((f) => /^k3pc-[0-9a-f]{32}\.state$/.test(f));

// The reply without any cache: the reference every cached reply must equal.
let reference;
async function plain() {
  if (!reference) {
    const s = await server([]);
    reference = await ask(client(s), conv('Boris'));
    await s.stop();
  }
  return reference;
}

// Anna's conversation on one server, stopped: DIR holds its snapshots.
async function seed(dir, args = [], model) {
  const s = await server(['--prompt-cache', dir, ...args], model);
  await ask(client(s), conv('Anna'));
  await s.stop();
  assert.ok(files(dir).length >= 2, `snapshots written: ${fs.readdirSync(dir)}`);
}

test('after a restart a new conversation resumes from the shared system prompt, same reply', async () => {
  const dir = tmp();
  await seed(dir);
  const s = await server(['--prompt-cache', dir]);
  assert.match(s.banner(), new RegExp(`prompt cache ${dir} within 32 GB, 1 in RAM`));
  const b = await ask(client(s), conv('Boris'));
  const common = shared(ids(conv('Anna')), ids(conv('Boris')));
  const cached = b.usage.prompt_tokens_details.cached_tokens;
  assert.ok(common > 100, `shared prefix ${common}`);
  assert.ok(cached >= 0.8 * common && cached <= common, `cached ${cached} of the shared ${common}`);
  assert.equal(await metric(s, 'k3_prompt_cache_hits_total'), 1);
  assert.equal(await metric(s, 'k3_prompt_cache_ram_hits_total'), 0, 'read from the folder');
  assert.equal(await metric(s, 'k3_prompt_cache_tokens_restored_total'), cached);
  assert.ok(await metric(s, 'k3_prompt_cache_read_bytes_total') > 0);
  const ref = await plain();
  assert.equal(ref.usage.prompt_tokens_details.cached_tokens, 0);
  assert.deepEqual(b.choices[0], ref.choices[0], 'the same reply and logprobs, bit for bit');
  // Anthropic's field reports the same
  const m = await fetch(`${s.url}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL_ID, max_tokens: 4, system: SYSTEM, messages: [{ role: 'user', content: 'Chen: and last?' }] }) });
  assert.equal(m.status, 200);
  assert.ok((await m.json()).usage.cache_read_input_tokens > 0);
  // the snapshot read from disk for Boris is in the RAM tier (--prompt-cache-ram 1): Dana's
  // conversation restores it from there, with its file gone
  const ram = await metric(s, 'k3_prompt_cache_ram_hits_total'); // Chen's above, from RAM too
  for (const f of files(dir)) fs.renameSync(path.join(dir, f), path.join(dir, `${f}.away`));
  const d = await ask(client(s), conv('Dana'));
  assert.equal(d.usage.prompt_tokens_details.cached_tokens, cached);
  assert.equal(await metric(s, 'k3_prompt_cache_ram_hits_total'), ram + 1);
});

test('every file truncated to half, corrupted, a link or a FIFO: skipped, 200, the same reply', async () => {
  for (const damage of ['half', 'flip', 'link-fifo']) {
    const dir = tmp();
    await seed(dir);
    for (const f of files(dir)) {
      const p = path.join(dir, f);
      const size = fs.statSync(p).size;
      if (damage === 'half') fs.truncateSync(p, Math.floor(size / 2));
      if (damage === 'flip') {
        const fd = fs.openSync(p, 'r+');
        const b = Buffer.alloc(1);
        fs.readSync(fd, b, 0, 1, Math.floor(size * 0.75));
        b[0] ^= 0x40;
        fs.writeSync(fd, b, 0, 1, Math.floor(size * 0.75));
        fs.closeSync(fd);
      }
      if (damage === 'link-fifo') {
        fs.renameSync(p, p + '.real');
        if (files(dir).length % 2) fs.symlinkSync(p + '.real', p);
        else execFileSync('mkfifo', [p]);
      }
    }
    const s = await server(['--prompt-cache', dir]);
    const b = await ask(client(s), conv('Boris'));
    assert.equal(b.usage.prompt_tokens_details.cached_tokens, 0, damage);
    assert.deepEqual(b.choices[0], (await plain()).choices[0], `${damage}: the reply without the cache`);
    await logMatch(s, /prompt cache: .*skipped/, damage);
    await s.stop();
    if (damage !== 'link-fifo') { // the prefill wrote good snapshots over the damaged ones
      const s2 = await server(['--prompt-cache', dir]);
      assert.ok((await ask(client(s2), conv('Boris'))).usage.prompt_tokens_details.cached_tokens > 0, damage);
      await s2.stop();
    }
  }
});

test("another model's files (k3-tiny-kjv under k3-nano's names) are skipped, same reply", async () => {
  const dir = tmp(), kjv = tmp();
  await seed(dir);
  await seed(kjv, [], KJV);
  const foreign = files(kjv).map((f) => path.join(kjv, f));
  files(dir).forEach((f, i) => fs.copyFileSync(foreign[i % foreign.length], path.join(dir, f)));
  const s = await server(['--prompt-cache', dir]);
  const b = await ask(client(s), conv('Boris'));
  assert.equal(b.usage.prompt_tokens_details.cached_tokens, 0);
  assert.deepEqual(b.choices[0], (await plain()).choices[0]);
  await logMatch(s, /another model/);
  await s.stop();
  // and the kjv server still uses its own folder (files of nano beside them are left alone)
  const k = await server(['--prompt-cache', kjv], KJV);
  const r = await ask(client(k), conv('Boris'));
  assert.ok(r.usage.prompt_tokens_details.cached_tokens > 0);
});

test('the disk budget: the least recently used files go, the folder stays within it', async () => {
  const dir = tmp();
  await seed(dir);
  const one = Math.max(...files(dir).map((f) => fs.statSync(path.join(dir, f)).size));
  const budget = 3.5 * one; // bytes
  const s = await server(['--prompt-cache', dir, '--prompt-cache-gb', String(budget / 1e9)]);
  const api = client(s);
  for (const who of ['Boris', 'Chen', 'Dana', 'Emil'])
    await ask(api, [{ role: 'system', content: `${who}'s garden. ${SYSTEM}` }, { role: 'user', content: 'Hello?' }]);
  const total = files(dir).reduce((n, f) => n + fs.statSync(path.join(dir, f)).size, 0);
  assert.ok(total <= budget, `${total} bytes in the folder, budget ${budget}`);
  assert.ok(await metric(s, 'k3_prompt_cache_evicted_total') > 0);
  assert.ok(files(dir).length > 0);
});

// unshare -rm: a user and mount namespace, where a small tmpfs stands for a full disk.
function canMount() {
  try {
    execFileSync('unshare', ['-rm', 'sh', '-c', 'mount -t tmpfs -o size=64k tmpfs /mnt'], { stdio: 'ignore' });
    return true;
  } catch { return false; }
}

test('a full disk evicts and never fails a request', async (t) => {
  if (!canMount()) return t.skip('unshare -rm / mount tmpfs is not allowed here');
  const seeded = tmp();
  await seed(seeded);
  const one = Math.max(...files(seeded).map((f) => fs.statSync(path.join(seeded, f)).size));
  const dir = tmp();
  const size = Math.ceil((2.5 * one) / 4096) * 4096; // room for two snapshots and a half
  const srv = await server(['--prompt-cache', dir, '--prompt-cache-gb', '1000'], MODEL,
    ['unshare', '-rm', 'sh', '-c', `mount -t tmpfs -o size=${size} tmpfs '${dir}' && exec "$0" "$@"`]);
  const api = client(srv);
  const plainApi = client(await server([]));
  for (const who of ['Boris', 'Chen', 'Dana', 'Emil']) {
    const messages = [{ role: 'system', content: `${who}'s garden. ${SYSTEM}` }, { role: 'user', content: 'Hello?' }];
    const r = await ask(api, messages);
    assert.deepEqual(r.choices[0], (await ask(plainApi, messages)).choices[0], who);
  }
  assert.ok(await metric(srv, 'k3_prompt_cache_evicted_total') > 0, `the full disk was met: ${srv.log()}`);
  const again = [{ role: 'system', content: `Emil's garden. ${SYSTEM}` }, { role: 'user', content: 'Hello?' }];
  assert.ok((await ask(api, again)).usage.prompt_tokens_details.cached_tokens > 0, 'the last one was stored');
});

test('two servers share one folder: one reads what the other wrote, same reply', async () => {
  const dir = tmp();
  const [s1, s2] = await Promise.all([server(['--prompt-cache', dir]), server(['--prompt-cache', dir])]);
  await Promise.all([ask(client(s1), conv('Anna')), ask(client(s2), conv('Anna'))]); // same names, both write
  const b = await ask(client(s2), conv('Boris'));
  assert.ok(b.usage.prompt_tokens_details.cached_tokens > 0);
  assert.deepEqual(b.choices[0], (await plain()).choices[0]);
  assert.deepEqual(fs.readdirSync(dir).filter((f) => !files(dir).includes(f)), [], 'no temp file left');
  const c = await ask(client(s1), conv('Boris'));
  assert.deepEqual(c.choices[0], b.choices[0]);
});

test('--state-dir is the old name of --prompt-cache; --state-files is refused', async () => {
  const dir = tmp();
  const s = await server(['--state-dir', dir]);
  await logMatch(s, /--state-dir is now --prompt-cache/);
  await ask(client(s), conv('Anna'));
  await s.stop();
  assert.ok(files(dir).length > 0, 'kept at exit');
  await assert.rejects(startServer(['--state-files', '2']), /--state-files is gone/);
  await assert.rejects(startServer(['--prompt-cache', '/nonexistent/k3-pc']), /not a folder/);
});
