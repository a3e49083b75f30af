// The pipeline page's restart policies: stored values, the last change (who/when/why), the history,
// and a change: a dry run first, then stored on confirmation with a reason (like the reset form).
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

  let current = null;  // the last GET answer
  let previewed = null;  // the policies of the shown dry run

  async function loadPolicies() {
    const error = document.getElementById("policies-error");
    try {
      const doc = await api(url);
      current = doc;
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

  // -- changing them

  const TEXT_FIELDS = ["firstRun", "window", "slide", "watermarkDelay"];
  const CHOICE_FIELDS = ["onDataLoss", "eventTimeIsKafkaTimestamp", "commitToKafka"];

  const message = window.OL.messageLine("policy-message");

  function hidePreview() {
    previewed = null;
    document.getElementById("policy-preview").hidden = true;
  }

  function changeBody() {
    const f = document.getElementById("policy-form").elements;
    const out = {};
    for (const name of TEXT_FIELDS) {
      const value = f[name].value.trim();
      if (!value) continue;
      if (name === "firstRun" && value.startsWith("{")) {
        try { out[name] = JSON.parse(value); } catch (_e) {
          throw new Error('First run offsets must be JSON like {"orders": {"0": 1200}}.');
        }
      } else if (name === "firstRun" && /^\d+$/.test(value)) {
        out[name] = Number(value);  // epoch milliseconds
      } else {
        out[name] = value;
      }
    }
    for (const name of CHOICE_FIELDS) {
      const value = f[name].value;
      if (value) out[name] = value === "true" ? true : value === "false" ? false : value;
    }
    for (const box of document.querySelectorAll("#policy-unset input[type=checkbox]:checked")) {
      if (box.value in out) throw new Error(`${LABELS[box.value]}: give a value or put it back to the default, not both.`);
      out[box.value] = null;
    }
    if (!Object.keys(out).length) throw new Error("Nothing to change: give a value or choose a policy to put back to its default.");
    return out;
  }

  const refusal = window.OL.refusal;

  async function preview(ev) {
    ev.preventDefault();
    hidePreview();
    document.getElementById("policy-result").hidden = true;
    let policies;
    try { policies = changeBody(); } catch (err) { message(err.message, "error"); return; }
    message("Checking…", "muted");
    try {
      const after = await api(url, { method: "PUT", body: { policies, actor: "console", dryRun: true } });
      message("");
      previewed = policies;
      const before = current ? current.effective : {};
      fill(document.querySelector("#policy-preview-table tbody"), Object.entries(after.effective).map(([name, value]) => {
        const changed = show(before[name]) !== show(value) || (current && current.sources[name] !== after.sources[name]);
        return el("tr", { "data-policy": name, class: changed ? "changed" : "" },
          el("th", { scope: "row" }, LABELS[name] || name),
          el("td", { class: "mono" }, show(before[name]), current && current.sources[name] === "default" ? " (default)" : ""),
          el("td", { class: "mono", "data-col": "after" }, show(value), after.sources[name] === "default" ? " (default)" : "",
            changed ? el("strong", {}, " changed") : null));
      }), "No policies.", 3);
      document.getElementById("policy-confirm").reset();
      document.getElementById("policy-preview").hidden = false;
      document.getElementById("policy-preview-heading").focus();
    } catch (err) {
      message(refusal(err), "error");
    }
  }

  async function save(ev) {
    ev.preventDefault();
    if (!previewed) { message("Preview the change first.", "error"); return; }
    const f = document.getElementById("policy-confirm").elements;
    const reason = f.reason.value.trim();
    if (!reason) { message("Give a reason: it is kept in the history.", "error"); f.reason.focus(); return; }
    if (!f.confirmed.checked) { message("Tick the confirmation to store the policies.", "error"); f.confirmed.focus(); return; }
    const button = document.getElementById("policy-save");
    button.disabled = true;
    try {
      const done = await api(url, { method: "PUT", body: { policies: previewed, reason, actor: "console" } });
      message("");
      hidePreview();
      document.getElementById("policy-form").reset();
      const result = document.getElementById("policy-result");
      result.hidden = false;
      result.className = "ok";
      result.textContent = `Policies stored (change #${done.lastChange.id}); the next restart applies them.`;
      await loadPolicies();
      if (!document.getElementById("policy-history").hidden) await loadHistory();
    } catch (err) {
      message(refusal(err), "error");
    } finally {
      button.disabled = false;
    }
  }

  function wireForm() {
    const unset = document.getElementById("policy-unset");
    unset.append(...Object.entries(LABELS).map(([name, label]) => el("label", {},
      el("input", { type: "checkbox", name: "unset", value: name }), " ", label)));
    const form = document.getElementById("policy-form");
    form.addEventListener("submit", preview);
    // A changed request makes the shown dry run stale: it must be previewed again.
    form.addEventListener("input", hidePreview);
    form.addEventListener("change", hidePreview);
    document.getElementById("policy-confirm").addEventListener("submit", save);
    document.getElementById("policy-cancel").addEventListener("click", () => { hidePreview(); message(""); });
  }

  document.addEventListener("DOMContentLoaded", () => {
    wireForm();
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
