// One pipeline: positions in the retained log, batches over time, history, runs, findings, resets.
"use strict";

(() => {
  const { api, ApiError, el, fill, num, time, stateBadge, headroomBadge, showError, describe, every, stamp } = window.OL;
  const body = document.body;
  const pipeline = body.dataset.pipeline;
  let group = body.dataset.group || "";
  const base = "/api/v1/pipelines/" + encodeURIComponent(pipeline);
  let logEnds = new Map();  // "topic/partition" -> log-end offset, from the latest lag answer
  let topics = [];
  let chart = null;
  // Batches are seconds apart at the least: no half-second ticks that repeat the same label.
  const WHOLE_SECONDS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
    86400, 172800, 604800, 2592000, 31536000];

  function q(params = {}) {
    const search = new URLSearchParams();
    if (group) search.set("consumerGroup", group);
    for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") search.set(k, v);
    const s = search.toString();
    return s ? "?" + s : "";
  }

  // -- summary and partitions (refreshed)

  function renderSummary(row) {
    const dl = document.getElementById("summary");
    const item = (term, value) => el("div", {}, el("dt", {}, term), el("dd", {}, value));
    dl.replaceChildren(...(row ? [
      item("Consumer group", row.consumerGroup), item("State", [stateBadge(row.state), row.stateReason ? el("span", { class: "muted small state-reason" }, " " + row.stateReason) : null]),
      item("Lag (records)", num(row.lag)), item("Retention headroom", headroomBadge(row)),
      item("Last batch", time(row.lastBatchTime, true)),
      item("App version", row.appVersion || "—"), item("Generation", num(row.generation ? row.generation.generation : null)),
      item("Findings", num(row.findings)),
      // Records the batches never read (issue 41): the pipeline's status is ERR while there are any.
      item("Records lost", row.recordsLost
        ? el("span", { class: "badge finding", "data-records-lost": row.recordsLost,
          title: "Batches read fewer rows than their offsets span: records deleted before they were fetched (verify lists them)" },
        `ERR ${num(row.recordsLost)} never read`)
        : num(row.recordsLost || 0)),
    ] : []));
  }

  function bar(p) {
    const start = p.logStartOffset, end = p.logEndOffset, pos = p.nextOffset;
    if (start === null || end === null || pos === null) return el("span", { class: "muted" }, "—");
    const span = Math.max(1, end - start);
    const share = Math.min(1, Math.max(0, (pos - start) / span));
    const outside = pos < start ? "before log-start (records lost to retention)" : pos > end ? "beyond log-end" : null;
    const label = `${p.topic} partition ${p.partition}: position ${num(pos)} in retained log ${num(start)} to ${num(end)}`
      + (outside ? `, ${outside}` : `, ${num(end - pos)} behind`);
    const fillNode = el("div", { class: "bar-fill" });
    fillNode.style.width = `${(share * 100).toFixed(2)}%`;
    const track = el("div", {
      class: outside ? "bar out" : "bar", role: "meter", "aria-label": label, title: label,
      "aria-valuemin": start, "aria-valuemax": end, "aria-valuenow": Math.min(end, Math.max(start, pos)),
      "aria-valuetext": outside ? `${num(pos)}, ${outside}` : `${num(pos)} (${Math.round(share * 100)}%)`,
    }, fillNode);
    return outside ? [track, el("span", { class: "bar-note" }, outside)] : track;
  }

  async function loadPartitions() {
    const offsets = await api(base + "/offsets" + q());
    group = group || offsets.consumerGroup;
    let lag = null;
    const lagError = document.getElementById("lag-error");
    try {
      lag = await api(base + "/lag" + q());
      lagError.hidden = true;
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) throw err;
      lagError.hidden = false;
      lagError.textContent = "Log-start and log-end unknown (Kafka): " + describe(err);
    }
    const byTp = new Map();
    for (const p of offsets.positions) byTp.set(`${p.topic}/${p.partition}`, { ...p, logStartOffset: null, logEndOffset: null, lag: null });
    if (lag) {
      logEnds = new Map();
      for (const p of lag.partitions) {
        const key = `${p.topic}/${p.partition}`;
        logEnds.set(key, p.logEndOffset);
        byTp.set(key, { placedBy: null, ...(byTp.get(key) || {}), ...p });
      }
    }
    const rows = [...byTp.values()].sort((a, b) => a.topic.localeCompare(b.topic) || a.partition - b.partition);
    fill(document.querySelector("#partitions tbody"), rows.map((p) => el("tr", { "data-topic": p.topic, "data-partition": p.partition },
      el("td", {}, p.topic), el("td", { class: "num" }, p.partition),
      el("td", { class: "num" }, num(p.logStartOffset)),
      el("td", { class: "num", "data-col": "position" }, num(p.nextOffset)),
      el("td", { class: "num" }, num(p.logEndOffset)), el("td", { class: "num" }, num(p.lag)),
      el("td", { class: "num", "data-col": "headroom" }, lag ? headroomBadge(p) : "—"),
      el("td", { class: "bar-col" }, bar(p)),
      el("td", {}, p.placedBy === "reset" ? `reset #${p.resetId}` : p.placedBy === "batch" ? `batch ${p.batchId}`
        : p.placedBy === "generation" ? "generation start" : "no position yet"),
    )), "No positions recorded.", 9);
    const seen = [...new Set(rows.map((r) => r.topic))].sort();
    if (seen.join() !== topics.join()) {
      topics = seen;
      for (const id of ["reset-topic", "history-topic"]) {
        const select = document.getElementById(id);
        const keep = select.value;
        select.replaceChildren(select.options[0], ...topics.map((t) => el("option", { value: t }, t)));
        select.value = topics.includes(keep) ? keep : "";
      }
    }
  }

  async function loadSummary() {
    const all = (await api("/api/v1/console/pipelines")).pipelines;
    renderSummary(all.find((p) => p.pipeline === pipeline && (!group || p.consumerGroup === group)));
  }

  async function loadRuns() {
    const data = await api(base + "/runs" + q());
    fill(document.querySelector("#generations tbody"), data.generations.map((g) => el("tr", {},
      el("td", { class: "num" }, g.generation), el("td", {}, g.appVersion || "—"), el("td", {}, g.reason),
      el("td", {}, time(g.createdAt)), el("td", { class: "path" }, g.location),
    )), "No checkpoint generations: this pipeline does not restart through start_from_ledger.", 5);
    fill(document.querySelector("#runs tbody"), data.runs.map((r) => el("tr", {},
      el("td", { class: "mono", title: `query ${r.queryId}` }, r.runId.slice(0, 8)),
      el("td", {}, r.appVersion || "—"),
      // A foreign run (not on the current generation's checkpoint) moves no position: say so loudly.
      el("td", { class: "num" }, num(r.generation), r.foreign ? el("span", { class: "badge finding" }, " foreign") : null),
      el("td", {}, time(r.startedAt)),
      // Unterminated rows as the liveness rule judges them: a silent one is presumed crashed, not running.
      el("td", { title: r.why || null }, r.terminatedAt && r.state === "terminated" ? ["ended ", time(r.terminatedAt)]
        : [r.state === "active" ? "running, heard " : "presumed ended, last heard ", time(r.lastHeartbeatAt || r.startedAt, true)],
        r.exception ? el("div", { class: "error small" }, r.exception) : null),
      el("td", { class: "num" }, num(r.lastBatchId)), el("td", { class: "path" }, r.checkpointLocation || "—"),
    )), "No runs recorded.", 7);
  }

  async function loadFindings() {
    const data = await api(base + "/findings" + q());
    fill(document.querySelector("#findings tbody"), data.findings.map((f) => el("tr", {},
      el("td", {}, time(f.createdAt)), el("td", {}, time(f.lastSeenAt)), el("td", { class: "num" }, num(f.occurrences)),
      el("td", {}, el("span", { class: "badge finding" }, f.kind)),
      el("td", {}, f.topic ? `${f.topic}/${f.partition ?? "*"}` : "—", f.batchId !== null ? ` batch ${f.batchId}` : ""),
      el("td", {}, f.message),
    )), "No findings.", 6);
  }

  async function loadAudit() {
    const data = await api(base + "/resets" + q({ limit: 50 }));
    fill(document.querySelector("#audit tbody"), data.resets.map((r) => el("tr", { "data-reset": r.resetId, "data-dry-run": r.dryRun },
      el("td", { class: "num" }, r.resetId), el("td", {}, time(r.createdAt)), el("td", {}, r.mode),
      // A dry run applied nothing: a grey badge and a muted row, so executed resets stand out.
      el("td", {}, r.dryRun ? el("span", { class: "badge dry-run", title: "audited; nothing was applied" }, "dry run")
        : `executed (${r.status})`, r.forced ? " forced" : ""),
      el("td", {}, r.actor), el("td", {}, r.reason || "—"),
      el("td", { class: "mono small" }, r.partitions.map((p) => el("div", {},
        p.refused
          ? `${p.topic}/${p.partition}: ${num(p.beforeNextOffset)} → refused: ${num(p.afterNextOffset)} is outside the log ${num(p.logStartOffset)}–${num(p.logEndOffset)}`
          : `${p.topic}/${p.partition}: ${num(p.beforeNextOffset)} → ${num(p.targetNextOffset)}`))),
    )), "No resets.", 7);
  }

  function showSections(show) {
    for (const section of document.querySelectorAll("main > section")) section.hidden = !show;
  }

  async function refresh() {
    const error = document.getElementById("page-error");
    try {
      await loadPartitions();
      await Promise.all([loadSummary(), loadRuns(), loadFindings(), loadAudit()]);
      error.hidden = true;
      showSections(true);
      stamp();
    } catch (err) {
      showError(error, err);
      // An unknown pipeline has nothing to show or reset: only the message stays.
      if (err instanceof ApiError && err.status === 404) showSections(false);
      const groups = err instanceof ApiError && err.status === 400 ? err.body.consumerGroups : null;
      if (Array.isArray(groups)) {
        // Several consumer groups and none named: offer each as a bookmarkable link.
        error.append(" Choose one: ", ...groups.flatMap((g, i) => [i ? ", " : "",
          el("a", { href: `/pipelines/${encodeURIComponent(pipeline)}?group=${encodeURIComponent(g)}` }, g)]));
      }
    }
  }

  // -- chart and history

  function fromZero(_u, _min, max) {
    return [0, max > 0 ? max * 1.1 : 1];
  }

  function drawChart(batches) {
    const holder = document.getElementById("chart");
    document.getElementById("chart-empty").hidden = batches.length > 0;
    if (chart) { chart.destroy(); chart = null; }
    if (!batches.length || typeof window.uPlot !== "function") return;
    const ordered = [...batches].reverse();
    const xs = [], read = [], behind = [];
    for (const b of ordered) {
      xs.push(Date.parse(b.batchTime) / 1000);
      let n = 0, known = true, gap = 0, gapKnown = logEnds.size > 0;
      for (const r of b.ranges) {
        if (r.fromOffset === null) known = false; else n += Math.max(0, r.untilOffset - r.fromOffset);
        const end = logEnds.get(`${r.topic}/${r.partition}`);
        if (end === undefined || end === null) gapKnown = false; else gap += Math.max(0, end - r.untilOffset);
      }
      read.push(known ? n : b.inputRows);  // a fresh checkpoint's first batch has no start offsets
      behind.push(gapKnown ? gap : null);
    }
    const width = Math.max(280, holder.clientWidth || 600);
    chart = new window.uPlot({
      width, height: 260,
      // Counts start at 0: an axis from 300 makes 310 records look like three times 303.
      scales: { x: { time: true }, rec: { range: fromZero }, behind: { range: fromZero } },
      series: [
        { label: "Batch time" },
        { label: "Records read", scale: "rec", stroke: "#1d4ed8", width: 2, points: { show: true, size: 5 } },
        { label: "Behind today's log-end", scale: "behind", stroke: "#b45309", width: 2, dash: [6, 4] },
      ],
      axes: [{ space: 90, incrs: WHOLE_SECONDS, values: (_u, ticks) => ticks.map((t) => new Date(t * 1000).toLocaleTimeString()) }, { scale: "rec", label: "records read" }, { scale: "behind", side: 1, label: "behind today's log-end", grid: { show: false } }],
    }, [xs, read, behind], holder);
  }

  const history = { cursor: null, previous: [], next: null };

  function historyParams() {
    const f = document.getElementById("history-filter").elements;
    const local = (v) => (v ? new Date(v).toISOString() : null);
    return { topic: f.topic.value || null, since: local(f.since.value), until: local(f.until.value), limit: f.size.value };
  }

  let historyRequest = 0;

  async function loadHistory() {
    const error = document.getElementById("history-error");
    const mine = ++historyRequest;
    try {
      const page = await api(base + "/history" + q({ ...historyParams(), cursor: history.cursor }));
      if (mine !== historyRequest) return;  // a newer filter or page was asked for meanwhile
      error.hidden = true;
      history.next = page.nextCursor;
      fill(document.querySelector("#history tbody"), page.batches.map((b) => el("tr", {},
        el("td", { class: "num" }, b.batchId), el("td", {}, time(b.batchTime)), el("td", { class: "num" }, num(b.inputRows)),
        el("td", { class: "mono small" }, b.ranges.map((r) => el("div", {},
          `${r.topic}/${r.partition}: ${r.fromOffset === null ? "start" : num(r.fromOffset)} → ${num(r.untilOffset)}`))),
        el("td", { class: "mono", title: b.runId }, b.runId.slice(0, 8)),
      )), "No batches match.", 5);
      document.getElementById("history-older").disabled = !history.next;
      document.getElementById("history-newer").disabled = history.previous.length === 0;
      document.getElementById("history-newest").disabled = history.previous.length === 0;
      document.getElementById("history-page").textContent = `Page ${history.previous.length + 1}`;
    } catch (err) {
      showError(error, err);
    }
  }

  async function loadChart() {
    try {
      const page = await api(base + "/history" + q({ limit: 500 }));
      drawChart(page.batches);
    } catch (_err) {
      /* the page error line already says why reads fail */
    }
  }

  // What the reset form (reset.js) needs from this page.
  window.OLPipeline = { base, group: () => group, refresh, loadAudit };

  document.addEventListener("DOMContentLoaded", () => {
    const filter = document.getElementById("history-filter");
    filter.addEventListener("submit", (ev) => { ev.preventDefault(); history.cursor = null; history.previous = []; loadHistory(); });
    document.getElementById("history-size").addEventListener("change", () => { history.cursor = null; history.previous = []; loadHistory(); });
    filter.addEventListener("reset", () => setTimeout(() => { history.cursor = null; history.previous = []; loadHistory(); }));
    document.getElementById("history-older").addEventListener("click", () => {
      if (!history.next) return;
      history.previous.push(history.cursor);
      history.cursor = history.next;
      loadHistory();
    });
    document.getElementById("history-newer").addEventListener("click", () => {
      if (!history.previous.length) return;
      history.cursor = history.previous.pop();
      loadHistory();
    });
    document.getElementById("history-newest").addEventListener("click", () => {
      history.cursor = null; history.previous = []; loadHistory();
    });
    document.addEventListener("ol:token", () => { loadHistory(); loadChart(); });
    let resizeTimer = null;
    window.addEventListener("resize", () => {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(() => { if (chart) chart.setSize({ width: Math.max(280, document.getElementById("chart").clientWidth), height: 260 }); }, 150);
    });

    every(10000, refresh)().then(() => { loadChart(); loadHistory(); });
  });
})();
