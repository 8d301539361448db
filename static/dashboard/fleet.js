/* The fleet page: the partition grid, the workers, the audit log and the latest events.
 * Tiles are created once and only changed fields are written; worker rows are kept by id and
 * updated in place (a row rebuilt every second would swallow clicks on its buttons).
 */
(() => {
  "use strict";

  const live = window.Leaseboard;
  const { fmt, el, setText, setData, setHidden, setTitle } = live;
  const $ = (id) => document.getElementById(id);
  const grid = $("partitions");
  const workersBody = document.querySelector("#workers tbody");
  const legend = $("legend");
  const feed = $("feed");
  const audit = $("audit");
  const COMPACT_ABOVE = 128; // partitions; above this tiles shrink to coloured squares
  const FEED_MAX = 60;
  const AUDIT_MAX = 20;

  const tiles = new Map(); // partition id -> {el, parts, data}
  const rows = new Map(); // worker id -> {tr, cells}
  const feedIds = new Set();

  // --- tiles --------------------------------------------------------------------------------

  function makeTile(pid) {
    const node = el("a", "tile");
    node.id = `partition-${pid}`;
    node.href = live.partitionLink(pid);
    node.dataset.partition = pid;
    const parts = {
      pid: el("span", "pid"), pin: el("span", "pin"), owner: el("span", "owner"),
      lag: el("span", "lag"), seconds: el("span", "seconds"), status: el("span", "badge"),
    };
    parts.pid.append(el("span", "p", "P"), pid); // the "P" is hidden on compact tiles
    const top = el("div", "top");
    top.append(parts.pid, parts.status, parts.pin);
    const facts = el("div", "facts");
    facts.append(parts.lag, parts.seconds);
    node.append(top, parts.owner, facts);
    return { el: node, parts, data: null };
  }

  const TILE_FIELDS = ["owner", "status", "sequence_number", "last_enqueued_sequence_number", "lag", "pinned_to",
    "last_modified", "lag_seconds", "lag_status"];

  function paintTile(tile, data) {
    const old = tile.data;
    tile.data = data;
    if (old && TILE_FIELDS.every((f) => old[f] === data[f])) return; // most tiles, most seconds
    const n = tile.el;
    const compact = grid.classList.contains("compact");
    if (!old || old.owner !== data.owner || old.status !== data.status) {
      n.dataset.owner = data.owner || "";
      n.dataset.status = data.status;
      const c = fmt.colour(data.owner);
      if (c) n.style.setProperty("--owner", c); else n.style.removeProperty("--owner");
      setText(tile.parts.owner, data.owner || (data.status === "expired" ? "lease expired" : "unowned"));
      if (old && !compact) {
        n.classList.add("changed");
        setTimeout(() => n.classList.remove("changed"), 1200);
      }
    }
    const pinned = data.pinned_to || "";
    n.classList.toggle("pinned", Boolean(pinned));
    setData(n, "pinnedTo", pinned);
    setText(tile.parts.pin, !pinned ? "" : pinned === data.owner ? "pinned" : `pin → ${pinned}`);
    setData(n, "sequenceNumber", data.sequence_number);
    setData(n, "lag", data.lag);
    setData(n, "lagSeconds", data.lag_seconds);
    setData(n, "lagStatus", data.lag_status);
    setData(tile.parts.status, "lagStatus", data.lag_status);
    setText(tile.parts.status, data.lag_status && data.lag_status !== "OK" ? data.lag_status : "");
    if (compact) return; // the texts below are hidden on compact tiles: the tooltip says it all
    setText(tile.parts.lag, `lag ${fmt.n(data.lag)}`);
    setText(tile.parts.seconds, data.lag_seconds === null || data.lag_seconds === undefined ? "" : fmt.duration(data.lag_seconds));
    tile.parts.lag.classList.toggle("high", (data.lag || 0) >= 1000);
  }

  /** The tooltip, written when the pointer reaches a tile (1024 of them a second would be wasted work). */
  function describe(data) {
    const lines = [`Partition ${data.id}: ${data.owner ? `owned by ${data.owner}` : data.status}`,
      `checkpoint ${fmt.n(data.sequence_number)} · last enqueued ${fmt.n(data.last_enqueued_sequence_number)}`,
      `lag ${fmt.n(data.lag)} events · ${fmt.duration(data.lag_seconds)} · status ${data.lag_status || "–"}`,
      `lease renewed ${fmt.clock(data.last_modified)}`];
    if (data.pinned_to) lines.push(`pinned to ${data.pinned_to}`);
    return lines.join("\n");
  }
  grid.addEventListener("pointerover", (e) => {
    const node = e.target.closest(".tile");
    const tile = node && tiles.get(node.dataset.partition);
    if (tile && tile.data) node.title = describe(tile.data);
  });

  function layoutTiles() {
    const ids = live.order;
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

  // --- workers ------------------------------------------------------------------------------

  function actionButton(action, target, label) {
    const b = el("button", "small", label);
    b.type = "button";
    b.dataset.action = action;
    b.dataset.target = target;
    return b;
  }

  function makeRow(id) {
    const tr = el("tr");
    tr.dataset.worker = id;
    const name = el("td");
    const wrap = el("span", "wid");
    const chip = el("span", "chip");
    chip.style.background = fmt.colour(id);
    const tag = el("span", "tag", "draining");
    const gaveUp = el("span", "tag gave-up");
    wrap.append(chip, el("span", "name", id), tag, gaveUp);
    name.append(wrap);
    const cells = {
      tag, gaveUp, owned: el("td", "num owned"), rate: el("td", "num rate"), seen: el("td", "seen"), actions: null,
    };
    const dot = el("span", "dot");
    const seenText = el("span");
    cells.seen.append(dot, seenText);
    cells.seenText = seenText;
    tr.append(name, cells.owned, cells.rate, cells.seen);
    if (live.cfg.canAct) {
      cells.actions = el("td", "row-actions");
      cells.drain = actionButton("drain", id, "Drain");
      cells.undrain = actionButton("undrain", id, "Undrain");
      cells.purge = actionButton("purge", id, "Purge");
      cells.actions.append(cells.drain, cells.undrain, cells.purge);
      tr.append(cells.actions);
    }
    return { tr, cells };
  }

  function renderWorkers() {
    const now = live.top ? live.top.generated_at : null;
    const ids = live.workerOrder.filter((id) => live.workers.has(id));
    for (const [id, row] of rows) if (!live.workers.has(id)) { row.tr.remove(); rows.delete(id); }
    let previous = null;
    for (const id of ids) {
      const w = live.workers.get(id);
      let row = rows.get(id);
      if (!row) { row = makeRow(id); rows.set(id, row); }
      const expected = previous ? previous.nextSibling : workersBody.firstChild;
      if (row.tr !== expected) workersBody.insertBefore(row.tr, expected);
      previous = row.tr;
      setData(row.tr, "alive", w.alive);
      setData(row.tr, "draining", w.draining);
      setData(row.tr, "purgeable", Boolean(w.purgeable));
      setHidden(row.cells.tag, !w.draining);
      const avoiding = w.avoiding || [];
      setHidden(row.cells.gaveUp, avoiding.length === 0);
      const unreading = avoiding.includes("*"); // it cannot read the hub at all: handing everything over
      setText(row.cells.gaveUp, unreading ? "can't read the hub" : `gave up ${avoiding.join(", ")}`);
      setTitle(row.cells.gaveUp, unreading
        ? "every reader of this worker kept failing: it hands its partitions over and claims none for now"
        : "partitions stuck on this worker (a reader that kept failing or hung, or a handler call stuck twice on one event), released for another worker; it takes them no more for now");
      setText(row.cells.owned, String(w.owned)); // the server's count, as of the last state
      setText(row.cells.rate, w.events_per_second === null || w.events_per_second === undefined ? "–" : fmt.n(w.events_per_second));
      const seen = w.last_seen === null || now === null ? "never" : fmt.ago(now - w.last_seen);
      setText(row.cells.seenText, w.alive ? seen : `gone · ${seen}`);
      setTitle(row.cells.seen, w.last_seen ? `last heartbeat ${fmt.when(w.last_seen)} (store clock)` : "no heartbeat");
      if (row.cells.actions) {
        setHidden(row.cells.drain, w.draining);
        setHidden(row.cells.undrain, !w.draining);
        setHidden(row.cells.purge, !w.purgeable);
      }
    }
    setHidden($("no-workers"), ids.length > 0);
    const alive = ids.filter((id) => live.workers.get(id).alive).length;
    const draining = ids.filter((id) => live.workers.get(id).draining).length;
    setText($("worker-count"), ids.length ? `(${alive} alive of ${ids.length}${draining ? `, ${draining} draining` : ""})` : "");
    renderLegend();
    renderCapacity();
  }

  // --- desired workers ----------------------------------------------------------------------

  const rate = (v) => (v === null || v === undefined ? "–" : fmt.n(v));
  function renderCapacity() {
    const c = live.top && live.top.summary ? live.top.summary.capacity : null;
    setHidden($("capacity"), !c);
    if (!c) return;
    setText($("desired-workers"), String(c.desired_workers));
    setText($("keda-workers"), c.keda_desired_workers === null ? "–" : String(c.keda_desired_workers));
    setText($("keda-threshold"), String(c.keda_threshold));
    setText($("capacity-workers"), String(c.workers));
    setText($("capacity-target"), fmt.duration(c.target_catchup_seconds));
    setText($("enqueue-rate"), rate(c.enqueue_rate));
    setText($("processing-rate"), rate(c.processing_rate));
    setText($("per-worker-rate"), rate(c.per_worker_rate));
    setText($("per-worker-kind"), c.per_worker_rate === null ? "" : c.measured_capacity ? " (measured while behind)" : " (at least)");
    setText($("backlog"), fmt.n(c.backlog));
    setHidden($("capacity-reason"), !c.reason);
    setText($("capacity-reason"), c.reason || "");
  }

  let legendKey = "";
  function renderLegend() {
    const owners = [...live.workers.keys()].sort(); // every owner of a lease is among the workers
    const key = owners.join("\u0000");
    if (key === legendKey) return;
    legendKey = key;
    for (const li of legend.querySelectorAll(".owner-key")) li.remove();
    const first = legend.firstElementChild;
    for (const owner of owners.slice(0, 24)) {
      const li = el("li", "owner-key");
      li.dataset.owner = owner;
      const sw = el("span", "swatch");
      sw.style.background = fmt.colour(owner);
      li.append(sw, owner);
      legend.insertBefore(li, first);
    }
    if (owners.length > 24) legend.insertBefore(el("li", "owner-key muted", `+${owners.length - 24} more`), first);
  }

  // --- listeners ----------------------------------------------------------------------------

  // The feed takes what arrived during a frame in one go; at more than a few events a second nobody reads
  // it line by line, so new lines stop flashing (each flash is a style recalculation every frame).
  let pending = [];
  const arrivals = [];
  function flushFeed() {
    const now = performance.now();
    arrivals.push(...pending.map(() => now));
    while (arrivals.length && now - arrivals[0] > 1000) arrivals.shift();
    const calm = arrivals.length <= 10;
    const newest = pending.slice(-FEED_MAX);
    pending = [];
    for (const [ev, fresh] of newest) live.insertNewestFirst(feed, live.eventItem(ev, fresh && calm), FEED_MAX, feedIds);
    setHidden($("no-events"), feed.children.length > 0);
  }
  const feedLater = live.coalesced(flushFeed);

  // Tiles are painted as events arrive; the worker table at most a few times a second.
  const workersLater = live.coalesced(renderWorkers, live.SUMMARY_EVERY_MS);
  live.listen({
    state(changed) {
      if (changed === null) layoutTiles();
      const ids = changed === null ? live.order : changed;
      for (const id of ids) {
        const tile = tiles.get(id);
        const data = live.view.get(id);
        if (tile && data) paintTile(tile, data);
      }
      workersLater();
    },
    events(events, fresh) {
      for (const ev of events) {
        if (feedIds.has(ev.id)) continue;
        feedIds.add(ev.id);
        pending.push([ev, fresh]);
      }
      feedLater();
    },
    audit(entries, fresh) {
      for (const entry of entries) {
        if (audit.querySelector(`[data-audit-id="${entry.id}"]`)) continue;
        const li = live.auditItem(entry);
        if (fresh) li.classList.add("fresh");
        audit.prepend(li);
      }
      while (audit.children.length > AUDIT_MAX) audit.lastElementChild.remove();
      $("no-audit").hidden = audit.children.length > 0;
    },
  });
  window.leaseboard = { tiles, get renderMs() { return live.renderMs; } }; // kept for older tests and tools
})();
