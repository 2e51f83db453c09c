// serve.mjs — starts `k3 serve` on the k3-nano fixture on a free loopback port (--port 0; the
// URL is read from the startup line). No npm dependency, so tests/server/harness.mjs and
// tests/web/browser.mjs both import it.
//
// K3_BIN names the k3 binary (make test-server / test-web set it); default: build/k3-test,
// the test build whose K3_TEST_* controls these tests use (server.h, k3_server_test_control).
// Every server still running is killed (SIGKILL) when the test process exits.
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

const here = path.dirname(fileURLToPath(import.meta.url));
export const ROOT = path.resolve(here, '..', '..');
export const K3 = path.resolve(ROOT, process.env.K3_BIN || 'build/k3-test');
export const MODEL = path.join(ROOT, 'tests', 'fixtures', 'k3-nano');

const running = new Set();
process.on('exit', () => { for (const p of running) p.kill('SIGKILL'); });

// Starts a server; resolves to {url, base, proc, banner(), log(), exited, stop()} once it
// prints its URL. `env` adds variables (K3_TEST_TOKEN_DELAY_MS: the test-only pause after
// each token, server.h). `wrap`: a command that runs k3 (e.g. ['unshare', '-rpf'], k3 as pid 1
// of a namespace of its own, as in a container).
export async function startServer(args = [], env = {}, wrap = []) {
  const argv = [...wrap, K3, 'serve', MODEL, '--port', '0', ...args];
  const proc = spawn(argv[0], argv.slice(1), {
    cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'],
  });
  running.add(proc);
  let out = '', err = '';
  proc.stderr.on('data', (d) => { err += d; });
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`k3 serve did not start:\n${out}${err}`)), 20000);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/\S+)\/v1 /);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    // 'close': its stderr is read to the end, so the error names what the server said
    proc.on('close', (code) => { clearTimeout(timer); reject(new Error(`k3 serve exited ${code}:\n${out}${err}`)); });
    proc.on('error', (e) => { clearTimeout(timer); reject(new Error(`cannot run ${K3}: ${e.message}`)); });
  });
  // 'close', not 'exit': the process has ended AND its stdout and stderr are read to the end,
  // so that log() after stop() holds every line it wrote ('exit' can come first).
  const exited = new Promise((resolve) => proc.on('close', (code, sig) => resolve({ code, sig })));
  return {
    url, base: `${url}/v1`, proc, banner: () => out, log: () => err, exited,
    // Stops the server; throws when a sanitizer build (K3_BIN=build-asan/k3) reported errors.
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill('SIGTERM');
        const t = setTimeout(() => proc.kill('SIGKILL'), 10000);
        await exited;
        clearTimeout(t);
      }
      running.delete(proc);
      if (/Sanitizer|runtime error:/.test(err)) throw new Error(`k3 serve reported:\n${err}`);
      return exited;
    },
  };
}
