/* The history page: rebalances derived from the event log by the server (/api/history), fetched
 * again a few seconds after ownership changes arrive.
 */
(() => {
  "use strict";

  const live = window.Leaseboard;
  const { fmt, el, setText } = live;
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";
  let data = null;

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function median(values) {
    if (!values.length) return null;
    const s = values.slice().sort((a, b) => a - b);
    const m = Math.floor(s.length / 2);
    return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
  }

  function renderChart(episodes) {
    const box = $("history-chart");
    box.hidden = episodes.length === 0;
    if (!episodes.length) return;
    const width = Math.max(320, box.clientWidth || 800);
    const height = 180;
    const pad = { l: 44, r: 16, t: 10, b: 26 };
    const times = episodes.map((e) => e.started);
    const t0 = Math.min(...times);
    const t1 = Math.max(...episodes.map((e) => e.ended), Date.now() / 1000, t0 + 60);
    const top = live.niceMax(Math.max(...episodes.map((e) => e.moves + e.claims)), true);
    const x = (t) => pad.l + ((t - t0) / (t1 - t0)) * (width - pad.l - pad.r);
    const y = (v) => height - pad.b - (v / top) * (height - pad.t - pad.b);
    const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height });
    for (let i = 0; i <= 4; i += 1) {
      const v = (top * i) / 4;
      root.append(svg("line", { x1: pad.l, x2: width - pad.r, y1: y(v), y2: y(v), class: "grid-line" }));
      root.append(svg("text", { x: pad.l - 6, y: y(v) + 4, class: "axis", "text-anchor": "end" }, fmt.n(Math.round(v))));
    }
    for (let i = 0; i <= 5; i += 1) {
      const t = t0 + (i / 5) * (t1 - t0);
      root.append(svg("text", { x: x(t), y: height - 8, class: "axis", "text-anchor": i === 0 ? "start" : i === 5 ? "end" : "middle" }, fmt.when(t)));
    }
    for (const e of episodes) {
      const w = Math.max(4, x(e.ended) - x(e.started));
      const g = svg("g", { class: e.balanced === false ? "episode unbalanced" : "episode" });
      g.append(svg("rect", { x: x(e.started), y: y(e.moves + e.claims), width: w, height: y(0) - y(e.moves + e.claims), class: "ep-claims" }));
      g.append(svg("rect", { x: x(e.started), y: y(e.moves), width: w, height: y(0) - y(e.moves), class: "ep-moves" }));
      g.append(svg("title", {}, `${fmt.when(e.started)}: ${e.trigger}\n${e.moves} moves, ${e.claims} first claims, balanced after ${fmt.duration(e.seconds)}`));
      root.append(g);
    }
    box.replaceChildren(root);
  }

  function render() {
    const episodes = data.episodes;
    setText($("h-count"), fmt.n(episodes.length));
    setText($("h-moves"), fmt.n(episodes.reduce((n, e) => n + e.moves, 0)));
    setText($("h-median"), fmt.duration(median(episodes.map((e) => e.seconds))));
    setText($("h-max"), fmt.duration(episodes.length ? Math.max(...episodes.map((e) => e.seconds)) : null));
    setText($("history-note"), `a rebalance ends after ${fmt.duration(data.quiet)} without an ownership change · ${fmt.n(data.events)} events read${data.truncated ? " (the newest only)" : ""}`);
    renderChart(episodes.slice().reverse());
    const tbody = document.querySelector("#episodes tbody");
    tbody.replaceChildren(...episodes.map((e) => {
      const tr = el("tr");
      tr.dataset.firstId = e.first_id;
      const balanced = el("td");
      const b = el("span", "badge", e.balanced === null ? "–" : e.balanced ? "balanced" : "not balanced");
      b.dataset.lagStatus = e.balanced === false ? "WARN" : "OK";
      balanced.append(b);
      balanced.title = Object.entries(e.counts).map(([w, n]) => `${w}: ${n}`).join("\n");
      const kinds = Object.entries(e.kinds).map(([k, n]) => `${k} ${n}`).join(", ");
      const events = el("td", "num", fmt.n(e.events));
      events.title = kinds;
      tr.append(el("td", "", fmt.when(e.started)), el("td", "why", e.trigger), el("td", "num", fmt.n(e.moves)),
        el("td", "num", fmt.n(e.claims)), events, el("td", "num", fmt.duration(e.seconds)), balanced,
        el("td", "muted small", e.workers.join(", ")));
      return tr;
    }));
    $("no-episodes").hidden = episodes.length > 0;
  }

  async function load() {
    const q = new URLSearchParams({ hub: live.cfg.hub, consumer_group: live.cfg.consumerGroup });
    const response = await fetch(`${live.cfg.historyUrl}?${q}`, { headers: { Accept: "application/json" } });
    const body = await response.json();
    if (!response.ok) { live.showAlert(body.error); return; }
    data = body;
    render();
  }

  let pending = null;
  live.listen({
    events(events, fresh) {
      if (!fresh || pending) return;
      pending = setTimeout(() => { pending = null; load(); }, 2000);
    },
  });
  window.addEventListener("resize", () => { if (data) renderChart(data.episodes.slice().reverse()); });
  live.ready.then(load);
})();
