// run.mjs — `make test-agents`: the three coding agents people point at a local server, from
// npm at the versions pinned in package.json (installed once into tests/agents/node_modules,
// gitignored), each run non-interactively against `k3 serve` on the bundled model
// (tests/fixtures/k3-tiny-kjv) with a tool round trip:
//   Claude Code  `claude -p`      Anthropic Messages  (the Write tool writes a file)
//   Codex        `codex exec`     OpenAI Responses    (exec_command runs printf into a file)
//   opencode     `opencode run`   chat completions    (the write tool writes a file)
// Each reply of the server is scripted (the one door into the server used here: scripted(),
// below), so the model "calls" the tool; the client runs it, the test finds the file, the
// client sends the result back and prints the scripted final answer. A second Claude Code turn
// (--continue) must report cache_read_input_tokens > 0: the server reused the model state
// although Claude Code puts a per-request billing line in its system prompt. No request may
// get a 4xx (the server's log is read), and every client must exit 0.
//
// The clients need no login: each runs in a fresh HOME with a dummy key, telemetry, update
// checks and error reports switched off by environment or config. Their prompts are slimmed
// (a short system prompt, one or two tools) to fit the bundled model's 4096-token context.
//
// Prints SKIPPED (exit 0) when the clients are not installed and the npm registry cannot be
// reached. K3_BIN picks the k3 binary (default: build/k3-test when built, else ./k3).
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, '..', '..');
const K3 = path.resolve(ROOT, process.env.K3_BIN ||
  (fs.existsSync(path.join(ROOT, 'build', 'k3-test')) ? 'build/k3-test' : 'k3'));
const BIN = path.join(HERE, 'node_modules', '.bin');
const CLIENT_TIMEOUT_MS = 180000;
const running = new Set(); // servers and clients still running are killed when this exits
process.on('exit', () => { for (const p of running) p.kill('SIGKILL'); });
const MAX_TOKENS = '256'; // a scripted tool call is ~110 tokens of the bundled tokenizer

// ---- the clients, installed at their pinned versions --------------------------------------

function installed() {
  const want = JSON.parse(fs.readFileSync(path.join(HERE, 'package.json'), 'utf8')).dependencies;
  return Object.entries(want).every(([name, version]) => {
    try {
      const p = path.join(HERE, 'node_modules', name, 'package.json');
      return JSON.parse(fs.readFileSync(p, 'utf8')).version === version;
    } catch { return false; }
  });
}

function ensureClients() {
  if (installed()) return;
  console.log('test-agents: installing the pinned clients from npm (once; ~1.2 GB)...');
  const r = spawnSync('npm', ['install', '--no-audit', '--no-fund', '--no-package-lock',
    '--loglevel=error'], { cwd: HERE, stdio: ['ignore', 'inherit', 'pipe'], timeout: 900000 });
  if (r.status === 0 && installed()) return;
  const ping = spawnSync('npm', ['ping'], { cwd: HERE, timeout: 30000 });
  if (ping.status !== 0) {
    const lines = String(ping.stderr).split('\n');
    const why = lines.find((l) => /FetchError/.test(l)) || lines.find((l) => /code E/.test(l)) ||
      `npm ping exited ${ping.status}`;
    console.log('SKIPPED test-agents: the npm registry is unreachable and the clients are not ' +
      `installed in tests/agents/node_modules (${why.replace(/^npm error /, '')})`);
    process.exit(0);
  }
  throw new Error(`npm install of the pinned clients failed:\n${r.stderr}`);
}

// ---- the server ---------------------------------------------------------------------------

const THINK_END = '<|close|>think<|sep|><|open|>response<|sep|>';
const call = (name, args) => `<|open|>call tool="${name}" index="1"<|sep|>` +
  args.map(([k, v]) => `<|open|>argument key="${k}" type="string"<|sep|>${v}<|close|>argument<|sep|>`).join('') +
  '<|close|>call<|sep|>';
// A reply in K3's format as the model generates it after the prompt (spec §12.4-12.5).
const reply = (reasoning, content, calls = []) => `${reasoning}${THINK_END}${content}<|close|>response<|sep|>` +
  (calls.length ? `<|open|>tools<|sep|>${calls.join('')}<|close|>tools<|sep|>` : '') + '<|close|>message<|sep|>';

// The one door into the server: K3_TEST_SCRIPTED_REPLY (src/server/server.h, a test-only
// control) makes generation i emit the ids of replies[i % n] instead of sampled ones. The
// prompt is still rendered and prefilled, so state reuse and every protocol are real.
async function scripted(replies, dir) {
  const file = path.join(dir, 'script.json');
  fs.writeFileSync(file, JSON.stringify(replies));
  const proc = spawn(K3, ['serve', '--port', '0', '--max-tokens', MAX_TOKENS], {
    cwd: ROOT, env: { ...process.env, K3_TEST_SCRIPTED_REPLY: file },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  running.add(proc);
  proc.on('exit', () => running.delete(proc));
  let out = '', log = '';
  proc.stderr.on('data', (d) => { log += d; });
  const url = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`k3 serve did not start:\n${out}${log}`)), 30000);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/\S+)\/v1 /);
      if (m) { clearTimeout(t); resolve(m[1]); }
    });
    proc.on('close', (code) => { clearTimeout(t); reject(new Error(`k3 serve exited ${code}:\n${log}`)); });
  });
  const exited = new Promise((resolve) => proc.on('close', resolve));
  return {
    url,
    posts: () => log.split('\n').filter((l) => /k3 serve: POST /.test(l)),
    async stop() { proc.kill('SIGTERM'); await exited; },
  };
}

// ---- running a client ---------------------------------------------------------------------

function run(cmd, args, { cwd, env }) {
  return new Promise((resolve) => {
    const p = spawn(path.join(BIN, cmd), args, { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
    running.add(p);
    let stdout = '', stderr = '';
    p.stdout.on('data', (d) => { stdout += d; });
    p.stderr.on('data', (d) => { stderr += d; });
    const t = setTimeout(() => p.kill('SIGKILL'), CLIENT_TIMEOUT_MS);
    // The last bytes of stdout (the final answer the checks read) can come after 'exit': wait
    // for the pipes to close too, though not for ever (a helper of the client may hold them).
    const drained = Promise.all([p.stdout, p.stderr].map((s) => new Promise((r) => s.on('close', r))));
    p.on('exit', (code, sig) => {
      clearTimeout(t);
      Promise.race([drained, new Promise((r) => setTimeout(r, 10000))]).then(() => {
        running.delete(p);
        resolve({ code, sig, stdout, stderr });
      });
    });
  });
}

// A fresh HOME with nothing of the user's: no login, no settings, no history.
function home(name) {
  const h = fs.mkdtempSync(path.join(os.tmpdir(), `k3-agents-${name}-`));
  const env = { PATH: process.env.PATH, HOME: h, TERM: 'dumb', NO_COLOR: '1', LANG: 'C.UTF-8',
    XDG_CONFIG_HOME: path.join(h, '.config'), XDG_DATA_HOME: path.join(h, '.local', 'share'),
    XDG_STATE_HOME: path.join(h, '.local', 'state'),
    // opencode installs its provider package (@ai-sdk/openai-compatible) on first use: cached
    XDG_CACHE_HOME: path.join(HERE, 'node_modules', '.cache-home'),
    npm_config_cache: path.join(HERE, 'node_modules', '.npm-cache') };
  return { dir: h, env };
}

function check(cond, what, r, srv) {
  if (cond) return;
  throw new Error(`${what}\n--- exit ${r?.code} ${r?.sig ?? ''}\n--- stdout\n${r?.stdout}\n--- stderr\n` +
    `${r?.stderr}\n--- server\n${srv?.posts().join('\n')}`);
}

function no4xx(srv) {
  const bad = srv.posts().filter((l) => /POST \S+ 4\d\d /.test(l));
  check(bad.length === 0, `the server answered a 4xx:\n${bad.join('\n')}`, null, srv);
}

// ---- the three clients ----------------------------------------------------------------------

async function claudeCode() {
  const h = home('claude');
  const target = path.join(h.dir, 'cc-out.txt');
  const srv = await scripted([
    reply('Write it.', '', [call('Write', [['file_path', target], ['content', 'claude-ok']])]),
    reply('Done.', 'I wrote the file.'),
    reply('Again.', 'Second turn done.'),
  ], h.dir);
  try {
    const env = { ...h.env, ANTHROPIC_BASE_URL: srv.url, ANTHROPIC_API_KEY: 'dummy',
      DISABLE_TELEMETRY: '1', DISABLE_AUTOUPDATER: '1', DISABLE_ERROR_REPORTING: '1',
      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1' };
    const common = ['--model', 'k3-tiny-kjv', '--system-prompt', 'You are a test agent.',
      '--tools', 'Write', '--allowedTools', 'Write', '--strict-mcp-config'];
    const r = await run('claude', ['-p', `Write claude-ok to ${target}`, ...common], { cwd: h.dir, env });
    check(r.code === 0, 'claude -p did not exit 0', r, srv);
    check(fs.existsSync(target) && fs.readFileSync(target, 'utf8') === 'claude-ok',
      'the Write tool call was not executed', r, srv);
    check(r.stdout.includes('I wrote the file.'), 'no final answer after the tool result', r, srv);
    const r2 = await run('claude', ['-p', 'And again?', '--continue', '--output-format', 'json',
      ...common], { cwd: h.dir, env });
    check(r2.code === 0, 'claude -p --continue did not exit 0', r2, srv);
    const j = JSON.parse(r2.stdout.trim().split('\n').pop());
    check(j.result === 'Second turn done.', 'the second turn did not get its answer', r2, srv);
    check(j.usage.cache_read_input_tokens > 0, 'the second turn reused no model state ' +
      `(cache_read_input_tokens ${j.usage.cache_read_input_tokens})`, r2, srv);
    no4xx(srv);
    return `tool round trip, 2nd turn cache_read_input_tokens ${j.usage.cache_read_input_tokens}` +
      ` of ${j.usage.cache_read_input_tokens + j.usage.input_tokens}; ${srv.posts().length} requests`;
  } finally {
    await srv.stop();
    fs.rmSync(h.dir, { recursive: true, force: true });
  }
}

async function codex() {
  const h = home('codex');
  const target = path.join(h.dir, 'cx-out.txt');
  const srv = await scripted([
    reply('Run it.', '', [call('exec_command', [['cmd', `printf codex-ok > ${target}`]])]),
    reply('Done.', 'I ran the command.'),
  ], h.dir);
  try {
    const codexHome = path.join(h.dir, '.codex');
    fs.mkdirSync(codexHome);
    fs.writeFileSync(path.join(h.dir, 'instructions.md'), 'You are a test agent.\n');
    // README.md "Codex" shows the same provider entry; the rest slims the prompt to fit 4096
    fs.writeFileSync(path.join(codexHome, 'config.toml'), `model = "k3-tiny-kjv"
model_provider = "k3"
model_context_window = 4096
model_instructions_file = "${path.join(h.dir, 'instructions.md')}"
web_search = "disabled"
include_permissions_instructions = false
include_environment_context = false
project_doc_max_bytes = 0
check_for_update_on_startup = false
[analytics]
enabled = false
[agents]
enabled = false
[features]
goals = false
apps = false
plugins = false
skill_search = false
view_image = false
image_generation = false
tool_suggest = false
sleep_tool = false
browser_use = false
computer_use = false
[model_providers.k3]
name = "k3"
base_url = "${srv.url}/v1"
wire_api = "responses"
`);
    const env = { ...h.env, CODEX_HOME: codexHome };
    const r = await run('codex', ['exec', '--skip-git-repo-check',
      '--dangerously-bypass-approvals-and-sandbox', `Write codex-ok to ${target}`], { cwd: h.dir, env });
    check(r.code === 0, 'codex exec did not exit 0', r, srv);
    check(fs.existsSync(target) && fs.readFileSync(target, 'utf8') === 'codex-ok',
      'the exec_command call was not executed', r, srv);
    check(r.stdout.includes('I ran the command.'), 'no final answer after the tool result', r, srv);
    no4xx(srv);
    return `tool round trip over /v1/responses; ${srv.posts().length} requests`;
  } finally {
    await srv.stop();
    fs.rmSync(h.dir, { recursive: true, force: true });
  }
}

async function opencode() {
  const h = home('opencode');
  const proj = path.join(h.dir, 'proj');
  fs.mkdirSync(proj);
  const target = path.join(proj, 'oc-out.txt');
  const tool = reply('Write it.', '', [call('write', [['filePath', target], ['content', 'opencode-ok']])]);
  // opencode asks for a title beside the first turn (no tools offered there); whichever of the
  // two the server admits first, the turn's first generation is the tool call
  const srv = await scripted([tool, tool, reply('Done.', 'I wrote the file.')], h.dir);
  try {
    const off = Object.fromEntries(['bash', 'edit', 'glob', 'grep', 'read', 'skill', 'task',
      'todowrite', 'webfetch'].map((t) => [t, false]));
    fs.writeFileSync(path.join(proj, 'opencode.json'), JSON.stringify({
      $schema: 'https://opencode.ai/config.json',
      provider: { k3: { npm: '@ai-sdk/openai-compatible', name: 'k3',
        options: { baseURL: `${srv.url}/v1`, apiKey: 'dummy' },
        models: { 'k3-tiny-kjv': { name: 'k3-tiny-kjv', limit: { context: 4096, output: Number(MAX_TOKENS) } } } } },
      model: 'k3/k3-tiny-kjv', autoupdate: false, share: 'disabled',
      agent: { build: { prompt: 'You are a test agent.' } },
      tools: { ...off, write: true }, permission: { edit: 'allow' },
    }, null, 1));
    const env = { ...h.env, OPENCODE_DISABLE_AUTOUPDATE: '1', OPENCODE_DISABLE_MODELS_FETCH: '1',
      OPENCODE_DISABLE_LSP_DOWNLOAD: '1', OPENCODE_DISABLE_DEFAULT_PLUGINS: '1' };
    const r = await run('opencode', ['run', 'Write opencode-ok to oc-out.txt'], { cwd: proj, env });
    check(r.code === 0, 'opencode run did not exit 0', r, srv);
    check(fs.existsSync(target) && fs.readFileSync(target, 'utf8') === 'opencode-ok',
      'the write tool call was not executed', r, srv);
    check(r.stdout.includes('I wrote the file.'), 'no final answer after the tool result', r, srv);
    no4xx(srv);
    return `tool round trip over /v1/chat/completions; ${srv.posts().length} requests`;
  } finally {
    await srv.stop();
    fs.rmSync(h.dir, { recursive: true, force: true });
  }
}

// ---- main -----------------------------------------------------------------------------------

ensureClients();
let failed = 0;
for (const [name, fn] of [['Claude Code', claudeCode], ['Codex', codex], ['opencode', opencode]]) {
  const t0 = Date.now();
  try {
    const what = await fn();
    console.log(`ok      ${name}: ${what} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  } catch (e) {
    failed++;
    console.log(`FAILED  ${name}: ${e.message}`);
  }
}
console.log(failed ? `test-agents: ${failed} of 3 failed` : 'test-agents: 3 passed');
process.exit(failed ? 1 : 0);
