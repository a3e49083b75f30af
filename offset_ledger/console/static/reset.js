// The reset form of a pipeline's page: a dry run first, then execution on confirmation with a reason.
"use strict";

(() => {
  const { api, el, fill, num } = window.OL;
  const page = window.OLPipeline;
  const base = page.base;

  const form = () => document.getElementById("reset-form");
  let previewed = null;

  function resetBody() {
    const f = form().elements;
    const mode = f.mode.value;
    const out = { mode, outOfRange: f.outOfRange.value, actor: "console" };
    if (page.group()) out.consumerGroup = page.group();
    const partitions = f.partitions.value.trim();
    if (partitions && !f.topic.value) throw new Error("Choose a topic to limit the reset to some partitions.");
    if (f.topic.value) {
      const scope = { topic: f.topic.value };
      if (partitions) {
        const parts = partitions.split(/[\s,]+/).filter(Boolean);
        if (!parts.every((x) => /^\d+$/.test(x))) throw new Error("Partitions are numbers separated by commas, like 0,2.");
        scope.partitions = parts.map(Number);
      }
      out.topics = [scope];
    }
    if (mode === "offsets") {
      try { out.offsets = JSON.parse(f.offsets.value); } catch (_e) {
        throw new Error('Offsets must be JSON like {"orders": {"0": 1200}}.');
      }
    } else if (mode === "timestamp") {
      if (!f.timestamp.value) throw new Error("Choose the time to reset to.");
      out.timestamp = new Date(f.timestamp.value).toISOString();
    } else if (mode === "shift") {
      if (!/^-?\d+$/.test(f.shiftBy.value.trim())) throw new Error("Shift by a whole number of records, like -100.");
      out.shiftBy = Number(f.shiftBy.value.trim());
    }
    return out;
  }

  const message = window.OL.messageLine("reset-message");

  function hidePreview() {
    previewed = null;
    document.getElementById("reset-preview").hidden = true;
  }

  function showModeFields() {
    const mode = form().elements.mode.value;
    for (const node of document.querySelectorAll(".mode-field")) node.hidden = node.dataset.mode !== mode;
  }

  const refusal = window.OL.refusal;

  async function preview(ev) {
    ev.preventDefault();
    hidePreview();
    document.getElementById("reset-result").hidden = true;
    let request;
    try { request = resetBody(); } catch (err) { message(err.message, "error"); return; }
    message("Planning…", "muted");
    try {
      const plan = await api(base + "/resets", { method: "POST", body: { ...request, dryRun: true } });
      message("");
      previewed = request;
      renderPreview(plan);
      page.loadAudit().catch(() => {});
    } catch (err) {
      message(refusal(err), "error");
    }
  }

  // Sizes and times of the records a reset passes over (the API's cost; estimates, see docs/operations.md).
  function bytes(n) {
    if (n == null) return "?";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
  }
  function span(seconds) {
    if (seconds < 120) return `${seconds.toFixed(1)} s`;
    if (seconds < 7200) return `${(seconds / 60).toFixed(1)} min`;
    if (seconds < 172800) return `${(seconds / 3600).toFixed(1)} h`;
    return `${(seconds / 86400).toFixed(1)} d`;
  }
  function when(iso) { return iso ? iso.replace("T", " ").replace(/\.\d+/, "").replace("+00:00", "Z") : ""; }

  function renderPreview(plan) {
    const warnings = [];
    if (plan.wouldBeRefused) warnings.push("Some targets lie outside the retained log and the policy is “refuse”: executing will be refused. Choose “clamp” or other targets.");
    if (plan.activeRunIds.length) warnings.push(`The pipeline has an active run (${plan.activeRunIds.join(", ")}): executing will be refused (409) until it stops.`);
    const clamped = plan.partitions.filter((p) => p.clamped).length;
    if (clamped) warnings.push(`${clamped} target(s) clamped to the retained log.`);
    const replayed = plan.partitions.reduce((s, p) => s + p.recordsReplayed, 0);
    const skipped = plan.partitions.reduce((s, p) => s + p.recordsSkipped, 0);
    const cost = plan.cost || { reread: {}, skip: {}, partitions: [], complete: true };
    const costOf = new Map(cost.partitions.map((c) => [`${c.topic}\u0000${c.partition}`, c]));
    const moved = (p) => { const c = costOf.get(`${p.topic}\u0000${p.partition}`); return c && c.records ? c : null; };
    const about = (part) => part.records
      ? ` (≈ ${bytes(part.approxBytes)}${part.spanSeconds == null ? "" : `, ${span(part.spanSeconds)} of records`})` : "";
    document.getElementById("preview-heading").textContent =
      `Dry run #${plan.resetId} (${plan.mode}): ${num(replayed)} records replayed${about(cost.reread)}, ` +
      `${num(skipped)} skipped${about(cost.skip)}`;
    if (!cost.complete) warnings.push("Some sizes or record times are unknown: Kafka did not answer in time, or DESCRIBE on the cluster is not granted.");
    document.getElementById("preview-warnings").replaceChildren(...warnings.map((w) => el("li", { class: "warning" }, w)));
    fill(document.querySelector("#preview-table tbody"), plan.partitions.map((p) => el("tr", { "data-topic": p.topic, "data-partition": p.partition },
      el("td", {}, p.topic), el("td", { class: "num" }, p.partition), el("td", { class: "num" }, num(p.beforeNextOffset)),
      el("td", { class: "num", "data-col": "target" }, num(p.targetNextOffset)),
      el("td", { class: "num" }, num(p.recordsReplayed)), el("td", { class: "num" }, num(p.recordsSkipped)),
      el("td", { class: "num", "data-col": "bytes" }, moved(p) ? bytes(moved(p).approxBytes) : ""),
      el("td", { "data-col": "span" }, moved(p) && moved(p).firstRecordTime
        ? `${when(moved(p).firstRecordTime)} – ${when(moved(p).lastRecordTime)}` : ""),
      el("td", { class: p.outOfRange ? "warning" : "" }, p.outOfRange
        ? `${p.outOfRange.replaceAll("_", " ")}: requested ${num(p.requestedNextOffset)}, log ${num(p.logStartOffset)}–${num(p.logEndOffset)}${p.clamped ? ", clamped" : ""}`
        : ""),
    )), "The reset touches no partition.", 9);
    const confirm = document.getElementById("reset-confirm");
    confirm.reset();
    document.getElementById("reset-preview").hidden = false;
    document.getElementById("preview-heading").focus();
  }

  async function execute(ev) {
    ev.preventDefault();
    if (!previewed) { message("Preview the reset first.", "error"); return; }
    const f = document.getElementById("reset-confirm").elements;
    const reason = f.reason.value.trim();
    if (!reason) { message("Give a reason: it is kept in the audit trail.", "error"); f.reason.focus(); return; }
    if (!f.confirmed.checked) { message("Tick the confirmation to execute.", "error"); f.confirmed.focus(); return; }
    const button = document.getElementById("reset-execute");
    button.disabled = true;
    try {
      const done = await api(base + "/resets", { method: "POST", body: { ...previewed, dryRun: false, reason } });
      message("");
      hidePreview();
      const result = document.getElementById("reset-result");
      result.hidden = false;
      result.className = "ok";
      result.textContent = `Reset #${done.resetId} executed (${done.status}): the positions moved; the pipeline reads from them after its next restart through start_from_ledger.`;
      await page.refresh();
    } catch (err) {
      message(refusal(err), "error");
    } finally {
      button.disabled = false;
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    const f = form();
    f.addEventListener("submit", preview);
    // A changed request makes the shown dry run stale: it must be previewed again.
    f.addEventListener("input", () => { hidePreview(); showModeFields(); });
    f.addEventListener("change", () => { hidePreview(); showModeFields(); });
    showModeFields();
    document.getElementById("reset-confirm").addEventListener("submit", execute);
    document.getElementById("reset-cancel").addEventListener("click", () => { hidePreview(); message(""); });
  });
})();
