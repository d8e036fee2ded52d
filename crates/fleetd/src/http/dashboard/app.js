// fleetd's dashboard: the fleet live from GET /events, actions through the REST API. No build
// step and no library; every text from the daemon goes into the page as text, never as markup.
'use strict';

(() => {
  const $ = (id) => document.getElementById(id);
  const OPEN = new Set(['queued', 'delivered', 'working']);
  const HOUR = 3600 * 1000;
  const KEEP_EVENTS = 200;
  const KEEP_TICKETS = 300;

  const model = {
    members: new Map(),
    // Members waiting on a dialog: target → its member.blocked event.
    blocked: new Map(),
    questions: new Map(),
    tickets: new Map(),
    events: [],
    alerts: [],
    delivery: [],
    nudge: [],
    // The server's record of the last hour's latencies covers every event stamped up to this
    // moment; later events add their own sample (GET /events/latency).
    latencyAt: -Infinity,
    selected: null,
    detail: null,
  };
  let lastId = null;
  let received = 0;
  let phase = 'replay'; // replay → loading (snapshot in flight) → live
  let buffered = [];
  let renderQueued = false;
  let retryDelay = 500;
  // What changed since the last frame: only that is redrawn (a burst of thousands of events
  // must not rebuild the page for each one).
  const dirty = {
    allMembers: true, members: new Set(), questions: true, alerts: true, tickets: true,
    charts: true, blocked: true,
  };
  // A notice's link opens the page at one member (`#member=NAME`): its dialog, else its details.
  // Kept across a sign-in in another tab (the link `fleetd dashboard` prints) for a few minutes.
  let focusMember = null;
  const FOCUS_KEPT_MS = 10 * 60 * 1000;
  function takeFocus() {
    const m = /(?:^#|&)member=([A-Za-z0-9_@.-]+)/.exec(location.hash);
    if (m) {
      focusMember = m[1];
      try { localStorage.setItem('fleetd.focus', JSON.stringify({ member: m[1], at: Date.now() })); } catch (_) { /* private mode */ }
      return;
    }
    try {
      const kept = JSON.parse(localStorage.getItem('fleetd.focus') || 'null');
      if (kept && Date.now() - kept.at < FOCUS_KEPT_MS) focusMember = kept.member;
    } catch (_) { /* nothing kept */ }
  }
  function focusTaken() {
    focusMember = null;
    try { localStorage.removeItem('fleetd.focus'); } catch (_) { /* private mode */ }
  }
  takeFocus();
  let eventSeq = 0; // events recorded so far (each gets its number)
  let eventsShown = 0; // the number of the newest event in the log
  let slowAt = 0; // when the tickets and charts were last drawn
  let slowTimer = null; // a frame owed to them
  let started = false; // the app is shown and following the stream
  let ticker = null; // the once-a-second redraw (ages)

  // ---- helpers -------------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') node.className = v;
      else if (k === 'text') node.textContent = v;
      else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? '' : String(v));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function human(ms) {
    if (!(ms >= 0)) return '—';
    const s = Math.floor(ms / 1000);
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, '0')}s`;
    return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, '0')}m`;
  }

  function millis(ms) {
    if (ms < 1000) return `${Math.round(ms)} ms`;
    return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
  }

  // A UUIDv7's first 48 bits are its creation time in milliseconds.
  function uuidTime(id) {
    const hex = String(id || '').replace(/-/g, '').slice(0, 12);
    const ms = parseInt(hex, 16);
    return Number.isFinite(ms) ? ms : NaN;
  }

  // The tail of an id: a UUIDv7 starts with its time, the same for ids minted close together.
  const short = (id) => String(id || '').replace(/-/g, '').slice(-8);
  const clock = (ms) => new Date(ms).toTimeString().slice(0, 8);

  async function api(method, path, body) {
    const init = { method, credentials: 'same-origin', headers: {} };
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const res = await fetch(path, init);
    let json = null;
    try { json = await res.json(); } catch (_) { /* not JSON */ }
    if (!res.ok) {
      const err = new Error((json && json.message) || `HTTP ${res.status}`);
      err.status = res.status;
      err.code = json && json.error;
      throw err;
    }
    return json;
  }

  function setConn(state, text) {
    const c = $('conn');
    c.className = `conn ${state === 'live' ? 'live' : 'down'}`;
    c.dataset.state = state;
    c.textContent = text;
  }

  // ---- sign-in -------------------------------------------------------------------------------

  function showLogin(message) {
    started = false;
    clearInterval(ticker);
    $('app').hidden = true;
    $('login').hidden = false;
    $('login-error').textContent = message || '';
    setConn('signed-out', 'signed out');
  }

  async function signIn(credential) {
    await api('POST', '/dashboard/login', credential);
    $('login').hidden = true;
    start();
  }

  $('token-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const token = $('token').value.trim();
    $('token').value = '';
    if (token) signIn({ token }).catch((err) => showLogin(err.message));
  });

  // A link from `fleetd dashboard` opened in a tab already showing the page changes only the
  // fragment: no reload, so the key is taken from here too.
  window.addEventListener('hashchange', () => {
    takeFocus();
    if (started) { dirty.blocked = true; scheduleRender(); }
    if (!started && /(?:^#|&)key=/.test(location.hash)) boot();
  });

  async function boot() {
    const key = /(?:^#|&)key=([A-Za-z0-9_-]+)/.exec(location.hash);
    if (key) {
      // The key is spent by this one request; keep it out of the history and the address bar.
      window.history.replaceState(null, '', location.pathname);
      try {
        await signIn({ key: key[1] });
      } catch (err) {
        showLogin(err.message);
      }
      return;
    }
    try {
      await api('GET', '/dashboard/session');
      start();
    } catch (err) {
      showLogin(err.status === 401 || err.status === 403 ? '' : err.message);
    }
  }

  // ---- the stream ----------------------------------------------------------------------------

  function start() {
    if (started) return;
    started = true;
    $('app').hidden = false;
    $('login').hidden = true;
    follow();
    ticker = setInterval(() => {
      dirty.allMembers = true; dirty.questions = true; dirty.tickets = true; dirty.charts = true;
      scheduleRender();
    }, 1000);
  }

  // `replay=ring`: with no Last-Event-ID, the events the ring still holds (the charts and the
  // log start with the recent past); either way `stream.replayed` marks the live edge.
  async function follow() {
    setConn('connecting', 'connecting…');
    const headers = { Accept: 'text/event-stream' };
    if (lastId) headers['Last-Event-ID'] = lastId;
    let res;
    try {
      res = await fetch('/events?replay=ring', { headers, credentials: 'same-origin' });
    } catch (_) {
      return retry();
    }
    if (res.status === 401 || res.status === 403) {
      showLogin('This browser is no longer signed in (fleetd restarted, or the session expired).');
      return undefined;
    }
    if (!res.ok || !res.body) return retry();
    retryDelay = 500;
    setConn('live', 'live');
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = '';
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        // One pass over what arrived, one cut at the end (a chunk holds many events).
        let pos = 0;
        let cut;
        while ((cut = buf.indexOf('\n\n', pos)) >= 0) {
          onBlock(buf.slice(pos, cut));
          pos = cut + 2;
        }
        if (pos) buf = buf.slice(pos);
      }
    } catch (_) { /* the connection dropped */ }
    return retry();
  }

  function retry() {
    setConn('reconnecting', 'reconnecting…');
    setTimeout(follow, retryDelay);
    retryDelay = Math.min(retryDelay * 2, 5000);
  }

  function onBlock(block) {
    let kind = 'message';
    let id = null;
    const data = [];
    for (const line of block.split('\n')) {
      if (line.startsWith(':')) continue;
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? '' : line.slice(colon + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (field === 'event') kind = value;
      else if (field === 'id') id = value;
      else if (field === 'data') data.push(value);
    }
    if (!data.length) return;
    let d;
    try { d = JSON.parse(data.join('\n')); } catch (_) { return; }
    ingest(kind, id, d);
  }

  function ingest(kind, id, d) {
    received += 1;
    if (id) lastId = id;
    if (kind === 'stream.replayed') {
      // The backlog is in (the ring on first connect, what was missed on a reconnect): read
      // the state now unless it is already current.
      if (phase !== 'live') {
        phase = 'loading';
        loadSnapshot();
      }
      return;
    }
    if (kind === 'stream.gap') {
      note(kind, d.message, true, Date.now());
      if (phase === 'live') { phase = 'loading'; loadSnapshot(); }
      return;
    }
    if (kind === 'stream.lagged') {
      note(kind, d.message, true, Date.now());
      return;
    }
    record(kind, d);
    if (phase === 'live') applyState(kind, d);
    else if (phase === 'loading') buffered.push([kind, d]);
    scheduleRender();
  }

  async function loadSnapshot() {
    try {
      const [list, questions, latency, blocked] = await Promise.all([
        api('GET', '/sessions'),
        api('GET', '/questions'),
        api('GET', '/events/latency'),
        api('GET', '/blocked'),
      ]);
      model.blocked.clear();
      for (const b of blocked.blocked || []) model.blocked.set(b.target, b);
      dirty.blocked = true;
      // The whole hour from the server (the ring may hold only its last minutes).
      model.delivery = latency.delivery || [];
      model.nudge = latency.nudge || [];
      model.latencyAt = Date.parse(latency.at) || Date.now();
      dirty.charts = true;
      model.members.clear();
      for (const m of list.members || []) {
        model.members.set(m.target, {
          target: m.target,
          status: m.status,
          profile: m.profile,
          backend: m.backend || null,
          branch: m.branch || null,
          inboxDepth: m.inboxDepth ?? 0,
          openTickets: new Set(m.openTickets || []),
          lead: m.lead || null,
          spent: spentOf(m.usage),
          treeSpent: spentOf(m.treeUsage),
        });
      }
      model.questions.clear();
      for (const q of questions.questions || []) model.questions.set(q.questionId, q);
      if (focusMember && model.members.has(focusMember) && !model.blocked.has(focusMember)) {
        select(focusMember);
        focusTaken();
      }
      phase = 'live';
      for (const [kind, d] of buffered) applyState(kind, d);
      buffered = [];
      dirty.allMembers = true;
      dirty.questions = true;
      scheduleRender();
    } catch (err) {
      if (err.status === 401 || err.status === 403) showLogin(err.message);
      else setTimeout(loadSnapshot, 1000);
    }
  }

  let questionsTimer = null;
  function refreshQuestions() {
    clearTimeout(questionsTimer);
    questionsTimer = setTimeout(async () => {
      try {
        const answer = await api('GET', '/questions');
        for (const q of answer.questions || []) {
          if (model.questions.has(q.questionId)) model.questions.set(q.questionId, q);
        }
        dirty.questions = true;
        scheduleRender();
      } catch (_) { /* the next event tries again */ }
    }, 50);
  }

  // The members table, the open questions: what is true now.
  function applyState(kind, d) {
    if (d.target) dirty.members.add(d.target);
    if (kind.startsWith('question.')) dirty.questions = true;
    const m = model.members.get(d.target);
    switch (kind) {
      case 'member.spawned':
        model.members.set(d.target, {
          target: d.target, status: 'unknown', profile: d.profile, backend: d.backend || null,
          branch: d.branch || null, inboxDepth: 0, openTickets: new Set(), lead: d.lead || null,
          spent: null, treeSpent: null,
        });
        break;
      case 'usage': {
        // The member's own running total comes with the event; its tree's head adds it up.
        if (m) m.spent = { tokens: d.totalTokens, usd: d.totalCostMicros / 1e6 };
        const head = model.members.get(d.tree);
        if (head) {
          const t = head.treeSpent || { tokens: 0, usd: 0 };
          const n = d.tokens.input + d.tokens.output + d.tokens.cacheRead + d.tokens.cacheWrite;
          head.treeSpent = { tokens: t.tokens + n, usd: t.usd + d.costMicros / 1e6 };
          dirty.members.add(d.tree);
        }
        break;
      }
      case 'member.status':
        if (m) m.status = d.status;
        break;
      case 'member.blocked':
        model.blocked.set(d.target, d);
        dirty.blocked = true;
        break;
      case 'member.unblocked':
        model.blocked.delete(d.target);
        dirty.blocked = true;
        break;
      case 'member.released':
        model.blocked.delete(d.target);
        dirty.blocked = true;
        model.members.delete(d.target);
        if (model.selected === d.target) { model.selected = null; model.detail = null; }
        break;
      case 'ticket.state':
        if (m) {
          if (OPEN.has(d.state)) m.openTickets.add(d.ticket);
          else m.openTickets.delete(d.ticket);
        }
        break;
      case 'inbox.depth':
        if (m) m.inboxDepth = d.depth;
        if (model.selected === d.target) loadDetail(d.target);
        break;
      case 'question.opened':
        model.questions.set(d.question_id, { questionId: d.question_id, target: d.target, question: null });
        refreshQuestions();
        break;
      case 'question.closed':
        model.questions.delete(d.question_id);
        break;
      default:
        break;
    }
  }

  // The log, the ticket timeline, the latency series: what happened.
  function record(kind, d) {
    const at = Date.parse(d.at) || Date.now();
    eventSeq += 1;
    model.events.push({ kind, d, at, n: eventSeq });
    if (model.events.length > KEEP_EVENTS) model.events.splice(0, model.events.length - KEEP_EVENTS);
    switch (kind) {
      case 'ticket.state': {
        dirty.tickets = true;
        let t = model.tickets.get(d.ticket);
        if (!t) {
          t = { ticket: d.ticket, target: d.target, created: uuidTime(d.ticket), steps: [] };
          model.tickets.set(d.ticket, t);
          if (model.tickets.size > KEEP_TICKETS) model.tickets.delete(model.tickets.keys().next().value);
        }
        t.state = d.state;
        t.steps.push([d.state, at]);
        if (typeof d.waited_ms === 'number' && at > model.latencyAt) {
          model.delivery.push([at, d.waited_ms]);
          dirty.charts = true;
        }
        break;
      }
      case 'nudge':
        if (typeof d.after_ms === 'number' && at > model.latencyAt) {
          model.nudge.push([at, d.after_ms]);
          dirty.charts = true;
        }
        note('nudge', `${d.outcome.replace(/_/g, ' ')}${d.lead ? ` → ${d.lead}` : ''}`, d.outcome !== 'nudged', at);
        break;
      case 'incident':
        note('incident', `${(d.targets || []).join(', ')}: ${d.text}`, true, at);
        break;
      default:
        break;
    }
  }

  function note(kind, text, warn, at) {
    dirty.alerts = true;
    model.alerts.push({ kind, text, warn, at });
    if (model.alerts.length > 100) model.alerts.shift();
  }

  // ---- actions -------------------------------------------------------------------------------

  // Types one choice into a member's dialog: fleetd does only while that same dialog (its
  // fingerprint) is still on the member's screen.
  async function approve(target, choice, dialog, buttons, result) {
    for (const b of buttons) b.disabled = true;
    result.textContent = 'typing…';
    try {
      const out = await api('POST', `/sessions/${encodeURIComponent(target)}/approve`, { choice, dialog });
      result.textContent = out.outcome === 'answered'
        ? `answered: ${out.choice}. ${out.label}`
        : `typed ${out.choice}, but the dialog is still on screen: look at its pane`;
    } catch (err) {
      result.textContent = err.message;
      for (const b of buttons) b.disabled = false;
    }
  }

  async function answer(questionId, text, button, result) {
    button.disabled = true;
    result.textContent = 'sending…';
    try {
      const out = await api('POST', `/questions/${encodeURIComponent(questionId)}/answer`, { answer: text });
      result.textContent = `answered (${(out && out.deliveredTo) || 'sent'})`;
      model.questions.delete(questionId);
      dirty.questions = true;
      scheduleRender();
    } catch (err) {
      result.textContent = err.message;
      button.disabled = false;
    }
  }

  async function stop(target, button, result) {
    if (button.dataset.armed !== 'yes') {
      button.dataset.armed = 'yes';
      button.textContent = `Really stop ${target}?`;
      return;
    }
    button.disabled = true;
    try {
      await api('POST', `/sessions/${encodeURIComponent(target)}/stop`, {});
      result.textContent = 'stopped';
    } catch (err) {
      result.textContent = err.message;
      button.disabled = false;
    }
  }

  async function ack(target, msgId, button) {
    button.disabled = true;
    try {
      await api('POST', `/sessions/${encodeURIComponent(target)}/replies/${encodeURIComponent(msgId)}/ack`, {});
      loadDetail(target);
    } catch (err) {
      button.textContent = err.message;
    }
  }

  let detailSeq = 0;
  async function loadDetail(target) {
    const seq = ++detailSeq;
    try {
      const [status, replies] = await Promise.all([
        api('GET', `/sessions/${encodeURIComponent(target)}`),
        api('GET', `/sessions/${encodeURIComponent(target)}/replies?limit=20`),
      ]);
      if (seq !== detailSeq || model.selected !== target) return;
      model.detail = { target, status, replies: replies.replies || [] };
    } catch (err) {
      if (seq !== detailSeq) return;
      model.detail = { target, error: err.message };
    }
    renderDetail();
  }

  function select(target) {
    if (model.selected) dirty.members.add(model.selected);
    dirty.members.add(target);
    model.selected = model.selected === target ? null : target;
    model.detail = null;
    if (model.selected) loadDetail(model.selected);
    scheduleRender();
    renderDetail();
  }

  // ---- rendering -----------------------------------------------------------------------------

  function scheduleRender() {
    if (renderQueued) return;
    renderQueued = true;
    requestAnimationFrame(() => {
      renderQueued = false;
      render();
    });
  }

  // Tickets and charts are drawn at most this often while events pour in.
  const SLOW_EVERY = 250;

  function render() {
    const now = Date.now();
    renderMembers(now);
    if (dirty.questions) renderQuestions(now);
    if (dirty.alerts) renderAlerts();
    renderBlocked(now);
    renderEvents();
    if ((dirty.tickets || dirty.charts) && now - slowAt < SLOW_EVERY) {
      if (!slowTimer) {
        slowTimer = setTimeout(() => { slowTimer = null; scheduleRender(); }, SLOW_EVERY - (now - slowAt));
      }
    } else {
      if (dirty.tickets) renderTickets(now);
      if (dirty.charts) renderCharts(now);
      slowAt = now;
    }
    let working = 0;
    let inbox = 0;
    for (const m of model.members.values()) {
      if (m.status === 'working') working += 1;
      inbox += m.inboxDepth || 0;
    }
    const n = (count, one, many) => `${count} ${count === 1 ? one : many}`;
    const waiting = model.blocked.size ? ` · ${model.blocked.size} waiting on you` : '';
    setText($('counts'), `${n(model.members.size, 'member', 'members')} · ${working} working${waiting} · ${n(inbox, 'reply', 'replies')} waiting · ${n(model.questions.size, 'open question', 'open questions')}`);
    document.body.dataset.rendered = String(model.events.length);
  }

  function setText(node, text) {
    if (node.textContent !== text) node.textContent = text;
  }

  // One row per member, kept across frames: a change touches only its own row's cells.
  const rows = new Map();

  function memberRow(target) {
    const cell = (cls) => el('td', { class: cls });
    const c = {
      status: el('span', { class: 'status' }), profile: cell(), backend: cell(), branch: cell(),
      inbox: cell('num inbox'), open: cell('open'), lead: cell(), spent: cell('num spent'),
    };
    const tr = el('tr', { class: 'member', 'data-target': target, onclick: () => select(target) },
      el('td', { class: 'name', text: target }), el('td', {}, c.status), c.profile, c.backend,
      c.branch, c.inbox, c.open, c.lead, c.spent,
      el('td', {}, el('button', { type: 'button', text: 'details' })));
    return { tr, c };
  }

  function fillRow(row, m, now) {
    const { c } = row;
    setText(c.status, m.status);
    const cls = `status ${m.status}`;
    if (c.status.className !== cls) c.status.className = cls;
    setText(c.profile, m.profile || '—');
    setText(c.backend, m.backend || '—');
    setText(c.branch, m.branch || '—');
    setText(c.inbox, String(m.inboxDepth ?? 0));
    let oldest = Infinity;
    for (const t of m.openTickets) oldest = Math.min(oldest, uuidTime(t));
    setText(c.open, m.openTickets.size
      ? `${m.openTickets.size}${Number.isFinite(oldest) ? ` (oldest ${human(now - oldest)})` : ''}`
      : '—');
    setText(c.lead, m.lead || 'primary');
    const tree = m.treeSpent && m.spent && m.treeSpent.tokens > m.spent.tokens
      ? ` · tree ${spentText(m.treeSpent)}` : '';
    setText(c.spent, m.spent ? `${spentText(m.spent)}${tree}` : '—');
    row.tr.classList.toggle('selected', model.selected === m.target);
  }

  function renderMembers(now) {
    const targets = dirty.allMembers
      ? new Set([...rows.keys(), ...model.members.keys()])
      : dirty.members;
    let added = false;
    for (const target of targets) {
      const m = model.members.get(target);
      let row = rows.get(target);
      if (!m) {
        if (row) { row.tr.remove(); rows.delete(target); }
        continue;
      }
      if (!row) {
        row = memberRow(target);
        rows.set(target, row);
        added = true;
      }
      fillRow(row, m, now);
    }
    if (added) {
      const sorted = [...rows.keys()].sort((a, b) => a.localeCompare(b));
      $('members').tBodies[0].replaceChildren(...sorted.map((t) => rows.get(t).tr));
    }
    dirty.allMembers = false;
    dirty.members = new Set();
    $('no-members').hidden = rows.size > 0;
  }

  function renderQuestions(now) {
    const list = $('questions');
    const present = new Set(model.questions.keys());
    // Keep the cards being typed into: only add and remove.
    for (const li of [...list.children]) {
      if (!present.has(li.dataset.question)) li.remove();
    }
    for (const q of model.questions.values()) {
      let li = list.querySelector(`li[data-question="${CSS.escape(q.questionId)}"]`);
      if (!li) {
        const box = el('textarea', { 'aria-label': `answer to ${q.target}`, placeholder: 'Your answer' });
        const result = el('span', { class: 'result' });
        const button = el('button', { type: 'submit', class: 'primary', text: 'Answer' });
        const form = el('form', {
          onsubmit: (e) => {
            e.preventDefault();
            if (box.value.trim()) answer(q.questionId, box.value, button, result);
          },
        }, box, button, ' ', result);
        li = el('li', { 'data-question': q.questionId },
          el('div', {}, el('strong', { text: q.target }), ' ', el('span', { class: 'quiet age' })),
          el('div', { class: 'ask' }),
          form);
        list.append(li);
      }
      li.querySelector('.ask').textContent = q.question || '…';
      li.querySelector('.age').textContent = `asked ${human(now - uuidTime(q.questionId))} ago`;
    }
    $('no-questions').hidden = model.questions.size > 0;
    dirty.questions = false;
  }

  // Members waiting on a dialog, longest waiting first, each with its dialog as the member's
  // screen shows it and a button per choice.
  function renderBlocked(now) {
    const list = $('blocked');
    const waiting = [...model.blocked.values()].sort((a, b) => Date.parse(a.since) - Date.parse(b.since));
    for (const li of [...list.children]) {
      const b = model.blocked.get(li.dataset.target);
      if (!b || b.dialog !== li.dataset.dialog) li.remove();
    }
    for (const b of waiting) {
      let li = list.querySelector(`li[data-target="${CSS.escape(b.target)}"]`);
      if (!li) {
        const result = el('span', { class: 'result', role: 'status' });
        const buttons = (b.choices || []).map((c) => el('button', {
          type: 'button', class: 'choice', 'data-choice': c.key, text: `${c.key}. ${c.label}`,
        }));
        for (const button of buttons) {
          button.addEventListener('click', () => approve(b.target, button.dataset.choice, b.dialog, buttons, result));
        }
        li = el('li', { 'data-target': b.target, 'data-dialog': b.dialog, id: `blocked-${b.target}` },
          el('div', {}, el('strong', { text: b.target }), ' ', el('span', { class: 'quiet age' })),
          el('pre', { class: 'dialog', text: (b.lines || []).join('\n') }),
          buttons.length
            ? el('div', { class: 'choices' }, ...buttons, ' ', result)
            : el('p', { class: 'quiet', text: 'fleetd recognises no choices here: answer it in the member\'s pane.' }));
        list.append(li);
      }
      li.querySelector('.age').textContent = `waiting ${human(now - Date.parse(b.since))}`;
    }
    $('blocked-panel').hidden = model.blocked.size === 0;
    if (focusMember && model.blocked.has(focusMember)) {
      const card = $(`blocked-${focusMember}`);
      if (card) {
        card.classList.add('focus');
        // Below the sticky header, not under it.
        window.scrollTo(0, Math.max(0, card.getBoundingClientRect().top + window.scrollY - 80));
      }
      focusTaken();
    }
    dirty.blocked = false;
  }

  function renderAlerts() {
    const items = model.alerts.slice(-50).reverse();
    $('alerts').replaceChildren(...items.map((a) => el('li', { class: a.warn ? 'warn' : '' },
      el('time', { text: clock(a.at) }), el('span', { class: 'kind', text: a.kind }), a.text)));
    $('no-alerts').hidden = items.length > 0;
    dirty.alerts = false;
  }

  function renderTickets(now) {
    const items = [...model.tickets.values()].slice(-50).reverse();
    $('tickets').tBodies[0].replaceChildren(...items.map((t) => el('tr', { 'data-ticket': t.ticket },
      el('td', { text: short(t.ticket) }),
      el('td', { text: t.target }),
      el('td', { text: t.state }),
      el('td', { text: human(now - t.created) }),
      el('td', { class: 'timeline' }, ...t.steps.map(([state, at]) =>
        el('span', { text: `${state} +${millis(Math.max(0, at - t.created))}` }))))));
    dirty.tickets = false;
  }

  // A member's model spending (its `usage` in /sessions), as the table keeps it.
  function spentOf(u) {
    return u ? { tokens: u.totalTokens, usd: u.costUsd } : null;
  }

  function spentText(s) {
    const k = s.tokens >= 1e6 ? `${(s.tokens / 1e6).toFixed(1)}M` : s.tokens >= 1e3 ? `${(s.tokens / 1e3).toFixed(1)}k` : String(s.tokens);
    return `${k} tok $${s.usd.toFixed(2)}`;
  }

  function describe(kind, d) {
    switch (kind) {
      case 'member.spawned': return `${d.target} joined (profile ${d.profile}${d.backend ? `, backend ${d.backend}` : ''})`;
      case 'member.status': return `${d.target} is ${d.status}`;
      case 'member.released': return `${d.target} released (${d.cause})`;
      case 'ticket.state': return `${d.target} ticket ${short(d.ticket)} ${d.state}`;
      case 'reply.stored': return `${d.target} replied (${d.bytes} bytes${d.ticket ? `, ticket ${short(d.ticket)}` : ''})`;
      case 'ticket.wake': return `${d.target} ticket ${short(d.ticket)}: wake ${d.state}`;
      case 'inbox.depth': return `${d.target} has ${d.depth} replies waiting`;
      case 'question.opened': return `${d.target} asks (question ${d.question_id})`;
      case 'question.closed': return `${d.target}'s question ${d.question_id} ${d.how}`;
      case 'nudge': return `${d.outcome}${d.lead ? ` → ${d.lead}` : ''}`;
      case 'incident': return d.text;
      case 'member.blocked': return `${d.target} waits on a dialog: ${d.question}`;
      case 'member.unblocked': return `${d.target}'s dialog went after ${human(d.waitedMs)}`;
      case 'member.approved': return `${d.by} typed ${d.choice} (${d.label}) into ${d.target}'s dialog: ${d.outcome}`;
      case 'config.reloaded': return 'configuration reloaded';
      case 'usage': return `${d.target} used ${d.tokens.input + d.tokens.output + d.tokens.cacheRead + d.tokens.cacheWrite} tokens ($${(d.costMicros / 1e6).toFixed(4)})`;
      default: return JSON.stringify(d);
    }
  }

  // The log only grows at its top: the new events are added, the oldest beyond the cap removed.
  function renderEvents() {
    if (eventSeq === eventsShown) return;
    const list = $('events');
    const fresh = model.events.filter((e) => e.n > eventsShown).slice(-KEEP_EVENTS).reverse();
    const items = fresh.map((e) => el('li', { class: e.kind === 'incident' ? 'warn' : '' },
      el('time', { text: clock(e.at) }), el('span', { class: 'kind', text: e.kind }), describe(e.kind, e.d)));
    list.prepend(...items);
    while (list.children.length > KEEP_EVENTS) list.lastElementChild.remove();
    eventsShown = eventSeq;
  }

  function renderCharts(now) {
    chart('delivery', model.delivery, now);
    chart('nudge', model.nudge, now);
    dirty.charts = false;
  }

  function chart(name, series, now) {
    while (series.length && series[0][0] < now - HOUR) series.shift();
    const svg = $(`chart-${name}`);
    const ns = 'http://www.w3.org/2000/svg';
    const buckets = new Array(60).fill(0);
    for (const [at, ms] of series) {
      const i = Math.min(59, Math.max(0, Math.floor((at - (now - HOUR)) / 60000)));
      buckets[i] = Math.max(buckets[i], ms);
    }
    const top = Math.max(1, ...buckets);
    const shapes = [];
    const axis = document.createElementNS(ns, 'line');
    axis.setAttribute('class', 'axis');
    axis.setAttribute('x1', '0'); axis.setAttribute('x2', '300');
    axis.setAttribute('y1', '79'); axis.setAttribute('y2', '79');
    shapes.push(axis);
    buckets.forEach((ms, i) => {
      if (!ms) return;
      const h = Math.max(1, Math.round((ms / top) * 76));
      const bar = document.createElementNS(ns, 'rect');
      bar.setAttribute('class', 'bar');
      bar.setAttribute('x', String(i * 5));
      bar.setAttribute('width', '4');
      bar.setAttribute('y', String(79 - h));
      bar.setAttribute('height', String(h));
      const title = document.createElementNS(ns, 'title');
      title.textContent = `${clock(now - HOUR + i * 60000)}: worst ${millis(ms)}`;
      bar.append(title);
      shapes.push(bar);
    });
    svg.replaceChildren(...shapes);
    const sorted = series.map(([, ms]) => ms).sort((a, b) => a - b);
    const q = (p) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
    $(`stat-${name}`).textContent = sorted.length
      ? `${sorted.length} samples · p50 ${millis(q(0.5))} · p95 ${millis(q(0.95))} · worst ${millis(sorted[sorted.length - 1])}`
      : 'no samples in the last hour';
  }

  function renderDetail() {
    const panel = $('detail-panel');
    const target = model.selected;
    panel.hidden = !target;
    if (!target) return;
    $('detail-name').textContent = target;
    const box = $('detail');
    const d = model.detail;
    if (!d) { box.replaceChildren(el('p', { class: 'quiet', text: 'loading…' })); return; }
    if (d.error) { box.replaceChildren(el('p', { class: 'error', text: d.error })); return; }
    const result = el('span', { class: 'result' });
    const stopButton = el('button', {
      type: 'button', class: 'danger', 'data-action': 'stop', text: `Stop ${target}`,
      onclick: (e) => stop(target, e.currentTarget, result),
    });
    const member = d.status.member || d.status;
    const tickets = member.tickets || [];
    const replies = d.replies || [];
    box.replaceChildren(
      el('div', { class: 'detail-actions' }, stopButton, result),
      el('p', {}, `pane ${member.paneId || '—'} · ${member.connected ? 'connected' : 'not connected'} · ${member.queued ?? 0} tasks queued`),
      el('h3', { text: `Replies waiting (${replies.length})` }),
      ...replies.map((r) => el('div', { class: 'reply', 'data-msg': r.msgId },
        el('div', { class: 'quiet' }, `${r.kind || 'reply'} ${short(r.msgId)}${r.ticket ? ` · ticket ${short(r.ticket)}` : ''} `,
          el('button', { type: 'button', 'data-action': 'ack', text: 'Ack', onclick: (e) => ack(target, r.msgId, e.currentTarget) })),
        el('pre', { text: r.text || '' }))),
      el('h3', { text: 'Recent tickets' }),
      el('ul', {}, ...tickets.map((t) => el('li', { text: `${short(t.ticket)} ${t.state}${t.cause ? ` (${t.cause})` : ''}` }))),
    );
  }

  // For tests and the benchmark: the model, and how far the stream has been read.
  window.fleetdDashboard = {
    model,
    get lastId() { return lastId; },
    get received() { return received; },
  };
  boot();
})();
