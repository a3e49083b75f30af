// Shared by every console page: the API client with the bearer token, and small DOM helpers.
// The token lives in sessionStorage (this tab only) and travels only in the Authorization header.
"use strict";

window.OL = (() => {
  const KEY = "offset-ledger.api-token";

  class ApiError extends Error {
    constructor(status, body) {
      super((body && body.message) || `HTTP ${status}`);
      this.status = status;
      this.body = body || {};
    }
  }

  function token() {
    try { return sessionStorage.getItem(KEY) || ""; } catch (_e) { return ""; }
  }

  async function api(path, options = {}) {
    const headers = { Accept: "application/json" };
    const init = { method: options.method || "GET", headers, cache: "no-store", credentials: "omit" };
    if (options.body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(options.body);
    }
    const t = token();
    if (t) headers.Authorization = "Bearer " + t;
    let resp;
    try {
      resp = await fetch(path, init);
    } catch (_e) {
      throw new ApiError(0, { error: "NetworkError", message: "the server could not be reached" });
    }
    let body = null;
    try { body = await resp.json(); } catch (_e) { body = { error: "BadResponse", message: `HTTP ${resp.status}` }; }
    if (resp.status === 401) {
      askForToken(t ? "The API token was refused. Enter the right token to continue."
                    : "This server requires an API token. Enter it to see and change the ledger.");
      throw new ApiError(401, { error: "Unauthorized",
        message: t ? "the API token was refused" : "an API token is required" });
    }
    if (!resp.ok) throw new ApiError(resp.status, body);
    return body;
  }

  // -- token panel

  function panel() { return document.getElementById("token-panel"); }

  function showPanel(show) {
    panel().hidden = !show;
    document.getElementById("token-toggle").setAttribute("aria-expanded", String(show));
  }

  function askForToken(message) {
    document.getElementById("token-message").textContent = message;
    if (panel().hidden) {
      showPanel(true);
      document.getElementById("token-input").focus();
    }
  }

  function wireTokenPanel() {
    document.getElementById("token-toggle").addEventListener("click", () => {
      const open = panel().hidden;
      document.getElementById("token-message").textContent = token() ? "A token is set for this tab." : "";
      showPanel(open);
      if (open) document.getElementById("token-input").focus();
    });
    document.getElementById("token-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const input = document.getElementById("token-input");
      const value = input.value.trim();
      if (!value) { document.getElementById("token-message").textContent = "Enter a token."; return; }
      try { sessionStorage.setItem(KEY, value); } catch (_e) { /* storage disabled: nothing to keep */ }
      input.value = "";
      showPanel(false);
      document.dispatchEvent(new CustomEvent("ol:token"));
    });
    document.getElementById("token-forget").addEventListener("click", () => {
      try { sessionStorage.removeItem(KEY); } catch (_e) { /* nothing stored */ }
      document.getElementById("token-message").textContent = "Token forgotten for this tab.";
      document.dispatchEvent(new CustomEvent("ol:token"));
    });
  }

  // -- DOM helpers (text only: ledger strings never become markup)

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function fill(tbody, rows, emptyText, columns) {
    tbody.replaceChildren(...(rows.length ? rows
      : [el("tr", {}, el("td", { colspan: columns, class: "muted" }, emptyText))]));
  }

  function num(value) {
    return value === null || value === undefined ? "—" : Number(value).toLocaleString("en-US");
  }

  function ago(date) {
    const s = Math.round((Date.now() - date.getTime()) / 1000);
    if (s < 0) return "just now";
    if (s < 90) return `${s} s ago`;
    if (s < 5400) return `${Math.round(s / 60)} min ago`;
    if (s < 129600) return `${Math.round(s / 3600)} h ago`;
    return `${Math.round(s / 86400)} d ago`;
  }

  // A <time> with the local time as text, the exact ISO value in datetime and title.
  function time(iso, relative = false) {
    if (!iso) return document.createTextNode("—");
    const d = new Date(iso);
    const local = d.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" });
    return el("time", { datetime: iso, title: iso }, relative ? `${ago(d)} (${local})` : local);
  }

  function stateBadge(state) {
    return el("span", { class: `badge state-${state}` }, state);
  }

  // Retention headroom (offset_ledger.rules.retention): "12m05s" coloured by its status, or why there is no figure.
  function duration(seconds) {
    let s = Math.floor(seconds);
    const d = Math.floor(s / 86400); s -= d * 86400;
    const h = Math.floor(s / 3600); s -= h * 3600;
    const m = Math.floor(s / 60); s -= m * 60;
    const two = (n) => String(n).padStart(2, "0");
    return d ? `${d}d${h}h` : h ? `${h}h${two(m)}m` : m ? `${m}m${two(s)}s` : `${s}s`;
  }

  const HEADROOM_WHY = {
    lost: "records below the log-start were deleted before the pipeline read them",
    "caught-up": "nothing unread: retention cannot delete anything the pipeline has not read",
    unlimited: "retention.ms and retention.bytes are -1: nothing is deleted",
    compacted: "cleanup.policy=compact: nothing is deleted by age or size (compaction may drop superseded values)",
    "beyond-log-end": "the position is beyond log-end (topic re-created or truncated)",
    time: "earliest time the broker may delete the position's segment: the record's timestamp + retention.ms (an estimate)",
    size: "when the unread bytes reach retention.bytes at the append rate (an estimate)",
  };

  function headroomBadge(p) {
    const basis = p.headroomBasis;
    if (!basis || basis === "unknown") return el("span", { class: "muted", title: "unknown (Kafka not asked or not reachable)" }, "—");
    const text = basis === "lost" ? "lost" : p.headroomSeconds === null ? basis : duration(p.headroomSeconds);
    const status = p.headroomStatus;
    return el("span", { class: status ? `badge headroom-${status}` : "muted", title: `${status || "no figure"}: ${HEADROOM_WHY[basis] || basis}`,
      "data-headroom-status": status || "" }, status && status !== "OK" ? `${status} ${text}` : text);
  }

  function showError(node, err) {
    node.hidden = false;
    node.textContent = describe(err);
    const stampNode = document.getElementById("refreshed");
    if (stampNode) stampNode.textContent = `Not updated (${new Date().toLocaleTimeString()})`;
  }

  function describe(err) {
    if (err instanceof ApiError) {
      if (err.status === 0) return "The server could not be reached; retrying.";
      return `${err.status} ${err.body.error || ""}: ${err.body.message || err.message}`.replace(/\s+:/, ":");
    }
    return String(err && err.message ? err.message : err);
  }

  // Refresh `fn` every `ms` while the tab is visible; returns a function that refreshes now.
  function every(ms, fn) {
    let timer = null;
    const run = async () => {
      clearTimeout(timer);
      try { await fn(); } finally {
        if (!document.hidden) timer = setTimeout(run, ms);
      }
    };
    document.addEventListener("visibilitychange", () => { if (!document.hidden) run(); else clearTimeout(timer); });
    document.addEventListener("ol:token", run);
    return run;
  }

  function stamp() {
    const node = document.getElementById("refreshed");
    if (node) node.textContent = `Updated ${new Date().toLocaleTimeString()}`;
  }

  document.addEventListener("DOMContentLoaded", wireTokenPanel);

  // A form's message line (the element with ``id``): text, or hidden when there is none.
  function messageLine(id) {
    return (text, kind) => {
      const node = document.getElementById(id);
      node.hidden = !text;
      node.className = kind || "";
      node.textContent = text || "";
    };
  }

  // What a form says when the API refused its request (4xx but an expired login) or failed.
  function refusal(err) {
    if (err instanceof ApiError && err.status >= 400 && err.status < 500 && err.status !== 401) return "Refused: " + describe(err);
    return describe(err);
  }

  return { api, ApiError, el, fill, num, time, ago, stateBadge, headroomBadge, showError, describe, every, stamp, token,
           messageLine, refusal };
})();
