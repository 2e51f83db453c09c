// bench-pcache.mjs — the prompt cache (issue 30): a second conversation with the same ~2k-token
// system prompt, time to its one-token reply (prefill + 1 token: the time to first token):
//   cold      a server without --prompt-cache
//   seed      a server with an empty --prompt-cache (it also writes the snapshots)
//   disk      a server restarted on that folder, the files dropped from the page cache first
//             (posix_fadvise DONTNEED, via python3): the snapshot is read from the disk
//   RAM       the same server, a third conversation: the snapshot is in the RAM tier
//             (--prompt-cache-ram 1 keeps what was read back)
// each REPEAT times (median), every reply compared with the cold one (greedy: must be equal);
// then the snapshot bytes and write / read seconds from /metrics beside the folder's disk
// bandwidth measured in the same run (dd, 256 MiB, fdatasync / O_DIRECT).
//
// Environment: K3_BIN (default ./k3), MODEL_DIR (default the bundled k3-tiny-kjv),
// PCACHE_DIR (a folder on the disk to measure; default a new one under os.tmpdir()),
// PCACHE_REPEAT (default 3). Only 127.0.0.1 is contacted.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import os from 'node:os';
import { ROOT, median, metrics as allMetrics, modelDir, startServe } from './bench-lib.mjs';

const MODEL = modelDir('tests/fixtures/k3-tiny-kjv');
const REPEAT = Number(process.env.PCACHE_REPEAT || 3);
const BASE = process.env.PCACHE_DIR || os.tmpdir();

const verses = fs.readFileSync(path.join(ROOT, 'tests/fixtures/kjv-heldout-philippians.txt'), 'utf8');
const SYSTEM = `You answer from this text only.\n${verses.slice(0, 5300)}`;
const conv = (who) => [{ role: 'system', content: SYSTEM }, { role: 'user', content: `${who}: who wrote this?` }];

const start = (args) => startServe(MODEL, args);

async function ask(srv, who) {
  const t0 = performance.now();
  const r = await fetch(`${srv.url}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', messages: conv(who), max_tokens: 1, temperature: 0,
      reasoning_effort: 'none', logprobs: true }),
  });
  const j = await r.json();
  if (r.status !== 200) throw new Error(JSON.stringify(j));
  return { s: (performance.now() - t0) / 1e3, cached: j.usage.prompt_tokens_details.cached_tokens,
    prompt: j.usage.prompt_tokens, reply: JSON.stringify(j.choices[0]) };
}

const metrics = (srv) => allMetrics(srv.url, 'k3_prompt_cache_');
const files = (dir) => fs.readdirSync(dir).filter((f) => f.startsWith('k3pc-')).map((f) => path.join(dir, f));
function dropFromPageCache(dir) {
  const py = 'import os,sys\nfor p in sys.argv[1:]:\n fd=os.open(p,os.O_RDONLY); os.fsync(fd); ' +
    'os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED); os.close(fd)';
  execFileSync('python3', ['-c', py, ...files(dir)]);
}
function diskBandwidth(dir) {
  const f = path.join(dir, 'dd-probe');
  const dd = (args) => execFileSync('dd', args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  const rate = (txt) => { const m = txt.match(/copied, ([\d.]+) s/); return 256 * 1048576 / Number(m[1]) / 1e9; };
  const w = rate(execFileSync('sh', ['-c', `dd if=/dev/zero of=${f} bs=1M count=256 conv=fdatasync 2>&1`], { encoding: 'utf8' }));
  let r;
  try { r = rate(execFileSync('sh', ['-c', `dd if=${f} of=/dev/null bs=1M iflag=direct 2>&1`], { encoding: 'utf8' })); }
  catch { dropFromPageCache(dir); r = rate(execFileSync('sh', ['-c', `dd if=${f} of=/dev/null bs=1M 2>&1`], { encoding: 'utf8' })); }
  fs.rmSync(f);
  void dd;
  return { w, r };
}

const t = { cold: [], seed: [], disk: [], ram: [] };
let ref, prompt, cachedDisk, cachedRam, snap = {};
for (let i = 0; i < REPEAT; i++) {
  const cold = await start([]);
  const c = await ask(cold, 'Boris');
  await cold.stop();
  t.cold.push(c.s);
  ref ??= c.reply;
  prompt = c.prompt;
  if (c.reply !== ref) throw new Error('cold replies differ');

  const dir = fs.mkdtempSync(path.join(BASE, 'k3-bench-pcache-'));
  const s1 = await start(['--prompt-cache', dir]);
  t.seed.push((await ask(s1, 'Anna')).s);
  const m1 = await metrics(s1);
  await s1.stop();
  dropFromPageCache(dir);
  const s2 = await start(['--prompt-cache', dir]);
  const d = await ask(s2, 'Boris');
  const m2 = await metrics(s2);
  const r = await ask(s2, 'Chen');
  const m3 = await metrics(s2);
  await s2.stop();
  t.disk.push(d.s);
  t.ram.push(r.s);
  if (d.reply !== ref) throw new Error('the reply from the disk snapshot differs from the cold one');
  cachedDisk = d.cached;
  cachedRam = r.cached;
  snap = { files: m1.snapshots_total, written: m1.written_bytes_total, write_s: m1.write_seconds_total,
    read: m2.read_bytes_total, read_disk_s: m2.read_seconds_total,
    read_ram_s: m3.read_seconds_total - m2.read_seconds_total, ram_hits: m3.ram_hits_total };
  fs.rmSync(dir, { recursive: true, force: true });
}
const bw = diskBandwidth(BASE);
const f = (x) => x.toFixed(3);
console.log(`model ${path.basename(MODEL)}, prompt ${prompt} tokens, ${REPEAT} runs (median)`);
console.log('| case | cached tokens | time to the 1-token reply s | vs cold |');
console.log('|---|---:|---:|---:|');
console.log(`| cold, no cache | 0 | ${f(median(t.cold))} | 1.00 |`);
console.log(`| cold, writing the snapshots | 0 | ${f(median(t.seed))} | ${(median(t.seed) / median(t.cold)).toFixed(2)} |`);
console.log(`| warm from disk (restart, page cache dropped) | ${cachedDisk} | ${f(median(t.disk))} | ${(median(t.disk) / median(t.cold)).toFixed(2)} |`);
console.log(`| warm from RAM (the RAM tier, ${snap.ram_hits} hit) | ${cachedRam} | ${f(median(t.ram))} | ${(median(t.ram) / median(t.cold)).toFixed(2)} |`);
console.log(`snapshots written by the seed request: ${snap.files}, ${snap.written} bytes in ${f(snap.write_s)} s ` +
  `(${(snap.written / snap.write_s / 1e9).toFixed(3)} GB/s; dd to the same disk with fdatasync ${bw.w.toFixed(3)} GB/s)`);
console.log(`restored: ${snap.read} bytes, from disk in ${f(snap.read_disk_s)} s ` +
  `(${(snap.read / snap.read_disk_s / 1e9).toFixed(3)} GB/s; dd O_DIRECT read ${bw.r.toFixed(3)} GB/s), ` +
  `from the RAM tier in ${f(snap.read_ram_s)} s (${(snap.read / snap.read_ram_s / 1e9).toFixed(3)} GB/s)`);
console.log('every reply equals the cold one: yes');
