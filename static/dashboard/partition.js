/* One partition: live facts, the lag chart (samples), its ownership timeline, checkpoint history,
 * operator actions and events. The detail JSON is fetched again (never the page) when an event or a
 * sample concerns this partition.
 */
(() => {
  "use strict";

  const live = window.Leaseboard;
  const { fmt, el, setText, who } = live;
  const $ = (id) => document.getElementById(id);
  const pid = live.cfg.partition;
  const url = `${document.body.dataset.partitionUrl}?hub=${encodeURIComponent(live.cfg.hub)}&consumer_group=${encodeURIComponent(live.cfg.consumerGroup)}`;
  const SVG = "http://www.w3.org/2000/svg";
  const STATUS_COLOURS = { OK: "#16a34a", WARN: "#d97706", STALL: "#dc2626", STOP: "#7f1d1d", REWIND: "#7c3aed" };
  let samples = [];
  let detail = null;
  let lastSampled = null;

  // --- facts --------------------------------------------------------------------------------

  function renderFacts() {
    const p = live.view.get(pid);
    if (!p) return;
    const owner = $("p-owner");
    owner.replaceChildren(who(p.owner));
    owner.dataset.owner = p.owner || "";
    setText($("p-lease"), p.status === "owned" ? `renewed ${fmt.clock(p.last_modified)}` : p.status);
    setText($("p-pinned"), p.pinned_to || "–");
    setText($("p-checkpoint"), p.sequence_number === null ? "none" : `${fmt.n(p.sequence_number)} · ${fmt.when(p.checkpoint_modified)}`);
    $("p-checkpoint").dataset.sequenceNumber = p.sequence_number ?? "";
    setText($("p-enqueued"), p.last_enqueued_sequence_number === null ? "–" : `${fmt.n(p.last_enqueued_sequence_number)} · ${fmt.when(p.last_enqueued_time)}`);
    setText($("p-lag"), `${fmt.n(p.lag)} events`);
    $("p-lag").dataset.lag = p.lag ?? "";
    setText($("p-lag-seconds"), fmt.duration(p.lag_seconds));
    setText($("p-rate"), p.events_per_second === null || p.events_per_second === undefined ? "–" : `${fmt.n(p.events_per_second)} events/s`);
    const badge = $("p-status");
    badge.dataset.lagStatus = p.lag_status || "";
    setText(badge, p.lag_status || "no status yet");
    const unpin = document.querySelector('#partition-actions [data-action="unpin"]');
    if (unpin) unpin.hidden = !p.pinned_to;
    const rules = live.top && live.top.lag_rules;
    if (rules) {
      setText($("p-rules"), `Status over the last ${rules.window} samples, one every ${rules.sample_seconds} s; STOP after ${fmt.duration(rules.stop_seconds)} without a checkpoint.`);
    }
  }

  // --- the chart ----------------------------------------------------------------------------

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  const niceMax = live.niceMax;

  function renderChart() {
    const box = $("lag-chart");
    $("no-samples").hidden = samples.length > 0;
    box.hidden = samples.length === 0;
    if (!samples.length) return;
    const width = Math.max(320, box.clientWidth || 800);
    const height = 220;
    const pad = { l: 56, r: 56, t: 12, b: 38 };
    const t0 = samples[0].at;
    const t1 = Math.max(samples[samples.length - 1].at, t0 + 1);
    const maxLag = niceMax(Math.max(...samples.map((s) => s.lag || 0)), true);
    const maxSec = niceMax(Math.max(0.4, ...samples.map((s) => s.lag_seconds || 0)), false);
    const x = (t) => pad.l + ((t - t0) / (t1 - t0)) * (width - pad.l - pad.r);
    const yL = (v) => height - pad.b - (v / maxLag) * (height - pad.t - pad.b);
    const yS = (v) => height - pad.b - (v / maxSec) * (height - pad.t - pad.b);
    const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, class: "lag-svg" });
    for (let i = 0; i <= 4; i += 1) {
      const y = pad.t + (i / 4) * (height - pad.t - pad.b);
      root.append(svg("line", { x1: pad.l, x2: width - pad.r, y1: y, y2: y, class: "grid-line" }));
      root.append(svg("text", { x: pad.l - 6, y: y + 4, class: "axis lag-axis", "text-anchor": "end" }, fmt.n(Math.round(maxLag * (1 - i / 4)))));
      root.append(svg("text", { x: width - pad.r + 6, y: y + 4, class: "axis sec-axis" }, fmt.duration(maxSec * (1 - i / 4))));
    }
    const ticks = 6;
    for (let i = 0; i <= ticks; i += 1) {
      const t = t0 + (i / ticks) * (t1 - t0);
      root.append(svg("text", { x: x(t), y: height - pad.b + 16, class: "axis", "text-anchor": i === 0 ? "start" : i === ticks ? "end" : "middle" }, fmt.clock(t)));
    }
    // Samples further apart than a few intervals mean nobody sampled (the dashboard was down): no line across.
    const spacing = samples.length > 1 ? (t1 - t0) / (samples.length - 1) : 1;
    const every = (live.top && live.top.lag_rules && live.top.lag_rules.sample_seconds) || spacing;
    const gap = Math.max(3 * every, 10);
    const path = (points, y) => points.map((s, i) => {
      const move = i === 0 || s.at - points[i - 1].at > gap ? "M" : "L";
      return `${move}${x(s.at).toFixed(1)},${y(s).toFixed(1)}`;
    }).join("");
    // status strip along the bottom
    for (let i = 0; i < samples.length; i += 1) {
      const s = samples[i];
      let next = i + 1 < samples.length ? samples[i + 1].at : t1;
      if (next - s.at > gap) next = s.at + every;
      if (!s.status) continue;
      root.append(svg("rect", { x: x(s.at), y: height - pad.b + 22, width: Math.max(1, x(next) - x(s.at)), height: 6, fill: STATUS_COLOURS[s.status] || "#94a3b8" }));
    }
    const known = samples.filter((s) => s.lag !== null);
    if (known.length) {
      // the area under each unbroken stretch of the line
      let start = 0;
      for (let i = 1; i <= known.length; i += 1) {
        if (i < known.length && known[i].at - known[i - 1].at <= gap) continue;
        const run = known.slice(start, i);
        const d = `${path(run, (s) => yL(s.lag))}L${x(run[run.length - 1].at).toFixed(1)},${yL(0)}L${x(run[0].at).toFixed(1)},${yL(0)}Z`;
        root.append(svg("path", { d, class: "lag-area" }));
        start = i;
      }
      root.append(svg("path", { d: path(known, (s) => yL(s.lag)), class: "lag-line" }));
    }
    const secs = samples.filter((s) => s.lag_seconds !== null && s.lag_seconds !== undefined);
    if (secs.length) root.append(svg("path", { d: path(secs, (s) => yS(s.lag_seconds)), class: "sec-line" }));
    root.append(svg("text", { x: pad.l, y: height - 2, class: "axis legend-lag" }, "■ lag (events, left)"),
      svg("text", { x: pad.l + 150, y: height - 2, class: "axis legend-sec" }, "— lag (time, right)"),
      svg("text", { x: pad.l + 290, y: height - 2, class: "axis" }, "▬ status"));
    box.replaceChildren(root);
    setText($("chart-span"), `${samples.length} samples since ${fmt.when(t0)}`);
  }

  // --- tables -------------------------------------------------------------------------------

  function renderTimeline() {
    const tbody = document.querySelector("#timeline tbody");
    const spans = detail.timeline.slice().reverse();
    tbody.replaceChildren(...spans.map((s) => {
      const tr = el("tr");
      tr.dataset.owner = s.owner;
      const owner = el("td"); owner.append(who(s.owner));
      const came = el("td", "why");
      came.append(el("span", "kind", s.came), " ", el("span", "muted", s.came_reason + (s.from ? ` (from ${s.from})` : "")));
      came.querySelector(".kind").dataset.kind = s.came;
      const left = el("td", "why");
      if (s.ended) {
        left.append(el("span", "kind", s.ended), " ", el("span", "muted", s.ended_reason || ""));
        left.querySelector(".kind").dataset.kind = s.ended;
      } else left.append(el("span", "muted", "holds it now"));
      tr.append(owner, el("td", "", fmt.when(s.since)), came, el("td", "", s.until ? fmt.when(s.until) : "now"), left);
      return tr;
    }));
    $("no-timeline").hidden = spans.length > 0;
    // the bar: each holding as a coloured stretch over the covered time
    const bar = $("timeline-bar");
    bar.replaceChildren();
    if (!detail.timeline.length) return;
    const start = detail.timeline[0].since;
    const end = Math.max(Date.now() / 1000, start + 1);
    for (const s of detail.timeline) {
      const seg = el("span", "seg");
      const left = ((s.since - start) / (end - start)) * 100;
      const right = (((s.until || end) - start) / (end - start)) * 100;
      seg.style.left = `${left}%`;
      seg.style.width = `${Math.max(0.4, right - left)}%`;
      seg.style.background = fmt.colour(s.owner);
      seg.title = `${s.owner}: ${fmt.when(s.since)} – ${s.until ? fmt.when(s.until) : "now"}`;
      bar.append(seg);
    }
  }

  function renderCheckpoints() {
    const tbody = document.querySelector("#checkpoints tbody");
    const moves = detail.checkpoints.slice(-100).reverse();
    tbody.replaceChildren(...moves.map((c) => {
      const tr = el("tr");
      if (c.moved !== null && c.moved < 0) tr.classList.add("rewind");
      const by = el("td"); by.append(who(c.owner));
      const moved = c.moved === null ? "–" : (c.moved > 0 ? `+${fmt.n(c.moved)}` : fmt.n(c.moved));
      tr.append(el("td", "", fmt.when(c.at)), el("td", "num", fmt.n(c.sequence_number)), el("td", "num", moved), by);
      return tr;
    }));
    $("no-checkpoints").hidden = moves.length > 0;
  }

  function renderLists() {
    const audit = $("audit");
    audit.replaceChildren(...detail.audit.map(live.auditItem));
    $("no-audit").hidden = detail.audit.length > 0;
    const feed = $("feed");
    feed.replaceChildren(...detail.events.slice().reverse().slice(0, 100).map((ev) => live.eventItem(ev, false)));
    $("no-events").hidden = detail.events.length > 0;
  }

  async function load() {
    const response = await fetch(url, { headers: { Accept: "application/json" } });
    if (!response.ok) { live.showAlert(`partition ${pid}: ${(await response.json()).error || response.status}`); return; }
    detail = await response.json();
    samples = detail.samples;
    renderChart();
    renderTimeline();
    renderCheckpoints();
    renderLists();
  }

  let pending = null;
  function reload(delay) {
    if (pending) return;
    pending = setTimeout(() => { pending = null; load(); }, delay);
  }

  live.listen({
    state(changed) {
      if (changed === null || changed.has(pid)) renderFacts();
      const sampled = live.top && live.top.sampled_at;
      if (sampled && lastSampled !== null && sampled !== lastSampled) reload(300);
      lastSampled = sampled || lastSampled;
    },
    events(events, fresh) {
      if (fresh && events.some((ev) => ev.partition_id === pid)) reload(300);
    },
    audit(entries, fresh) {
      if (fresh && entries.some((e) => e.target === pid)) reload(100);
    },
  });
  window.addEventListener("resize", () => renderChart());
  live.ready.then(load);
})();
