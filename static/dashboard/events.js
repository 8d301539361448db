/* The events page: a filterable feed of balancer events, live. Filters go to /api/events (the
 * server filters the log); live events are filtered here the same way before they are shown.
 */
(() => {
  "use strict";

  const live = window.Leaseboard;
  const { fmt, el, setText, who } = live;
  const $ = (id) => document.getElementById(id);
  const tbody = document.querySelector("#events tbody");
  const form = $("filters");
  const MAX_ROWS = 1000;
  const PAGE = 200;
  const shown = new Set();

  function filters() {
    const kinds = [...form.querySelectorAll('input[name="kind"]:checked')].map((i) => i.value);
    return {
      kinds,
      all: kinds.length === form.querySelectorAll('input[name="kind"]').length,
      partition: $("filter-partition").value.trim(),
      worker: $("filter-worker").value.trim(),
    };
  }

  function matches(ev, f) {
    if (!f.kinds.includes(ev.category || ev.kind)) return false;
    if (f.partition && ev.partition_id !== f.partition) return false;
    if (f.worker && ![ev.owner_id, ev.previous_owner, ev.reporter].includes(f.worker)) return false;
    return true;
  }

  function row(ev, fresh) {
    const tr = el("tr");
    tr.dataset.eventId = ev.id;
    tr.dataset.kind = ev.category || ev.kind;
    tr.dataset.partition = ev.partition_id;
    if (fresh) tr.classList.add("fresh");
    const kind = el("span", "kind", ev.category || ev.kind);
    kind.dataset.kind = ev.category || ev.kind;
    const k = el("td"); k.append(kind);
    const p = el("td", "num");
    if (ev.partition_id === "*") p.textContent = "–"; else {
      const a = el("a", "", ev.partition_id);
      a.href = live.partitionLink(ev.partition_id);
      p.append(a);
    }
    const from = el("td"); from.append(who(ev.previous_owner));
    const to = el("td"); to.append(who(ev.owner_id));
    const time = el("td", "time", fmt.when(ev.at));
    time.title = new Date(ev.at * 1000).toISOString();
    tr.append(time, k, p, from, el("td", "arrow", "→"), to, el("td", "reason", ev.reason || ""), el("td", "muted", ev.reporter || ""));
    return tr;
  }

  function add(ev, fresh, atEnd) {
    if (shown.has(ev.id)) return;
    shown.add(ev.id);
    const tr = row(ev, fresh);
    if (atEnd) { tbody.append(tr); return; }
    let before = tbody.firstElementChild;
    while (before && Number(before.dataset.eventId) > ev.id) before = before.nextElementSibling;
    tbody.insertBefore(tr, before);
    while (tbody.children.length > MAX_ROWS) { shown.delete(Number(tbody.lastElementChild.dataset.eventId)); tbody.lastElementChild.remove(); }
  }

  function params(f, before) {
    const q = new URLSearchParams({ hub: live.cfg.hub, consumer_group: live.cfg.consumerGroup, limit: String(PAGE) });
    if (!f.all) q.set("kind", f.kinds.join(","));
    if (f.partition) q.set("partition", f.partition);
    if (f.worker) q.set("worker", f.worker);
    if (before) q.set("before", String(before));
    return q;
  }

  let generation = 0;
  async function load(before) {
    const f = filters();
    const mine = ++generation;
    if (!before) { tbody.replaceChildren(); shown.clear(); }
    if (!f.kinds.length) { finish(0); return; }
    const response = await fetch(`${live.cfg.eventsUrl}?${params(f, before)}`, { headers: { Accept: "application/json" } });
    const data = await response.json();
    if (mine !== generation) return; // a newer filter won
    if (!response.ok) { live.showAlert(data.error); return; }
    for (const ev of data.slice().reverse()) add(ev, false, true);
    finish(data.length);
  }

  function finish(count) {
    $("older").hidden = count < PAGE;
    $("no-events").hidden = tbody.children.length > 0;
    setText($("events-count"), `${fmt.n(tbody.children.length)} shown`);
  }

  live.listen({
    events(events, fresh) {
      if (!fresh || $("pause").checked) return;
      const f = filters();
      for (const ev of events) if (matches(ev, f)) add(ev, true, false);
      finish(PAGE);
    },
  });
  let typing = null;
  form.addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(() => load(), 250); });
  form.addEventListener("submit", (e) => e.preventDefault());
  $("older").addEventListener("click", () => {
    const last = tbody.lastElementChild;
    if (last) load(Number(last.dataset.eventId));
  });
  live.ready.then(() => load());
})();
