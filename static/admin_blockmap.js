// The block map: the pool, or a zoomed range of it, as cells of k blocks each (the server sums them: see
// app/admin/block_map.py). A cell of one block takes its state's colour; a cell of many is a small stacked bar of
// its mix (shared, in use, cached from the bottom; free the rest), so 256 blocks and 250,000 both read at a glance.
// Drag across cells (or pick one and press Enter) to zoom in; hover, click or arrow keys tell a cell's contents; a
// selected sequence's cells are outlined and the rest dimmed. A little over 300 lines: drawing, the pointer and keys,
// and the info panel all read the same cell geometry and counts.
import { cellLayout, cellsFor, decodeCounts, drawCell } from "./admin_cells.js";
import { hidpiContext, onThemeChange, themeColor } from "./canvas.js";

const FALLBACK = {
  free: "#e6e8ee", cached: "#a7dcc9", used: "#4f7cf7", shared: "#e09422",
  outline: "#111827", hover: "#ef4444", drag: "rgba(79, 124, 247, 0.25)",
};
const STATE_NAMES = { free: "free", cached: "cached (evictable)", used: "in use", shared: "shared" };
function colors() {
  const c = {};
  for (const [name, fallback] of Object.entries(FALLBACK)) c[name] = themeColor("--map-" + name, fallback);
  return c;
}

function fmt(n) {
  return n.toLocaleString("en-US");
}

export class BlockMap {
  constructor(canvas, info, scale) {
    this.canvas = canvas;
    this.info = info;
    this.scale = scale; // the "1 cell = k blocks" line
    this.map = null; // the feed's block map of the current view
    this.cells = null; // its decoded counts
    this.labels = {}; // seq_id -> who it is for, from the sequences list
    this.hover = null;
    this.pinned = null;
    this.drag = null; // {from, to} cell indexes while the mouse is down
    this.layout = { cell: 10, gap: 2, cols: 1 };
    this.onSelectSequence = () => {};
    this.onZoom = () => {}; // ({start, end} | null for the whole pool)
    canvas.addEventListener("mousedown", (e) => this.startDrag(e));
    canvas.addEventListener("mousemove", (e) => this.moveDrag(e));
    canvas.addEventListener("mouseup", (e) => this.endDrag(e));
    canvas.addEventListener("mouseleave", () => {
      this.drag = null;
      this.setHover(null);
    });
    canvas.addEventListener("keydown", (e) => this.onKey(e));
    if (window.ResizeObserver) new ResizeObserver(() => this.draw()).observe(canvas.parentElement);
    onThemeChange(() => this.draw());
  }

  /** A new sample: the view's map and the live sequences (for the owners' names). */
  update(map, sequences) {
    const viewChanged = !this.map || this.map.start !== map.start || this.map.end !== map.end ||
      this.map.blocks_per_cell !== map.blocks_per_cell;
    this.map = map;
    const counts = map.counts;
    this.cells = {
      cached: decodeCounts(counts.cached), used: decodeCounts(counts.used),
      shared: decodeCounts(counts.shared), picked: decodeCounts(counts.picked),
    };
    this.labels = {};
    for (const s of sequences) this.labels[s.seq_id] = s;
    if (viewChanged) {
      this.hover = null;
      this.pinned = null;
    }
    this.renderScale();
    this.draw();
    this.showInfo(this.hover !== null ? this.hover : this.pinned);
  }

  /** Block range [start, end) of cell i. */
  cellRange(i) {
    const m = this.map;
    const start = m.start + i * m.blocks_per_cell;
    return [start, Math.min(m.end, start + m.blocks_per_cell)];
  }

  /** A cell's counts by state (free is what the others leave). */
  mix(i) {
    const [a, b] = this.cellRange(i);
    const c = this.cells;
    const cached = c.cached[i], used = c.used[i], shared = c.shared[i];
    return { size: b - a, cached, used, shared, free: b - a - cached - used - shared, picked: c.picked ? c.picked[i] : 0 };
  }

  renderScale() {
    const m = this.map;
    const k = m.blocks_per_cell;
    const whole = m.start === 0 && m.end === m.num_blocks;
    const range = whole ? "the whole pool, " + fmt(m.num_blocks) + " blocks" :
      "blocks " + fmt(m.start) + "–" + fmt(m.end - 1) + " of " + fmt(m.num_blocks);
    this.scale.textContent = "1 cell = " + fmt(k) + (k === 1 ? " block" : " blocks") + " · " + range;
    this.scale.dataset.blocksPerCell = String(k);
  }

  cellAt(event) {
    if (!this.map) return null;
    const rect = this.canvas.getBoundingClientRect();
    const { cell, gap, cols } = this.layout;
    const col = Math.floor((event.clientX - rect.left) / (cell + gap));
    const row = Math.floor((event.clientY - rect.top) / (cell + gap));
    const index = row * cols + col;
    return col >= 0 && col < cols && index >= 0 && index < this.map.num_cells ? index : null;
  }

  startDrag(event) {
    const i = this.cellAt(event);
    this.drag = i === null ? null : { from: i, to: i };
  }

  moveDrag(event) {
    const i = this.cellAt(event);
    if (this.drag && i !== null) this.drag.to = i;
    this.setHover(i);
  }

  endDrag(event) {
    const drag = this.drag;
    this.drag = null;
    const i = this.cellAt(event);
    if (!drag) return;
    if (i === null || i === drag.from) {
      this.pin(drag.from);
      return;
    }
    const [start] = this.cellRange(Math.min(drag.from, i));
    const [, end] = this.cellRange(Math.max(drag.from, i));
    this.onZoom({ start, end });
  }

  /** Zoom in around cell i: the blocks around it at one block a cell (as many as fill the map). */
  zoomInto(i) {
    const m = this.map;
    if (!m || m.blocks_per_cell === 1) return;
    const [a, b] = this.cellRange(i);
    const span = Math.min(m.num_blocks, Math.max(b - a, cellsFor(this.canvas.parentElement.clientWidth)));
    const start = Math.max(0, Math.min(m.num_blocks - span, Math.floor((a + b - span) / 2)));
    this.onZoom({ start, end: start + span });
  }

  /** Zoom out: four times the range around its middle (the whole pool once that covers it). */
  zoomOut() {
    const m = this.map;
    if (!m) return;
    const span = (m.end - m.start) * 4;
    if (span >= m.num_blocks) {
      this.onZoom(null);
      return;
    }
    const start = Math.max(0, Math.min(m.num_blocks - span, Math.floor((m.start + m.end - span) / 2)));
    this.onZoom({ start, end: start + span });
  }

  setHover(index) {
    if (index === this.hover) return;
    this.hover = index;
    this.draw();
    this.showInfo(index !== null ? index : this.pinned);
  }

  pin(index) {
    this.pinned = index;
    const block = index !== null && this.map.blocks ? this.map.blocks[String(this.cellRange(index)[0])] : null;
    if (block && block.owners.length) this.onSelectSequence(block.owners[0]);
    this.draw();
    this.showInfo(index);
  }

  onKey(event) {
    if (!this.map) return;
    const n = this.map.num_cells;
    const cols = this.layout.cols;
    const at = this.pinned !== null ? this.pinned : -1;
    const moves = { ArrowRight: 1, ArrowLeft: -1, ArrowDown: cols, ArrowUp: -cols, Home: -at, End: n - 1 - at };
    if (event.key in moves) {
      event.preventDefault();
      this.pin(Math.max(0, Math.min(n - 1, at < 0 ? 0 : at + moves[event.key])));
    } else if ((event.key === "Enter" || event.key === "+") && this.pinned !== null) {
      event.preventDefault();
      this.zoomInto(this.pinned);
    } else if (event.key === "-") {
      this.zoomOut();
    } else if (event.key === "Escape") {
      this.pin(null);
    }
  }

  draw() {
    const m = this.map;
    const canvas = this.canvas;
    const width = canvas.parentElement.clientWidth;
    if (!m || !width) return;
    const n = m.num_cells;
    const layout = (this.layout = cellLayout(width, n));
    const { cell, gap, cols, rows } = layout;
    const height = rows * (cell + gap);
    canvas.style.width = width + "px";
    canvas.style.height = height + "px";
    const ctx = hidpiContext(canvas, width, height);
    const color = colors();
    const marking = this.cells.picked !== null;
    let inUse = 0;
    for (let i = 0; i < n; i++) {
      const mix = this.mix(i);
      inUse += mix.used + mix.shared;
      const x = (i % cols) * (cell + gap);
      const y = Math.floor(i / cols) * (cell + gap);
      ctx.globalAlpha = marking && !mix.picked ? 0.28 : 1;
      drawCell(ctx, mix, x, y, cell, color);
      if (m.blocks_per_cell === 1 && mix.shared) this.darkenByRefs(ctx, x, y, cell, i);
    }
    ctx.globalAlpha = 1;
    if (marking) {
      ctx.strokeStyle = color.outline;
      ctx.lineWidth = cell >= 8 ? 1.5 : 1;
      for (let i = 0; i < n; i++) if (this.cells.picked[i]) this.outline(ctx, i);
    }
    if (this.drag && this.drag.to !== this.drag.from) {
      ctx.fillStyle = color.drag;
      const lo = Math.min(this.drag.from, this.drag.to), hi = Math.max(this.drag.from, this.drag.to);
      for (let i = lo; i <= hi; i++) ctx.fillRect((i % cols) * (cell + gap), Math.floor(i / cols) * (cell + gap), cell, cell);
    }
    for (const [index, c] of [[this.pinned, color.outline], [this.hover, color.hover]]) {
      if (index === null || index >= n) continue;
      ctx.strokeStyle = c;
      ctx.lineWidth = 2;
      this.outline(ctx, index);
    }
    canvas.dataset.inUse = String(inUse);
    canvas.dataset.blocks = String(m.num_blocks);
    canvas.dataset.cells = String(n);
    canvas.dataset.cellPx = String(cell);
  }

  // a shared block darkens with its ref count (2, 3, 4-5, 6-9, 10+), as the legend's gradient shows
  darkenByRefs(ctx, x, y, cell, i) {
    const block = this.map.blocks && this.map.blocks[String(this.map.start + i)];
    const refs = block ? block.refs : 2;
    const step = refs >= 10 ? 4 : refs >= 6 ? 3 : refs >= 4 ? 2 : refs - 2;
    if (step <= 0) return;
    const alpha = ctx.globalAlpha;
    ctx.globalAlpha = alpha * 0.14 * step;
    ctx.fillStyle = "#000";
    ctx.fillRect(x, y, cell, cell);
    ctx.globalAlpha = alpha;
  }

  outline(ctx, i) {
    const { cell, gap, cols } = this.layout;
    ctx.strokeRect((i % cols) * (cell + gap) + 0.5, Math.floor(i / cols) * (cell + gap) + 0.5, cell - 1, cell - 1);
  }

  owner(seqId) {
    const seq = this.labels[seqId];
    if (!seq) return "seq " + seqId;
    const who = seq.label ? seq.label.title + ", " + seq.label.owner : seq.request_id.slice(0, 18);
    return "seq " + seqId + " (" + who + ")";
  }

  showInfo(index) {
    const info = this.info;
    if (index === null || !this.map || index >= this.map.num_cells) {
      const hint = document.createElement("span");
      hint.className = "muted";
      hint.textContent = this.map && this.map.blocks_per_cell > 1
        ? "Hover or click a cell; drag across cells (or pick one and press Enter) to zoom in."
        : "Hover or click a block (or focus the map and use the arrow keys).";
      info.replaceChildren(hint);
      return;
    }
    const fields = this.map.blocks_per_cell === 1 ? this.blockFields(index) : this.cellFields(index);
    const list = document.createElement("dl");
    list.className = "block-fields";
    for (const [k, v] of fields) {
      const dt = document.createElement("dt");
      dt.textContent = k;
      const dd = document.createElement("dd");
      dd.textContent = v;
      list.append(dt, dd);
    }
    const nodes = [list];
    if (this.map.blocks_per_cell > 1) {
      const zoom = document.createElement("button");
      zoom.type = "button";
      zoom.className = "btn btn-small map-zoom-cell";
      zoom.textContent = "Zoom in here";
      zoom.addEventListener("click", () => this.zoomInto(index));
      nodes.push(zoom);
    }
    info.replaceChildren(...nodes);
  }

  blockFields(index) {
    const id = this.map.start + index;
    const mix = this.mix(index);
    const block = (this.map.blocks && this.map.blocks[String(id)]) || { refs: 0, owners: [], hash: null };
    const state = mix.shared ? "shared" : mix.used ? "used" : mix.cached ? "cached" : "free";
    const hash = !("hash" in block) ? "(next sample)" : block.hash ? block.hash + "…" : "none (partial or never full)";
    return [
      ["Block", "#" + id],
      ["State", STATE_NAMES[state]],
      ["Ref count", String(block.refs)],
      ["Hash", hash],
      ["Owners", block.owners.length ? block.owners.map((s) => this.owner(s)).join(", ") : "none"],
    ];
  }

  cellFields(index) {
    const [a, b] = this.cellRange(index);
    const mix = this.mix(index);
    const pct = (n) => fmt(n) + " (" + Math.round((100 * n) / mix.size) + "%)";
    const fields = [
      ["Blocks", "#" + fmt(a) + "–#" + fmt(b - 1) + " (" + fmt(mix.size) + ")"],
      ["In use", pct(mix.used + mix.shared) + (mix.shared ? ", " + fmt(mix.shared) + " shared" : "")],
      ["Cached", pct(mix.cached)],
      ["Free", pct(mix.free)],
    ];
    if (this.cells.picked) fields.push(["Selected sequence", fmt(mix.picked) + " of its blocks here"]);
    return fields;
  }
}
