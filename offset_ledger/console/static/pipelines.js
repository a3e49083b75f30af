// The pipelines page: one row per pipeline and consumer group, sortable, refreshed every 5 s.
"use strict";

(() => {
  const { api, el, fill, num, time, stateBadge, headroomBadge, showError, every, stamp } = window.OL;
  let rows = [];
  let sortKey = "pipeline";
  let ascending = true;

  function pipelineHref(p) {
    const base = "/pipelines/" + encodeURIComponent(p.pipeline);
    // The group goes in the URL only when the pipeline name alone does not pick it.
    return p.groupCount > 1 || p.consumerGroup !== p.pipeline
      ? `${base}?group=${encodeURIComponent(p.consumerGroup)}` : base;
  }

  // The generation is the API's object ({generation, appVersion, checkpointLocation}): sort by its number.
  const sortValue = (p) => (sortKey === "generation" ? (p.generation ? p.generation.generation : null) : p[sortKey]);

  function compare(a, b) {
    const x = sortValue(a), y = sortValue(b);
    // Unknown values (no lag, no batch yet) sort last whichever the direction.
    if (x === null || x === undefined) return y === null || y === undefined ? 0 : 1;
    if (y === null || y === undefined) return -1;
    const order = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
    return ascending ? order : -order;
  }

  function render() {
    const sorted = [...rows].sort((a, b) => compare(a, b)
      || a.pipeline.localeCompare(b.pipeline) || a.consumerGroup.localeCompare(b.consumerGroup));
    const tbody = document.querySelector("#pipelines tbody");
    fill(tbody, sorted.map((p) => el("tr", { "data-pipeline": p.pipeline, "data-group": p.consumerGroup },
      el("th", { scope: "row" }, el("a", { href: pipelineHref(p) }, p.pipeline)),
      el("td", {}, p.consumerGroup),
      el("td", { "data-col": "state", title: p.stateReason || null }, stateBadge(p.state),
        p.stateReason ? el("div", { class: "muted small state-reason" }, p.stateReason) : null),
      el("td", { class: "num", "data-col": "lag", title: p.lag === null ? "Kafka not reachable or no positions" : null }, num(p.lag)),
      el("td", { class: "num", "data-col": "headroomSeconds" }, headroomBadge(p)),
      el("td", { "data-col": "lastBatchTime" }, time(p.lastBatchTime, true)),
      // Orange only for findings that need a look: a first run or a new partition is informational.
      el("td", { class: p.findingsAttention ? "num attention" : "num", "data-col": "findings",
        title: p.findings ? `${p.findingsAttention || 0} need a look (first_run and new_partition are informational)` : null },
      num(p.findings)),
      el("td", { "data-col": "appVersion" }, p.appVersion || "—"),
      el("td", { class: "num", "data-col": "generation" }, num(p.generation ? p.generation.generation : null)),
    )), "No pipelines.", 9);
    document.getElementById("pipelines-empty").hidden = rows.length > 0;
    for (const th of document.querySelectorAll("#pipelines thead th")) {
      const key = th.querySelector("button").dataset.key;
      if (key === sortKey) th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
    }
  }

  async function load() {
    const error = document.getElementById("pipelines-error");
    try {
      rows = (await api("/api/v1/console/pipelines")).pipelines;
      error.hidden = true;
      render();
      stamp();
    } catch (err) {
      showError(error, err);
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    for (const button of document.querySelectorAll("#pipelines thead button")) {
      button.addEventListener("click", () => {
        ascending = sortKey === button.dataset.key ? !ascending : true;
        sortKey = button.dataset.key;
        render();
      });
    }
    every(5000, load)();
  });
})();
