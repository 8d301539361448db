/* The partition page's event browser: a page of /api/partitions/<id>/events at a time, the events
 * as the hub holds them (read without a lease or a checkpoint). "show" reads at the position chosen
 * (newest, earliest, a sequence number, an offset or an enqueued time); "older" and "newer" follow
 * the answer's cursors (before= and after=). Bodies come for staff only unless the console's
 * LEASEBOARD_EVENT_BODIES says readers.
 */
(() => {
  "use strict";

  const live = window.Leaseboard;
  const { fmt, el, setText } = live;
  const $ = (id) => document.getElementById(id);
  const body = document.body;
  const fromSelect = $("browser-from");
  const valueInput = $("browser-value");
  let older = null;
  let newer = null;

  const { showError, setState } = live.pollStatus("browser-connection", "browser-alert");

  function bodyCell(view, shown) {
    const td = el("td", "body");
    if (!view) { td.append(el("span", "muted", shown ? "–" : "(staff only)")); return td; }
    const text = view.encoding === "json" ? JSON.stringify(view.value, null, 2) : view.value;
    td.append(el("pre", `body-${view.encoding}`, text));
    const cut = view.truncated ? ", cut" : "";
    td.append(el("span", "muted small", `${view.encoding}, ${fmt.n(view.size)} bytes${cut}`));
    return td;
  }

  function row(event, shown) {
    const tr = el("tr");
    tr.dataset.sequence = String(event.sequence_number);
    if (event.body) tr.dataset.encoding = event.body.encoding;
    const props = Object.keys(event.properties || {}).length ? JSON.stringify(event.properties) : "–";
    tr.append(
      el("td", "num mono", fmt.n(event.sequence_number)), el("td", "num mono", event.offset),
      el("td", "time", fmt.when(event.enqueued_time)), el("td", "mono", event.partition_key ?? "–"),
      el("td", "props mono", props), bodyCell(event.body, shown),
    );
    return tr;
  }

  function render(data) {
    const held = data.last_sequence_number === null ? "the partition is empty"
      : `it holds ${fmt.n(data.first_sequence_number)}..${fmt.n(data.last_sequence_number)}`;
    const cut = data.cut ? ", cut at the byte bound" : "";
    setText($("browser-note"), `${fmt.n(data.events.length)} shown at ${fmt.clock(data.generated_at)}; ${held}${cut}`);
    document.querySelector("#browser tbody").replaceChildren(...data.events.map((e) => row(e, data.bodies_shown)));
    $("no-hub-events").hidden = data.events.length > 0;
    older = data.older;
    newer = data.newer;
    $("browser-older").disabled = older === null;
    $("browser-newer").disabled = newer === null;
  }

  // The position of the form: from=newest|earliest, or from=<kind>:<value>.
  function position() {
    const kind = fromSelect.value;
    if (kind === "newest" || kind === "earliest") return { from: kind };
    return { from: `${kind}:${valueInput.value.trim()}` };
  }

  async function load(where) {
    const query = new URLSearchParams({
      hub: body.dataset.hub, consumer_group: body.dataset.consumerGroup,
      count: $("browser-count").value, order: $("browser-order").value, ...where,
    });
    setState("connecting", "reading…");
    try {
      const response = await fetch(`${body.dataset.hubEventsUrl}?${query}`, { headers: { Accept: "application/json" } });
      const data = await response.json();
      if (!response.ok) {
        setState(response.status === 400 ? "live" : "reconnecting", `${response.status}`);
        showError(data.error || `events request failed (${response.status})`);
        return;
      }
      render(data);
      setState("live", "read");
      showError(null);
    } catch (err) {
      setState("reconnecting", "unreachable");
      showError(`dashboard unreachable: ${err}`);
    }
  }

  fromSelect.addEventListener("change", () => {
    valueInput.disabled = fromSelect.value === "newest" || fromSelect.value === "earliest";
    if (!valueInput.disabled) valueInput.focus();
  });
  $("browser-form").addEventListener("submit", (event) => { event.preventDefault(); load(position()); });
  $("browser-older").addEventListener("click", () => { if (older !== null) load({ before: String(older) }); });
  $("browser-newer").addEventListener("click", () => { if (newer !== null) load({ after: String(newer) }); });
  load({ from: "newest" });
})();
