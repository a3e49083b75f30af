// A pipeline's "Exactly once?" section: runs GET /api/v1/pipelines/{pipeline}/verify on request (it
// sweeps the whole history, so it is not refreshed on a timer) and lists every gap and overlap,
// explained (with the reset or finding that explains it) or not.
"use strict";

(() => {
  const { api, el, fill, num, describe } = window.OL;
  const page = window.OLPipeline;

  function batchLabel(b) {
    if (!b) return null;
    return `batch ${b.batchId} of ${b.queryId.slice(0, 8)}` + (b.generation !== null && b.generation !== undefined ? ` (gen ${b.generation})` : "");
  }

  function borders(s) {
    if (s.kind === "unknown") {
      return (s.before ? `after ${batchLabel(s.before)}; ` : "") + "start unknown: " + s.batches.map(batchLabel).join(", ");
    }
    if (s.kind === "gap") {
      return [s.before ? `after ${batchLabel(s.before)}` : null,
        s.after ? `before ${batchLabel(s.after)}` : "before the current position"].filter(Boolean).join("; ");
    }
    return "read by " + s.batches.map(batchLabel).join(", ");
  }

  async function run() {
    const status = document.getElementById("verify-status");
    const button = document.getElementById("verify-run");
    button.disabled = true;
    status.hidden = false;
    status.className = "muted";
    status.textContent = "Verifying the whole history…";
    try {
      const group = page.group();
      const doc = await api(page.base + "/verify" + (group ? "?consumerGroup=" + encodeURIComponent(group) : ""));
      const c = doc.summary;
      status.className = doc.ok ? "ok" : "error";
      status.textContent = (doc.ok ? "Every record read exactly once, or explained. " : "Not accounted for. ")
        + `${num(c.partitions)} partition(s), ${num(c.ranges)} recorded ranges: ${num(c.explained)} explained stretch(es), `
        + `${num(c.unexplained)} unexplained (${num(c.unexplainedGaps)} gap(s), ${num(c.unexplainedOverlaps)} overlap(s)`
        + (c.unexplainedLosses ? `, ${num(c.unexplainedLosses)} loss(es): ${num(c.recordsLost)} record(s) never read` : "")
        + (c.unknown ? `, ${num(c.unknown)} unknown start(s)` : "")
        + `); ${c.seconds} s.`;
      fill(document.querySelector("#verify tbody"), doc.stretches.map((s) => el("tr", { "data-explained": String(s.explained), "data-kind": s.kind },
        el("td", {}, el("span", { class: s.explained ? "badge" : "badge finding" }, s.explained ? "explained" : "UNEXPLAINED")),
        el("td", {}, `${s.topic}/${s.partition}` + (s.incarnation ? ` (incarnation ${s.incarnation})` : "")),
        el("td", { class: "num" }, num(s.fromOffset)), el("td", { class: "num" }, num(s.untilOffset)),
        el("td", { class: "num" }, num(s.records)), el("td", {}, s.kind + (s.times > 1 ? ` x${s.times}` : "")),
        el("td", {}, s.reasons.length ? s.reasons.map((r) => el("div", {}, `${r.kind}${r.id !== null ? " " + r.id : ""}${r.detail ? ": " + r.detail : ""}`)) : "—"),
        el("td", { class: "small" }, borders(s), s.notes.map((n) => el("div", { class: "muted" }, n))),
      )), "No gap and no overlap: the recorded ranges tile every partition.", 8);
      document.getElementById("verify-result").hidden = false;
    } catch (err) {
      status.className = "error";
      status.textContent = describe(err);
    } finally {
      button.disabled = false;
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.getElementById("verify-run").addEventListener("click", run);
  });
})();
