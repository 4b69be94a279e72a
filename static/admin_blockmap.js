// The block map: one canvas cell per KV block, coloured by state; hover, click or arrow keys show a block's
// details; a selected sequence's block table is outlined and the rest dimmed.
import { hidpiContext } from "./canvas.js";
import { cssColors, onThemeChange } from "./theme_colors.js";
// the theme's colours (static/base.css): a cell's state, shared cells by ref count (2, 3, 4-5, 6-9, 10+), outlines
const COLOR_VARS = {
  f: "--map-free", c: "--map-cached", u: "--map-used", outline: "--map-outline", hover: "--map-hover",
  shared1: "--map-shared-1", shared2: "--map-shared-2", shared3: "--map-shared-3", shared4: "--map-shared-4",
  shared5: "--map-shared-5",
};
const STATE_NAMES = { f: "free", c: "cached (evictable)", u: "in use" };
const MAX_HEIGHT = 300;

function sharedColor(colors, refs) {
  if (refs >= 10) return colors.shared5;
  if (refs >= 6) return colors.shared4;
  if (refs >= 4) return colors.shared3;
  return refs >= 3 ? colors.shared2 : colors.shared1;
}

export class BlockMap {
  constructor(canvas, info) {
    this.canvas = canvas;
    this.info = info;
    this.pool = null;
    this.highlightSeq = null;
    this.hover = null;
    this.pinned = null;
    this.layout = { cell: 10, gap: 2, cols: 1 };
    this.onSelectSequence = () => {};
    canvas.addEventListener("mousemove", (e) => this.setHover(this.cellAt(e)));
    canvas.addEventListener("mouseleave", () => this.setHover(null));
    canvas.addEventListener("click", (e) => this.pin(this.cellAt(e)));
    canvas.addEventListener("keydown", (e) => this.onKey(e));
    if (window.ResizeObserver) new ResizeObserver(() => this.draw()).observe(canvas.parentElement);
    onThemeChange(() => this.draw());
  }

  update(pool) {
    this.pool = pool;
    this.owners = pool.block_owners || {};
    this.seqById = {};
    for (const s of pool.sequences) this.seqById[s.seq_id] = s;
    if (this.highlightSeq !== null && !this.seqById[this.highlightSeq]) this.highlightSeq = null;
    this.draw();
    this.showInfo(this.hover !== null ? this.hover : this.pinned);
  }

  setHighlight(seqId) {
    this.highlightSeq = seqId;
    this.draw();
  }

  cellAt(event) {
    if (!this.pool) return null;
    const rect = this.canvas.getBoundingClientRect();
    const { cell, gap, cols } = this.layout;
    const col = Math.floor((event.clientX - rect.left) / (cell + gap));
    const row = Math.floor((event.clientY - rect.top) / (cell + gap));
    const index = row * cols + col;
    return col >= 0 && col < cols && index >= 0 && index < this.pool.num_blocks ? index : null;
  }

  setHover(index) {
    this.hover = index;
    this.draw();
    this.showInfo(index !== null ? index : this.pinned);
  }

  pin(index) {
    this.pinned = index;
    const owners = index !== null ? this.owners[index] : null;
    this.onSelectSequence(owners && owners.length ? owners[0] : null);
    this.draw();
    this.showInfo(index);
  }

  onKey(event) {
    if (!this.pool) return;
    const n = this.pool.num_blocks;
    const cols = this.layout.cols;
    const at = this.pinned !== null ? this.pinned : -1;
    const moves = { ArrowRight: 1, ArrowLeft: -1, ArrowDown: cols, ArrowUp: -cols, Home: -at, End: n - 1 - at };
    if (event.key in moves) {
      event.preventDefault();
      this.pin(Math.max(0, Math.min(n - 1, (at < 0 ? 0 : at + moves[event.key]))));
    } else if (event.key === "Escape") {
      this.pin(null);
    }
  }

  computeLayout(width, n) {
    let cell = Math.floor(Math.sqrt((width * MAX_HEIGHT) / Math.max(n, 1))) - 2;
    cell = Math.max(3, Math.min(18, cell));
    const gap = cell >= 8 ? 2 : 1;
    const cols = Math.max(1, Math.floor((width + gap) / (cell + gap)));
    return { cell, gap, cols, rows: Math.ceil(n / cols) };
  }

  draw() {
    const pool = this.pool;
    const canvas = this.canvas;
    const width = canvas.parentElement.clientWidth;
    if (!pool || !width) return;
    const n = pool.num_blocks;
    const layout = (this.layout = this.computeLayout(width, n));
    const { cell, gap, cols, rows } = layout;
    const height = rows * (cell + gap);
    canvas.style.width = width + "px";
    canvas.style.height = height + "px";
    const ctx = hidpiContext(canvas, width, height);
    const colors = cssColors(COLOR_VARS);
    const states = pool.block_states;
    const refs = pool.ref_counts;
    const table = this.highlightSeq !== null ? new Set(this.seqById[this.highlightSeq].block_table) : null;
    let inUse = 0;
    for (let i = 0; i < n; i++) {
      const state = states[i];
      const r = refs[i] || 0;
      if (state === "u") inUse++;
      ctx.globalAlpha = table && !table.has(i) ? 0.28 : 1;
      ctx.fillStyle = state === "u" && r > 1 ? sharedColor(colors, r) : colors[state] || colors.f;
      ctx.fillRect((i % cols) * (cell + gap), Math.floor(i / cols) * (cell + gap), cell, cell);
    }
    ctx.globalAlpha = 1;
    if (table) {
      ctx.strokeStyle = colors.outline;
      ctx.lineWidth = cell >= 8 ? 1.5 : 1;
      for (const i of table) this.outline(ctx, i, layout);
    }
    for (const [index, color] of [[this.pinned, colors.outline], [this.hover, colors.hover]]) {
      if (index === null || index >= n) continue;
      ctx.strokeStyle = color;
      ctx.lineWidth = 2;
      this.outline(ctx, index, layout);
    }
    canvas.dataset.inUse = String(inUse);
    canvas.dataset.blocks = String(n);
  }

  outline(ctx, i, layout) {
    const { cell, gap, cols } = layout;
    ctx.strokeRect((i % cols) * (cell + gap) + 0.5, Math.floor(i / cols) * (cell + gap) + 0.5, cell - 1, cell - 1);
  }

  showInfo(index) {
    const info = this.info;
    if (index === null || !this.pool || index >= this.pool.num_blocks) {
      const hint = document.createElement("span");
      hint.className = "muted";
      hint.textContent = "Hover or click a block (or focus the map and use the arrow keys).";
      info.replaceChildren(hint);
      return;
    }
    const state = this.pool.block_states[index];
    const refs = this.pool.ref_counts[index] || 0;
    const hash = this.pool.block_hashes[index];
    const owners = (this.owners[index] || []).map((id) => {
      const seq = this.seqById[id];
      return "seq " + id + (seq ? " (" + seq.request_id.slice(0, 18) + ")" : "");
    });
    const fields = [
      ["Block", "#" + index],
      ["State", refs > 1 ? "shared" : STATE_NAMES[state] || state],
      ["Ref count", String(refs)],
      ["Hash", hash ? hash + "…" : "none (partial or never full)"],
      ["Owners", owners.length ? owners.join(", ") : "none"],
    ];
    const list = document.createElement("dl");
    list.className = "block-fields";
    for (const [k, v] of fields) {
      const dt = document.createElement("dt");
      dt.textContent = k;
      const dd = document.createElement("dd");
      dd.textContent = v;
      list.append(dt, dd);
    }
    info.replaceChildren(list);
  }
}
