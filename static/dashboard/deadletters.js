/* The dead-letters page: a page of /api/deadletters at a time (oldest first, partition by partition;
 * "next page" follows the answer's cursor). Bodies and error texts come for staff only. Staff tick
 * dead letters of one partition and replay or purge them, or all of the partition chosen, through the
 * action dialog (actions.js): the buttons carry data-action, data-target (the partition) and
 * data-value (the selection). The page reads again when the dialog closes.
 */
(() => {
  "use strict";

  const live = window.Leaseboard;
  const { fmt, el, setText } = live;
  const $ = (id) => document.getElementById(id);
  const body = document.body;
  const canAct = body.dataset.canAct === "true";
  const partitionSelect = $("deadletters-partition");
  const limitSelect = $("deadletters-limit");
  let partition = body.dataset.deadlettersPartition || ""; // "" for every partition
  let current = ""; // the cursor of the page shown ("" for the first)
  let next = null;

  const { showError, setState } = live.pollStatus("deadletters-connection", "deadletters-alert");

  function bodyCell(view) {
    const td = el("td", "body");
    if (!view) { td.append(el("span", "muted", "(staff only)")); return td; }
    const text = view.encoding === "json" ? JSON.stringify(view.value, null, 2) : view.value;
    td.append(el("pre", `body-${view.encoding}`, text));
    const cut = view.truncated ? ", cut" : "";
    td.append(el("span", "muted small", `${view.encoding}, ${fmt.n(view.size)} bytes${cut}`));
    return td;
  }

  function replayedCell(replayed, failed) {
    if (!replayed && failed) {
      const by = failed.owner ? ` by ${failed.owner}` : "";
      return el("td", "replayed failed", `in place${by} failed at ${fmt.when(failed.replayed_at)}: ${failed.error || "?"}`);
    }
    if (!replayed) return el("td", "replayed muted", "–");
    const as = replayed.to ? ` as ${replayed.to}` : "";
    const by = replayed.user ? ` by ${replayed.user}` : "";
    return el("td", "replayed", `${fmt.when(replayed.replayed_at)}${by}${as}`);
  }

  function row(letter) {
    const tr = el("tr");
    tr.dataset.partition = letter.partition_id;
    tr.dataset.sequence = String(letter.sequence_number);
    tr.dataset.replayed = String(Boolean(letter.replayed));
    if (letter.body) tr.dataset.encoding = letter.body.encoding;
    if (canAct) {
      const td = el("td");
      const box = el("input");
      box.type = "checkbox";
      box.className = "pick";
      box.setAttribute("aria-label", `dead letter ${letter.partition_id}:${letter.sequence_number}`);
      td.append(box);
      tr.append(td);
    }
    const props = Object.keys(letter.properties || {}).length ? JSON.stringify(letter.properties) : "–";
    tr.append(
      el("td", "mono", letter.partition_id), el("td", "num mono", fmt.n(letter.sequence_number)),
      el("td", "num mono", letter.offset ?? "–"), el("td", "time", fmt.when(letter.enqueued_time)),
      el("td", "time", fmt.when(letter.set_aside_at)), el("td", "err", letter.error || "–"),
      el("td", "props mono", props), bodyCell(letter.body), replayedCell(letter.replayed, letter.in_place_failed),
    );
    return tr;
  }

  function partitions(ids) {
    const all = new Set(ids);
    if (partition) all.add(partition);
    const options = [el("option", "", "all")];
    options[0].value = "";
    for (const id of [...all].sort((a, b) => Number(a) - Number(b))) {
      const option = el("option", "", id);
      option.value = id;
      options.push(option);
    }
    partitionSelect.replaceChildren(...options);
    partitionSelect.value = partition;
  }

  // The selection buttons name the partition and the sequence numbers ticked (one partition at a time).
  function updateSelection() {
    if (!canAct) return;
    const picked = [...document.querySelectorAll("#deadletters tbody tr")].filter((tr) => tr.querySelector(".pick").checked);
    const pids = new Set(picked.map((tr) => tr.dataset.partition));
    const one = pids.size === 1 ? [...pids][0] : "";
    for (const id of ["replay-selected", "replay-selected-in-place", "purge-selected"]) {
      const button = $(id);
      button.disabled = !one;
      button.dataset.target = one;
      button.dataset.value = picked.map((tr) => tr.dataset.sequence).join(",");
      button.title = pids.size > 1 ? "tick dead letters of one partition" : "";
    }
    const pid = partition;
    for (const id of ["replay-all", "replay-all-in-place", "purge-all"]) {
      const button = $(id);
      button.hidden = !pid;
      button.dataset.target = pid;
      const where = id.endsWith("in-place") ? " in place" : "";
      setText(button, `${id.startsWith("replay") ? "replay" : "purge"} all of partition ${pid}${where}`);
    }
  }

  function render(data) {
    partitions(data.partitions);
    const more = data.next ? ", more on the next page" : "";
    setText($("deadletters-note"), `${fmt.n(data.entries.length)} shown at ${fmt.clock(data.generated_at)}${more}`);
    document.querySelector("#deadletters tbody").replaceChildren(...data.entries.map(row));
    $("no-deadletters").hidden = data.entries.length > 0;
    next = data.next;
    $("deadletters-next").disabled = !next;
    updateSelection();
  }

  async function load(after) {
    const query = new URLSearchParams({ hub: body.dataset.hub, consumer_group: body.dataset.consumerGroup, limit: limitSelect.value });
    if (partition) query.set("partition", partition);
    if (after) query.set("after", after);
    try {
      const response = await fetch(`${body.dataset.deadlettersUrl}?${query}`, { headers: { Accept: "application/json" } });
      const data = await response.json();
      if (!response.ok) {
        setState("reconnecting", `${response.status}`);
        showError(data.error || `dead letters request failed (${response.status})`);
        return;
      }
      current = after || "";
      render(data);
      setState("live", "read");
      showError(null);
    } catch (err) {
      setState("reconnecting", "unreachable");
      showError(`dashboard unreachable: ${err}`);
    }
  }

  partitionSelect.addEventListener("change", () => { partition = partitionSelect.value; load(""); });
  limitSelect.addEventListener("change", () => load(""));
  $("deadletters-first").addEventListener("click", () => load(""));
  $("deadletters-next").addEventListener("click", () => { if (next) load(next); });
  document.querySelector("#deadletters tbody").addEventListener("change", updateSelection);
  const dialog = $("action-dialog");
  if (dialog) dialog.addEventListener("close", () => load(current));
  load("");
})();
