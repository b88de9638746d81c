"""The status page's script (inlined into :data:`app.observability.page.STATUS_HTML`).

It polls ``status.json`` every two seconds and renders the cards, the per-API tables (a column per
API of ``apis``, from the server, plus ``all``), the recent requests and the chart, with
``textContent`` only (model names come from clients); the API selector narrows the recent requests
and the chart to one API without waiting for the next poll. Once a poll has rendered,
``body[data-loaded]`` is ``true`` (the browser tests wait for it).
"""

from __future__ import annotations

STATUS_SCRIPT = """"use strict";
const fmt = new Intl.NumberFormat("en-US");
const num = (v) => (v === null || v === undefined) ? "–" : fmt.format(v);
const ms = (v) => (v === null || v === undefined) ? "–" : v.toFixed(1);

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const [text, cls] of cells) {
    const td = tr.appendChild(el("td", text, cls));
    if (cls === "clip") td.title = String(text);
  }
  return tr;
}

function duration(s) {
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
  return (d ? d + "d " : "") + (d || h ? h + "h " : "") + m + "m " + Math.floor(s % 60) + "s";
}

const share = (part, whole) => whole ? (100 * part / whole).toFixed(1) + "%" : "–";
const pairs = (o) => Object.entries(o || {}).filter(([, v]) => v).map(([k, v]) => k + " " + fmt.format(v))
  .join(", ") || "none";
const fittedRow = (r) => r.api !== null && r.api !== undefined && r.route === r.api;

function renderCards(data) {
  const c = data.counters, cache = data.summary_cache || {};
  const saved = share(c.tokens_saved, c.tokens_before);
  const cards = [
    ["requests", num(c.requests)], ["fitted requests", num(c.fitted_requests)],
    ["requests cut", num(c.changed_requests)], ["tokens saved", num(c.tokens_saved)],
    ["share of tokens saved", saved], ["emergency retries", num(c.emergency_retries)],
    ["rejected", num((c.by_outcome || {}).rejected || 0)], ["in flight", num(data.in_flight)],
    ["summary cache hits", num(cache.hit || 0)], ["summary cache misses", num(cache.miss || 0)],
  ];
  const box = document.getElementById("cards");
  box.replaceChildren();
  for (const [k, v] of cards) {
    const card = el("div", null, "card");
    card.appendChild(el("div", v, "v"));
    card.appendChild(el("div", k, "k"));
    box.appendChild(card);
  }
  document.getElementById("breakdown").textContent =
    "Outcomes: " + pairs(c.by_outcome) + ". Routes: " + pairs(c.by_route) +
    ". Actions: " + pairs(c.actions) + ".";
}

// Figures of the per-API tables: [key, label, value of one API's counters].
const API_ROWS = [
  ["requests", "requests (every route)", (c) => num(c.requests)],
  ["fitted_requests", "fitted requests", (c) => num(c.fitted_requests)],
  ["changed_requests", "cut to fit", (c) => num(c.changed_requests)],
  ["tokens_before", "tokens before", (c) => num(c.tokens_before)],
  ["tokens_after", "tokens after", (c) => num(c.tokens_after)],
  ["tokens_saved", "tokens saved",
   (c) => num(c.tokens_saved) + " (" + share(c.tokens_saved, c.tokens_before) + ")"],
  ["prefix_reused_tokens", "prefix reused (share of after)",
   (c) => num(c.prefix_reused_tokens) + " (" + share(c.prefix_reused_tokens, c.tokens_after) + ")"],
  ["emergency_retries", "emergency retries", (c) => num(c.emergency_retries)],
  ["rejected", "rejected", (c) => num((c.by_outcome || {}).rejected || 0)],
  ["actions", "actions", (c) => pairs(c.actions), "text"],
];
const SUMMARY_ROWS = [
  ["memory_summary", "cuts with a summary", (c) => num((c.memory || {}).summary || 0)],
  ["memory_index", "cuts with the index alone", (c) => num((c.memory || {}).index || 0)],
  ["memory_note", "cuts with the plain note", (c) => num((c.memory || {}).note || 0)],
  ["calls", "summary calls", (c) => num((c.summaries || {}).calls || 0)],
  ["failures", "failed", (c) => num((c.summaries || {}).failures || 0)],
  ["rejected", "refused by the checks", (c) => num((c.summaries || {}).rejected || 0)],
  ["tokens_in", "tokens sent", (c) => num((c.summaries || {}).tokens_in || 0)],
  ["tokens_out", "summary tokens", (c) => num((c.summaries || {}).tokens_out || 0)],
  ["cache_hit", "cache hits", (c) => num((c.summaries || {}).cache_hit || 0)],
  ["cache_miss", "cache misses", (c) => num((c.summaries || {}).cache_miss || 0)],
];
const RECALL_ROWS = [
  ["calls", "ctx_recall calls answered", (c) => num((c.recall || {}).calls || 0)],
  ["rounds", "rounds continued", (c) => num((c.recall || {}).rounds || 0)],
  ["bytes", "bytes recalled", (c) => num((c.recall || {}).bytes || 0)],
  ["misses", "misses", (c) => num((c.recall || {}).misses || 0)],
];

function apiTable(id, figures, data) {
  const apis = data.apis || [];
  const byApi = data.counters.by_api || {};
  const head = document.querySelector("#" + id + " thead");
  const tr = document.createElement("tr");
  tr.appendChild(el("th", ""));
  for (const name of [...apis, "all"]) tr.appendChild(el("th", name, "num")).dataset.api = name;
  head.replaceChildren(tr);
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren();
  for (const [key, label, value, cls] of figures) {
    const line = document.createElement("tr");
    line.dataset.figure = key;
    line.appendChild(el("td", label));
    for (const name of apis) {
      line.appendChild(el("td", value(byApi[name] || {}), cls)).dataset.api = name;
    }
    line.appendChild(el("td", value(data.counters), cls)).dataset.api = "all";
    body.appendChild(line);
  }
}

function renderApis(data) {
  apiTable("apis", API_ROWS, data);
  apiTable("summaries", SUMMARY_ROWS, data);
  apiTable("recall", RECALL_ROWS, data);
  const select = document.getElementById("api-filter");
  const wanted = ["", ...(data.apis || [])];
  if ([...select.options].map((o) => o.value).join() !== wanted.join()) {
    const chosen = select.value;
    select.replaceChildren(...wanted.map((name) => {
      const option = el("option", name || "all");
      option.value = name;
      return option;
    }));
    select.value = wanted.includes(chosen) ? chosen : "";
  }
}

function chosenApi() {
  return document.getElementById("api-filter").value;
}

function renderRecent(data) {
  const body = document.querySelector("#recent tbody");
  body.replaceChildren();
  const api = chosenApi();
  const recent = data.recent.filter((r) => !api || r.api === api);
  for (const r of recent) {
    const t = new Date(r.at_s * 1000).toLocaleTimeString();
    const bad = r.outcome !== "ok";
    // A fitted request's route is its API's name; another route of an API says both.
    const route = r.api && r.route !== r.api ? r.api + " " + r.route : r.route;
    body.appendChild(row([
      [t], [r.request_id, "clip"], [route], [r.model || "–", "clip"], [r.status, "num"],
      [r.outcome, bad ? "bad" : "good"], [num(r.tokens_before), "num"],
      // A rejected request forwarded nothing: no "after".
      [r.outcome === "rejected" ? "–" : num(r.tokens_after), "num"],
      [(r.actions || "–").replaceAll(",", ", "), "actions"], [r.retries, "num"], [ms(r.latency_ms), "num"],
      [ms(r.upstream_ms), "num"], [ms(r.overhead_ms), "num"],
    ]));
  }
  document.getElementById("recent-count").textContent =
    "(" + recent.length + " shown, the last " + data.recent_max +
    " are kept; newest first; no content is ever stored)";
}

function renderUpstream(data) {
  const u = data.upstream, h = u.health;
  const box = document.getElementById("upstream-detail");
  box.replaceChildren();
  box.appendChild(el("div", "Base URL: " + u.base_url));
  const routes = Object.entries(u.routes || {});
  if (routes.length) {
    box.appendChild(el("div", "Routes: " + routes.map(([k, v]) => k + " → " + v).join(", ")));
  }
  const last = h.last_status !== null ? "HTTP " + h.last_status
    : (h.calls ? "no answer (connection failed)" : "no call yet");
  const after = h.last_latency_ms !== null ? " after " + ms(h.last_latency_ms) + " ms" : "";
  box.appendChild(el("div", "Upstream calls: " + num(h.calls) + ", failed or 5xx: " + num(h.errors) +
    ". Last answer: " + last + after + "."));
  document.getElementById("upstream").textContent = "upstream " + u.base_url;
}

function modelRow(name, m) {
  return row([[name], [num(m.window_tokens), "num"], [num(m.max_output_tokens), "num"],
              [m.encoding], [m.source]]);
}

function renderModels(data) {
  const body = document.querySelector("#models tbody");
  const rows = data.models.entries || [];
  // The table is static while the process runs: build it once.
  if (body.childElementCount !== rows.length + (data.models.default ? 1 : 0) || !rows.length) {
    body.replaceChildren();
    if (data.models.default) body.appendChild(modelRow("[default]", data.models.default));
    for (const m of rows) body.appendChild(modelRow(m.name, m));
    document.getElementById("model-count").textContent = "(" + rows.length + " entries)";
  }
  const learned = data.models.learned || [];
  const box = document.getElementById("learned-box");
  box.style.display = learned.length ? "block" : "none";
  const lbody = document.querySelector("#learned tbody");
  lbody.replaceChildren();
  for (const m of learned) {
    const name = m.tenant ? m.name + " (client " + m.tenant + ")" : m.name;
    lbody.appendChild(row([[name, "clip"], [num(m.window_tokens), "num"], [m.source],
      [num(m.max_output_tokens), "num"], [m.encoding], [m.correction.toFixed(3), "num"]]));
  }
}

function drawChart(data) {
  const canvas = document.getElementById("chart");
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 1200, height = canvas.clientHeight || 260;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  const api = chosenApi();
  const points = data.recent
    .filter((r) => fittedRow(r) && (!api || r.api === api) && r.tokens_before !== null).reverse();
  const note = document.getElementById("chart-note");
  const left = 64, right = 12, top = 10, bottom = 28;
  const plotW = width - left - right, plotH = height - top - bottom;
  const max = Math.max(10, ...points.map((p) => Math.max(p.tokens_before, p.tokens_after || 0)));
  // A log axis: one 100k-token request must not flatten the 2k ones next to it.
  const top10 = Math.ceil(Math.log10(max));
  const scale = (v) => (v <= 1 ? 0 : plotH * Math.log10(v) / top10);
  const style = getComputedStyle(document.documentElement);
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#5b6475";
  ctx.strokeStyle = "#dde2ea";
  ctx.lineWidth = 1;
  const ticks = [];
  for (let e = 0; e <= top10; e++) {
    const y = top + plotH - scale(10 ** e);
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(width - right, y); ctx.stroke();
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    ticks.push(fmt.format(10 ** e));
    ctx.fillText(ticks[ticks.length - 1], left - 6, y);
  }
  canvas.dataset.scale = "log";
  canvas.dataset.ticks = ticks.join(" ");
  if (!points.length) {
    ctx.textAlign = "center";
    ctx.fillText("no fitted request yet", left + plotW / 2, top + plotH / 2);
    note.textContent = "";
    return;
  }
  const slot = plotW / points.length;
  const bar = Math.max(1, Math.min(18, slot * 0.4));
  points.forEach((p, i) => {
    const x = left + slot * i + slot / 2;
    const hb = scale(p.tokens_before);
    const after = p.outcome === "rejected" ? 0 : (p.tokens_after || 0);
    const ha = scale(after);
    ctx.fillStyle = style.getPropertyValue("--before").trim() || "#f0a35e";
    ctx.fillRect(x - bar, top + plotH - hb, bar, hb);
    ctx.fillStyle = style.getPropertyValue("--after").trim() || "#2f6fdb";
    ctx.fillRect(x, top + plotH - ha, bar, ha);
  });
  ctx.fillStyle = "#5b6475";
  ctx.textAlign = "left"; ctx.textBaseline = "top";
  ctx.fillText("oldest", left, top + plotH + 8);
  ctx.textAlign = "right";
  ctx.fillText("newest", width - right, top + plotH + 8);
  const cut = points.filter((p) => p.tokens_after !== null && p.tokens_after < p.tokens_before).length;
  note.textContent = points.length + " fitted requests shown, " + cut + " of them cut to fit " +
    "(tokens on a log scale).";
}

async function refresh() {
  const box = document.getElementById("error");
  try {
    const response = await fetch("status.json", {cache: "no-store"});
    if (!response.ok) throw new Error("status.json answered HTTP " + response.status);
    const data = await response.json();
    document.getElementById("version").textContent = "version " + data.version;
    document.getElementById("uptime").textContent = "up " + duration(data.uptime_s);
    renderCards(data);
    renderApis(data);
    renderRecent(data);
    renderUpstream(data);
    renderModels(data);
    drawChart(data);
    box.style.display = "none";
    document.body.dataset.loaded = "true";
    return data;
  } catch (err) {
    box.style.display = "block";
    box.textContent = "Could not load the status: " + err.message + " (retrying)";
  }
}

let last = null;
async function poll() {
  last = await refresh() || last;
}
document.getElementById("api-filter").addEventListener("change", () => {
  if (last) { renderRecent(last); drawChart(last); }
});
poll();
setInterval(poll, 2000);
"""
