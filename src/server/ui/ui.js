// k3 chat page: plain JS, no libraries, nothing loaded from outside the server.
//
// Safety rule: text from the model (or the server, or storage) reaches the page only through
// textContent / createTextNode and attribute setters on elements this file creates; nothing
// is ever parsed as HTML. The server also sends a Content-Security-Policy without inline
// script, so an injected <script> would not run even if it became an element.
//
// Conversations are kept in localStorage and sent back whole on every turn, our earlier
// replies with their reasoning_content verbatim, so that k3 serve can reuse the model state
// of the previous turn (only the new message is prefilled).
'use strict';
(() => {
  const LS_CONVS = 'k3.conversations';
  const LS_CURRENT = 'k3.current';
  const LS_SETTINGS = 'k3.settings';
  const SS_KEY = 'k3.apiKey'; // the API key: this tab only
  const STATUS_EVERY_MS = 2000;
  const SAVE_EVERY_MS = 500;

  const $ = (id) => document.getElementById(id);

  // An element with a class and text (never HTML).
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  // ---- storage ------------------------------------------------------------------------

  function loadJSON(store, key, fallback) {
    try {
      const v = JSON.parse(store.getItem(key));
      return v === null ? fallback : v;
    } catch {
      return fallback;
    }
  }

  const state = {
    convs: (() => {
      const v = loadJSON(localStorage, LS_CONVS, []);
      return Array.isArray(v) ? v.filter((c) => c && Array.isArray(c.messages)) : [];
    })(),
    current: localStorage.getItem(LS_CURRENT),
    busy: null,          // {ctl: AbortController, conv, reply} while a reply streams
    model: null,         // the served model id (GET /v1/models)
    views: new WeakMap(), // message object -> its DOM parts, for live updates
    lastSave: 0,
  };

  function saveConvs() {
    state.lastSave = Date.now();
    try {
      localStorage.setItem(LS_CONVS, JSON.stringify(state.convs));
      if (state.current) localStorage.setItem(LS_CURRENT, state.current);
      else localStorage.removeItem(LS_CURRENT);
    } catch (e) {
      notice(`could not save the conversation in this browser: ${e.message}`);
    }
  }

  function currentConv() {
    return state.convs.find((c) => c.id === state.current) || null;
  }

  function newId() {
    return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
  }

  // ---- settings -----------------------------------------------------------------------

  function readSettings() {
    const t = parseFloat($('temperature').value);
    const n = parseInt($('max-tokens').value, 10);
    return {
      thinking: $('thinking').checked,
      effort: $('effort').value,
      temperature: Number.isFinite(t) ? Math.min(2, Math.max(0, t)) : 1,
      maxTokens: Number.isFinite(n) && n > 0 ? n : null,
    };
  }

  function applySettings() {
    const s = loadJSON(localStorage, LS_SETTINGS, {});
    if (typeof s.thinking === 'boolean') $('thinking').checked = s.thinking;
    if (['max', 'high', 'low'].includes(s.effort)) $('effort').value = s.effort;
    if (Number.isFinite(s.temperature)) $('temperature').value = String(s.temperature);
    if (Number.isFinite(s.maxTokens)) $('max-tokens').value = String(s.maxTokens);
    $('effort').disabled = !$('thinking').checked;
  }

  function saveSettings() {
    $('effort').disabled = !$('thinking').checked;
    try {
      localStorage.setItem(LS_SETTINGS, JSON.stringify(readSettings()));
    } catch { /* settings are a convenience */ }
  }

  // ---- the API key --------------------------------------------------------------------

  function authHeaders() {
    const k = sessionStorage.getItem(SS_KEY);
    return k ? { Authorization: `Bearer ${k}` } : {};
  }

  // Shows the key dialog; resolves once a key was entered (or the dialog was closed).
  function askKey(why) {
    const dlg = $('key-dialog');
    const err = $('key-error');
    err.hidden = !why;
    err.textContent = why || '';
    $('key-input').value = '';
    return new Promise((resolve) => {
      const done = () => {
        dlg.removeEventListener('close', done);
        const k = $('key-input').value.trim();
        if (k) sessionStorage.setItem(SS_KEY, k);
        resolve();
      };
      dlg.addEventListener('close', done);
      if (!dlg.open) dlg.showModal();
      $('key-input').focus();
    });
  }

  // GET /v1/models: the model's name, and whether the key (if any is needed) is right.
  async function probe() {
    for (let tries = 0; tries < 100; tries++) {
      let r;
      try {
        r = await fetch('/v1/models', { headers: authHeaders() });
      } catch (e) {
        notice(`cannot reach the server: ${e.message}`);
        return;
      }
      if (r.status === 401) {
        await askKey(sessionStorage.getItem(SS_KEY) ? 'The server refused that key.' : '');
        continue;
      }
      if (r.ok) {
        const j = await r.json().catch(() => null);
        state.model = j && j.data && j.data[0] ? String(j.data[0].id) : null;
        $('model-name').textContent = state.model || '';
        document.title = state.model ? `k3 chat · ${state.model}` : 'k3 chat';
      }
      return;
    }
  }

  // ---- Markdown, as DOM nodes -----------------------------------------------------------

  // Inline spans: `code`, **bold**, *italic*, _italic_, [text](http(s) link). The pattern is
  // used through matchAll (which copies it), so the recursion below does not share state.
  const INLINE = /(`+)([^`][\s\S]*?)\1(?!`)|\*\*(?=\S)([\s\S]+?)\*\*|\*(?=[^\s*])([^*\n]+?)\*|\b_([^_\n]+?)_\b|\[([^\]\n]+)\]\((https?:\/\/[^\s)]+)\)/g;

  function inline(parent, text) {
    let last = 0;
    for (const m of text.matchAll(INLINE)) {
      if (m.index > last) parent.append(document.createTextNode(text.slice(last, m.index)));
      last = m.index + m[0].length;
      if (m[1]) {
        parent.append(el('code', null, m[2]));
      } else if (m[3] !== undefined) {
        const b = el('strong');
        inline(b, m[3]);
        parent.append(b);
      } else if (m[4] !== undefined || m[5] !== undefined) {
        const i = el('em');
        inline(i, m[4] !== undefined ? m[4] : m[5]);
        parent.append(i);
      } else {
        const a = el('a', null, m[6]);
        a.href = m[7]; // http(s) only (the pattern): no javascript: links
        a.rel = 'noopener noreferrer nofollow';
        a.target = '_blank';
        parent.append(a);
      }
    }
    if (last < text.length) parent.append(document.createTextNode(text.slice(last)));
  }

  // Blocks: fenced code, headings, lists, quotes, rules, paragraphs. An unclosed fence (a
  // reply still streaming) runs to the end.
  function markdown(src) {
    const frag = document.createDocumentFragment();
    const lines = src.replace(/\r\n?/g, '\n').split('\n');
    let para = [];
    const flush = () => {
      if (!para.length) return;
      const p = el('p');
      inline(p, para.join('\n'));
      frag.append(p);
      para = [];
    };
    const ITEM = /^\s*([-*+]|\d{1,9}[.)])\s+(.*)$/;
    for (let i = 0; i < lines.length;) {
      const line = lines[i];
      let m;
      if ((m = /^\s*(`{3,}|~{3,})\s*([\w+.#-]*).*$/.exec(line))) {
        flush();
        const fence = m[1];
        const body = [];
        for (i++; i < lines.length && !lines[i].trim().startsWith(fence); i++) body.push(lines[i]);
        i++;
        const pre = el('pre', 'code');
        if (m[2]) pre.append(el('span', 'lang', m[2]));
        pre.append(el('code', null, body.join('\n')));
        frag.append(pre);
      } else if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
        flush();
        frag.append(el('hr'));
        i++;
      } else if ((m = /^(#{1,6})\s+(.*)$/.exec(line))) {
        flush();
        const h = el(`h${Math.min(6, m[1].length + 2)}`);
        inline(h, m[2]);
        frag.append(h);
        i++;
      } else if ((m = ITEM.exec(line))) {
        flush();
        const ordered = /\d/.test(m[1]);
        const list = el(ordered ? 'ol' : 'ul');
        for (; i < lines.length && (m = ITEM.exec(lines[i])) && /\d/.test(m[1]) === ordered; i++) {
          const li = el('li');
          inline(li, m[2]);
          list.append(li);
        }
        frag.append(list);
      } else if (/^\s*>/.test(line)) {
        flush();
        const q = [];
        for (; i < lines.length && /^\s*>/.test(lines[i]); i++) q.push(lines[i].replace(/^\s*>\s?/, ''));
        const bq = el('blockquote');
        bq.append(markdown(q.join('\n')));
        frag.append(bq);
      } else if (!line.trim()) {
        flush();
        i++;
      } else {
        para.push(line);
        i++;
      }
    }
    flush();
    return frag;
  }

  // ---- rendering ------------------------------------------------------------------------

  function notice(text) {
    const n = $('notice');
    n.textContent = text || '';
    n.hidden = !text;
  }

  function renderConvList() {
    const nav = $('conversations');
    nav.replaceChildren();
    const sorted = [...state.convs].sort((a, b) => (b.updated || 0) - (a.updated || 0));
    for (const c of sorted) {
      const row = el('div', c.id === state.current ? 'conv current' : 'conv');
      row.tabIndex = 0;
      row.setAttribute('role', 'button');
      row.dataset.id = c.id;
      const title = el('span', 'title', c.title || 'New chat');
      title.title = c.title || '';
      const del = el('button', 'del', '×');
      del.type = 'button';
      del.title = 'Delete this conversation';
      del.setAttribute('aria-label', `Delete conversation ${c.title || ''}`);
      del.addEventListener('click', (e) => {
        e.stopPropagation();
        if (state.busy && state.busy.conv === c) state.busy.ctl.abort();
        state.convs = state.convs.filter((x) => x !== c);
        if (state.current === c.id) state.current = null;
        saveConvs();
        renderAll();
      });
      const open = () => {
        state.current = c.id;
        saveConvs();
        renderAll();
        $('input').focus();
      };
      row.addEventListener('click', open);
      row.addEventListener('keydown', (e) => {
        if (e.key === 'Enter' || e.key === ' ') {
          e.preventDefault();
          open();
        }
      });
      row.append(title, del);
      nav.append(row);
    }
  }

  function userNode(m) {
    const d = el('div', 'msg user');
    d.append(el('div', 'who', 'You'), el('div', 'body', m.content));
    return d;
  }

  function assistantNode(m) {
    const d = el('div', 'msg assistant');
    const think = el('details', 'thinking');
    const summary = el('summary', null, 'Thinking');
    const thinkText = el('div', 'text');
    think.append(summary, thinkText);
    const v = { root: d, think, summary, thinkText, tools: el('div', 'tools'),
                body: el('div', 'body'), meta: el('div', 'meta'), userToggled: false,
                shownContent: null };
    summary.addEventListener('click', () => { v.userToggled = true; });
    d.append(el('div', 'who', 'k3'), think, v.tools, v.body, v.meta);
    state.views.set(m, v);
    updateAssistant(m, false);
    return d;
  }

  function metaText(m) {
    const parts = [];
    const u = m.usage;
    if (u) {
      const cached = u.prompt_tokens_details ? u.prompt_tokens_details.cached_tokens : 0;
      parts.push(`${u.completion_tokens} tokens`);
      parts.push(`prompt ${u.prompt_tokens}${cached ? ` (${cached} reused)` : ''}`);
    }
    if (m.tokensPerS) parts.push(`${m.tokensPerS.toFixed(1)} tokens/s`);
    if (m.finish && m.finish !== 'stop') parts.push(`finish: ${m.finish}`);
    return parts.join(' · ');
  }

  // Brings a reply's view up to date (live: it is still streaming).
  function updateAssistant(m, live) {
    const v = state.views.get(m);
    if (!v) return;
    const reasoning = m.reasoning_content || '';
    v.think.hidden = !reasoning;
    v.thinkText.textContent = reasoning;
    v.summary.textContent = live && !m.content ? 'Thinking…' : `Thought (${reasoning.length} characters)`;
    if (!v.userToggled) v.think.open = live && !m.content; // closes once the answer starts
    v.tools.replaceChildren();
    for (const t of m.tool_calls || []) {
      const box = el('div', 'tool-call');
      const f = t.function || {};
      box.append(el('span', null, 'tool call '), el('span', 'name', f.name || '(unnamed)'));
      if (t.id) box.append(el('span', 'call-id', ` ${t.id}`));
      box.append(el('pre', null, f.arguments || ''));
      v.tools.append(box);
    }
    if (v.shownContent !== m.content) {
      v.body.replaceChildren(markdown(m.content || ''));
      v.shownContent = m.content;
    }
    v.body.classList.toggle('cursor', live);
    v.meta.replaceChildren();
    if (m.error) v.meta.append(el('span', 'error', m.error));
    if (m.stopped) v.meta.append(el('span', 'stopped', 'stopped'));
    const t = metaText(m);
    if (t) v.meta.append(el('span', null, (m.error || m.stopped ? ' · ' : '') + t));
  }

  function nearBottom(box) {
    return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
  }

  function renderChat() {
    const box = $('messages');
    box.replaceChildren();
    const c = currentConv();
    if (!c || !c.messages.length) {
      const hint = el('div', 'msg');
      hint.append(el('p', 'meta', 'A new conversation. Replies stream as they are generated; ' +
        'thinking shows dimmed above the answer. Conversations stay in this browser.'));
      box.append(hint);
      return;
    }
    for (const m of c.messages) box.append(m.role === 'user' ? userNode(m) : assistantNode(m));
    box.scrollTop = box.scrollHeight;
  }

  function renderAll() {
    renderConvList();
    renderChat();
  }

  function setBusy(busy) {
    $('send').disabled = busy;
    $('stop').disabled = !busy;
    $('chat').dataset.state = busy ? 'streaming' : 'idle';
  }

  // ---- a turn -------------------------------------------------------------------------

  // The conversation as the API wants it: our replies with their thinking, failed ones left out.
  function wire(messages) {
    const out = [];
    for (const m of messages) {
      if (m.role === 'user') {
        out.push({ role: 'user', content: m.content });
      } else if (m.role === 'assistant' && !m.error) {
        const w = { role: 'assistant', content: m.content || '' };
        if (m.reasoning_content) w.reasoning_content = m.reasoning_content;
        if (m.tool_calls && m.tool_calls.length) w.tool_calls = m.tool_calls;
        out.push(w);
      }
    }
    return out;
  }

  // One SSE event's data into the reply; returns false at [DONE].
  function takeEvent(data, m, clock) {
    if (data === '[DONE]') return false;
    let j;
    try {
      j = JSON.parse(data);
    } catch {
      return true;
    }
    if (j.error) throw new Error(j.error.message || 'the server reported an error');
    if (j.usage) m.usage = j.usage;
    const ch = j.choices && j.choices[0];
    if (!ch) return true;
    const d = ch.delta || {};
    const r = d.reasoning_content ?? d.reasoning;
    if (typeof r === 'string' && r) m.reasoning_content = (m.reasoning_content || '') + r;
    if (typeof d.content === 'string' && d.content) m.content += d.content;
    if (Array.isArray(d.tool_calls)) {
      m.tool_calls = m.tool_calls || [];
      for (const t of d.tool_calls) {
        const at = Number.isInteger(t.index) ? t.index : m.tool_calls.length;
        const call = m.tool_calls[at] || (m.tool_calls[at] = { id: '', type: 'function', function: { name: '', arguments: '' } });
        if (t.id) call.id = t.id;
        if (t.type) call.type = t.type;
        if (t.function) {
          if (t.function.name) call.function.name += t.function.name;
          if (t.function.arguments) call.function.arguments += t.function.arguments;
        }
      }
    }
    if ((r || d.content || d.tool_calls) && clock) {
      const now = performance.now();
      if (!clock.first) clock.first = now;
      clock.last = now;
      clock.n++;
    }
    if (ch.finish_reason) m.finish = ch.finish_reason;
    return true;
  }

  async function send(text) {
    if (state.busy) return;
    notice('');
    let conv = currentConv();
    if (!conv) {
      conv = { id: newId(), title: '', created: Date.now(), updated: Date.now(), messages: [] };
      state.convs.push(conv);
      state.current = conv.id;
    }
    const s = readSettings();
    const history = wire(conv.messages);
    conv.messages.push({ role: 'user', content: text });
    if (!conv.title) conv.title = text.split('\n')[0].slice(0, 60);
    const reply = { role: 'assistant', content: '', reasoning_content: '' };
    conv.messages.push(reply);
    conv.updated = Date.now();
    saveConvs();
    renderAll();
    const body = {
      model: state.model || 'k3',
      messages: [...history, { role: 'user', content: text }],
      stream: true,
      stream_options: { include_usage: true },
      temperature: s.temperature,
      reasoning_effort: s.thinking ? s.effort : 'none',
    };
    if (s.maxTokens) body.max_tokens = s.maxTokens;
    const ctl = new AbortController();
    state.busy = { ctl, conv, reply };
    setBusy(true);
    const clock = { first: 0, last: 0, n: 0 };
    let frame = 0;
    const redraw = () => {
      frame = 0;
      const box = $('messages');
      const stick = nearBottom(box);
      updateAssistant(reply, true);
      if (stick) box.scrollTop = box.scrollHeight;
      if (Date.now() - state.lastSave > SAVE_EVERY_MS) saveConvs();
    };
    try {
      const res = await fetch('/v1/chat/completions', {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', ...authHeaders() },
        body: JSON.stringify(body),
        signal: ctl.signal,
      });
      if (!res.ok) {
        let msg = `HTTP ${res.status}`;
        try {
          const j = await res.json();
          if (j.error && j.error.message) msg = j.error.message;
        } catch { /* not JSON */ }
        if (res.status === 401) {
          askKey('The server needs an API key; send the message again after entering it.');
        }
        throw new Error(msg);
      }
      const reader = res.body.getReader();
      const dec = new TextDecoder();
      let buf = '';
      let more = true;
      while (more) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true }).replace(/\r\n?/g, '\n');
        let k;
        while (more && (k = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, k);
          buf = buf.slice(k + 2);
          const data = ev.split('\n').filter((l) => l.startsWith('data:'))
            .map((l) => l.slice(5).replace(/^ /, '')).join('\n');
          if (data) more = takeEvent(data, reply, clock);
        }
        if (!frame) frame = requestAnimationFrame(redraw);
      }
      if (more) throw new Error('the stream ended early (the server stopped?)');
    } catch (e) {
      if (e.name === 'AbortError') reply.stopped = true;
      else reply.error = e.message;
    } finally {
      ctl.abort(); // after an error event or a cut stream, let go of the connection too
      if (frame) cancelAnimationFrame(frame);
      // Our own clock, over the deltas after the first; too short a span says nothing.
      if (clock.n > 1 && clock.last - clock.first > 250) {
        reply.tokensPerS = ((reply.usage ? reply.usage.completion_tokens : clock.n) - 1) /
                           ((clock.last - clock.first) / 1000);
      }
      state.busy = null;
      conv.updated = Date.now();
      saveConvs();
      updateAssistant(reply, false);
      setBusy(false);
      refreshStatus();
      setTimeout(refreshStatus, 400); // the worker files its figures just after the stream ends
    }
  }

  function submit() {
    const input = $('input');
    const text = input.value;
    if (!text.trim() || state.busy) return;
    input.value = '';
    send(text);
  }

  // ---- the status panel -----------------------------------------------------------------

  function fmt(x, digits) {
    return Number.isFinite(x) ? x.toFixed(digits) : '–';
  }

  function renderStatus(h) {
    const dl = $('status-list');
    dl.replaceChildren();
    const row = (k, v) => dl.append(el('dt', null, k), el('dd', null, v));
    if (!h) {
      row('server', 'not answering');
      return;
    }
    row('state', h.generating ? 'generating' : 'idle');
    row('queue', `${h.queued} waiting (limit ${h.queue_limit})`);
    row('replies', `${h.generations} (${h.completion_tokens} tokens)`);
    if (h.context_tokens) row('context', `${h.context_tokens} tokens`);
    const g = h.last_generation;
    if (g) {
      row('last', `${g.completion_tokens} tokens, ${fmt(g.tokens_per_s, 1)} tokens/s`);
      row('prompt', `${g.prompt_tokens} (${g.cached_tokens} reused), ${fmt(g.prefill_s, 2)} s`);
      row('read', `${fmt(g.gb_per_token, 3)} GB/token`);
    }
    if (h.expert_hit_rate !== undefined) {
      row('hit rate', h.expert_hit_rate === null ? '–' : `${fmt(100 * h.expert_hit_rate, 1)} %`);
    }
    const plan = [h.memory_plan, h.device].filter(Boolean).join('\n');
    $('status-plan').hidden = !plan;
    $('status-plan-text').textContent = plan;
  }

  async function refreshStatus() {
    try {
      const r = await fetch('/health', { cache: 'no-store' });
      renderStatus(r.ok ? await r.json() : null);
    } catch {
      renderStatus(null);
    }
  }

  // /metrics, where the server has it (it may not): shown as text, quietly hidden otherwise.
  async function refreshMetrics() {
    try {
      const r = await fetch('/metrics', { cache: 'no-store', headers: authHeaders() });
      const type = r.headers.get('Content-Type') || '';
      if (!r.ok || !type.startsWith('text/plain')) return;
      $('metrics-text').textContent = await r.text();
      $('metrics').hidden = false;
    } catch { /* no metrics */ }
  }

  // ---- wiring -------------------------------------------------------------------------

  function init() {
    applySettings();
    for (const id of ['thinking', 'effort', 'temperature', 'max-tokens']) {
      $(id).addEventListener('change', saveSettings);
    }
    $('settings').addEventListener('submit', (e) => e.preventDefault());
    $('composer').addEventListener('submit', (e) => {
      e.preventDefault();
      submit();
    });
    $('input').addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.altKey && !e.isComposing) {
        e.preventDefault();
        submit();
      }
    });
    $('stop').addEventListener('click', () => state.busy && state.busy.ctl.abort());
    document.addEventListener('keydown', (e) => {
      if (e.key === 'Escape' && state.busy && !$('key-dialog').open) {
        e.preventDefault();
        state.busy.ctl.abort();
      } else if (e.altKey && (e.key === 'n' || e.key === 'N')) {
        e.preventDefault();
        $('new-chat').click();
      }
    });
    $('new-chat').addEventListener('click', () => {
      state.current = null;
      saveConvs();
      renderAll();
      $('input').focus();
    });
    if (!currentConv()) state.current = null;
    setBusy(false);
    renderAll();
    renderStatus(null);
    refreshStatus();
    setInterval(() => { if (!document.hidden) refreshStatus(); }, STATUS_EVERY_MS);
    probe().then(refreshMetrics).finally(() => {
      document.body.dataset.ready = '1';
      $('input').focus();
    });
  }

  init();
})();
