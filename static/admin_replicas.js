// The replica panels of the admin page (`pagedchat serve --replicas N`): one per replica, with its health and pid,
// load, blocks, prefix hit rate, the routing decisions that sent requests to it, and a small map of its whole pool.
// Picking a panel shows that replica in the rest of the page (counters, block map, sequences, charts, advice).
import { cellLayout, decodeCounts, drawCell } from "./admin_cells.js";
import { hidpiContext, themeColor } from "./canvas.js";

export const PANEL_MAP_HEIGHT = 96; // CSS px a panel's map may take
const PANEL_PITCH = 8; // CSS px a cell (with its gap) when the pool has blocks enough to fill the map

const panels = new Map(); // replica name -> { root, fields, canvas, map }

/** How many cells to ask the server for, for a panel map `width` px wide. */
export function panelCellsFor(width) {
  const cols = Math.max(8, Math.floor(width / PANEL_PITCH));
  return Math.max(16, Math.min(8192, cols * Math.floor(PANEL_MAP_HEIGHT / PANEL_PITCH)));
}

function pct(rate) {
  return rate == null ? "–" : (rate * 100).toFixed(rate === 0 || rate >= 0.995 ? 0 : 1) + "%";
}

function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

/** Draw a block map (the feed's counts for the whole pool) into a panel's canvas: each cell a bar of its mix. */
export function drawPanelMap(canvas, map) {
  const width = canvas.parentElement.clientWidth;
  if (!map || !width) return;
  const layout = cellLayout(width, map.num_cells, PANEL_MAP_HEIGHT);
  const { cell, gap, cols, rows } = layout;
  const height = rows * (cell + gap);
  canvas.style.width = width + "px";
  canvas.style.height = height + "px";
  const ctx = hidpiContext(canvas, width, height);
  const color = {};
  for (const [name, fallback] of [["free", "#e6e8ee"], ["cached", "#a7dcc9"], ["used", "#4f7cf7"], ["shared", "#e09422"]]) {
    color[name] = themeColor("--map-" + name, fallback);
  }
  const cached = decodeCounts(map.counts.cached), used = decodeCounts(map.counts.used);
  const shared = decodeCounts(map.counts.shared);
  let inUse = 0;
  for (let i = 0; i < map.num_cells; i++) {
    const start = map.start + i * map.blocks_per_cell;
    const size = Math.min(map.end, start + map.blocks_per_cell) - start;
    const mix = { size, cached: cached[i], used: used[i], shared: shared[i] };
    mix.free = size - mix.cached - mix.used - mix.shared;
    inUse += mix.used + mix.shared;
    const x = (i % cols) * (cell + gap), y = Math.floor(i / cols) * (cell + gap);
    drawCell(ctx, mix, x, y, cell, color);
  }
  canvas.dataset.cells = String(map.num_cells);
  canvas.dataset.blocks = String(map.num_blocks);
  canvas.dataset.inUse = String(inUse);
}

const FIELDS = [
  ["load", "Load"],
  ["blocks", "Blocks"],
  ["hits", "Prefix hit rate"],
  ["routed", "Routed here"],
];

function makePanel(name, onSelect) {
  const root = document.createElement("li");
  root.className = "replica-panel";
  root.dataset.replica = name;
  const head = document.createElement("button");
  head.type = "button";
  head.className = "replica-head";
  head.setAttribute("aria-label", "Show replica " + name + " below");
  head.addEventListener("click", () => onSelect(name));
  const title = document.createElement("span");
  title.className = "replica-name mono";
  title.textContent = name;
  const badge = document.createElement("span");
  badge.className = "replica-state";
  const pid = document.createElement("span");
  pid.className = "replica-pid muted small";
  head.append(title, badge, pid);
  const list = document.createElement("dl");
  list.className = "replica-fields";
  const fields = {};
  for (const [key, label] of FIELDS) {
    const dt = document.createElement("dt");
    dt.textContent = label;
    const dd = document.createElement("dd");
    dd.dataset.field = key;
    list.append(dt, dd);
    fields[key] = { dd };
  }
  const wrap = document.createElement("div");
  wrap.className = "replica-map-wrap";
  const canvas = document.createElement("canvas");
  canvas.className = "replica-map";
  canvas.setAttribute("role", "img");
  canvas.setAttribute("aria-label", "The pool of replica " + name + ": each cell a block, or a group of blocks shaded by their mix");
  canvas.addEventListener("click", () => onSelect(name));
  wrap.append(canvas);
  root.append(head, list, wrap);
  return { root, badge, pid, fields, canvas, map: null };
}

function fill(panel, p) {
  setText(panel.badge, p.state);
  panel.badge.dataset.state = p.state;
  setText(panel.pid, (p.pid != null ? "pid " + p.pid : "pid –") + (p.rank != null ? " · rank " + p.rank : "") +
    " · " + p.in_flight + " in flight");
  const f = panel.fields;
  const s = p.stats;
  setText(f.load.dd, s ? s.num_running + " running, " + s.num_waiting + " waiting" : "not sampled");
  setText(f.blocks.dd, s ? s.num_used_blocks + " used · " + s.num_cached_blocks + " cached · " +
    s.num_free_blocks + " free of " + s.num_blocks : "–");
  setText(f.hits.dd, s ? pct(p.hit_rate) + " last minute · " + pct(p.hit_rate_total) + " since start" : "–");
  const r = p.routing;
  setText(f.routed.dd, r ? r.num_requests + ": " + r.longest_prefix + " to the longest prefix, " +
    r.load_fallback + " fell back for load, " + r.other + " other" : "–");
  if (r) f.routed.dd.title = Object.entries(r.requests).map(([k, v]) => k + " " + v).join(", ");
  panel.map = p.map;
  panel.canvas.hidden = !p.map;
  drawPanelMap(panel.canvas, p.map);
}

/** Show the replica panels of a sample (`replicas`: asked, ready, panels) with `focused` marked. */
export function renderReplicas(replicas, focused, onSelect) {
  const section = document.getElementById("replicas");
  section.hidden = false;
  setText(document.getElementById("replicas-ready"), replicas.ready + " of " + replicas.asked + " serving");
  setText(document.getElementById("map-replica"), "replica " + focused);
  const list = document.getElementById("replica-panels");
  const names = new Set(replicas.panels.map((p) => p.name));
  for (const [name, panel] of panels) {
    if (!names.has(name)) {
      panel.root.remove();
      panels.delete(name);
    }
  }
  let previous = null;
  for (const p of replicas.panels) {
    let panel = panels.get(p.name);
    if (!panel) {
      panel = makePanel(p.name, onSelect);
      panels.set(p.name, panel);
    }
    const expected = previous ? previous.nextSibling : list.firstChild;
    if (expected !== panel.root) list.insertBefore(panel.root, expected);
    previous = panel.root;
    panel.root.classList.toggle("is-focused", p.name === focused);
    panel.root.setAttribute("aria-current", String(p.name === focused));
    fill(panel, p);
  }
}

/** Redraw every panel's map (a resize, a theme change). */
export function redrawPanels() {
  for (const panel of panels.values()) drawPanelMap(panel.canvas, panel.map);
}
