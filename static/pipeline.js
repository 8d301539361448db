/* Leaseboard Pipeline page. Plain JS, no build step, no CDN.
 *
 * Polls /api/pipeline every few seconds (data-poll-seconds) and redraws: the figures, a stacked
 * bar chart of events per minute per sensor with the alerts as a line (inline SVG), the batch
 * durations as bars, and the tables. A failed poll marks the page stale and keeps the last data.
 *
 * Alerts and the live latency also arrive over the /ws/pipeline/ websocket (data-feed-path) the
 * moment they are raised: the alerts table merges both sources (one row per partition and sequence
 * number, the newest data-alert-rows by event time, as the API lists them). A closed socket is
 * opened again with backoff; meanwhile the poll keeps everything current, a few seconds later.
 */
(() => {
  "use strict";

  const body = document.body;
  const apiUrl = `${body.dataset.apiUrl}?${new URLSearchParams({ hub: body.dataset.hub })}`;
  const pollMs = Math.max(1, Number(body.dataset.pollSeconds) || 3) * 1000;
  const alertRows = Math.max(1, Number(body.dataset.alertRows) || 20);
  const SVG = "http://www.w3.org/2000/svg";
  const COLOURS = { motion: "#94a3b8", door: "#2563eb", window: "#0891b2", glass_break: "#db2777", smoke: "#ea580c" };
  const EXTRA = ["#7c3aed", "#059669", "#a16207", "#4f46e5"];
  const KINDS = { glass_break: "glass break", smoke: "smoke", opened_while_armed: "opened while armed" };

  const $ = (id) => document.getElementById(id);
  const numbers = new Intl.NumberFormat("en-US");
  const hm = new Intl.DateTimeFormat("en-GB", { hour: "2-digit", minute: "2-digit", hour12: false });
  const hms = new Intl.DateTimeFormat("en-GB", { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
  const fmt = (n) => (n === null || n === undefined ? "–" : numbers.format(n));
  const clock = (epoch) => (epoch ? hms.format(new Date(epoch * 1000)) : "–");
  function seconds(s) {
    if (s === null || s === undefined) return "–";
    if (s < 10) return `${s.toFixed(1)} s`;
    if (s < 120) return `${Math.round(s)} s`;
    if (s < 7200) return `${Math.round(s / 60)} min`;
    return `${Math.round(s / 3600)} h`;
  }
  // From enqueued to committed: of the batch's newest event, and of its oldest when it took longer.
  function latency(b) {
    if (b.latency_seconds === null) return "–";
    const most = b.max_latency_seconds;
    return most !== null && most - b.latency_seconds >= 0.5
      ? `${seconds(b.latency_seconds)}–${seconds(most)}` : seconds(b.latency_seconds);
  }
  // Sub-second figures in milliseconds: the alerts' target is a second.
  function quick(s) {
    if (s === null || s === undefined) return "–";
    if (s < 1) return `${Math.round(s * 1000)} ms`;
    if (s < 10) return `${s.toFixed(1)} s`;
    return seconds(s);
  }
  function colour(sensor, i) {
    return COLOURS[sensor] || EXTRA[i % EXTRA.length];
  }
  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  const BAD_ROWS = 8;
  function row(cells) {
    const tr = document.createElement("tr");
    for (const [text, cls] of cells) {
      const td = el("td", cls || "", text);
      if (cls && cls.includes("err")) td.title = text; // the whole message on hover
      tr.appendChild(td);
    }
    return tr;
  }
  function fill(tableId, emptyId, rows) {
    const tbody = document.querySelector(`#${tableId} tbody`);
    tbody.replaceChildren(...rows);
    $(tableId).hidden = rows.length === 0;
    $(emptyId).hidden = rows.length !== 0;
  }
  function niceMax(v) {
    if (v <= 0) return 1;
    const step = 10 ** Math.floor(Math.log10(v));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * step >= v) return m * step;
    return 10 * step;
  }

  // --- the chart: stacked bars per minute, alerts as a line on the same scale -------------------

  function drawChart(chart) {
    const box = $("chart");
    const series = chart.series || [];
    $("no-chart").hidden = series.length !== 0;
    box.hidden = series.length === 0;
    const legend = $("chart-legend");
    legend.replaceChildren(
      ...chart.sensors.map((s, i) => {
        const li = el("li");
        const sw = el("span", "sw");
        sw.style.background = colour(s, i);
        li.append(sw, document.createTextNode(s.replace("_", " ")));
        return li;
      }),
      (() => {
        const li = el("li");
        const sw = el("span", "sw");
        sw.style.background = "#dc2626";
        sw.style.height = "3px";
        li.append(sw, document.createTextNode("alerts"));
        return li;
      })(),
    );
    if (!series.length) return;
    const W = 760, H = 240, L = 44, R = 8, T = 10, B = 24;
    const totals = series.map((p) => chart.sensors.reduce((a, s) => a + (p.events[s] || 0), 0));
    const top = niceMax(Math.max(...totals, ...series.map((p) => p.alerts)));
    const y = (v) => T + (H - T - B) * (1 - v / top);
    const slot = (W - L - R) / series.length;
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img",
                              "aria-label": "events per minute by sensor type" });
    for (let i = 0; i <= 4; i++) {
      const v = (top * i) / 4;
      root.appendChild(svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid-line" }));
      root.appendChild(svg("text", { x: L - 6, y: y(v) + 3.5, "text-anchor": "end" }, fmt(Math.round(v))));
    }
    series.forEach((p, i) => {
      let base = 0;
      const x = L + i * slot + slot * 0.12;
      chart.sensors.forEach((s, j) => {
        const v = p.events[s] || 0;
        if (!v) return;
        const rect = svg("rect", { x, width: Math.max(slot * 0.76, 1), y: y(base + v), height: y(base) - y(base + v),
                                   fill: colour(s, j) });
        rect.appendChild(svg("title", {}, `${hm.format(new Date(p.minute * 1000))} ${s}: ${fmt(v)}`));
        root.appendChild(rect);
        base += v;
      });
      if (i % Math.ceil(series.length / 10) === 0) {
        root.appendChild(svg("text", { x: L + (i + 0.5) * slot, y: H - 6, "text-anchor": "middle" },
                             hm.format(new Date(p.minute * 1000))));
      }
    });
    const points = series.map((p, i) => `${L + (i + 0.5) * slot},${y(p.alerts)}`);
    root.appendChild(svg("polyline", { points: points.join(" "), class: "alerts" }));
    series.forEach((p, i) => {
      if (!p.alerts) return;
      const dot = svg("circle", { cx: L + (i + 0.5) * slot, cy: y(p.alerts), r: 2.5, class: "alert-dot" });
      dot.appendChild(svg("title", {}, `${hm.format(new Date(p.minute * 1000))}: ${fmt(p.alerts)} alerts`));
      root.appendChild(dot);
    });
    box.replaceChildren(root);
  }

  // --- batch durations ------------------------------------------------------------------------

  function drawDurations(batches) {
    const box = $("durations");
    const timed = batches.filter((b) => b.duration_seconds !== null || b.write_seconds !== null);
    if (!timed.length) {
      box.replaceChildren();
      return;
    }
    const W = 760, H = 90, L = 44, B = 4, T = 6;
    const value = (b) => (b.duration_seconds !== null ? b.duration_seconds : b.write_seconds);
    const top = niceMax(Math.max(...timed.map(value)));
    const slot = (W - L) / Math.max(timed.length, 10);
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": "batch durations" });
    for (const v of [0, top / 2, top]) {
      const yy = T + (H - T - B) * (1 - v / top);
      root.appendChild(svg("line", { x1: L, x2: W, y1: yy, y2: yy, class: "grid-line" }));
      root.appendChild(svg("text", { x: L - 6, y: yy + 3.5, "text-anchor": "end" }, seconds(v)));
    }
    timed.forEach((b, i) => {
      const v = value(b);
      const h = (H - T - B) * (v / top);
      const rect = svg("rect", { x: L + i * slot + slot * 0.15, width: slot * 0.7, y: H - B - h, height: h,
                                 fill: b.unreadable_files ? "#dc2626" : "#2563eb" });
      rect.appendChild(svg("title", {}, `batch ${b.batch_id}: ${seconds(v)}, ${fmt(b.events)} events`));
      root.appendChild(rect);
    });
    box.replaceChildren(root);
  }

  // --- figures and tables ---------------------------------------------------------------------

  function render(state) {
    const lag = state.lag;
    const t = state.totals;
    $("lag").textContent = seconds(lag.seconds);
    $("newest-landed").textContent = clock(lag.newest_landed);
    $("newest-aggregated").textContent = clock(lag.newest_aggregated);
    $("latency").textContent = state.batches.length ? latency(state.batches[state.batches.length - 1]) : "–";
    $("total-events").textContent = fmt(t.events);
    $("total-duplicates").textContent = fmt(t.duplicates);
    $("total-alerts").textContent = fmt(t.alerts);
    $("total-batches").textContent = fmt(t.batches);
    $("total-dead").textContent = fmt(t.dead_letters);
    $("total-dead").classList.toggle("bad", t.dead_letters > 0);
    $("total-unreadable").textContent = fmt(t.unreadable_files);
    $("total-unreadable").classList.toggle("bad", t.unreadable_files > 0);
    $("generated").textContent = `as of ${clock(state.generated_at)}`;

    drawChart(state.chart);
    drawDurations(state.batches);
    fill("batches", "no-batches", state.batches.slice().reverse().map((b) => row([
      [fmt(b.batch_id), "num mono"], [clock(b.finished_at)], [fmt(b.events), "num"], [fmt(b.duplicates), "num"],
      [fmt(b.alerts), "num"], [seconds(b.duration_seconds !== null ? b.duration_seconds : b.write_seconds), "num"],
      [latency(b), "num"],
    ])));
    mergeAlerts(state.alerts, false);
    if (state.latency) drawLatency(state.latency);
    fill("dead-letters", "no-dead-letters", state.dead_letters.slice(0, BAD_ROWS).map((d) => row([
      [clock(d.set_aside_at), "mono"], [d.partition_id, "mono"], [fmt(d.sequence_number), "num mono"], [d.error, "err"],
    ])));
    drawSpark(state.spark);
    fill("unreadable", "no-unreadable", state.unreadable_files.slice(0, BAD_ROWS).map((u) => row([
      [clock(u.found_at), "mono"], [u.path.split("/").slice(-2).join("/"), "mono path"], [u.error, "err"],
    ])));
  }

  // --- alerts: from the poll and the websocket, each once ---------------------------------------

  const shown = new Map(); // "partition:sequence" -> the alert, the newest alertRows by event time
  const rowsByKey = new Map(); // the same keys -> their table row, kept so a fresh row stays marked
  const keyOf = (a) => `${a.partition_id}:${a.sequence_number}`;
  const newestFirst = (x, y) => y.event_time - x.event_time || y.raised_at - x.raised_at
    || keyOf(y).localeCompare(keyOf(x));

  function alertRow(a, live) {
    const tr = row([[clock(a.event_time), "mono"], [""], [a.home, "mono"], [`${a.sensor_id} ${a.event}`]]);
    const kind = el("span", "kind", KINDS[a.kind] || a.kind);
    kind.dataset.kind = a.kind;
    tr.children[1].appendChild(kind);
    tr.dataset.partition = a.partition_id;
    tr.dataset.sequence = String(a.sequence_number);
    tr.title = `raised by the ${a.raised_by || "pipeline"} ${quick(a.latency_seconds)} after it was enqueued`;
    if (live) {
      tr.classList.add("fresh");
      setTimeout(() => tr.classList.remove("fresh"), 3000);
    }
    return tr;
  }

  // Adds the alerts not shown yet; keeps the table at alertRows rows, newest event first.
  function mergeAlerts(alerts, live) {
    let changed = false;
    for (const a of alerts || []) {
      if (shown.has(keyOf(a))) continue;
      shown.set(keyOf(a), a);
      changed = true;
    }
    if (!changed && rowsByKey.size === shown.size && shown.size) return;
    const kept = [...shown.values()].sort(newestFirst).slice(0, alertRows);
    shown.clear();
    const rows = kept.map((a) => {
      const key = keyOf(a);
      shown.set(key, a);
      return rowsByKey.get(key) || alertRow(a, live);
    });
    rowsByKey.clear();
    kept.forEach((a, i) => rowsByKey.set(keyOf(a), rows[i]));
    fill("alerts", "no-alerts", rows);
  }

  function drawLatency(latency) {
    const a = latency.alerts;
    const g = latency.aggregates;
    const span = `in the last ${latency.window_seconds} s`;
    $("alert-latency").textContent = a.count ? `${quick(a.p50)} / ${quick(a.p95)}` : "–";
    $("alert-latency").title = `${fmt(a.count)} alerts raised ${span}`;
    $("aggregate-latency").textContent = g.events ? `${quick(g.p50)} / ${quick(g.p95)}` : "–";
    $("aggregate-latency").title = `${fmt(g.events)} events aggregated ${span} (estimated from their batches)`;
  }

  // The master and executors the driver published (null until a driver started).
  function drawSpark(spark) {
    $("spark-master").textContent = spark ? spark.master : "–";
    $("spark-app").textContent = spark ? `${spark.app_id} (${spark.default_parallelism} cores)` : "–";
    $("spark-updated").textContent = spark ? `seen ${clock(spark.updated_at)}` : "–";
    const executors = spark ? spark.executors : [];
    fill("executors", "no-executors", executors.map((e) => row([
      [e.driver ? "driver" : e.id, "mono"], [e.host_port, "mono"], [fmt(e.cores), "num"], [fmt(e.running_tasks), "num"],
    ])));
  }

  // --- polling --------------------------------------------------------------------------------

  // The header's #connection and #alert are the live console's (live.js): the pipeline's are its own.
  const conn = $("pipeline-connection");
  const alertBox = $("pipeline-alert");
  function status(state, text) {
    conn.dataset.state = state;
    conn.textContent = text;
  }
  async function poll() {
    try {
      const response = await fetch(apiUrl, { headers: { Accept: "application/json" }, cache: "no-store" });
      const data = await response.json();
      if (!response.ok) throw new Error(data.error || `HTTP ${response.status}`);
      render(data);
      status("live", "live");
      alertBox.hidden = true;
    } catch (err) {
      status("stale", "stale");
      alertBox.textContent = `Could not load the pipeline state: ${err.message}. Retrying.`;
      alertBox.hidden = false;
    } finally {
      setTimeout(poll, document.hidden ? pollMs * 3 : pollMs);
    }
  }
  poll();

  // --- the live feed: /ws/pipeline/ ------------------------------------------------------------

  const feedPill = $("alerts-feed");
  let attempt = 0;
  function feedStatus(state, text, title) {
    feedPill.dataset.state = state;
    feedPill.textContent = text;
    feedPill.title = title || "alerts arrive over /ws/pipeline/ as they are raised";
  }
  function connectFeed() {
    const proto = location.protocol.endsWith("s:") ? "wss:" : "ws:"; // a page served over TLS: a TLS socket
    const query = new URLSearchParams({ hub: body.dataset.hub });
    const ws = new WebSocket(`${proto}//${location.host}${body.dataset.feedPath}?${query}`);
    ws.onmessage = (msg) => {
      let data;
      try {
        data = JSON.parse(msg.data);
      } catch (err) {
        return;
      }
      switch (data.type) {
        case "snapshot":
          attempt = 0; // reset here, not on open: a socket refused at once must still back off
          mergeAlerts(data.alerts, false);
          drawLatency(data.latency);
          feedStatus("live", "live");
          break;
        case "alerts":
          mergeAlerts(data.alerts, true);
          break;
        case "latency":
          drawLatency(data.latency);
          feedStatus("live", "live");
          break;
        case "error":
          feedStatus("stale", "stale", `${data.error} (the page still polls)`);
          break;
        default:
          break;
      }
    };
    ws.onclose = (e) => {
      if (e.code === 4400 || e.code === 4401) { // retrying will not help: the poll goes on alone
        feedStatus("polling", "polling", "the live feed was refused; the page polls /api/pipeline");
        return;
      }
      const delay = Math.min(10000, 500 * 2 ** attempt) * (0.75 + Math.random() * 0.5);
      attempt += 1;
      feedStatus("reconnecting", "reconnecting", `reconnecting in ${(delay / 1000).toFixed(1)} s; the page polls meanwhile`);
      setTimeout(connectFeed, delay);
    };
  }
  connectFeed();
})();
