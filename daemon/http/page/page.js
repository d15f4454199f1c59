// ckptd's cache page: polls the daemon's read-only /cache/* JSON and draws it. No
// framework, no build step; every piece of data goes in through textContent.
"use strict";

const TIERS = ["device", "host", "disk", "remote"];
const COLOR = Object.fromEntries(TIERS.map(t => [t, `var(--${t})`]));
const EVERY = { tiers: 5000, requests: 700, misses: 2000, tree: 10000, pinned: 15000 };
const state = { key: sessionStorage.getItem("ckptd-key") || "", asking: false };

// Small helpers
function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "style") el.style.cssText = v;
    else if (k === "class") el.className = v;
    else if (k.startsWith("data-")) el.setAttribute(k, String(v));
    else el[k] = v;
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}
const $ = id => document.getElementById(id);
const fill = (id, ...kids) => $(id).replaceChildren(...kids.flat().filter(k => k !== null && k !== undefined));
const num = n => (n === null || n === undefined) ? "–" : Math.round(n).toLocaleString("en-US");
function bytes(n) {
  if (!n) return "0 B";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  const i = Math.min(u.length - 1, Math.floor(Math.log(n) / Math.log(1024)));
  return `${(n / 1024 ** i).toFixed(i ? (n / 1024 ** i < 10 ? 2 : 1) : 0)} ${u[i]}`;
}
function dur(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${Math.round(s % 60)}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor(s % 3600 / 60)}m`;
}
const ago = t => dur(Math.max(0, Date.now() / 1000 - t)) + " ago";
const pct = x => `${(100 * x).toFixed(x < 0.1 ? 1 : 0)}%`;
const svg = (tag, attrs) => {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
};
function tierBar(counts, total, cls) {
  const bar = h("div", { class: "bar " + (cls || "") });
  for (const t of TIERS) {
    if (counts[t]) bar.append(h("i", { style: `width:${100 * counts[t] / total}%;background:${COLOR[t]}`,
      title: `${t}: ${num(counts[t])}` }));
  }
  return bar;
}

// One thin bar per tier: the share of a branch's entries each tier holds (an entry is
// often in several at once: its page on the device, a copy in RAM, one on disk).
function tierRows(counts, total) {
  const held = TIERS.filter(t => counts[t]);
  return h("div", { class: "tier-rows", title: held.map(t => `${t}: ${num(counts[t])} of ${num(total)}`).join(" · ") },
    ["device", "host", "disk"].map(t => h("div", {},
      h("i", { style: `width:${100 * (counts[t] || 0) / Math.max(1, total)}%;background:${COLOR[t]}` }))));
}

// Fetching
async function get(path) {
  const headers = state.key ? { Authorization: `Bearer ${state.key}` } : {};
  const r = await fetch(path, { headers, cache: "no-store" });
  if (r.status === 401) { askKey(); throw new Error("a key is needed"); }
  const body = await r.json().catch(() => ({}));
  if (!r.ok) {
    const msg = (body.error && body.error.message) || r.statusText;
    banner(r.status === 403 ? `The cache views are turned off on this daemon: ${msg}` :
      r.status === 503 ? `The daemon is not ready: ${msg}` : `${path}: ${r.status} ${msg}`);
    throw new Error(msg);
  }
  return body;
}
function banner(text) {
  const b = $("banner");
  b.textContent = text || "";
  b.classList.toggle("show", Boolean(text));
  $("status").classList.toggle("off", Boolean(text));
}
function askKey() {
  if (state.asking) return;
  state.asking = true;
  $("key-input").value = "";
  $("key-dialog").showModal();
}
$("key-form").addEventListener("submit", ev => {
  ev.preventDefault();
  state.key = $("key-input").value.trim();
  sessionStorage.setItem("ckptd-key", state.key);
  state.asking = false;
  $("key-dialog").close();
  for (const name of Object.keys(EVERY)) poll(name, true);
});
$("key-cancel").addEventListener("click", () => { state.asking = false; $("key-dialog").close(); });
$("key-button").addEventListener("click", askKey);

// Tiers and their history
function drawTiers(d) {
  const s = d.server, now = d.now;
  fill("server",
    h("span", {}, h("i", { class: "dot", id: "status" }), h("b", {}, s.model)),
    h("span", {}, "weights ", h("b", { class: "mono" }, s.fingerprint)),
    h("span", {}, s.hybrid ? "hybrid" : "attention", " · block ", h("b", {}, s.block_size)),
    h("span", {}, "up ", h("b", {}, dur(s.uptime_s))),
    s.sleeping ? h("span", { class: "pill" }, "asleep") : null);
  banner("");
  const restored = now.cached_by_tier, all = Object.values(restored).reduce((a, b) => a + b, 0);
  fill("tiers", TIERS.filter(t => now.tiers[t]).map(t => {
    const x = now.tiers[t];
    if (t === "remote") {
      return h("div", { class: "panel tier", style: `--c:${COLOR[t]}`, "data-tier": t,
        "data-bytes": x.bytes_down },
      h("div", { class: "name" }, "remote", h("em", {}, s.remote || "")),
      h("div", { class: "big" }, bytes(x.bytes_down), h("small", {}, " read")),
      h("div", { class: "bar" }), h("div", { class: "kv" }, "uploaded", h("b", {}, bytes(x.bytes_up)),
        "restored tokens", h("b", {}, num(restored.remote || 0))));
    }
    const share = x.budget ? x.bytes / x.budget : 0;
    return h("div", { class: "panel tier", style: `--c:${COLOR[t]}`, "data-tier": t,
      "data-bytes": x.bytes, "data-entries": x.entries },
    h("div", { class: "name" }, t, h("em", {}, { device: "KV pages", host: "RAM", disk: "LMDB · zstd" }[t])),
    h("div", { class: "big" }, h("span", { class: "bytes" }, bytes(x.bytes)),
      h("small", {}, ` of ${bytes(x.budget)}`)),
    h("div", { class: "bar" }, h("i", { style: `width:${Math.min(100, 100 * share)}%;background:${COLOR[t]}` })),
    h("div", { class: "kv" },
      t === "device" ? "prefix pages" : "entries", h("b", { class: "entries" }, num(x.entries)),
      "restored tokens", h("b", {}, num(restored[t] || 0)),
      "share of restores", h("b", {}, all ? pct((restored[t] || 0) / all) : "–")));
  }));
  const total = now.prompt_tokens;
  $("hit-rate").textContent = total ? pct(now.cached_tokens / total) : "";
  drawHistory([...d.history, now], now);
}

function drawHistory(points, now) {
  const tiers = TIERS.filter(t => t === "remote" ? now.tiers.remote : true);
  // hit rate of each interval, stacked by tier
  const rates = [];
  for (let i = 1; i < points.length; i++) {
    const a = points[i - 1], b = points[i], dp = b.prompt_tokens - a.prompt_tokens;
    const row = { t: b.t };
    for (const t of tiers) row[t] = dp > 0 ? ((b.cached_by_tier[t] || 0) - (a.cached_by_tier[t] || 0)) / dp : 0;
    row.idle = dp <= 0;
    rates.push(row);
  }
  fill("hit-chart", chart(rates, tiers, { bars: true, top: 1, label: v => `${Math.round(100 * v)}%` }));
  fill("hit-legend", tiers.map(t => h("span", {}, h("i", { style: `background:${COLOR[t]}` }), t)),
    h("span", {}, `${points.length} samples`));
  const local = tiers.filter(t => t !== "remote");
  const held = points.map(p => Object.fromEntries([["t", p.t], ...local.map(t => [t, p.tiers[t].bytes])]));
  const most = Math.max(1, ...held.flatMap(r => local.map(t => r[t])));
  fill("bytes-chart", chart(held, local, { top: niceTop(most), label: bytes }));
  fill("bytes-legend", local.map(t => h("span", {}, h("i", { style: `background:${COLOR[t]}` }),
    `${t} ${bytes(now.tiers[t].bytes)}`)));
}

function niceTop(x) {
  const p = 1024 ** Math.floor(Math.log(x) / Math.log(1024)), m = x / p;
  return p * ([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024].find(s => s >= m) || 1024);
}

// Bars (each interval's stacked shares: a rate belongs to an interval, not a point) or
// lines (what a tier held at each sample), over time, with a 0 / half / top axis.
function chart(rows, keys, opt) {
  const W = 600, H = 170, L = 52, B = 18, top = 8;
  const box = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none" });
  const Y = v => top + (H - B - top) * (1 - Math.max(0, Math.min(1, v / opt.top)));
  for (const f of [0, 0.5, 1]) {
    const y = Y(f * opt.top);
    box.append(svg("line", { x1: L, x2: W, y1: y, y2: y, stroke: "#232a34", "stroke-width": 1 }));
    const label = svg("text", { x: L - 6, y: y + 4, fill: "#5b6573", "font-size": 10, "text-anchor": "end" });
    label.textContent = opt.label(f * opt.top);
    box.append(label);
  }
  if (!rows.length) return box;
  const t0 = opt.bars ? rows[0].t - 5 : rows[0].t, t1 = rows[rows.length - 1].t;
  const span = Math.max(1, t1 - t0);
  const X = t => L + (W - L - 4) * (t - t0) / span;
  if (opt.bars) {
    rows.forEach((r, i) => {
      const x1 = X(r.t), x0 = i ? X(rows[i - 1].t) : X(t0);
      let base = 0;
      for (const k of keys) {
        if (r[k] <= 0) continue;
        box.append(svg("rect", { x: x0 + 0.5, width: Math.max(0.5, x1 - x0 - 1), y: Y(base + r[k]),
          height: Y(base) - Y(base + r[k]), fill: COLOR[k], opacity: 0.9 }));
        base += r[k];
      }
    });
  } else {
    for (const k of keys) {
      box.append(svg("polyline", { points: rows.map(r => `${X(r.t)},${Y(r[k])}`).join(" "),
        fill: "none", stroke: COLOR[k], "stroke-width": 2, "vector-effect": "non-scaling-stroke" }));
    }
  }
  const note = svg("text", { x: W - 4, y: H - 4, fill: "#5b6573", "font-size": 10, "text-anchor": "end" });
  note.textContent = `last ${dur(span)}`;
  box.append(note);
  return box;
}

// Live requests
function drawRequests(d) {
  EVERY.requests = d.running.length || d.waiting ? 700 : 2500;    // quick only while busy
  $("waiting").textContent = `${d.running.length} running · ${d.waiting} waiting`;
  if (!d.running.length) return fill("live", h("div", { class: "empty" }, "No request is running."));
  fill("live", h("table", {}, h("tr", {}, h("th", {}, "#"), h("th", {}, "state"), h("th", {}, "prompt"),
    h("th", { class: "num" }, "tokens"), h("th", { class: "num" }, "rate"), h("th", { class: "num" }, "ETA"),
    h("th", {}, "cache")),
  d.running.map(r => {
    const w = x => `${100 * x / Math.max(1, r.prompt)}%`;
    const prog = h("div", { class: "progress", title: `${num(r.restored)} restored` },
      h("i", { style: `width:${w(r.restored)};background:var(--device)` }),
      h("i", { style: `width:${w(r.computed - r.restored)};background:var(--accent);opacity:.75` }),
      h("span", {}, `${pct(r.computed / Math.max(1, r.prompt))}`));
    return h("tr", { "data-request": r.id, "data-state": r.state, "data-computed": r.computed,
      "data-prompt": r.prompt },
      h("td", { class: "mono" }, `#${r.id}`), h("td", {}, h("span", { class: `pill ${r.state}` }, r.state)),
      h("td", { style: "width:40%" }, prog),
      h("td", { class: "num" }, r.state === "decode" ? `${num(r.generated)} generated` :
        `${num(r.computed)} / ${num(r.prompt)}`),
      h("td", { class: "num" }, r.tokens_per_s ? `${num(r.tokens_per_s)} tok/s` : "–"),
      h("td", { class: "num" }, r.state === "prefill" ? dur(r.eta_s) : "–"),
      h("td", {}, r.miss ? h("span", { class: `reason r-${r.miss}` }, r.miss) :
        h("span", { class: "detail" }, r.state === "admitting" ? "–" : "all restored")));
  })));
}

// Misses
function drawMisses(d) {
  $("restores").textContent = `${num(d.complete)} of ${num(d.restores)} restores complete`;
  const most = Math.max(1, ...Object.values(d.by_reason));
  fill("reasons", Object.entries(d.by_reason).sort((a, b) => b[1] - a[1]).map(([r, n]) =>
    h("div", { class: "line", "data-reason": r, "data-count": n }, h("span", { class: `reason r-${r}` }, r),
      h("div", { class: "bar" }, h("i", { style: `width:${100 * n / most}%;background:var(--accent);opacity:${n ? 0.8 : 0}` })),
      h("span", { class: "num detail", style: "text-align:right" }, num(n)))));
  if (!d.recent.length) return fill("misses", h("div", { class: "empty" }, "No miss yet."));
  fill("misses", h("table", {}, h("tr", {}, h("th", {}, "when"), h("th", {}, "#"), h("th", {}, "restored"),
    h("th", {}, "reason")),
  d.recent.slice(0, 8).map(m => h("tr", { "data-miss": m.miss.reason },
    h("td", { class: "detail", style: "white-space:nowrap" }, ago(m.at)),
    h("td", { class: "mono" }, `#${m.request}`),
    h("td", { style: "width:150px" }, h("div", { class: "num", style: "text-align:left" },
      `${num(m.restored)} / ${num(m.prompt)}`), tierBar(m.tiers, m.prompt, "tiers")),
    h("td", {}, h("div", { class: `reason r-${m.miss.reason}` }, m.miss.reason),
      h("div", { class: "detail" }, m.miss.detail))))));
}

// The prefix tree
function drawTree(d) {
  $("tree-total").textContent = `largest branches · ${num(d.entries)} entries, ${bytes(d.stored_bytes)} on disk`;
  if (!d.nodes.length) return fill("tree", h("div", { class: "empty" }, "The cache is empty."));
  fill("tree", h("table", {}, h("tr", {}, h("th", {}, "branch"), h("th", { class: "num" }, "tokens"),
    h("th", { title: "share of the branch's entries each tier holds" }, "device · host · disk"),
    h("th", { class: "num" }, "snapshots"), h("th", { class: "num" }, "subtree"),
    h("th", { class: "num" }, "hits"), h("th", {}, "starts with")),
  d.nodes.map(n => {
    const pad = "│ ".repeat(Math.max(0, n.depth - 1)) + (n.depth ? "├ " : "");
    const more = n.hidden.branches ? h("div", { class: "detail" },
      `+ ${n.hidden.branches} smaller branch${n.hidden.branches > 1 ? "es" : ""}, ${bytes(n.hidden.bytes)}`) : null;
    if (n.kind === "root") {
      return h("tr", { "data-node": n.id, "data-kind": "root" }, h("td", { colspan: 7 },
        h("div", { class: "branch" }, h("span", { class: "pill" }, "root"),
          h("span", { class: "mono detail" }, `${n.id.slice(0, 12)} · weights ${n.fingerprint.slice(0, 12)}`),
          h("span", { class: "detail" }, `${num(n.subtree_entries)} entries, ${bytes(n.subtree_bytes)}`)), more));
    }
    const span = n.kind === "snapshot" ? `@${num(n.position)}` : `${num(n.start)}–${num(n.end)}`;
    const count = n.kind === "snapshot" ? 1 : n.count;
    return h("tr", { "data-node": n.id, "data-kind": n.kind, "data-start": n.start ?? n.position,
      "data-end": n.end ?? n.position },
    h("td", {}, h("div", { class: "branch" }, h("span", { class: "guide" }, pad),
      h("span", {}, n.kind === "snapshot" ? "snapshot" : `${num(n.count)} block${n.count > 1 ? "s" : ""}`),
      n.pinned ? h("span", { class: "pill" }, "pinned") : null), more),
    h("td", { class: "num mono" }, span),
    h("td", {}, tierRows(n.tiers, count)),
    h("td", { class: "num" }, n.snapshots ? num(n.snapshots.length) : "–"),
    h("td", { class: "num" }, bytes(n.subtree_bytes)),
    h("td", { class: "num" }, num(n.hits)),
    h("td", {}, h("div", { class: "preview", title: n.preview }, n.preview)));
  })));
}

// Contexts and pins
function drawPinned(d) {
  fill("contexts", d.contexts.length ? h("table", {}, h("tr", {}, h("th", {}, "name"),
    h("th", { class: "num" }, "tokens"), h("th", {}, "state"), h("th", {}, "registered")),
  d.contexts.map(c => h("tr", { "data-context": c.name }, h("td", { class: "mono" }, c.name),
    h("td", { class: "num" }, num(c.tokens)),
    h("td", {}, h("span", { class: "pill" }, c.cached ? (c.pinned ? "pinned" : "cached") : "not cached"),
      c.salted ? h("span", { class: "detail" }, " salted") : null),
    h("td", { class: "detail" }, ago(c.created))))) :
    h("div", { class: "empty" }, "No named context (POST /v1/contexts)."));
  fill("pinned", d.prefixes.length ? h("table", { class: "fixed" }, h("tr", {},
    h("th", { class: "num", style: "width:70px" }, "tokens"), h("th", { class: "num", style: "width:90px" }, "stored"),
    h("th", { style: "width:110px" }, "context"), h("th", {}, "ends with")),
  d.prefixes.map(p => h("tr", { "data-pinned": p.key }, h("td", { class: "num" }, num(p.position)),
    h("td", { class: "num" }, bytes(p.stored_bytes)), h("td", { class: "mono" }, p.contexts.join(", ") || "–"),
    h("td", {}, h("div", { class: "preview", title: p.text }, "…" + p.text))))) :
    h("div", { class: "empty" }, "Nothing is pinned."));
}

// Polling
const VIEWS = { tiers: ["/cache/tiers", drawTiers], requests: ["/cache/requests", drawRequests],
  misses: ["/cache/misses", drawMisses], tree: ["/cache/tree?limit=24", drawTree],
  pinned: ["/cache/pinned", drawPinned] };
const timers = {};
async function poll(name, now) {
  clearTimeout(timers[name]);
  if (!now && document.hidden) { timers[name] = setTimeout(() => poll(name), EVERY[name]); return; }
  const [path, draw] = VIEWS[name];
  try { draw(await get(path)); } catch (e) { console.warn(name, e.message); }
  timers[name] = setTimeout(() => poll(name), EVERY[name]);
}
for (const name of Object.keys(VIEWS)) poll(name, true);
