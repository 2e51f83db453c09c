// The chat page of `k3 serve` (src/server/ui/) in a real headless Chromium against the
// fixture model: streaming, stop, state reuse across turns, persistence across a reload,
// keyboard use, safe rendering of a scripted hostile reply, and the API key prompt.
// Screenshots go to build/web-artifacts/; K3_WEB_DOCS_SHOT=PATH also writes the README's.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { startServer, health, launch, shot, sseBody, sleep } from './browser.mjs';

const READY = 'body[data-ready="1"]';
const IDLE = '#chat[data-state="idle"]';

// Texts of every message on the page: [{role, thinking, body, meta}].
function messages(page) {
  return page.$$eval('#messages .msg.user, #messages .msg.assistant', (ns) => ns.map((n) => ({
    role: n.classList.contains('user') ? 'user' : 'assistant',
    thinking: n.querySelector('.thinking .text')?.textContent ?? '',
    body: n.querySelector('.body').textContent,
    meta: n.querySelector('.meta')?.textContent ?? '',
  })));
}

// Characters of the last reply so far (thinking + answer).
function replyLength(page) {
  return page.$$eval('#messages .msg.assistant', (ns) => {
    const n = ns[ns.length - 1];
    return n ? n.querySelector('.thinking .text').textContent.length +
               n.querySelector('.body').textContent.length : -1;
  });
}

async function setField(page, sel, value) {
  await page.focus(sel);
  await page.keyboard.down('Control');
  await page.keyboard.press('A');
  await page.keyboard.up('Control');
  await page.keyboard.press('Backspace');
  if (value) await page.keyboard.type(value);
  await page.keyboard.press('Tab'); // 'change' fires; the settings are saved
}

// Presses Enter (sending the message typed) and waits until the reply has streamed and ended.
// A MutationObserver set up before the key notes the streaming state however briefly it lasts
// (from the attribute's old values): a short reply can come and go between two looks of
// waitForSelector('...streaming'), which then waits in vain.
async function sendAndWait(page) {
  await page.evaluate(() => {
    const chat = document.querySelector('#chat');
    window.__k3obs?.disconnect();
    window.__k3streamed = false;
    window.__k3obs = new MutationObserver((recs) => {
      if (chat.dataset.state === 'streaming' || recs.some((r) => r.oldValue === 'streaming'))
        window.__k3streamed = true;
    });
    window.__k3obs.observe(chat, { attributes: true, attributeFilter: ['data-state'], attributeOldValue: true });
  });
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => window.__k3streamed && document.querySelector('#chat').dataset.state === 'idle');
}

// Waits until the server has nothing running (a stopped reply's generation ended).
async function waitServerIdle(srv, limitMs) {
  const t0 = Date.now();
  for (;;) {
    const h = await health(srv);
    if (!h.generating && h.queued === 0) return Date.now() - t0;
    if (Date.now() - t0 > limitMs) throw new Error(`still generating after ${limitMs} ms`);
    await sleep(20);
  }
}

// One Chromium for every suite (starting one takes seconds on a small machine).
let browser;
before(async () => { browser = await launch(); });
after(async () => { await browser?.close(); });

describe('k3 serve chat page', () => {
  let srv, page;
  const outside = [];   // requests that left the server
  const errors = [];    // page errors and console errors

  before(async () => {
    // 20 ms after each token: a reply streams for seconds, so Stop lands mid-stream however
    // fast the machine (k3-nano's whole greedy reply takes ~0.2 s without it) and however
    // slowly a loaded one clicks (the 273 ids of the reply it stops take 5 s).
    srv = await startServer([], { K3_TEST_TOKEN_DELAY_MS: '20' });
    page = await browser.newPage();
    page.on('request', (r) => {
      if (!r.url().startsWith(srv.url) && !r.url().startsWith('data:')) outside.push(r.url());
    });
    page.on('pageerror', (e) => errors.push(`pageerror: ${e.message}`));
    page.on('console', (m) => { if (m.type() === 'error') errors.push(`console: ${m.text()}`); });
  });

  after(async () => {
    await page?.close();
    await srv?.stop();
  });

  test('the page comes from the binary, with nothing loaded from outside', async () => {
    const res = await page.goto(`${srv.url}/`, { waitUntil: 'load' });
    assert.equal(res.status(), 200);
    assert.match(res.headers()['content-type'], /^text\/html/);
    assert.match(res.headers()['content-security-policy'], /script-src 'self'/);
    await page.waitForSelector(READY);
    assert.equal(await page.$eval('#model-name', (e) => e.textContent), 'k3-nano');
    assert.equal((await page.goto(`${srv.url}/ui`)).status(), 200);
    await page.waitForSelector(READY);
    await page.waitForFunction(() => document.querySelector('#status-list').textContent.includes('idle'));
    const status = await page.$eval('#status', (e) => e.textContent);
    assert.match(status, /memory plan: base/); // /health's memory_plan line
    assert.deepEqual(outside, []);
    await shot(page, '01-empty');
  });

  test('keyboard only: Shift+Enter is a new line, Enter sends; the reply streams', async () => {
    // Greedy: the fixture then writes on to the token limit (sampled, it may stop after a few);
    // at the server's 20 ms a token 300 ids stream for 6 s, so the streaming state is seen.
    await setField(page, '#temperature', '0');
    await setField(page, '#max-tokens', '300');
    await page.focus('#input');
    await page.keyboard.type('line one');
    await page.keyboard.down('Shift');
    await page.keyboard.press('Enter');
    await page.keyboard.up('Shift');
    await page.keyboard.type('line two');
    assert.equal(await page.$eval('#input', (e) => e.value), 'line one\nline two');
    assert.equal((await messages(page)).length, 0, 'Shift+Enter must not send');
    await page.keyboard.press('Enter');
    await page.waitForSelector('#chat[data-state="streaming"]');
    // Watch the reply grow while it streams: several different lengths, each longer.
    const seen = [];
    for (;;) {
      const streaming = await page.$('#chat[data-state="streaming"]');
      const n = await replyLength(page);
      if (n > 0 && n !== seen[seen.length - 1]) seen.push(n);
      if (!streaming) break;
      await sleep(15);
    }
    // The reply is seen growing in several steps; a stalled browser could miss them all, so one
    // length is the least asserted here (the SSE deltas themselves are checked token by token
    // in tests/server).
    assert.ok(seen.length >= 1, `the reply streamed in, saw lengths ${seen}`);
    for (let i = 1; i < seen.length; i++) assert.ok(seen[i] > seen[i - 1], `${seen}`);
    const ms = await messages(page);
    assert.equal(ms.length, 2);
    assert.deepEqual(ms[0], { role: 'user', thinking: '', body: 'line one\nline two', meta: '' });
    assert.ok(ms[1].thinking.length > 0, 'thinking is on by default: reasoning_content shows');
    assert.match(ms[1].meta, /^300 tokens · prompt \d+ (· [\d.]+ tokens\/s )?· finish: length$/);
    assert.equal(await page.$eval('#input', (e) => e.value), '');
    assert.equal(await page.evaluate(() => document.activeElement.id), 'input');
    // The thinking is dimmed and folds: closed once done, opened by its summary.
    const look = await page.$eval('#messages .msg.assistant', (n) => ({
      think: getComputedStyle(n.querySelector('.thinking')).color,
      body: getComputedStyle(n.querySelector('.body')).color,
      open: n.querySelector('.thinking').open,
    }));
    assert.notEqual(look.think, look.body);
    assert.equal(look.open, false);
    await page.click('#messages .msg.assistant .thinking summary');
    assert.equal(await page.$eval('#messages .msg.assistant .thinking', (e) => e.open), true);
    await shot(page, '02-streamed');
  });

  test('the next turn resends the conversation and the server reuses its state', async () => {
    const before = await health(srv);
    await page.focus('#input');
    await page.keyboard.type('and then?');
    await sendAndWait(page);
    const h = await health(srv);
    assert.equal(h.generations, before.generations + 1);
    const g = h.last_generation;
    // Everything up to our previous reply was reused: only the new message was prefilled.
    assert.ok(g.cached_tokens > before.last_generation.prompt_tokens,
              `cached ${g.cached_tokens} of ${g.prompt_tokens}, previous prompt ${before.last_generation.prompt_tokens}`);
    const ms = await messages(page);
    assert.equal(ms.length, 4);
    assert.match(ms[3].meta, new RegExp(`prompt ${g.prompt_tokens} \\(${g.cached_tokens} reused\\)`));
    assert.match(await page.$eval('#status', (e) => e.textContent), new RegExp(`${g.cached_tokens} reused`));
  });

  test('a reload finds the conversation in the browser', async () => {
    const was = await messages(page);
    await page.reload({ waitUntil: 'load' });
    await page.waitForSelector(READY);
    assert.deepEqual(await messages(page), was);
    const convs = await page.$$eval('#conversations .conv .title', (ns) => ns.map((n) => n.textContent));
    assert.deepEqual(convs, ['line one']);
    assert.equal(await page.$eval('#max-tokens', (e) => e.value), '300', 'settings are kept too');
    await shot(page, '03-reloaded');
  });

  test('Stop ends a reply mid-stream and the server stops generating', async () => {
    await page.keyboard.down('Alt');
    await page.keyboard.press('n'); // new chat
    await page.keyboard.up('Alt');
    assert.equal((await messages(page)).length, 0);
    await setField(page, '#max-tokens', ''); // no limit: runs until stopped
    await page.focus('#input');
    await page.keyboard.type('a long story please');
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => {
      const t = document.querySelector('#messages .msg.assistant .thinking .text');
      return t && t.textContent.length > 0;
    }); // the first text: with the server's 10 ms per token, the reply has seconds to go
    await page.click('#stop');
    await page.waitForSelector(IDLE, { timeout: 30000 });
    const ms = await waitServerIdle(srv, 30000);
    const h = await health(srv);
    assert.ok(h.last_generation.completion_tokens < 4000, 'stopped long before the context end');
    const [, reply] = await messages(page);
    assert.match(reply.meta, /^stopped/);
    assert.ok(reply.thinking.length > 0);
    // Escape stops too (keyboard only).
    await page.focus('#input');
    await page.keyboard.type('again');
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => {
      const ns = document.querySelectorAll('#messages .msg.assistant .thinking .text');
      return ns.length === 2 && ns[1].textContent.length > 0;
    });
    await page.keyboard.press('Escape');
    await page.waitForSelector(IDLE, { timeout: 30000 });
    await waitServerIdle(srv, 30000);
    assert.match((await messages(page))[3].meta, /^stopped/);
    await shot(page, '04-stopped');
    console.log(`# server idle ${ms} ms after Stop`);
    const convs = await page.$$eval('#conversations .conv', (ns) => ns.length);
    assert.equal(convs, 2);
  });

  test('a hostile scripted reply stays text: no <script>, no <img onerror>, no javascript: link', async () => {
    const hostile = {
      reasoning: ['I will <b>not</b> be bold. ', '<img src=x onerror="window.__k3pwned=1">'],
      content: [
        'Here: <script>window.__k3pwned=2</script>\n\n',
        '**bold** and `<i>code</i>` and [a link](javascript:window.__k3pwned=3)',
        ' and [ok](http://127.0.0.1/doc)\n\n',
        '```html\n<img src=x onerror="window.__k3pwned=4">\n```\n',
        '- one <svg onload="window.__k3pwned=5">\n- two\n',
      ],
      toolCalls: [
        { index: 0, id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '' } },
        { index: 0, function: { arguments: '{"city": "<script>x</script>"}' } },
      ],
      usage: { prompt_tokens: 12, completion_tokens: 34, total_tokens: 46 },
    };
    const body = sseBody(hostile);
    await page.setRequestInterception(true);
    const onReq = (r) => {
      if (r.method() === 'POST' && r.url().endsWith('/v1/chat/completions')) {
        r.respond({ status: 200, headers: { 'Content-Type': 'text/event-stream' }, body });
      } else {
        r.continue();
      }
    };
    page.on('request', onReq);
    try {
      await page.click('#new-chat');
      await page.focus('#input');
      await page.keyboard.type('<script>window.__k3pwned=6</script>');
      await page.keyboard.press('Enter');
      await page.waitForFunction(() => document.querySelectorAll('#messages .msg').length === 2 &&
                                       document.querySelector('#chat').dataset.state === 'idle');
    } finally {
      page.off('request', onReq);
      await page.setRequestInterception(false);
    }
    const check = async () => {
      const r = await page.evaluate(() => {
        const box = document.querySelector('#messages');
        const a = box.querySelector('.msg.assistant');
        return {
          pwned: window.__k3pwned,
          bad: box.querySelectorAll('script, img, svg, iframe, [onerror], [onload], i, b').length,
          user: box.querySelector('.msg.user .body').textContent,
          thinking: a.querySelector('.thinking .text').textContent,
          body: a.querySelector('.body').textContent,
          code: a.querySelector('pre.code code')?.textContent,
          lang: a.querySelector('pre.code .lang')?.textContent,
          strong: a.querySelector('strong')?.textContent,
          inlineCode: a.querySelector('p code')?.textContent,
          links: [...a.querySelectorAll('a')].map((l) => l.getAttribute('href')),
          items: [...a.querySelectorAll('li')].map((l) => l.textContent),
          tool: a.querySelector('.tool-call .name')?.textContent,
          toolArgs: a.querySelector('.tool-call pre')?.textContent,
          meta: a.querySelector('.meta').textContent,
        };
      });
      assert.equal(r.pwned, undefined);
      assert.equal(r.bad, 0, 'no element was made from model text');
      assert.equal(r.user, '<script>window.__k3pwned=6</script>');
      assert.equal(r.thinking, 'I will <b>not</b> be bold. <img src=x onerror="window.__k3pwned=1">');
      assert.ok(r.body.includes('Here: <script>window.__k3pwned=2</script>'), r.body);
      assert.ok(r.body.includes('[a link](javascript:window.__k3pwned=3)'), 'a javascript: link stays text');
      assert.deepEqual(r.links, ['http://127.0.0.1/doc']);
      assert.equal(r.code, '<img src=x onerror="window.__k3pwned=4">');
      assert.equal(r.lang, 'html');
      assert.equal(r.strong, 'bold');
      assert.equal(r.inlineCode, '<i>code</i>');
      assert.deepEqual(r.items, ['one <svg onload="window.__k3pwned=5">', 'two']);
      assert.equal(r.tool, 'get_weather');
      assert.equal(r.toolArgs, '{"city": "<script>x</script>"}');
      assert.match(r.meta, /^34 tokens · prompt 12/);
    };
    await check();
    await shot(page, '05-hostile');
    await page.reload({ waitUntil: 'load' }); // rendered again from localStorage
    await page.waitForSelector(READY);
    await check();
  });

  test('errors show the server\'s message; failed replies are not sent back', async () => {
    const answers = [
      { status: 429, headers: { 'Content-Type': 'application/json', 'Retry-After': '1' },
        body: JSON.stringify({ error: { message: 'k3 is generating another reply (one at a time); retry later',
                                        type: 'rate_limit_error', param: null, code: 'rate_limit_exceeded' } }) },
      { status: 200, headers: { 'Content-Type': 'text/event-stream' },
        body: `${sseBody({ reasoning: ['half a thought'] }).split('data: {"id"').slice(0, 3).join('data: {"id"')}` +
              'data: {"error":{"message":"generation failed: disk","type":"server_error","param":null,"code":null}}\n\n' },
      { status: 200, headers: { 'Content-Type': 'text/event-stream' }, body: sseBody({ content: ['fine'] }) },
    ];
    const sent = [];
    await page.setRequestInterception(true);
    const onReq = (r) => {
      if (r.method() === 'POST' && r.url().endsWith('/v1/chat/completions')) {
        sent.push(JSON.parse(r.postData()));
        r.respond(answers[sent.length - 1]);
      } else {
        r.continue();
      }
    };
    page.on('request', onReq);
    try {
      await page.click('#new-chat');
      for (const [i, text] of ['one', 'two', 'three'].entries()) {
        await page.focus('#input');
        await page.keyboard.type(text);
        await page.keyboard.press('Enter');
        await page.waitForFunction((n) => document.querySelectorAll('#messages .msg').length === n &&
                                           document.querySelector('#chat').dataset.state === 'idle', {}, 2 * (i + 1));
      }
    } finally {
      page.off('request', onReq);
      await page.setRequestInterception(false);
    }
    const ms = await messages(page);
    assert.equal(ms[1].meta, 'k3 is generating another reply (one at a time); retry later');
    assert.equal(ms[3].thinking, 'half a thought');
    assert.equal(ms[3].meta, 'generation failed: disk');
    assert.equal(ms[5].body, 'fine');
    assert.deepEqual(sent[2].messages, [{ role: 'user', content: 'one' }, { role: 'user', content: 'two' },
                                        { role: 'user', content: 'three' }]);
    assert.equal(sent[2].stream, true);
    assert.equal(sent[2].reasoning_effort, 'max');
    assert.equal(sent[2].temperature, 0); // as set in the first test
    await shot(page, '06-errors');
  });

  test('the README screenshot (a scripted reply: the fixture model writes noise)', async () => {
    const body = sseBody({
      reasoning: ['The user wants a quick way to count lines in a file. ',
                  '`wc -l` does it; a Python version shows the idea too.'],
      content: ['Use **`wc -l`**:\n\n```sh\nwc -l notes.txt\n```\n\n',
                'or, in Python:\n\n```python\nwith open("notes.txt") as f:\n',
                '    print(sum(1 for _ in f))\n```\n\n- both count newline characters\n',
                '- an unterminated last line is not counted by `wc`\n'],
      usage: { prompt_tokens: 41, completion_tokens: 96, total_tokens: 137,
               prompt_tokens_details: { cached_tokens: 0 } },
    });
    // A fresh profile, so that the sidebar holds this conversation only.
    const ctx = await browser.createBrowserContext();
    const page = await ctx.newPage();
    await page.goto(`${srv.url}/`, { waitUntil: 'load' });
    await page.waitForSelector(READY);
    await page.setRequestInterception(true);
    const onReq = (r) => (r.method() === 'POST' && r.url().endsWith('/v1/chat/completions')
      ? r.respond({ status: 200, headers: { 'Content-Type': 'text/event-stream' }, body })
      : r.continue());
    page.on('request', onReq);
    try {
      await page.focus('#input');
      await page.keyboard.type('How do I count the lines of a file?');
      await page.keyboard.press('Enter');
      await page.waitForFunction(() => document.querySelectorAll('#messages .msg').length === 2 &&
                                       document.querySelector('#chat').dataset.state === 'idle');
    } finally {
      page.off('request', onReq);
      await page.setRequestInterception(false);
    }
    await page.click('#messages .msg.assistant .thinking summary');
    await page.click('#status-plan summary');
    const file = await shot(page, 'web-ui');
    if (process.env.K3_WEB_DOCS_SHOT) fs.copyFileSync(file, process.env.K3_WEB_DOCS_SHOT);
    assert.equal(await page.$$eval('#messages pre.code', (ns) => ns.length), 2);
    await ctx.close();
  });

  test('no page errors and nothing fetched from outside the server', () => {
    // The browser logs each 404 (/metrics: none yet) and the scripted 429 itself.
    assert.deepEqual(errors.filter((e) => !/responded with a status of (404|429)/.test(e)), []);
    assert.deepEqual(outside, []);
  });
});

describe('k3 serve --api-key: the page asks for the key', () => {
  let srv;
  const KEY = 'sekrit-key-123';

  // 10 ms a token: the 5-token reply streams for a while (sendAndWait sees it however briefly).
  before(async () => { srv = await startServer(['--api-key', KEY], { K3_TEST_TOKEN_DELAY_MS: '10' }); });
  after(async () => { await srv?.stop(); });

  test('served without the key; the key is asked for, kept for the tab, sent as Bearer', async () => {
    const api = await fetch(`${srv.url}/v1/models`);
    assert.equal(api.status, 401, 'the API still needs the key');
    const ctx = await browser.createBrowserContext();
    const page = await ctx.newPage();
    const auth = [];
    page.on('request', (r) => { if (r.url().includes('/v1/')) auth.push(r.headers().authorization); });
    const res = await page.goto(`${srv.url}/`, { waitUntil: 'load' });
    assert.equal(res.status(), 200, 'the page needs no key');
    await page.waitForSelector('#key-dialog[open]');
    await page.keyboard.type('wrong');
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => !document.querySelector('#key-error').hidden &&
                                     document.querySelector('#key-dialog').open);
    assert.match(await page.$eval('#key-error', (e) => e.textContent), /refused/);
    await shot(page, '07-key');

    await page.keyboard.type(KEY);
    await page.keyboard.press('Enter');
    await page.waitForSelector(READY);
    assert.equal(await page.$eval('#key-dialog', (e) => e.open), false);
    assert.equal(await page.$eval('#model-name', (e) => e.textContent), 'k3-nano');
    await setField(page, '#temperature', '0');
    await setField(page, '#max-tokens', '5');
    await page.focus('#input');
    await page.keyboard.type('hi');
    await sendAndWait(page);
    const [, reply] = await messages(page);
    assert.match(reply.meta, /^5 tokens/);
    assert.equal(auth[auth.length - 1], `Bearer ${KEY}`);
    const stored = await page.evaluate(() => ({
      session: sessionStorage.getItem('k3.apiKey'),
      local: JSON.stringify({ ...localStorage }),
    }));
    assert.equal(stored.session, KEY);
    assert.ok(!stored.local.includes(KEY), 'the key is not kept beyond the tab');
    // Another tab (a fresh browsing context) asks again.
    const other = await (await browser.createBrowserContext()).newPage();
    await other.goto(`${srv.url}/ui`, { waitUntil: 'load' });
    await other.waitForSelector('#key-dialog[open]');

    await ctx.close();
  });
});
