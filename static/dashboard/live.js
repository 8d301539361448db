/* Leaseboard console: the live state every page shares. Plain JS, no build step.
 *
 * State model. The server sends one snapshot on connect, then deltas (only the fields that changed,
 * per partition and per worker). Each carries `last_event_id`, the watermark: every event at or below
 * it is reflected in the state. `base` holds the partitions exactly as the server last described
 * them; `view` is what the page shows: base plus the events above the watermark, applied once each,
 * per partition in id order. A delta moves the watermark; the events it now covers are dropped and
 * the rest replayed, on the partitions they touch only, so a second of a busy hub with 1024
 * partitions touches only what moved. Every (re)connect starts over from the socket's snapshot: the
 * page loads the state once per connect, and /api/state only when the socket never gave one.
 *
 * Counts (owned per worker, the header's totals, statuses) are the server's (`summary`, `owned`):
 * the page shows them as the last state said, and only tiles move ahead of it with the events.
 */
(() => {
  "use strict";

  const body = document.body;
  const cfg = {
    page: body.dataset.page,
    hub: body.dataset.hub,
    consumerGroup: body.dataset.consumerGroup,
    stateUrl: body.dataset.stateUrl,
    eventsUrl: body.dataset.eventsUrl,
    historyUrl: body.dataset.historyUrl,
    auditUrl: body.dataset.auditUrl,
    previewUrl: body.dataset.previewUrl,
    applyUrl: body.dataset.applyUrl,
    wsPath: body.dataset.wsPath,
    canAct: body.dataset.canAct === "true",
    partition: body.dataset.partition || null,
  };
  const query = new URLSearchParams({ hub: cfg.hub, consumer_group: cfg.consumerGroup }).toString();

  const BUFFER_MAX = 5000;
  const STALE_AFTER_MS = 5000;
  const SUMMARY_EVERY_MS = 250; // derived counts (header, worker table): at most four times a second
  const PALETTE = ["#2563eb", "#7c3aed", "#059669", "#db2777", "#ea580c", "#0891b2",
                   "#4d7c0f", "#9333ea", "#dc2626", "#0f766e", "#a16207", "#4f46e5"];
  const STATUSES = ["OK", "WARN", "STALL", "STOP", "REWIND"];

  // --- formatting -------------------------------------------------------------------------

  const $ = (id) => document.getElementById(id);
  // One formatter each: toLocaleString() builds a new one per call, far too slow for 1024 tiles a second.
  const numbers = new Intl.NumberFormat("en-US");
  const times = new Intl.DateTimeFormat("en-GB", { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
  const days = new Intl.DateTimeFormat("en-GB", { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
  const colours = new Map();
  const fmt = {
    n: (n) => (n === null || n === undefined ? "–" : numbers.format(n)),
    clock: (epoch) => (epoch ? times.format(new Date(epoch * 1000)) : "–"),
    when: (epoch) => {
      if (!epoch) return "–";
      const d = new Date(epoch * 1000);
      return Date.now() - d.getTime() < 20 * 3600 * 1000 ? times.format(d) : days.format(d);
    },
    ago(seconds) {
      if (seconds === null || seconds === undefined) return "never";
      const s = Math.max(0, seconds);
      if (s < 1) return "just now";
      if (s < 90) return `${Math.round(s)}s ago`;
      if (s < 5400) return `${Math.round(s / 60)}m ago`;
      return `${Math.round(s / 3600)}h ago`;
    },
    duration(seconds) {
      if (seconds === null || seconds === undefined) return "–";
      if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
      if (seconds < 90) return `${seconds.toFixed(seconds < 10 ? 1 : 0)} s`;
      if (seconds < 5400) return `${(seconds / 60).toFixed(1)} min`;
      return `${(seconds / 3600).toFixed(1)} h`;
    },
    colour(owner) {
      if (!owner) return null;
      let c = colours.get(owner);
      if (!c) {
        const i = colours.size;
        c = i < PALETTE.length ? PALETTE[i] : `hsl(${Math.round((i * 137.508) % 360)} 55% 38%)`;
        colours.set(owner, c);
      }
      return c;
    },
  };

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }
  function setText(node, text) {
    if (node && node.textContent !== text) node.textContent = text;
  }
  function setData(node, key, value) {
    const text = value === null || value === undefined ? "" : String(value);
    if (node.dataset[key] !== text) node.dataset[key] = text;
  }
  // Writing an attribute its own value still costs a style recalculation: on a big fleet, once a frame.
  function setHidden(node, hidden) {
    if (node.hidden !== hidden) node.hidden = hidden;
  }
  function setTitle(node, title) {
    if (node.title !== title) node.title = title;
  }
  function who(owner) {
    const span = el("span", "who");
    if (!owner) { span.textContent = "nobody"; span.classList.add("muted"); return span; }
    const chip = el("span", "chip");
    chip.style.background = fmt.colour(owner);
    span.append(chip, owner);
    return span;
  }
  function link(path) {
    return `${path}${path.includes("?") ? "&" : "?"}${query}`;
  }
  function partitionLink(pid) {
    return link(`/partitions/${encodeURIComponent(pid)}/`);
  }

  /** A feed line for one event (`compact`: for the side feeds). */
  function eventItem(ev, fresh) {
    const li = el("li");
    li.dataset.eventId = ev.id;
    li.dataset.kind = ev.category || ev.kind;
    li.dataset.partition = ev.partition_id;
    li.dataset.owner = ev.owner_id || "";
    if (fresh) li.classList.add("fresh");
    const time = el("time", "", fmt.clock(ev.at));
    time.dateTime = new Date(ev.at * 1000).toISOString();
    const kind = el("span", "kind", ev.category || ev.kind);
    kind.dataset.kind = ev.category || ev.kind;
    const move = el("span", "move");
    if (ev.partition_id === "*") {
      move.append(who(ev.previous_owner || ev.owner_id));
    } else {
      const a = el("a", "pid", `P${ev.partition_id}`);
      a.href = partitionLink(ev.partition_id);
      move.append(a, " ", who(ev.previous_owner), " → ", who(ev.owner_id));
    }
    const reason = el("span", "reason", ev.reason || "");
    if (ev.reporter && ev.reporter !== ev.owner_id && ev.reporter !== ev.previous_owner) {
      reason.textContent += ` (reported by ${ev.reporter})`;
    }
    li.append(time, kind, move, reason);
    return li;
  }

  /** Insert `li` into `list` newest first, keeping at most `max` items. */
  function insertNewestFirst(list, li, max, ids) {
    const id = Number(li.dataset.eventId);
    let before = list.firstElementChild;
    while (before && Number(before.dataset.eventId) > id) before = before.nextElementSibling;
    list.insertBefore(li, before);
    while (list.children.length > max) {
      if (ids) ids.delete(Number(list.lastElementChild.dataset.eventId));
      list.lastElementChild.remove();
    }
  }

  function auditItem(entry) {
    const li = el("li");
    li.dataset.auditId = entry.id;
    li.dataset.outcome = entry.outcome;
    li.dataset.action = entry.action;
    li.dataset.target = entry.target;
    const time = el("time", "", fmt.when(entry.at));
    const what = el("span", "what");
    const verb = el("strong", "", entry.action);
    what.append(el("span", "user", entry.user), " ", verb, " ", [entry.target, entry.value].filter((x) => x && x !== "*").join(" "));
    const outcome = el("span", "outcome", entry.outcome);
    outcome.dataset.outcome = entry.outcome;
    const why = el("span", "reason", `“${entry.reason}”`);
    const message = el("span", "message", entry.message || "");
    li.append(time, what, outcome, why, message);
    return li;
  }

  // --- the live state -----------------------------------------------------------------------

  /** What an event does to a partition as shown, or null when it says nothing certain. */
  function afterEvent(p, ev) {
    switch (ev.kind) {
      case "claim": case "expire": case "steal":
        return ev.owner_id ? { ...p, owner: ev.owner_id, status: "owned" } : null;
      case "release":
        return p.owner === ev.previous_owner || p.owner === null ? { ...p, owner: null, status: "unowned" } : null;
      case "lost": // the loser reports; the winner (if named) holds it now
        return ev.owner_id ? { ...p, owner: ev.owner_id, status: "owned" } : null;
      case "pin":
        return { ...p, pinned_to: ev.owner_id || null };
      case "unpin":
        return { ...p, pinned_to: null };
      default:
        return null;
    }
  }

  const live = {
    SUMMARY_EVERY_MS, cfg, fmt, el, setText, setData, setHidden, setTitle, who, link, partitionLink, eventItem, insertNewestFirst, auditItem, STATUSES,
    base: new Map(), // partition id -> as the server last said
    view: new Map(), // partition id -> as shown (base + events above the watermark)
    order: [], // partition ids in grid order
    workers: new Map(), // worker id -> worker
    workerOrder: [],
    top: null, // the state's scalar fields (generated_at, source, ...)
    watermark: 0,
    buffered: [], // events above the watermark, id order
    bufferedIds: new Set(),
    touched: new Set(), // partitions whose view differs from base because of buffered events
    latencies: [], // seconds from an event's report to the page applying it (for the benchmark)
    lastLeg: [], // seconds from the server sending events to the page having applied them
    renderMs: [],
    listeners: [],
    connection: "connecting",
    error: null,

    /** `handlers`: {state(changed: Set|null = everything), events(events, fresh), audit(entries, fresh), connection(state)} */
    listen(handlers) {
      this.listeners.push(handlers);
      if (this.top && handlers.state) handlers.state(null); // a state came first: it gets all of it now
    },
    /** Resolved after the first state: colours go to workers in id order first, whatever renders first. */
    ready: null,
    emit(name, ...args) {
      for (const h of this.listeners) if (h[name]) h[name](...args);
    },

    applySnapshot(state) {
      for (const id of state.workers.map((w) => w.id).sort()) fmt.colour(id);
      this.base = new Map(state.partitions.map((p) => [p.id, p]));
      this.order = state.partitions.map((p) => p.id);
      this.workers = new Map(state.workers.map((w) => [w.id, w]));
      this.workerOrder = state.workers.map((w) => w.id);
      this.top = scalars(state);
      this.setWatermark(state.last_event_id || 0);
      this.view = new Map();
      for (const id of this.order) this.view.set(id, this.base.get(id));
      this.touched.clear();
      this.replay(new Set(this.order));
      this.emit("state", null);
      readyNow();
    },

    applyDelta(message) {
      const changed = new Set();
      for (const change of message.partitions) {
        const was = this.base.get(change.id);
        this.base.set(change.id, was ? { ...was, ...change } : change);
        changed.add(change.id);
      }
      for (const id of message.removed_partitions || []) { this.base.delete(id); this.view.delete(id); }
      let layout = false;
      if (message.order) { this.order = message.order; layout = true; }
      for (const change of message.workers) {
        const was = this.workers.get(change.id);
        this.workers.set(change.id, was ? { ...was, ...change } : change);
        fmt.colour(change.id);
      }
      for (const id of message.removed_workers || []) this.workers.delete(id);
      if (message.worker_order) this.workerOrder = message.worker_order;
      else this.workerOrder = this.workerOrder.filter((id) => this.workers.has(id)).concat(
        [...this.workers.keys()].filter((id) => !this.workerOrder.includes(id)));
      this.top = { ...this.top, ...scalars(message) };
      this.setWatermark(message.last_event_id || this.watermark);
      for (const id of this.touched) changed.add(id);
      this.touched.clear();
      for (const id of changed) if (this.base.has(id)) this.view.set(id, this.base.get(id));
      this.replay(changed);
      this.emit("state", layout ? null : changed);
    },

    setWatermark(mark) {
      this.watermark = mark;
      this.buffered = this.buffered.filter((ev) => ev.id > mark);
      this.bufferedIds = new Set(this.buffered.map((ev) => ev.id));
    },

    /** Re-apply the buffered events to the partitions in `changed`, and to those they touch. */
    replay(changed) {
      for (const ev of this.buffered) {
        if (!this.base.has(ev.partition_id)) continue;
        if (!changed.has(ev.partition_id)) {
          if (!this.touched.has(ev.partition_id)) continue; // its view already has this event
        }
        const next = afterEvent(this.view.get(ev.partition_id), ev);
        if (next) this.view.set(ev.partition_id, next);
        this.touched.add(ev.partition_id);
        changed.add(ev.partition_id);
      }
    },

    applyEvents(events, fresh) {
      const changed = new Set();
      for (const ev of events) {
        if ((ev.kind === "drain" || ev.kind === "undrain") && ev.partition_id === "*") {
          const id = ev.kind === "drain" ? ev.previous_owner : ev.owner_id;
          const w = this.workers.get(id);
          if (w) this.workers.set(id, { ...w, draining: ev.kind === "drain" });
        }
        if (ev.id <= this.watermark || this.bufferedIds.has(ev.id)) continue;
        this.buffered.push(ev);
        this.bufferedIds.add(ev.id);
        const p = this.view.get(ev.partition_id);
        if (!p) continue;
        const next = afterEvent(p, ev);
        if (next) { this.view.set(ev.partition_id, next); changed.add(ev.partition_id); }
        this.touched.add(ev.partition_id);
      }
      this.buffered.sort((a, b) => a.id - b.id);
      while (this.buffered.length > BUFFER_MAX) this.bufferedIds.delete(this.buffered.shift().id);
      if (this.latencies.length > 20000) this.latencies.splice(0, 10000);
      this.emit("events", events, fresh);
      if (changed.size) this.emit("state", changed);
      if (fresh) { // applied to the grid and the feed: from the reporter's clock to now
        const now = Date.now() / 1000;
        for (const ev of events) this.latencies.push(now - ev.at);
      }
    },

    timed(render) {
      const started = performance.now();
      render();
      this.renderMs.push(Math.round((performance.now() - started) * 10) / 10);
      if (this.renderMs.length > 50) this.renderMs.shift();
    },
  };

  let readyNow = null;
  live.ready = new Promise((resolve) => { readyNow = resolve; });

  function scalars(state) {
    const out = {};
    for (const key of ["namespace", "hub", "consumer_group", "generated_at", "last_event_id", "expiry", "source", "version", "sampled_at", "lag_rules", "summary"]) {
      if (key in state) out[key] = state[key];
    }
    return out;
  }

  // --- header summary -------------------------------------------------------------------------

  function summarise() {
    const summary = live.top && live.top.summary;
    if (!summary) return;
    // A page whose view knows no hub reference (the pipeline's) learns the scope from the state.
    for (const [id, key] of [["namespace", "namespace"], ["consumer-group", "consumer_group"]]) {
      if ($(id) && !$(id).textContent) setText($(id), live.top[key]);
    }
    setText($("owned-summary"), `${summary.owned} / ${summary.partitions} owned`);
    const alive = summary.workers_alive;
    const draining = summary.workers_draining || 0;
    setText($("workers-summary"), `${alive} worker${alive === 1 ? "" : "s"} alive${draining ? `, ${draining} draining` : ""}`);
    setData($("workers-summary"), "draining", draining);
    setText($("lag-summary"), `lag ${fmt.n(summary.lag)}`);
    const statuses = new Map(Object.entries(summary.by_lag_status).filter(([s, n]) => s !== "OK" && n > 0));
    const box = $("status-summary");
    const key = STATUSES.map((s) => `${s}${statuses.get(s) || 0}`).join();
    if (box.dataset.key !== key) {
      box.dataset.key = key;
      box.replaceChildren();
      if (!statuses.size) box.append(el("span", "badge", "all OK")); else {
        for (const s of STATUSES) {
          if (!statuses.get(s)) continue;
          const b = el("span", "badge", `${statuses.get(s)} ${s}`);
          b.dataset.lagStatus = s;
          box.append(b);
        }
      }
      box.dataset.lagStatus = statuses.size ? "bad" : "OK";
    }
  }

  // --- alerts and toasts ----------------------------------------------------------------------

  const alertBox = $("alert");
  function showAlert(text) {
    setHidden(alertBox, !text);
    if (text) setText(alertBox, text);
  }
  let toastTimer = null;
  function toast(text, kind) {
    const box = $("toast");
    box.dataset.kind = kind || "ok";
    setText(box, text);
    box.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => { box.hidden = true; }, 6000);
  }
  live.showAlert = showAlert;
  live.toast = toast;

  /** A polling page's status: its pill (``setState``) and its alert box (``showError``; "" hides it). */
  live.pollStatus = (pillId, alertId) => ({
    showError(text) {
      const box = $(alertId);
      box.hidden = !text;
      setText(box, text || "");
    },
    setState(state, text) {
      const pill = $(pillId);
      pill.dataset.state = state;
      setText(pill, text);
    },
  });

  // --- connection -----------------------------------------------------------------------------

  const conn = $("connection");
  let socket = null;
  let attempt = 0;
  let lastStateAt = 0;
  let sockError = null;
  let snapshotted = false; // the current socket delivered its snapshot

  function setConn(state, text) {
    conn.dataset.state = state;
    setText(conn, text || state);
    live.connection = state;
    live.emit("connection", state);
  }

  /** Only while the page shows nothing and the socket could not give a snapshot (it never opened). */
  async function loadState() {
    try {
      const response = await fetch(`${cfg.stateUrl}?${query}`, { headers: { Accept: "application/json" } });
      const data = await response.json();
      if (!response.ok) { showAlert(data.error || `state request failed (${response.status})`); return; }
      if (live.top) return; // a socket's snapshot came first
      live.timed(() => live.applySnapshot(data));
      if (data.stale) showAlert(`showing the last known state: ${data.error}`);
      else showAlert(data.source && data.source.error ? data.source.error : null);
    } catch (err) {
      showAlert(`dashboard unreachable: ${err}`);
    }
  }

  function connect() {
    setConn("connecting", "connecting…");
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(`${proto}//${location.host}${cfg.wsPath}?${query}`);
    socket = ws;
    snapshotted = false;
    ws.onopen = () => { attempt = 0; };
    ws.onmessage = (msg) => {
      const data = JSON.parse(msg.data);
      switch (data.type) {
        case "snapshot":
          sockError = null;
          snapshotted = true;
          live.timed(() => live.applySnapshot(data.state));
          lastStateAt = Date.now();
          setConn("live", "live");
          showAlert(data.state.source && data.state.source.error ? data.state.source.error : null);
          break;
        case "delta":
          if (sockError) { sockError = null; showAlert(null); }
          live.timed(() => live.applyDelta(data));
          lastStateAt = Date.now();
          if (live.connection !== "live") setConn("live", "live");
          if (data.source && data.source.error) showAlert(data.source.error);
          break;
        case "events":
          live.timed(() => live.applyEvents(data.events, true));
          if (data.sent_at) live.lastLeg.push(Date.now() / 1000 - data.sent_at);
          if (live.lastLeg.length > 20000) live.lastLeg.splice(0, 10000);
          break;
        case "history": live.applyEvents(data.events, false); break;
        case "audit": live.emit("audit", data.entries, live.connection === "live"); break;
        case "error": sockError = data.error; showAlert(data.error); break;
        default: break;
      }
    };
    ws.onclose = (e) => {
      if (socket !== ws) return;
      socket = null;
      if (e.code === 4400) { setConn("reconnecting", "bad request"); return; } // retrying will not help
      if (e.code === 4401) { setConn("reconnecting", "log in"); return; }
      if (!snapshotted && !live.top && attempt === 0) loadState(); // something to look at while retrying
      const delay = Math.min(10000, 500 * 2 ** attempt) * (0.75 + Math.random() * 0.5);
      attempt += 1;
      setConn("reconnecting", `reconnecting in ${(delay / 1000).toFixed(1)}s`);
      setTimeout(connect, delay);
    };
  }

  setInterval(() => {
    if (socket && socket.readyState === WebSocket.OPEN && Date.now() - lastStateAt > STALE_AFTER_MS) {
      setConn("stale", "stale");
    }
  }, 1000);

  /** Run `render` once in the next animation frame however often it is asked for before then, and
   * (`minGap`, ms) no sooner than that after its last run: a summary over 1024 partitions need not
   * be redone in every frame of a busy hub. */
  function coalesced(render, minGap = 0) {
    let queued = false;
    let last = -Infinity;
    const run = () => { queued = false; last = performance.now(); render(); };
    return () => {
      if (queued) return;
      queued = true;
      const wait = last + minGap - performance.now();
      if (wait > 0) setTimeout(() => requestAnimationFrame(run), wait); else requestAnimationFrame(run);
    };
  }
  live.coalesced = coalesced;

  /** The top of an axis of 4 steps covering `v`, each step 1, 2, 2.5 or 5 times a power of ten
   * (`whole`: whole numbers only). */
  live.niceMax = (v, whole) => {
    const raw = Math.max(v, whole ? 4 : 1e-9) / 4;
    const p = 10 ** Math.floor(Math.log10(raw));
    for (const m of [1, 2, 2.5, 5, 10]) {
      if (whole && m === 2.5 && p < 10) continue;
      if (raw <= m * p) return 4 * m * p;
    }
    return 40 * p;
  };
  live.listen({ state: coalesced(summarise, SUMMARY_EVERY_MS) });
  live.csrf = () => (document.querySelector('meta[name="csrf-token"]') || {}).content || "";
  live.post = async (url, payload) => {
    const response = await fetch(url, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-CSRFToken": live.csrf(), Accept: "application/json" },
      body: JSON.stringify({ hub: cfg.hub, consumer_group: cfg.consumerGroup, ...payload }),
      credentials: "same-origin",
    });
    let data;
    try { data = await response.json(); } catch (err) { data = { error: `${response.status} ${response.statusText}` }; }
    return { ok: response.ok, status: response.status, data };
  };

  window.Leaseboard = live;
  // The page's own scripts register their listeners first. They run after this one, but a classic
  // script's fetch lets timers run meanwhile: on a busy machine a socket opened from setTimeout(0)
  // delivered its snapshot before fleet.js was loaded, and the grid never got its tiles (the deltas
  // after it name only what changed). DOMContentLoaded comes after every script of the page ran.
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", connect, { once: true });
  else setTimeout(connect, 0);
})();
