/* Operator actions (staff only: this script is not even sent to others). Any button with
 * data-action opens the dialog: the reason is asked for, Preview shows the dry run the server
 * computed with the fleet's own strategy, and only Confirm applies it. Changing an input after a
 * preview asks for a new one. What each action is called and asks for comes from the server's
 * registry (#action-catalogue, dashboard/control/registry.py): nothing here names an action.
 */
(() => {
  "use strict";

  const live = window.Leaseboard;
  const { el, setText, who } = live;
  const $ = (id) => document.getElementById(id);
  const dialog = $("action-dialog");
  const reason = $("action-reason");
  const worker = $("action-worker");
  const to = $("action-to");
  const selection = $("action-selection");
  const force = $("action-force");
  const confirmLast = $("action-confirm-last");
  const previewBox = $("action-preview");
  const errorBox = $("action-error");
  const previewButton = $("action-preview-button");
  const confirmButton = $("action-confirm");

  const CATALOGUE = new Map(JSON.parse($("action-catalogue").textContent).map((a) => [a.name, a]));
  const asks = (spec, kind) => Boolean(spec.value && spec.value.kind === kind);

  let current = null; // {action, target, spec}
  let previewed = null; // the request the preview was for

  function request() {
    const { spec } = current;
    const wanted = { action: current.action, target: current.target, reason: reason.value.trim() };
    if (asks(spec, "worker")) wanted.value = worker.value;
    if (asks(spec, "position")) wanted.value = to.value.trim();
    if (asks(spec, "selection")) wanted.value = selection.value.trim();
    if (spec.force) wanted.force = force.checked;
    return wanted;
  }
  const same = (a, b) => a && b && JSON.stringify({ ...a, reason: "" }) === JSON.stringify({ ...b, reason: "" });

  function open(action, target, value) {
    const spec = CATALOGUE.get(action);
    if (!spec) { live.toast(`Unknown action ${action}`); return; }
    current = { action, target: target || spec.fixed_target, spec };
    previewed = null;
    setText($("action-title"), spec.title.replace("{target}", target));
    setText($("action-intro"), spec.help);
    dialog.dataset.action = action;
    $("field-worker").hidden = !asks(spec, "worker");
    $("field-to").hidden = !asks(spec, "position");
    $("field-selection").hidden = !asks(spec, "selection");
    selection.value = value || "";
    if (asks(spec, "worker")) {
      worker.replaceChildren();
      for (const id of live.workerOrder) {
        const w = live.workers.get(id);
        if (!w || !w.alive || w.draining) continue;
        const option = el("option", "", id);
        option.value = id;
        worker.append(option);
      }
    }
    to.value = "";
    force.checked = false;
    const p = live.view.get(target);
    // Only a partition a worker owns needs forcing a reset; a replay may always be forced (replayed already).
    $("field-force").hidden = !(spec.force && ((p && p.owner) || asks(spec, "selection")));
    setText($("action-force-help"), spec.force);
    reason.value = "";
    confirmLast.checked = false;
    previewBox.hidden = true;
    errorBox.hidden = true;
    confirmButton.disabled = true;
    dialog.showModal();
    (asks(spec, "position") ? to : reason).focus();
  }

  function showError(text) {
    errorBox.hidden = !text;
    setText(errorBox, text || "");
  }

  function showPreview(data) {
    previewBox.hidden = false;
    setText($("preview-summary"), data.summary);
    const strategy = $("preview-strategy");
    strategy.hidden = !data.strategy;
    strategy.dataset.strategy = data.strategy || "";
    setText(strategy, data.strategy ? `Planned with ${data.strategy}: ${data.strategy_basis}.` : "");
    const moves = $("preview-moves");
    const tbody = moves.querySelector("tbody");
    tbody.replaceChildren();
    for (const m of data.moves) {
      const tr = el("tr");
      tr.dataset.partition = m.partition_id;
      tr.dataset.caused = String(m.caused);
      const note = m.caused ? "" : "already on its way";
      const from = el("td"); from.append(who(m.before));
      const target = el("td");
      target.append(m.after_known === false ? el("span", "muted", "whoever wins the race") : who(m.after));
      tr.append(el("td", "num", m.partition_id), from, el("td", "arrow", "→"), target, el("td", "muted", note));
      tbody.append(tr);
    }
    moves.hidden = data.moves.length === 0;
    const cp = $("preview-checkpoint");
    cp.replaceChildren();
    if (data.checkpoint) {
      const c = data.checkpoint;
      const rows = [["checkpoint", `${c.from ?? "none"} → ${c.to ?? "none"}`], ["lag", `${live.fmt.n(c.lag_before)} → ${live.fmt.n(c.lag_after)} events`]];
      if (c.again) rows.push(["handled again", `${live.fmt.n(c.again)} events`]);
      if (c.skipped) rows.push(["skipped", `${live.fmt.n(c.skipped)} events`]);
      for (const [k, v] of rows) { const d = el("div"); d.append(el("dt", "", k), el("dd", "", v)); cp.append(d); }
    }
    cp.hidden = !data.checkpoint;
    const notes = $("preview-notes");
    notes.replaceChildren(...data.notes.map((n) => el("li", "", n)));
    $("confirm-last-row").hidden = !data.needs_confirmation;
    updateConfirm(data.needs_confirmation);
  }

  function updateConfirm(needsLast) {
    const ok = previewed && same(previewed, request()) && reason.value.trim() && (!needsLast || confirmLast.checked);
    confirmButton.disabled = !ok;
  }

  let needsLast = false;
  async function preview() {
    showError(null);
    const wanted = request();
    if (asks(current.spec, "worker") && !wanted.value) { showError("no live worker to choose"); return; }
    previewButton.disabled = true;
    try {
      const { ok, data } = await live.post(live.cfg.previewUrl, wanted);
      if (!ok) { previewBox.hidden = true; previewed = null; showError(data.error); confirmButton.disabled = true; return; }
      previewed = wanted;
      needsLast = data.needs_confirmation;
      showPreview(data);
    } finally {
      previewButton.disabled = false;
    }
  }

  async function confirm() {
    showError(null);
    const wanted = { ...request(), confirmed: true, confirm_last: confirmLast.checked };
    if (!wanted.reason) { showError("give a reason: it is kept in the audit log"); return; }
    confirmButton.disabled = true;
    const { ok, data } = await live.post(live.cfg.applyUrl, wanted);
    if (!ok) { showError(data.error); updateConfirm(needsLast); return; }
    dialog.close();
    live.toast(`Applied: ${data.message}`);
  }

  document.addEventListener("click", (e) => {
    const button = e.target.closest("[data-action]");
    if (!button || button.closest("dialog")) return;
    e.preventDefault();
    open(button.dataset.action, button.dataset.target || "", button.dataset.value || "");
  });
  previewButton.addEventListener("click", preview);
  confirmButton.addEventListener("click", confirm);
  $("action-cancel").addEventListener("click", () => dialog.close());
  for (const input of [reason, worker, to, selection, force, confirmLast]) {
    input.addEventListener("input", () => updateConfirm(needsLast));
    input.addEventListener("change", () => updateConfirm(needsLast));
  }
  for (const b of dialog.querySelectorAll("[data-to]")) {
    b.addEventListener("click", () => { to.value = b.dataset.to; updateConfirm(needsLast); });
  }
  live.actions = { open };
})();
