/* The groups page: every hub and consumer group the store knows, polled from /api/groups every few
 * seconds (data-poll-seconds; the next poll is asked for once the last one answered). A failed poll
 * keeps the last rows and says why; each row links into its group's fleet page.
 */
(() => {
  "use strict";

  const live = window.Leaseboard;
  const { fmt, el, setText } = live;
  const $ = (id) => document.getElementById(id);
  const body = document.body;
  const pollMs = Math.max(1, Number(body.dataset.pollSeconds) || 5) * 1000;

  const { showError, setState } = live.pollStatus("groups-connection", "groups-alert");

  function statusCell(group) {
    const td = el("td", "lag-status");
    const badge = el("span", "badge", group.lag_status || "–");
    if (group.lag_status) badge.dataset.lagStatus = group.lag_status;
    const counts = Object.entries(group.by_lag_status).filter(([, n]) => n > 0);
    td.title = counts.length ? counts.map(([s, n]) => `${n} ${s}`).join(", ")
      : "not sampled yet: open its fleet page to start sampling its lag";
    td.append(badge);
    return td;
  }

  function row(group) {
    const tr = el("tr");
    tr.dataset.hub = group.hub;
    tr.dataset.consumerGroup = group.consumer_group;
    tr.dataset.lagStatus = group.lag_status || "";
    const owned = el("td", "num owned", `${fmt.n(group.owned)} / ${fmt.n(group.partitions)}`);
    const alive = el("td", "num alive", fmt.n(group.workers_alive));
    alive.title = `${group.workers} known, ${group.workers_draining} draining`;
    const behind = el("td", "num behind", fmt.n(group.lag));
    if (group.source.error) behind.title = group.source.error;
    const desired = el("td", "num desired", fmt.n(group.desired_workers));
    if (group.desired_reason) desired.title = group.desired_reason;
    const link = el("a", "fleet", "fleet →");
    link.href = group.fleet_url;
    const go = el("td");
    go.append(link);
    tr.append(el("td", "hub", group.hub), el("td", "group", group.consumer_group), owned, alive, statusCell(group),
      behind, desired, go);
    return tr;
  }

  function render(data) {
    setText($("groups-namespace"), `namespace ${data.namespace}`);
    const reads = `${data.store_requests} ${data.store} store request${data.store_requests === 1 ? "" : "s"}`;
    setText($("groups-note"), `${fmt.n(data.groups.length)} groups at ${fmt.clock(data.generated_at)}, ${reads}`);
    document.querySelector("#groups tbody").replaceChildren(...data.groups.map(row));
    $("no-groups").hidden = data.groups.length > 0;
  }

  async function poll() {
    try {
      const response = await fetch(body.dataset.groupsUrl, { headers: { Accept: "application/json" } });
      const data = await response.json();
      if (!response.ok) {
        setState("reconnecting", `${response.status}`);
        showError(data.error || `groups request failed (${response.status})`);
      } else {
        render(data);
        setState("live", "live");
        showError(null);
      }
    } catch (err) {
      setState("reconnecting", "unreachable");
      showError(`dashboard unreachable: ${err}`);
    }
    setTimeout(poll, pollMs);
  }

  poll();
})();
