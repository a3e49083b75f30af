// The API reference, rendered from /openapi.json (fetched with the tab's token; no third-party code).
"use strict";

(() => {
  const { api, el, showError } = window.OL;
  const METHODS = ["get", "post", "put", "patch", "delete"];

  function schemaText(schema) {
    if (!schema) return "";
    if (schema.$ref) return schema.$ref.split("/").pop();
    if (schema.anyOf) return schema.anyOf.map(schemaText).join(" | ");
    return schema.type || "object";
  }

  function operation(path, method, op) {
    const params = (op.parameters || []).map((p) => el("li", {},
      el("code", {}, p.name), ` (${p.in}${p.required ? ", required" : ""}, ${schemaText(p.schema)})`,
      p.description ? ` — ${p.description}` : ""));
    const body = op.requestBody ? el("p", {}, "Body: ", el("code", {},
      Object.keys(op.requestBody.content || {}).join(", ")), " ",
      schemaText(Object.values(op.requestBody.content || {})[0]?.schema)) : null;
    const statuses = Object.entries(op.responses || {}).map(([code, r]) =>
      el("li", {}, el("code", {}, code), " ", r.description || ""));
    return el("section", { class: "card", id: op.operationId || `${method}-${path}` },
      el("h3", {}, el("code", {}, method.toUpperCase()), " ", el("code", {}, path)),
      el("p", {}, op.summary || ""),
      params.length ? el("div", {}, el("h4", {}, "Parameters"), el("ul", {}, params)) : null,
      body,
      el("h4", {}, "Responses"), el("ul", {}, statuses));
  }

  async function load() {
    const node = document.getElementById("docs");
    try {
      const doc = await api("/openapi.json");
      document.getElementById("docs-error").hidden = true;
      const out = [el("p", {}, `${doc.info.title} ${doc.info.version}: ${doc.info.description || ""}`)];
      for (const [path, item] of Object.entries(doc.paths || {})) {
        for (const method of METHODS) if (item[method]) out.push(operation(path, method, item[method]));
      }
      node.replaceChildren(...out);
    } catch (err) {
      showError(document.getElementById("docs-error"), err);
    }
  }

  document.addEventListener("DOMContentLoaded", load);
  document.addEventListener("ol:token", load);
})();
