/* Leaseboard live dashboard. Plain JS, no build step.
 *
 * State model: a snapshot (from /api/state or the websocket) carries `last_event_id`, the newest
 * event already reflected in it. Events above it are applied on top, each once, per partition in
 * id order; a newer snapshot replaces the state and the buffered events above its watermark are
 * replayed on it. Tiles are created once and only changed fields are written, so a burst of
 * events or a snapshot of 1024 partitions touches only what moved.
 */
(() => {
  "use strict";

  const body = document.body;
  const cfg = {
    hub: body.dataset.hub,
    consumerGroup: body.dataset.consumerGroup,
    stateUrl: body.dataset.stateUrl,
    eventsUrl: body.dataset.eventsUrl,
    wsPath: body.dataset.wsPath,
  };
  const query = new URLSearchParams({ hub: cfg.hub, consumer_group: cfg.consumerGroup }).toString();

  const COMPACT_ABOVE = 128; // partitions; above this tiles shrink to coloured squares
  const FEED_MAX = 200;
  const BUFFER_MAX = 5000;
  const STALE_AFTER_MS = 5000;
  const PALETTE = ["#2563eb", "#7c3aed", "#059669", "#db2777", "#ea580c", "#0891b2",
                   "#4d7c0f", "#9333ea", "#dc2626", "#0f766e", "#a16207", "#4f46e5"];

  const $ = (id) => document.getElementById(id);
  const grid = $("partitions");
  const feed = $("feed");
  const workersBody = document.querySelector("#workers tbody");
  const legend = $("legend");
  const conn = $("connection");
  const alertBox = $("alert");

  const tiles = new Map(); // partition id -> {el, parts, data, eventId}
  const colours = new Map(); // owner id -> colour, stable for this page's life
  let snapshot = null; // the last snapshot applied (partitions are in `tiles`)
  let watermark = 0;
  let buffered = []; // events above `watermark`, in id order
  const bufferedIds = new Set();
  const feedIds = new Set();
  let lastSnapshotAt = 0;
  let socket = null;
  let attempt = 0;
  let sockError = null;

  // --- formatting -------------------------------------------------------------------------

  // One formatter each: toLocaleString() builds a new one per call, far too slow for 1024 tiles a second.
  const numbers = new Intl.NumberFormat("en-US");
  const times = new Intl.DateTimeFormat("en-GB", { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
  const fmt = (n) => (n === null || n === undefined ? "–" : numbers.format(n));
  const clock = (epoch) => (epoch ? times.format(new Date(epoch * 1000)) : "–");
  function ago(seconds) {
    if (seconds === null || seconds === undefined) return "never";
    const s = Math.max(0, seconds);
    if (s < 1) return "just now";
    if (s < 90) return `${Math.round(s)}s ago`;
    if (s < 5400) return `${Math.round(s / 60)}m ago`;
    return `${Math.round(s / 3600)}h ago`;
  }
  function colour(owner) {
    if (!owner) return null;
    let c = colours.get(owner);
    if (!c) {
      const i = colours.size;
      c = i < PALETTE.length ? PALETTE[i] : `hsl(${Math.round((i * 137.508) % 360)} 55% 38%)`;
      colours.set(owner, c);
    }
    return c;
  }
  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function setText(node, text) {
    if (node.textContent !== text) node.textContent = text;
  }
  function setData(node, key, value) {
    const text = String(value);
    if (node.dataset[key] !== text) node.dataset[key] = text;
  }

  // --- partition tiles ----------------------------------------------------------------------

  function makeTile(pid) {
    const node = el("div", "tile");
    node.id = `partition-${pid}`;
    node.dataset.partition = pid;
    const parts = {
      pid: el("span", "pid"), pin: el("span", "pin"), owner: el("span", "owner"), ckpt: el("span", "ckpt"), lag: el("span", "lag"),
    };
    parts.pid.append(el("span", "p", "P"), pid); // the "P" is hidden on compact tiles
    const top = el("div", "top");
    top.append(parts.pid, parts.pin);
    const facts = el("div", "facts");
    facts.append(parts.ckpt, parts.lag);
    node.append(top, parts.owner, facts);
    return { el: node, parts, data: null, eventId: 0 };
  }

  const TILE_FIELDS = ["owner", "status", "sequence_number", "last_enqueued_sequence_number", "lag", "pinned_to", "last_modified"];

  function paintTile(tile, data, animate) {
    const old = tile.data;
    tile.data = data;
    if (old && TILE_FIELDS.every((f) => old[f] === data[f])) return; // most tiles, most seconds
    const n = tile.el;
    if (!old || old.owner !== data.owner || old.status !== data.status) {
      n.dataset.owner = data.owner || "";
      n.dataset.status = data.status;
      const c = colour(data.owner);
      if (c) n.style.setProperty("--owner", c); else n.style.removeProperty("--owner");
      setText(tile.parts.owner, data.owner || (data.status === "expired" ? "lease expired" : "unowned"));
      if (old && animate) {
        n.classList.add("changed");
        setTimeout(() => n.classList.remove("changed"), 1200);
      }
    }
    const pinned = data.pinned_to || "";
    n.classList.toggle("pinned", Boolean(pinned));
    setData(n, "pinnedTo", pinned);
    setText(tile.parts.pin, !pinned ? "" : pinned === data.owner ? "pinned" : `pin → ${pinned}`);
    setData(n, "sequenceNumber", data.sequence_number ?? "");
    setData(n, "lag", data.lag ?? "");
    setText(tile.parts.ckpt, `ckpt ${fmt(data.sequence_number)}`);
    setText(tile.parts.lag, `lag ${fmt(data.lag)}`);
    tile.parts.lag.classList.toggle("high", (data.lag || 0) >= 1000);
    const title = [`Partition ${data.id}: ${data.owner ? `owned by ${data.owner}` : data.status}`,
      `checkpoint ${fmt(data.sequence_number)} · last enqueued ${fmt(data.last_enqueued_sequence_number)} · lag ${fmt(data.lag)}`,
      `lease modified ${clock(data.last_modified)}`];
    if (pinned) title.push(`pinned to ${pinned}`);
    const t = title.join("\n");
    if (n.title !== t) n.title = t;
  }

  function layoutTiles(partitions) {
    const ids = partitions.map((p) => p.id);
    const same = ids.length === tiles.size && ids.every((id) => tiles.has(id));
    if (!same) {
      const wanted = new Set(ids);
      for (const [id, tile] of tiles) if (!wanted.has(id)) { tile.el.remove(); tiles.delete(id); }
      const frag = document.createDocumentFragment();
      for (const id of ids) {
        let tile = tiles.get(id);
        if (!tile) { tile = makeTile(id); tiles.set(id, tile); }
        frag.append(tile.el); // re-appending keeps id order when partitions were added
      }
      grid.append(frag);
      grid.classList.toggle("compact", ids.length > COMPACT_ABOVE);
      setText($("partition-count"), `(${ids.length})`);
    }
  }

  // --- events -----------------------------------------------------------------------------

  /** The tile data after `ev`, or null when the event says nothing certain about the owner. */
  function afterEvent(data, ev) {
    switch (ev.kind) {
      case "claim": case "expire": case "steal":
        return ev.owner_id ? { ...data, owner: ev.owner_id, status: "owned" } : null;
      case "release":
        return data.owner === ev.previous_owner || data.owner === null ? { ...data, owner: null, status: "unowned" } : null;
      case "lost": // the loser reports; the winner (if named) holds it now
        return ev.owner_id ? { ...data, owner: ev.owner_id, status: "owned" } : null;
      default:
        return null;
    }
  }

  function applyToTile(ev, animate) {
    const tile = tiles.get(ev.partition_id);
    if (!tile || !tile.data || ev.id <= tile.eventId) return;
    tile.eventId = ev.id;
    const next = afterEvent(tile.data, ev);
    if (next) paintTile(tile, next, animate);
  }

  function addToFeed(ev, fresh) {
    if (feedIds.has(ev.id)) return;
    feedIds.add(ev.id);
    const li = el("li");
    li.dataset.eventId = ev.id;
    li.dataset.kind = ev.kind;
    li.dataset.partition = ev.partition_id;
    li.dataset.owner = ev.owner_id || "";
    if (fresh) li.classList.add("fresh");
    const time = el("time", "", clock(ev.at));
    time.dateTime = new Date(ev.at * 1000).toISOString();
    const kind = el("span", "kind", ev.kind);
    kind.dataset.kind = ev.kind;
    const move = el("span", "move");
    move.append(`P${ev.partition_id}  `, who(ev.previous_owner), " → ", who(ev.owner_id));
    const reason = el("span", "reason", ev.reason || "");
    if (ev.reporter && ev.reporter !== ev.owner_id && ev.reporter !== ev.previous_owner) reason.textContent += ` (reported by ${ev.reporter})`;
    li.append(time, kind, move, reason);
    let before = feed.firstElementChild; // newest first; live events nearly always go on top
    while (before && Number(before.dataset.eventId) > ev.id) before = before.nextElementSibling;
    feed.insertBefore(li, before);
    while (feed.children.length > FEED_MAX) {
      feedIds.delete(Number(feed.lastElementChild.dataset.eventId));
      feed.lastElementChild.remove();
    }
    $("no-events").hidden = true;
  }

  function who(owner) {
    const span = el("span");
    if (!owner) { span.textContent = "nobody"; span.className = "muted"; return span; }
    const chip = el("span", "chip");
    chip.style.background = colour(owner);
    span.append(chip, owner);
    return span;
  }

  function onEvents(events, fresh) {
    for (const ev of events) {
      addToFeed(ev, fresh);
      if (ev.id > watermark && !bufferedIds.has(ev.id)) {
        buffered.push(ev);
        bufferedIds.add(ev.id);
        applyToTile(ev, true);
      }
    }
    buffered.sort((a, b) => a.id - b.id);
    while (buffered.length > BUFFER_MAX) bufferedIds.delete(buffered.shift().id);
    refreshTotals();
  }

  // --- snapshots --------------------------------------------------------------------------

  function onSnapshot(state) {
    // Colours go to workers in id order first, so a reload shows the same colours for the same workers.
    for (const id of state.workers.map((w) => w.id).sort()) colour(id);
    snapshot = state;
    lastSnapshotAt = Date.now();
    watermark = state.last_event_id || 0;
    buffered = buffered.filter((ev) => ev.id > watermark);
    bufferedIds.clear();
    const replay = new Map(); // partition id -> its buffered events, in id order
    for (const ev of buffered) {
      bufferedIds.add(ev.id);
      if (!replay.has(ev.partition_id)) replay.set(ev.partition_id, []);
      replay.get(ev.partition_id).push(ev);
    }
    layoutTiles(state.partitions);
    for (const p of state.partitions) {
      const tile = tiles.get(p.id);
      let data = p;
      tile.eventId = watermark;
      for (const ev of replay.get(p.id) || []) {
        data = afterEvent(data, ev) || data;
        tile.eventId = ev.id;
      }
      paintTile(tile, data, true);
    }
    renderWorkers(state);
    refreshTotals();
    showAlert(sockError || (state.source && state.source.error ? state.source.error : null));
    if (socket && socket.readyState === WebSocket.OPEN) setConn("live", "live");
  }

  function ownedCounts() {
    const counts = new Map();
    for (const tile of tiles.values()) {
      const o = tile.data && tile.data.owner;
      if (o) counts.set(o, (counts.get(o) || 0) + 1);
    }
    return counts;
  }

  function renderWorkers(state) {
    const rows = [];
    for (const w of state.workers) {
      const tr = el("tr");
      tr.dataset.worker = w.id;
      tr.dataset.alive = String(w.alive);
      tr.dataset.draining = String(w.draining);
      const id = el("td");
      const wrap = el("span", "wid");
      const chip = el("span", "chip");
      chip.style.background = colour(w.id);
      wrap.append(chip, w.id);
      if (w.draining) wrap.append(el("span", "tag", "draining"));
      id.append(wrap);
      const owned = el("td", "num owned", String(w.owned));
      const alive = el("td");
      alive.append(el("span", "dot"), w.alive ? "alive" : "gone");
      const seen = el("td", "seen", w.last_seen === null ? "never" : ago(state.generated_at - w.last_seen));
      tr.append(id, owned, alive, seen);
      rows.push(tr);
    }
    workersBody.replaceChildren(...rows);
    $("no-workers").hidden = state.workers.length > 0;
  }

  function refreshTotals() {
    if (!snapshot) return;
    const counts = ownedCounts();
    for (const tr of workersBody.children) setText(tr.querySelector(".owned"), String(counts.get(tr.dataset.worker) || 0));
    let owned = 0;
    let lag = 0;
    let lagKnown = false;
    for (const tile of tiles.values()) {
      if (tile.data.owner) owned += 1;
      if (tile.data.lag !== null && tile.data.lag !== undefined) { lag += tile.data.lag; lagKnown = true; }
    }
    setText($("owned-summary"), `${owned} / ${tiles.size} owned`);
    const alive = snapshot.workers.filter((w) => w.alive).length;
    setText($("workers-summary"), `${alive} worker${alive === 1 ? "" : "s"} alive`);
    setText($("lag-summary"), `lag ${lagKnown ? fmt(lag) : "–"}`);
    renderLegend(counts);
  }

  let legendKey = "";
  function renderLegend(counts) {
    const owners = [...new Set([...snapshot.workers.map((w) => w.id), ...counts.keys()])].sort();
    const key = owners.join("\u0000");
    if (key === legendKey) return;
    legendKey = key;
    for (const li of legend.querySelectorAll(".owner-key")) li.remove();
    const first = legend.firstElementChild;
    for (const owner of owners) {
      const li = el("li", "owner-key");
      li.dataset.owner = owner;
      const sw = el("span", "swatch");
      sw.style.background = colour(owner);
      li.append(sw, owner);
      legend.insertBefore(li, first);
    }
  }

  function showAlert(text) {
    alertBox.hidden = !text;
    if (text) setText(alertBox, text);
  }

  // --- connection -------------------------------------------------------------------------

  function setConn(state, text) {
    conn.dataset.state = state;
    setText(conn, text || state);
  }

  async function loadState() {
    try {
      const response = await fetch(`${cfg.stateUrl}?${query}`, { headers: { Accept: "application/json" } });
      const data = await response.json();
      if (!response.ok) { showAlert(data.error || `state request failed (${response.status})`); return; }
      onSnapshot(data);
    } catch (err) {
      showAlert(`dashboard unreachable: ${err}`);
    }
  }

  function connect() {
    setConn("connecting", "connecting…");
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(`${proto}//${location.host}${cfg.wsPath}?${query}`);
    socket = ws;
    ws.onopen = () => { attempt = 0; setConn("live", "live"); };
    ws.onmessage = (msg) => {
      const data = JSON.parse(msg.data);
      if (data.type === "snapshot") { sockError = null; timed(() => onSnapshot(data.state)); }
      else if (data.type === "events") timed(() => onEvents(data.events, true));
      else if (data.type === "history") onEvents(data.events, false);
      else if (data.type === "error") { sockError = data.error; showAlert(data.error); }
    };
    ws.onclose = (e) => {
      if (socket !== ws) return;
      socket = null;
      if (e.code === 4400) { setConn("reconnecting", "bad request"); return; } // retrying will not help
      const delay = Math.min(10000, 500 * 2 ** attempt) * (0.75 + Math.random() * 0.5);
      attempt += 1;
      setConn("reconnecting", `reconnecting in ${(delay / 1000).toFixed(1)}s`);
      setTimeout(() => { loadState().finally(connect); }, delay);
    };
  }

  setInterval(() => {
    if (socket && socket.readyState === WebSocket.OPEN && Date.now() - lastSnapshotAt > STALE_AFTER_MS) {
      setConn("stale", "stale");
    }
  }, 1000);

  const renderMs = []; // the last renders' durations, for checking the page stays light at 1024 partitions
  function timed(render) {
    const started = performance.now();
    render();
    renderMs.push(Math.round((performance.now() - started) * 10) / 10);
    if (renderMs.length > 50) renderMs.shift();
  }

  window.leaseboard = { tiles, renderMs, applySnapshot: onSnapshot, get snapshot() { return snapshot; }, get watermark() { return watermark; } };
  loadState().finally(connect);
})();
