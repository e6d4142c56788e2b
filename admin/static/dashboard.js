// The fedmask admin dashboard: plain JavaScript over the REST API of the same
// origin; no build step, nothing loaded from elsewhere. The token is kept in
// sessionStorage (this tab only) and sent as "Authorization: Bearer". Every
// value from the API is put into the page as text (never as HTML).
"use strict";

const KEY = "fedmask-admin-token";
// The stages of a running round, in order, as GET /v1/federation lists them (round_stages:
// every secure-aggregation stage of the protocol, then aggregating). Empty until it answers.
let stages = [];
// Stages a round runs only in some modes: shown as skipped unless the round opened them.
const OPTIONAL = ["share_check", "consistency_check"];
// A stage's label is its name with spaces ("share_check" -> "share check"), unless named here.
const LABELS = { consistency_check: "consistency" };
const label = (stage) => LABELS[stage] || stage.replace(/_/g, " ");
let token = sessionStorage.getItem(KEY);
let live = null;          // the live round as /v1/rounds/current gives it (updated by events)
let watching = null;      // AbortController of the event stream
let refreshTimer = null;

const $ = (id) => document.getElementById(id);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function say(text) { $("status-msg").textContent = text || ""; }

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {}, { Authorization: "Bearer " + token });
  const r = await fetch(path, Object.assign({}, options, { headers }));
  const type = r.headers.get("content-type") || "";
  const body = type.includes("json") ? await r.json() : await r.text();
  if (r.status === 401) { signOut("The token was refused."); }
  if (!r.ok) {
    const err = new Error((body && body.detail) || r.statusText);
    err.status = r.status;
    throw err;
  }
  return body;
}

// ---------------------------------------------------------------- sign in

function signIn(value) {
  token = value;
  sessionStorage.setItem(KEY, value);
  $("signin").hidden = true;
  $("app").hidden = false;
  $("signout").hidden = false;
  refreshAll();
  watch();
  clearInterval(refreshTimer);
  refreshTimer = setInterval(refreshAll, 5000);
}

function signOut(message) {
  token = null;
  sessionStorage.removeItem(KEY);
  if (watching) watching.abort();
  clearInterval(refreshTimer);
  $("app").hidden = true;
  $("signin").hidden = false;
  $("signout").hidden = true;
  $("phase").textContent = message || "not signed in";
}

// -------------------------------------------------------------- live round

function renderLive() {
  const strip = $("stage-strip");
  strip.replaceChildren();
  const round = live;
  $("live-number").textContent = round ? "#" + round.number : "(none running)";
  const current = round ? stages.indexOf(round.stage) : -1;
  const byStage = {};
  for (const s of (round && round.stages) || []) byStage[s.stage] = s;
  for (const [i, stage] of stages.entries()) {
    const li = el("li", label(stage));
    li.dataset.stage = stage;
    const skipped = OPTIONAL.includes(stage) && !byStage[stage];
    if (round && i < current) li.classList.add(skipped ? "skipped" : "done");
    if (round && i === current) li.classList.add("active");
    const s = byStage[stage];
    if (s) li.appendChild(el("span", s.survivors + " in, " + s.dropouts + " out", "n"));
    strip.appendChild(li);
  }
  renderSurvivors(round);
}

function renderSurvivors(round) {
  const box = $("survivors");
  box.replaceChildren();
  if (!round || !round.cohort_size) return;
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 400 34");
  svg.setAttribute("preserveAspectRatio", "xMinYMid meet");
  const w = (n) => (400 * n) / round.cohort_size;
  const rect = (x, width, fill) => {
    const r = document.createElementNS(ns, "rect");
    r.setAttribute("x", x); r.setAttribute("y", 4); r.setAttribute("width", width); r.setAttribute("height", 16);
    r.setAttribute("fill", fill);
    svg.appendChild(r);
  };
  rect(0, 400, "#d9dee3");
  const ok = round.live_devices >= round.threshold;
  rect(0, w(round.live_devices), ok ? "#1a7f37" : "#c0392b");
  const line = document.createElementNS(ns, "line");
  line.setAttribute("x1", w(round.threshold)); line.setAttribute("x2", w(round.threshold));
  line.setAttribute("y1", 0); line.setAttribute("y2", 24); line.setAttribute("stroke", "#1d232a");
  line.setAttribute("stroke-width", 2);
  svg.appendChild(line);
  const label = document.createElementNS(ns, "text");
  label.setAttribute("x", 2); label.setAttribute("y", 33); label.setAttribute("font-size", 10);
  label.textContent = round.live_devices + " live of " + round.cohort_size + ", threshold " + round.threshold;
  svg.appendChild(label);
  box.appendChild(svg);
}

async function refreshLive() {
  try {
    const current = await api("/v1/rounds/current");
    live = current.round;
    renderLive();
  } catch (e) { if (e.status !== 403) say("live state: " + e.message); }
}

// ----------------------------------------------------- overview and rounds

// an active tier's replicas: how many, which leads, and each one's streams (from the store)
function replicaSummary(replicas) {
  if (!replicas) return "";
  const leader = replicas.find((r) => r.leader);
  return " · " + replicas.length + " replica" + (replicas.length === 1 ? "" : "s") +
    " (" + replicas.map((r) => r.name + " " + r.connected).join(", ") + "; " +
    (leader ? "leader " + leader.name : "no leader") + ")";
}

async function refreshOverview() {
  try {
    const f = await api("/v1/federation");
    if (f.round_stages.join() !== stages.join()) {
      stages = f.round_stages;
      renderLive();
    }
    const phase = $("phase");
    phase.textContent = f.phase || "coordinator unreachable";
    phase.className = "badge " + (stages.includes(f.phase) ? "running" : (f.phase || ""));
    $("summary").textContent = (f.model_name || "no model") + " v" + (f.current_version ?? "-") + " · " +
      f.rounds_committed + " committed, " + f.rounds_aborted + " aborted · devices " +
      (f.devices_connected ?? "?") + " connected of " + f.devices_enrolled + replicaSummary(f.replicas);
    // epsilon with its delta, the unit it protects and sampling (the service's sentence, rounded up),
    // and below it what the same noise would give a production-size deployment
    const budget = f.epsilon_budget ? " · budget " + f.epsilon_budget.toFixed(2) : "";
    $("privacy").textContent = (f.privacy_statement || "epsilon spent " + f.epsilon_spent.toFixed(2)) + budget +
      (f.phase === "budget_exhausted" ? " — budget exhausted" : "");
    $("privacy-plan").textContent = f.production_plan ? f.production_plan.text : "";
    $("chart-epsilon-title").textContent = "Epsilon spent" +
      (f.delta !== null && f.delta !== undefined ? " (delta " + f.delta.toExponential(0) + ", protecting " +
        f.protects + ")" : "");
  } catch (e) { if (e.status !== 403) say("overview: " + e.message); }
}

function fmt(x, digits) { return x === null || x === undefined ? "" : Number(x).toFixed(digits); }

function mainMetric(rounds) {
  for (const r of rounds) {
    const keys = Object.keys(r.validation || {}).sort();
    const hr = keys.find((k) => k.includes("hr@10") || k.includes("hits@10"));
    if (hr) return hr;
    if (keys.length) return keys[0];
  }
  return null;
}

async function refreshRounds() {
  let page;
  try { page = await api("/v1/rounds?limit=50"); } catch (e) { if (e.status !== 403) say("rounds: " + e.message); return; }
  const rounds = page.items;
  const metric = mainMetric(rounds);
  const body = $("rounds-table").querySelector("tbody");
  body.replaceChildren();
  for (const r of rounds) {
    const tr = el("tr");
    tr.dataset.round = r.number;
    tr.appendChild(el("td", r.number));
    tr.appendChild(el("td", r.outcome + (r.abort_reason ? " (" + r.abort_reason + ")" : ""), r.outcome));
    tr.appendChild(el("td", r.started_at.replace("T", " ").slice(0, 19)));
    tr.appendChild(el("td", fmt(r.seconds, 2)));
    tr.appendChild(el("td", r.cohort_size));
    tr.appendChild(el("td", r.contributors ?? ""));
    tr.appendChild(el("td", metric && r.validation[metric] !== undefined ? fmt(r.validation[metric], 3) : ""));
    tr.appendChild(el("td", fmt(r.epsilon, 2)));
    tr.appendChild(el("td", r.model_version ?? ""));
    body.appendChild(tr);
  }
  const old = rounds.slice().reverse();
  $("chart-val-title").textContent = "Federated validation" + (metric ? " (" + metric + ")" : "");
  // Under DP the devices send no metric totals (D36): say so rather than wait for data that never comes.
  const noMetric = rounds.some((r) => r.outcome === "committed") && !metric;
  chart($("chart-val"), old.filter((r) => metric && r.validation[metric] !== undefined).map((r) => [r.number, r.validation[metric]]),
        noMetric ? "none released (off under DP)" : "no data yet");
  chart($("chart-duration"), old.filter((r) => r.seconds !== null).map((r) => [r.number, r.seconds]));
  chart($("chart-epsilon"), old.filter((r) => r.epsilon !== null).map((r) => [r.number, r.epsilon]));
}

function chart(box, points, empty = "no data yet") {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 300 160");
  box.replaceChildren(svg);
  if (!points.length) {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", 10); t.setAttribute("y", 80); t.textContent = empty;
    svg.appendChild(t);
    return;
  }
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(0, ...ys), y1 = Math.max(...ys) || 1;
  const sx = (x) => 36 + (x1 === x0 ? 120 : ((x - x0) / (x1 - x0)) * 254);
  const sy = (y) => 140 - ((y - y0) / (y1 - y0 || 1)) * 128;
  const axis = document.createElementNS(ns, "path");
  axis.setAttribute("d", "M36 8 V140 H292"); axis.setAttribute("class", "axis"); axis.setAttribute("fill", "none");
  svg.appendChild(axis);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", points.map((p) => sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1)).join(" "));
  line.setAttribute("class", "line");
  svg.appendChild(line);
  for (const [text, x, y] of [[y1.toPrecision(3), 2, 14], [y0.toPrecision(3), 2, 140], ["#" + x0, 36, 155], ["#" + x1, 270, 155]]) {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", x); t.setAttribute("y", y); t.textContent = text;
    svg.appendChild(t);
  }
}

function refreshAll() {
  if (!token) return;
  refreshOverview();
  refreshLive();
  refreshRounds();
}

// ------------------------------------------------------------------ events

function onFrame(frame) {
  let event = "message", data = null;
  for (const line of frame.split("\n")) {
    if (line.startsWith("event: ")) event = line.slice(7);
    else if (line.startsWith("data: ")) data = JSON.parse(line.slice(6));
  }
  if (!data) return;
  if (event === "snapshot") {
    live = data.round || null;
    renderLive();
  } else if (event === "stage") {
    const number = Number(data.round_number);
    if (!live || live.number !== number) live = { number, stages: [], cohort_size: data.cohort_size };
    live.stage = data.stage;
    live.threshold = data.threshold;
    live.live_devices = data.live_devices;
    live.cohort_size = data.cohort_size || live.cohort_size;
    renderLive();
    refreshLive();
  } else if (event === "committed" || event === "aborted") {
    live = null;
    renderLive();
    refreshRounds();
    refreshOverview();
  } else if (event === "federation" || event === "devices") {
    refreshOverview();
  }
}

async function watch() {
  if (watching) watching.abort();
  const controller = new AbortController();
  watching = controller;
  while (token && !controller.signal.aborted) {
    try {
      const r = await fetch("/v1/events", { headers: { Authorization: "Bearer " + token }, signal: controller.signal });
      if (!r.ok) throw new Error("event stream: HTTP " + r.status);
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let i;
        while ((i = buffer.indexOf("\n\n")) >= 0) {
          onFrame(buffer.slice(0, i));
          buffer = buffer.slice(i + 2);
        }
      }
    } catch (e) {
      if (controller.signal.aborted) return;
    }
    await sleep(2000);
  }
}

// ---------------------------------------------------------------- actions

async function act(path, what) {
  try {
    const r = await api(path, { method: "POST", headers: { "content-type": "application/json" },
                                body: JSON.stringify({ reason: "dashboard" }) });
    say(what + (r.changed ? " done" : ": nothing to change"));
    refreshOverview();
  } catch (e) { say(what + " refused: " + e.message); }
}

async function topK(ev) {
  ev.preventDefault();
  const user = $("topk-user").value.trim(), device = $("topk-device").value.trim();
  const k = $("topk-k").value || "10", exclude = $("topk-exclude").checked;
  if (!user && !device) { say("give a user handle or a device id"); return; }
  const base = user ? "/v1/users/" + encodeURIComponent(user) : "/v1/devices/" + encodeURIComponent(device);
  const body = $("topk-results").querySelector("tbody");
  body.replaceChildren();
  $("topk-meta").textContent = "asking the device…";
  try {
    const r = await api(base + "/recommendations?k=" + encodeURIComponent(k) + "&exclude_seen=" + exclude);
    for (const item of r.items) {
      const tr = el("tr");
      tr.appendChild(el("td", item.rank));
      tr.appendChild(el("td", item.item_id));
      tr.appendChild(el("td", item.title || ""));
      body.appendChild(tr);
    }
    // the device decides whether seen items are left out; say what it did, and when it overrode the box
    const seen = r.seen_excluded ? (exclude ? "seen items left out" : "seen items left out by the device's policy")
                                 : "seen items included";
    $("topk-meta").textContent = "computed on device " + r.device_id + " (user " + r.user + ") with model v" +
      r.model_version + " in " + r.latency_ms.toFixed(1) + " ms; " + seen + "; recommendation " + r.recommendation_id;
    say("");
  } catch (e) {
    $("topk-meta").textContent = "";
    say("top-k: " + e.message + (e.status ? " (HTTP " + e.status + ")" : ""));
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("token-form").addEventListener("submit", (ev) => { ev.preventDefault(); signIn($("token-input").value.trim()); });
  $("signout").addEventListener("click", () => signOut());
  $("pause-btn").addEventListener("click", () => act("/v1/federation/pause", "pause"));
  $("resume-btn").addEventListener("click", () => act("/v1/federation/resume", "resume"));
  $("topk-form").addEventListener("submit", topK);
  renderLive();
  if (token) signIn(token);
});
