// The pipeline page's restart policies: stored values, the last change (who/when/why), the history. Read-only.
"use strict";

(() => {
  const { api, el, fill, time, showError, every } = window.OL;
  const pipeline = document.body.dataset.pipeline;
  const url = "/api/v1/pipelines/" + encodeURIComponent(pipeline) + "/policies";
  const LABELS = {
    firstRun: "First run", onDataLoss: "On data loss", window: "Window", slide: "Slide",
    watermarkDelay: "Watermark delay", eventTimeIsKafkaTimestamp: "Event time is the Kafka timestamp",
    commitToKafka: "Commit to Kafka",
  };

  function show(value) {
    if (value === null || value === undefined) return "—";
    if (typeof value === "object") return JSON.stringify(value);
    return String(value);
  }

  function summary(policies) {
    return Object.keys(policies).length
      ? Object.entries(policies).map(([k, v]) => el("div", {}, `${k}: ${show(v)}`))
      : el("span", { class: "muted" }, "all defaults");
  }

  async function loadPolicies() {
    const error = document.getElementById("policies-error");
    try {
      const doc = await api(url);
      error.hidden = true;
      fill(document.querySelector("#policies tbody"), Object.entries(doc.effective).map(([name, value]) =>
        el("tr", { "data-policy": name, "data-source": doc.sources[name] },
          el("th", { scope: "row" }, LABELS[name] || name, " ", el("code", { class: "muted small" }, name)),
          el("td", { class: "mono", "data-col": "value" }, show(value)),
          el("td", { "data-col": "source" }, doc.sources[name] === "stored" ? "stored" : "default"),
        )), "No policies.", 3);
      const last = document.getElementById("policies-last");
      const change = doc.lastChange;
      last.replaceChildren(...(change
        ? ["Last changed ", time(change.createdAt), " by ", el("strong", { id: "policies-actor" }, change.actor),
          ": ", el("q", { id: "policies-reason" }, change.reason || "—")]
        : [el("span", { class: "muted" }, "Never set: every restart uses the defaults.")]));
    } catch (err) {
      showError(error, err);
    }
  }

  async function loadHistory() {
    const data = await api(url + "/history");
    fill(document.querySelector("#policy-history-table tbody"), data.changes.map((c) => el("tr", { "data-change": c.id },
      el("td", { class: "num" }, c.id), el("td", {}, time(c.createdAt)), el("td", {}, c.actor),
      el("td", {}, c.reason || "—"), el("td", { class: "mono small" }, summary(c.policies)),
    )), "No changes: the policies were never set.", 5);
  }

  async function openHistory(focus) {
    const box = document.getElementById("policy-history");
    box.hidden = false;
    document.getElementById("policy-history-link").setAttribute("aria-expanded", "true");
    try {
      await loadHistory();
    } catch (err) {
      showError(document.getElementById("policies-error"), err);
    }
    if (focus) document.getElementById("policy-history-heading").focus();
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.getElementById("policy-history-link").addEventListener("click", (ev) => {
      ev.preventDefault();
      history.replaceState(null, "", "#policy-history");
      openHistory(true);
    });
    every(10000, async () => {
      await loadPolicies();
      if (!document.getElementById("policy-history").hidden) await loadHistory().catch(() => {});
    })();
    if (location.hash === "#policy-history") openHistory(false);
  });
})();
