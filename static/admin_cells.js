// The block map's cells, apart from drawing: the feed's counts decoded, how many cells to ask for at a width, their
// layout, and the stacked bar that shows a cell's mix of states.
export const MAX_HEIGHT = 300; // CSS px the map may take
const TARGET_PITCH = 10; // CSS px a cell (with its gap) when the server has blocks enough to fill the map
const MAX_CELL = 22;

/** A base64 little-endian uint16 array (the feed's per-cell counts) as a Uint16Array. */
export function decodeCounts(base64) {
  if (!base64) return null;
  const bytes = atob(base64);
  const out = new Uint16Array(bytes.length >> 1);
  for (let i = 0; i < out.length; i++) out[i] = bytes.charCodeAt(2 * i) | (bytes.charCodeAt(2 * i + 1) << 8);
  return out;
}

/** How many cells to ask the server for at this width: what fills the map at about TARGET_PITCH px a cell. */
export function cellsFor(width) {
  const cols = Math.max(4, Math.floor(width / TARGET_PITCH));
  return Math.max(16, Math.min(8192, cols * Math.floor(MAX_HEIGHT / TARGET_PITCH)));
}

/** Cell size, gap and columns that fit `numCells` into `width` x `maxHeight` CSS px. */
export function cellLayout(width, numCells, maxHeight = MAX_HEIGHT) {
  let cell = Math.floor(Math.sqrt((width * maxHeight) / Math.max(numCells, 1))) - 2;
  cell = Math.max(3, Math.min(MAX_CELL, cell));
  const gap = cell >= 8 ? 2 : 1;
  const cols = Math.max(1, Math.floor((width + gap) / (cell + gap)));
  return { cell, gap, cols, rows: Math.ceil(numCells / cols) };
}

/** A cell's stacked bar, bottom up: [state, height] of shared, used, cached. A state's height grows with the square
 * root of its share, at least a quarter of the cell, so 3 blocks in use among 121 show (a linear bar would be a
 * hairline); a cell of one state is filled. */
export function barHeights(mix, cell) {
  const bars = [];
  for (const state of ["shared", "used", "cached"]) {
    if (mix[state]) bars.push([state, cell * Math.max(0.25, Math.sqrt(mix[state] / mix.size))]);
  }
  const total = bars.reduce((sum, [, h]) => sum + h, 0);
  const scale = total > cell || mix.free === 0 ? cell / total : 1;
  return bars.map(([state, h]) => [state, h * scale]);
}

// One cell of a pool map at (x, y): the free colour, then a bar per state from the bottom up.
export function drawCell(ctx, mix, x, y, cell, color) {
  ctx.fillStyle = color.free;
  ctx.fillRect(x, y, cell, cell);
  let bottom = y + cell;
  for (const [state, h] of barHeights(mix, cell)) {
    ctx.fillStyle = color[state];
    ctx.fillRect(x, bottom - h, cell, h);
    bottom -= h;
  }
}

