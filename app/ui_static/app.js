// Arena dashboard: polls the JSON API (app/ui.py) and redraws. No framework, no build step.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

// The write token of this `arena ui` start (app/ui.py puts it in the page); every POST sends it.
const TOKEN = (document.querySelector('meta[name="arena-token"]') || {}).content || "";

async function api(path, body) {
  const init = body === undefined ? {} : {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-Arena-Token": TOKEN },
    body: JSON.stringify(body),
  };
  const resp = await fetch(path, init);
  let data = null;
  try { data = await resp.json(); } catch (e) { data = { error: `${resp.status} ${resp.statusText}` }; }
  if (!resp.ok) throw new Error((data && data.error) || `${resp.status} ${resp.statusText}`);
  return data;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "className") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

const fmtRate = (r) => (r === null || r === undefined ? "–" : r.toFixed(r < 10 ? 1 : 0));
const fmtNum = (n) => (n === null || n === undefined ? "–" : String(n));

function setStatus(text, bad) {
  const s = $("status");
  s.textContent = text;
  s.classList.toggle("bad", !!bad);
}

// Poll fn every periodMs, after the previous call finished (never piling up requests).
function every(periodMs, fn) {
  const tick = async () => {
    try { await fn(); } catch (e) { console.error(e); }
    setTimeout(tick, periodMs);
  };
  tick();
}

// --- stage graph -----------------------------------------------------------------------------

// Top to bottom, one row per depth: the graph is at most four topics wide, so it fits the panel's
// width; it scrolls inside the panel only when the panel is narrower than its narrowest layout.
const G = { boxW: 168, boxH: 34, rowH: 92, pad: 12, gap: 28 };
let lastView = null;

// Node centres: rows by depth; in each row, nodes near the mean centre of what feeds them, kept apart.
function layout(view, width) {
  const rows = new Map();
  for (const n of view.nodes) {
    if (!rows.has(n.depth)) rows.set(n.depth, []);
    rows.get(n.depth).push(n);
  }
  const feeds = new Map();
  for (const e of view.edges) {
    if (!feeds.has(e.target)) feeds.set(e.target, []);
    feeds.get(e.target).push(e.source);
  }
  const widest = Math.max(...[...rows.values()].map((r) => r.length), 1);
  const W = Math.max(width, G.pad * 2 + widest * (G.boxW + G.gap) - G.gap);
  const step = G.boxW + G.gap, lo = G.pad + G.boxW / 2, hi = W - G.pad - G.boxW / 2;
  const pos = new Map();
  const depths = [...rows.keys()].sort((a, b) => a - b);
  for (const depth of depths) {
    const nodes = rows.get(depth);
    const want = new Map(nodes.map((n, i) => {
      const ups = (feeds.get(n.id) || []).filter((s) => pos.has(s)).map((s) => pos.get(s).cx);
      const spread = lo + ((hi - lo) * (i + 0.5)) / nodes.length;
      return [n.id, ups.length ? ups.reduce((a, b) => a + b, 0) / ups.length : spread];
    }));
    nodes.sort((a, b) => want.get(a.id) - want.get(b.id) || a.id.localeCompare(b.id));
    const xs = nodes.map((n) => want.get(n.id));
    for (let i = 0; i < xs.length; i++) xs[i] = Math.max(xs[i], i ? xs[i - 1] + step : lo);
    for (let i = xs.length - 1; i >= 0; i--) xs[i] = Math.min(xs[i], i < xs.length - 1 ? xs[i + 1] - step : hi);
    nodes.forEach((n, i) => pos.set(n.id, { cx: xs[i], y: G.pad + depth * G.rowH }));
  }
  const height = G.pad * 2 + (Math.max(...depths, 0) + 1) * G.rowH - (G.rowH - G.boxH);
  return { pos, width: W, height };
}

const overlaps = (a, b) => a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;

function bezier(p, t) {
  const u = 1 - t;
  return {
    x: u * u * u * p[0].x + 3 * u * u * t * p[1].x + 3 * u * t * t * p[2].x + t * t * t * p[3].x,
    y: u * u * u * p[0].y + 3 * u * u * t * p[1].y + 3 * u * t * t * p[2].y + t * t * t * p[3].y,
  };
}

// A spot for a label of size w x h near its edge that overlaps no box and no label placed before.
function placeLabel(curve, w, h, taken, width) {
  const spots = [];
  for (const t of [0.5, 0.4, 0.6, 0.3, 0.7, 0.22, 0.78]) spots.push({ t, dx: 0, dy: 0 });
  for (let k = 1; k <= 40; k++) {
    for (const dx of [k * 12, -k * 12]) spots.push({ t: 0.5, dx, dy: 0 });
    for (const dy of [k * 7, -k * 7]) spots.push({ t: 0.5, dx: 0, dy });
  }
  for (const s of spots) {
    const c = bezier(curve, s.t);
    const box = { x: c.x + s.dx - w / 2, y: c.y + s.dy - h / 2, w, h };
    if (box.x >= 0 && box.x + w <= width && !taken.some((o) => overlaps(box, o))) return box;
  }
  const c = bezier(curve, 0.5);
  return { x: c.x - w / 2, y: c.y - h / 2, w, h }; // nowhere free: the edge's middle
}

function labelText(e) {
  if (e.idle) return "idle";
  const lag = e.pending_capped ? `≥${e.lag}` : fmtNum(e.lag);
  return `lag ${lag} · ${fmtRate(e.throughput)}/s`;
}

function nodeText(n) {
  if (n.kind === "sink") return n.idle ? "sink · idle" : "sink";
  const records = n.records === null ? "–" : `${n.records_complete ? "" : "≥"}${n.records}`;
  return n.idle ? `idle · ${records} records` : `${records} records · ${fmtRate(n.rate)}/s`;
}

function drawGraph(view) {
  lastView = view;
  const root = $("graph-svg");
  const { pos, width, height } = layout(view, root.parentElement.clientWidth);
  root.replaceChildren();
  root.setAttribute("width", width);
  root.setAttribute("height", height);
  root.setAttribute("viewBox", `0 0 ${width} ${height}`);
  // Edges leave a box's bottom and enter the next box's top spread out, in the order of their far end.
  const outs = new Map(), ins = new Map();
  for (const e of view.edges) {
    if (!pos.has(e.source) || !pos.has(e.target)) continue;
    if (!outs.has(e.source)) outs.set(e.source, []);
    if (!ins.has(e.target)) ins.set(e.target, []);
    outs.get(e.source).push(e);
    ins.get(e.target).push(e);
  }
  const port = (list, e, far) => {
    const sorted = [...list].sort((a, b) => pos.get(far(a)).cx - pos.get(far(b)).cx);
    return (sorted.indexOf(e) + 1) / (sorted.length + 1);
  };
  const taken = view.nodes.filter((n) => pos.has(n.id)).map((n) => {
    const p = pos.get(n.id);
    return { x: p.cx - G.boxW / 2, y: p.y, w: G.boxW, h: G.boxH };
  });
  const labels = [];
  for (const e of view.edges) {
    const a = pos.get(e.source), b = pos.get(e.target);
    if (!a || !b) continue;
    const x1 = a.cx - G.boxW / 2 + G.boxW * port(outs.get(e.source), e, (x) => x.target);
    const x2 = b.cx - G.boxW / 2 + G.boxW * port(ins.get(e.target), e, (x) => x.source);
    const y1 = a.y + G.boxH, y2 = b.y, my = (y1 + y2) / 2;
    const curve = [{ x: x1, y: y1 }, { x: x1, y: my }, { x: x2, y: my }, { x: x2, y: y2 }];
    const state = e.idle ? " idle" : ((e.lag || 0) > 0 ? " lagging" : "");
    root.append(svg("path", {
      d: `M${x1},${y1} C${x1},${my} ${x2},${my} ${x2},${y2}`, class: `edge${state}`, "data-edge": e.id,
    }));
    const text = svg("text", {
      "text-anchor": "middle", "dominant-baseline": "central", class: `edge-label${state}`,
      "data-testid": "edge-label", "data-edge": e.id,
    }, labelText(e));
    root.append(text);
    labels.push({ text, curve });
  }
  const backs = [];
  for (const { text, curve } of labels) {
    const size = text.getBBox();
    const box = placeLabel(curve, size.width + 6, size.height + 2, taken, width);
    taken.push(box);
    text.setAttribute("x", box.x + box.w / 2);
    text.setAttribute("y", box.y + box.h / 2);
    // a backing so the edge it sits on does not run through the text
    backs.push(svg("rect", { x: box.x, y: box.y, width: box.w, height: box.h, rx: 3, class: "edge-label-bg" }));
  }
  for (const n of view.nodes) {
    const p = pos.get(n.id);
    const g = svg("g", {
      class: `node ${n.kind}${n.idle ? " idle" : ""}`, "data-node": n.id,
      transform: `translate(${p.cx - G.boxW / 2},${p.y})`,
    });
    g.append(svg("rect", { width: G.boxW, height: G.boxH, rx: 4 }));
    g.append(svg("text", { x: 6, y: 14 }, n.id));
    g.append(svg("text", { x: 6, y: 28, class: "node-sub", "data-testid": "node-sub" }, nodeText(n)));
    root.append(g);
  }
  // Labels drawn last stay readable where an edge runs under them.
  root.append(...backs);
  for (const { text } of labels) root.append(text);
}

// Lag and pending are one count (data records still to read); an idle group (never ran) says so instead.
function lagCells(row) {
  const count = row.lag === null || row.lag === undefined ? "–"
    : (row.pending_capped ? `≥${row.lag}` : String(row.lag));
  const shown = row.idle ? "idle" : count;
  return [
    el("td", { className: "num lag", "data-col": "lag" }, shown),
    el("td", { className: "num", "data-col": "pending" }, shown),
    el("td", { className: "num", "data-col": "offset-lag" }, fmtNum(row.offset_lag)),
    el("td", { className: "num", "data-col": "throughput" }, fmtRate(row.throughput)),
  ];
}

const rowState = (row) => (row.idle ? "idle" : ((row.lag || 0) > 0 ? "lagging" : ""));

function drawEdges(view) {
  const body = $("edges").tBodies[0];
  body.replaceChildren(...view.edges.map((e) => el("tr", {
    "data-edge": e.id, "data-testid": "edge-row", className: rowState(e),
  }, el("td", {}, e.worker), el("td", {}, e.group), el("td", {}, e.source), el("td", {}, e.target), ...lagCells(e))));
}

function drawGroups(view) {
  const body = $("groups").tBodies[0];
  body.replaceChildren(...view.groups.map((g) => el("tr", {
    "data-group": g.group, "data-topic": g.topic, "data-testid": "group-row", className: rowState(g),
  }, el("td", {}, g.group), el("td", {}, g.topic), el("td", {}, g.worker || ""),
  el("td", { className: "num", "data-col": "committed" }, fmtNum(g.committed)),
  el("td", { className: "num", "data-col": "end" }, fmtNum(g.end)), ...lagCells(g))));
}

async function refreshGraph() {
  try {
    const view = await api("/api/graph");
    drawGraph(view);
    drawEdges(view);
    drawGroups(view);
    const t = new Date(view.sampled_at);
    setStatus(`lag sampled ${t.toLocaleTimeString()}`, false);
  } catch (e) {
    setStatus(`graph: ${e.message}`, true);
  }
}

// --- stage ledger ----------------------------------------------------------------------------

// "gate 3, other 1" from {gate: 3, other: 1}, largest first.
function breakdown(counts, prefix) {
  return Object.entries(counts || {}).sort((a, b) => b[1] - a[1]).map(([k, n]) => `${prefix}${k} ${n}`);
}

function stageRow(s) {
  const accounted = s.produced + s.rejected + s.dead_lettered + s.in_flight;
  const why = [...breakdown(s.rejected_by_gate, ""), ...breakdown(s.dead_lettered_by_kind, "dlq:")].join(", ");
  const verdict = s.balanced ? (s.ran || !s.in ? "yes" : "idle: never ran")
    : `NO: ${accounted} of ${s.in} accounted for`;
  const num = (col, n) => el("td", { className: "num", "data-col": col }, fmtNum(n));
  return el("tr", {
    "data-stage": s.stage, "data-testid": "stage-row", className: s.balanced ? (s.in_flight ? "lagging" : "") : "unbalanced",
  }, el("td", {}, s.stage), el("td", {}, s.topic), num("in", s.in), num("produced", s.produced),
  num("outputs", s.outputs), num("rejected", s.rejected), num("dead-lettered", s.dead_lettered),
  num("in-flight", s.in_flight), el("td", { "data-col": "why" }, why),
  el("td", { "data-col": "balanced" }, verdict));
}

async function refreshStages() {
  try {
    const rows = await api("/api/stages");
    $("stages-table").tBodies[0].replaceChildren(...rows.map(stageRow));
    const off = rows.filter((s) => !s.balanced).map((s) => s.stage);
    $("stages-note").textContent = off.length ? `not balanced: ${off.join(", ")}` : "";
    $("stages-note").classList.toggle("error", off.length > 0);
  } catch (e) {
    $("stages-note").textContent = `stage ledger: ${e.message}`;
    $("stages-note").classList.add("error");
  }
}

// --- data versions ---------------------------------------------------------------------------

let versionRows = []; // the versions drawn last (main first)

function versionState(v) {
  if (v.state === "idle") return "idle: none of its workers ran yet";
  if (v.state === "running") return `running: ${v.pending_capped ? "≥" : ""}${v.pending} pending`;
  return v.main ? "live: nothing pending" : "drained: done";
}

function versionRow(v) {
  const overrides = [...Object.keys(v.settings || {}), ...Object.keys(v.prompts || {}).map((r) => `prompt ${r}`)];
  const created = v.created_at ? new Date(v.created_at).toLocaleString() : "";
  const num = (col, n) => el("td", { className: "num", "data-col": col }, fmtNum(n));
  const pending = v.pending_capped ? `≥${v.pending}` : String(v.pending);
  return el("tr", {
    "data-version": v.name, "data-testid": "version-row", "data-state": v.state,
    className: v.state === "running" ? "lagging" : (v.state === "idle" ? "idle" : ""),
  }, el("td", {}, v.name), el("td", {}, v.parent || ""), el("td", {}, v.stage || (v.main ? "(live)" : "")),
  el("td", { "data-col": "stages" }, v.main ? "all" : v.stages.join(", ")),
  num("records", v.records), el("td", { "data-col": "overrides", title: JSON.stringify(v.settings || {}) }, overrides.join(", ") || "–"),
  el("td", { "data-col": "config" }, v.config_hash || ""), el("td", {}, created),
  num("groups", v.groups), el("td", { className: "num lag", "data-col": "pending" }, pending),
  num("read", v.read), el("td", { "data-col": "state" }, versionState(v)));
}

// Options of a <select>, redrawn only when they changed (a redraw would drop an open menu);
// the choice is kept when still offered, else `fallback`.
function setOptions(select, values, labels, fallback) {
  const now = [...select.options].map((o) => o.value);
  if (now.join("\n") !== values.join("\n")) {
    const keep = select.value;
    select.replaceChildren(...values.map((v, i) => el("option", { value: v }, labels[i])));
    select.value = values.includes(keep) ? keep : fallback;
  }
}

function drawDiffChoices() {
  const names = versionRows.map((v) => v.name);
  if (!names.length) return;
  const newest = names[names.length - 1];
  setOptions($("diff-a"), names, names, "main");
  setOptions($("diff-b"), names, names, newest);
  // The stages a comparison covers: those the non-main side(s) ran, every stage when both are main.
  const picked = [$("diff-a").value, $("diff-b").value].map((n) => versionRows.find((v) => v.name === n)).filter(Boolean);
  const replays = picked.filter((v) => !v.main);
  const stages = [...new Set((replays.length ? replays : picked).flatMap((v) => v.stages))];
  setOptions($("diff-stage"), ["", ...stages], ["all it ran", ...stages], "");
}

async function refreshVersions() {
  try {
    versionRows = await api("/api/versions");
  } catch (e) {
    $("versions-note").textContent = `versions: ${e.message}`;
    $("versions-note").classList.add("error");
    return;
  }
  $("versions-table").tBodies[0].replaceChildren(...versionRows.map(versionRow));
  const replays = versionRows.filter((v) => !v.main);
  const running = replays.filter((v) => v.state === "running").map((v) => v.name);
  $("versions-note").classList.remove("error");
  $("versions-note").textContent = !replays.length
    ? "no data versions yet: `arena replay STAGE --as NAME` makes one"
    : `${replays.length} data version(s)` + (running.length ? `; replaying: ${running.join(", ")}` : "");
  drawDiffChoices();
}

function fmtInterval(i) {
  if (!i || i.mean === null || i.mean === undefined) return "–";
  if (i.low === null || i.high === null) return `${i.mean.toFixed(3)} (n=${i.n})`;
  return `${i.mean.toFixed(3)} [${i.low.toFixed(3)}, ${i.high.toFixed(3)}] (n=${i.n})`;
}

// The figures of one stage, A and B side by side (the rows `arena diff` prints).
function diffFigures(d, s) {
  const rows = [
    ["records in", s.a.records_in, s.b.records_in],
    ["produced", s.a.produced, s.b.produced],
    ["rejected", s.a.rejected, s.b.rejected],
    ["dead-lettered", s.a.dead_lettered, s.b.dead_lettered],
    ["outputs", s.a.outputs, s.b.outputs],
  ];
  const keys = (x, y) => [...new Set([...Object.keys(x || {}), ...Object.keys(y || {})])].sort();
  for (const g of keys(s.a.rejections_by_gate, s.b.rejections_by_gate)) {
    rows.push([`  rejected: ${g}`, s.a.rejections_by_gate[g] || 0, s.b.rejections_by_gate[g] || 0]);
  }
  for (const k of keys(s.a.dead_letters_by_kind, s.b.dead_letters_by_kind)) {
    rows.push([`  dead letters: ${k}`, s.a.dead_letters_by_kind[k] || 0, s.b.dead_letters_by_kind[k] || 0]);
  }
  for (const name of keys(s.a.scores, s.b.scores)) {
    rows.push([`score ${name}`, fmtInterval(s.a.scores[name]), fmtInterval(s.b.scores[name])]);
  }
  rows.push(
    ["LLM calls", s.a.llm_calls, s.b.llm_calls],
    ["LLM requests", s.a.llm_requests, s.b.llm_requests],
    ["LLM tokens", s.a.llm_tokens, s.b.llm_tokens],
    ["calls / output", s.a.calls_per_output, s.b.calls_per_output],
    ["tokens / output", s.a.tokens_per_output, s.b.tokens_per_output],
  );
  return el("table", { className: "diff", "data-testid": "diff-figures" },
    el("thead", {}, el("tr", {}, el("th", {}, ""), el("th", { className: "num" }, d.a), el("th", { className: "num" }, d.b))),
    el("tbody", {}, ...rows.map(([label, x, y]) => el("tr", {
      "data-row": label.trim(), className: fmtNum(x) !== fmtNum(y) ? "changed" : "",
    }, el("td", { className: label.startsWith(" ") ? "sub" : "" }, label.trim()),
    el("td", { className: "num", "data-side": "a" }, fmtNum(x)), el("td", { className: "num", "data-side": "b" }, fmtNum(y))))));
}

function diffExamples(d, s) {
  if (!s.examples.length) return el("p", { className: "note" }, "no upstream record whose outputs changed");
  const outs = (list) => el("td", {}, ...(list.length ? list.map((t) => el("div", { className: "output" }, t)) : ["–"]));
  return el("table", { className: "examples", "data-testid": "diff-examples" },
    el("thead", {}, el("tr", {}, el("th", {}, "changed: upstream record"), el("th", {}, d.a), el("th", {}, d.b))),
    el("tbody", {}, ...s.examples.map((x) => el("tr", { "data-root": x.root, "data-testid": "diff-example" },
      el("td", {}, x.root), outs(x.a), outs(x.b)))));
}

function diffStage(d, s) {
  return el("div", { className: "diff-stage", "data-stage": s.stage, "data-testid": "diff-stage" },
    el("h4", {}, `${s.stage}: ${d.a} vs ${d.b}`),
    diffFigures(d, s),
    el("p", { className: "note", "data-testid": "diff-match" },
      `upstream records: ${s.only_a} only in ${d.a}, ${s.only_b} only in ${d.b}, ${s.both} in both `
      + `(${s.identical} with identical outputs)`),
    diffExamples(d, s));
}

async function runDiff(ev) {
  ev.preventDefault();
  const out = $("diff-out");
  const q = new URLSearchParams({ a: $("diff-a").value, b: $("diff-b").value });
  if ($("diff-stage").value) q.set("stage", $("diff-stage").value);
  $("diff-error").textContent = "";
  $("diff-meta").textContent = "comparing…";
  out.replaceChildren();
  try {
    const d = await api(`/api/diff?${q}`);
    $("diff-meta").textContent = d.stages.length ? `${d.stages.length} stage(s)`
      : "nothing to compare: neither version has stage ledger entries in the lake yet";
    out.replaceChildren(...d.stages.map((s) => diffStage(d, s)));
  } catch (e) {
    $("diff-meta").textContent = "";
    $("diff-error").textContent = e.message;
  }
}

// --- dead letters ----------------------------------------------------------------------------

function dlqFilter() {
  const q = new URLSearchParams();
  if ($("dlq-topic").value.trim()) q.set("topic", $("dlq-topic").value.trim());
  if ($("dlq-reason").value.trim()) q.set("reason", $("dlq-reason").value.trim());
  return q.toString();
}

const dlqSelected = new Set(); // keys of the letters ticked, kept across refreshes
const dlqNotes = new Map(); // letter key -> { text, bad }: the result of the replay clicked in its row
let dlqRows = []; // the letters drawn last

function replaySummary(r) {
  const parts = [`replayed ${r.replayed}`];
  if (r.skipped_already_replayed) {
    parts.push(`${r.skipped_already_replayed} replayed before` + (r.failed_again ? ` (${r.failed_again} failed again)` : ""));
  }
  if (r.in_progress) parts.push(`${r.in_progress} in progress elsewhere`);
  if (r.failed.length) parts.push(`failed ${r.failed.length}: ${r.failed.map((f) => f.reason).join("; ")}`);
  return parts.join(", ");
}

// Replay exactly these letters. Those whose failure was replayed before go in a forced request
// (the "replay again" button), the others in a plain one: a letter someone else replayed since
// the page was drawn is then not sent twice.
async function replayLetters(rows) {
  const total = { replayed: 0, skipped_already_replayed: 0, failed_again: 0, in_progress: 0, failed: [] };
  for (const force of [false, true]) {
    const keys = [...new Set(rows.filter((d) => d.needs_force === force).map((d) => d.key))];
    if (!keys.length) continue;
    const r = await api("/api/dlq/replay", { keys, force });
    for (const k of ["replayed", "skipped_already_replayed", "failed_again", "in_progress"]) total[k] += r[k];
    total.failed.push(...r.failed);
  }
  return total;
}

async function replayRow(d) {
  dlqNotes.set(d.key, { text: "replaying…", bad: false });
  drawDlq();
  try {
    const r = await replayLetters([d]);
    dlqNotes.set(d.key, { text: replaySummary(r), bad: r.failed.length > 0 });
  } catch (e) {
    dlqNotes.set(d.key, { text: `replay failed: ${e.message}`, bad: true });
  }
  await refreshDlq();
}

async function replaySelected() {
  const rows = dlqRows.filter((d) => dlqSelected.has(d.key));
  const out = $("dlq-result");
  out.textContent = `replaying ${rows.length} letter(s)…`;
  out.className = "note";
  try {
    const r = await replayLetters(rows);
    out.textContent = `${rows.length} selected: ${replaySummary(r)}`;
    out.className = r.failed.length ? "error" : "note";
    dlqSelected.clear();
  } catch (e) {
    out.textContent = `replay failed: ${e.message}`;
    out.className = "error";
  }
  await refreshDlq();
}

function drawSelection() {
  const n = dlqRows.filter((d) => dlqSelected.has(d.key)).length;
  $("dlq-replay-selected").disabled = n === 0;
  $("dlq-replay-selected").textContent = n ? `Replay selected (${n})` : "Replay selected";
  $("dlq-all").checked = n > 0 && n === dlqRows.length;
}

function dlqRow(d) {
  const pick = el("input", { type: "checkbox", "data-testid": "select", "aria-label": `select ${d.key}` });
  pick.checked = dlqSelected.has(d.key);
  pick.addEventListener("change", () => {
    if (pick.checked) dlqSelected.add(d.key); else dlqSelected.delete(d.key);
    drawDlq();
  });
  const button = el("button", { type: "button", "data-testid": "replay" }, d.needs_force ? "replay again" : "replay");
  button.addEventListener("click", () => replayRow(d));
  const note = dlqNotes.get(d.key);
  return el("tr", {
    "data-testid": "dlq-row", "data-key": d.key, "data-dlq-topic": d.dlq_topic, "data-offset": d.offset,
    "data-replayed": d.replayed ? "yes" : "no",
  }, el("td", {}, pick), el("td", {}, d.dlq_topic), el("td", {}, d.source_topic),
  el("td", { className: "num" }, fmtNum(d.partition)), el("td", { className: "num" }, fmtNum(d.offset)),
  el("td", {}, d.stage), el("td", {}, d.kind), el("td", {}, d.reason), el("td", {}, d.at),
  el("td", { "data-col": "history" }, d.history), el("td", { "data-col": "replayed" }, d.replayed ? "yes" : "no"),
  el("td", {}, button, el("div", { "data-testid": "replay-note", className: note && note.bad ? "error" : "note" },
    note ? note.text : "")));
}

function drawDlq() {
  const body = $("dlq-table").tBodies[0];
  body.replaceChildren(...dlqRows.map(dlqRow));
  if (!dlqRows.length) body.append(el("tr", {}, el("td", { colspan: 12, className: "note" }, "no dead letters")));
  drawSelection();
}

async function refreshDlq() {
  try {
    const q = dlqFilter();
    dlqRows = await api(`/api/dlq${q ? "?" + q : ""}`);
  } catch (e) {
    $("dlq-table").tBodies[0].replaceChildren(el("tr", {}, el("td", { colspan: 12, className: "error" }, e.message)));
    return;
  }
  const shown = new Set(dlqRows.map((d) => d.key));
  for (const key of [...dlqSelected]) if (!shown.has(key)) dlqSelected.delete(key);
  drawDlq();
}

// --- lake ------------------------------------------------------------------------------------

async function refreshTables() {
  const body = $("lake-tables").tBodies[0];
  try {
    const tables = await api("/api/lake/tables");
    body.replaceChildren(...tables.map((t) => {
      const link = el("a", { href: "#lake" }, t.view);
      // the live pipeline's rows: every view also holds the data versions' (its _version column)
      link.addEventListener("click", () => {
        $("sql").value = `select * from ${t.view} where _version = 'main' limit 50`;
      });
      const others = Object.entries(t.version_rows || {});
      const more = others.reduce((n, [, rows]) => n + rows, 0);
      return el("tr", { "data-view": t.view, "data-testid": "lake-table" }, el("td", {}, link),
        el("td", { className: "num", "data-col": "rows" }, t.rows,
          more ? el("span", { className: "note", "data-col": "version-rows",
            title: others.map(([v, rows]) => `${v}: ${rows}`).join(", ") }, ` +${more} in versions`) : ""),
        el("td", { className: "num" }, t.files), el("td", { className: "num" }, t.bytes));
    }));
  } catch (e) {
    body.replaceChildren(el("tr", {}, el("td", { colspan: 4, className: "error" }, e.message)));
  }
}

function showCell(v) {
  if (v === null || v === undefined) return "";
  return typeof v === "object" ? JSON.stringify(v) : String(v);
}

async function runQuery(ev) {
  ev.preventDefault();
  const table = $("query-result");
  $("query-error").textContent = "";
  $("query-meta").textContent = "running…";
  try {
    const r = await api("/api/lake/query", { sql: $("sql").value });
    table.tHead.replaceChildren(el("tr", {}, ...r.columns.map((c) => el("th", {}, c))));
    table.tBodies[0].replaceChildren(...r.rows.map((row) => el("tr", { "data-testid": "result-row" },
      ...row.map((v) => el("td", {}, showCell(v))))));
    $("query-meta").textContent = `${r.rows.length}${r.truncated ? "+" : ""} rows in ${r.elapsed_ms} ms`
      + (r.note ? ` — ${r.note}` : "");
  } catch (e) {
    table.tHead.replaceChildren();
    table.tBodies[0].replaceChildren();
    $("query-meta").textContent = "";
    $("query-error").textContent = e.message;
  }
}

// --- training curves -------------------------------------------------------------------------

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf"];

function chart(metric, runs) {
  const w = 360, h = 180, l = 46, r = 10, t = 20, b = 24;
  const pts = runs.map((run) => run.points.filter((p) => Number.isFinite(p.metrics[metric]))
    .map((p) => [p.step, p.metrics[metric]]));
  const all = pts.flat();
  const box = el("div", { className: "chart", "data-testid": "chart", "data-metric": metric });
  const s = svg("svg", { width: w, height: h, viewBox: `0 0 ${w} ${h}` });
  s.append(svg("text", { x: l, y: 13 }, metric));
  if (!all.length) { box.append(s); return box; }
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) x1 = x0 + 1;
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const X = (x) => l + ((x - x0) / (x1 - x0)) * (w - l - r);
  const Y = (y) => h - b - ((y - y0) / (y1 - y0)) * (h - t - b);
  s.append(svg("line", { x1: l, y1: h - b, x2: w - r, y2: h - b, class: "axis" }));
  s.append(svg("line", { x1: l, y1: t, x2: l, y2: h - b, class: "axis" }));
  s.append(svg("text", { x: l - 4, y: t + 4, "text-anchor": "end" }, y1.toPrecision(3)));
  s.append(svg("text", { x: l - 4, y: h - b, "text-anchor": "end" }, y0.toPrecision(3)));
  s.append(svg("text", { x: l, y: h - 6 }, `step ${x0}`));
  s.append(svg("text", { x: w - r, y: h - 6, "text-anchor": "end" }, `step ${x1}`));
  pts.forEach((series, i) => {
    if (!series.length) return;
    s.append(svg("polyline", {
      points: series.map(([x, y]) => `${X(x).toFixed(1)},${Y(y).toFixed(1)}`).join(" "),
      stroke: COLORS[i % COLORS.length], "data-run": runs[i].run_id,
    }));
  });
  box.append(s);
  return box;
}

async function refreshTraining() {
  const charts = $("charts");
  try {
    const view = await api("/api/training");
    const steps = view.runs.reduce((n, run) => n + run.points.length, 0);
    $("training-note").textContent = view.runs.length
      ? `${view.runs.length} run(s), ${steps} steps` : "no training steps published yet (`arena train`)";
    const legend = el("div", { className: "legend" }, ...view.runs.map((run, i) =>
      el("span", { style: `color:${COLORS[i % COLORS.length]}` }, `■ ${run.run_id}`)));
    charts.replaceChildren(...view.metrics.slice(0, 6).map((m) => chart(m, view.runs)));
    if (view.runs.length) charts.prepend(legend);
  } catch (e) {
    $("training-note").textContent = e.message;
  }
}

// --- trace -----------------------------------------------------------------------------------

function edgeTable(title, edges, nodes) {
  const topic = (id) => (nodes[id] && nodes[id].topic) || "?";
  return el("div", {},
    el("h3", {}, `${title} (${edges.length})`),
    el("table", { "data-testid": `trace-${title}` },
      el("thead", {}, el("tr", {}, ...["parent", "topic", "→ child", "topic", "stage", "backend", "prompts", "at"]
        .map((h) => el("th", {}, h)))),
      el("tbody", {}, ...edges.map((e) => el("tr", {},
        el("td", {}, e.parent), el("td", {}, topic(e.parent)), el("td", {}, e.child), el("td", {}, topic(e.child)),
        el("td", {}, `${e.stage} ${e.stage_version}`), el("td", {}, [e.backend, e.model].filter(Boolean).join(" ")),
        el("td", {}, e.prompts.map((p) => `${p.role}=${p.id}`).join(", ")), el("td", {}, e.at || ""))))));
}

async function runTrace(ev) {
  ev.preventDefault();
  const id = $("trace-id").value.trim();
  const out = $("trace-out");
  $("trace-error").textContent = "";
  out.replaceChildren();
  if (!id) return;
  try {
    const r = await api(`/api/trace/${encodeURIComponent(id)}`);
    const rec = r.record;
    out.append(
      el("p", { "data-testid": "trace-record" }, `${rec.id} (${rec.kind}${rec.topic ? ", " + rec.topic : ""})`
        + (r.truncated ? " — cut at depth" : "")),
      el("p", { className: "note" }, `sources: ${r.sources.join(", ") || "none"}; samples: ${r.samples.join(", ") || "none"}; `
        + `training steps: ${r.training_steps.join(", ") || "none"}`),
      edgeTable("ancestors", r.ancestors, r.nodes),
      edgeTable("descendants", r.descendants, r.nodes),
      el("details", {}, el("summary", {}, "JSON"), el("pre", {}, JSON.stringify(r, null, 2))));
  } catch (e) {
    $("trace-error").textContent = e.message;
  }
}

// The sticky header must not cover a section's title when a link scrolls to it.
function fitHeader() {
  document.documentElement.style.scrollPaddingTop = `${$("top").offsetHeight + 8}px`;
}

document.addEventListener("DOMContentLoaded", () => {
  fitHeader();
  window.addEventListener("resize", () => {
    fitHeader();
    if (lastView) drawGraph(lastView);
  });
  $("query-form").addEventListener("submit", runQuery);
  $("trace-form").addEventListener("submit", runTrace);
  $("diff-form").addEventListener("submit", runDiff);
  for (const id of ["diff-a", "diff-b"]) $(id).addEventListener("change", drawDiffChoices);
  $("dlq-filter").addEventListener("submit", (ev) => { ev.preventDefault(); refreshDlq(); });
  $("dlq-replay-selected").addEventListener("click", replaySelected);
  $("dlq-all").addEventListener("change", () => {
    for (const d of dlqRows) if ($("dlq-all").checked) dlqSelected.add(d.key); else dlqSelected.delete(d.key);
    drawDlq();
  });
  every(1000, refreshGraph);
  every(5000, refreshStages);
  every(5000, refreshVersions);
  every(3000, refreshDlq);
  every(10000, refreshTables);
  every(3000, refreshTraining);
});
