// The admin page's entry module: listens to /api/admin/stream (SSE) and updates counters, the block map,
// sequences, charts, what paging saves, advice and the disk tier panel from each sample. The block map is the
// feed's view of the pool (a range, a marked sequence): zooming reconnects the feed with the new view. With
// replicas, a panel per replica heads the page, and the rest shows the replica the view names.
import { BlockMap } from "./admin_blockmap.js";
import { cellsFor } from "./admin_cells.js";
import { LineChart, compact } from "./admin_charts.js";
import { panelCellsFor, redrawPanels, renderReplicas } from "./admin_replicas.js";
import { renderSequences, select } from "./admin_sequences.js";
import { state } from "./admin_state.js";
import { renderTier } from "./admin_tier.js";
import { onThemeChange } from "./canvas.js";

const HISTORY_S = 180;
const $ = (id) => document.getElementById(id);

function setText(id, text) {
  const node = $(id);
  if (node.textContent !== text) node.textContent = text;
}

function pct(value) {
  if (value == null) return "–";
  if (value > 0 && value < 0.001) return "<0.1%"; // 25 blocks of 250,000 in use is not 0.0%
  return (value * 100).toFixed(value >= 0.995 || value === 0 ? 0 : 1) + "%";
}

function setFeedStatus(kind, text) {
  const node = $("feed-status");
  node.dataset.state = kind;
  node.textContent = text;
}

function makeCharts() {
  // colours: the theme's custom properties (static/base.css)
  const c = (key, colorVar, label, fill) => ({ key, colorVar, color: "#7d8396", label, fill });
  const specs = {
    blocks: [[c("num_used_blocks", "--chart-blue", "in use", true), c("num_cached_blocks", "--chart-green", "cached"),
      c("num_free_blocks", "--chart-grey", "free")]],
    sequences: [[c("num_running", "--chart-blue", "running", true), c("num_waiting", "--chart-orange", "waiting"),
      c("num_preempted", "--chart-red", "preempted")]],
    preemptions: [[c("preemptions_per_min", "--chart-red", "per min", true)]],
    hits: [[c("hit_pct", "--chart-green", "all hits", true), c("disk_hit_pct", "--chart-purple", "from disk")],
      { yMax: 100, format: (v) => (v == null ? "–" : v.toFixed(0) + "%") }],
    speed: [[c("tokens_per_s", "--chart-purple", "tok/s", true)]],
    waste: [[c("paged_waste_tokens", "--chart-blue", "paged", true),
      c("contiguous_waste_tokens", "--chart-red", "hypothetical contiguous")]],
  };
  for (const canvas of document.querySelectorAll("canvas[data-chart]")) {
    const [series, options] = specs[canvas.dataset.chart];
    const chartOptions = Object.assign({ maxSpanS: HISTORY_S }, options);
    state.charts[canvas.dataset.chart] = new LineChart(canvas, series, chartOptions);
  }
}

function withDerived(point) {
  const asPct = (rate) => (rate == null ? null : rate * 100);
  return Object.assign({}, point, { hit_pct: asPct(point.prefix_hit_rate), disk_hit_pct: asPct(point.disk_hit_rate) });
}

function renderCounters(pool, point) {
  const s = pool.stats;
  setText("stat-used", String(s.num_used_blocks));
  setText("stat-used-pct", pct(s.num_used_blocks / Math.max(1, s.num_blocks)) + " of pool");
  setText("stat-cached", String(s.num_cached_blocks));
  setText("stat-free", String(s.num_free_blocks));
  setText("stat-total", "of " + s.num_blocks.toLocaleString("en-US") + " blocks");
  setText("stat-shared", String(s.num_shared_blocks));
  setText("stat-running", String(s.num_running));
  const loading = s.num_loading ? ", " + s.num_loading + " loading" : "";
  setText("stat-queue", s.num_waiting + " waiting" + loading + ", " + point.num_preempted + " preempted");
  setText("stat-preempt-rate", point.preemptions_per_min.toFixed(1) + "/min");
  setText("stat-preempt-total", s.num_preemptions + " since start");
  setText("stat-hit-rate", pct(point.prefix_hit_rate));
  setText("stat-tokps", compact(point.tokens_per_s));
  setText("stat-waste-paged", point.paged_waste_tokens + " tok");
  renderSpeculation(s.spec);
}

// speculative decoding since start: the share of proposed tokens kept, and how many (null: the method is off)
function renderSpeculation(spec) {
  if (!spec) {
    setText("stat-spec-rate", "off");
    setText("stat-spec-sub", "one token a step");
    return;
  }
  const rate = spec.num_draft_tokens ? spec.num_accepted_tokens / spec.num_draft_tokens : null;
  setText("stat-spec-rate", rate == null ? "–" : pct(rate));
  setText("stat-spec-sub", compact(spec.num_accepted_tokens) + " of " + compact(spec.num_draft_tokens) +
    " proposed tokens kept (" + spec.method + ")");
}

function renderPaging(paging, advice, point) {
  setText("paging-paged", compact(advice.paged_allocated_tokens) + " slots");
  setText("paging-paged-sub", point.paged_waste_tokens + " allocated but empty (each sequence's last block)");
  setText("paging-contig", compact(advice.contiguous_reserved_tokens) + " slots");
  setText("paging-contig-sub", point.contiguous_waste_tokens + " reserved but empty");
  setText("paging-text", paging.text);
}

function renderAdvice(advice) {
  const json = JSON.stringify(advice.items);
  if (json === state.adviceJson) return;
  state.adviceJson = json;
  $("advice").replaceChildren(...advice.items.map((item) => {
    const li = document.createElement("li");
    li.className = "advice-item advice-" + item.level;
    const title = document.createElement("strong");
    title.textContent = item.title;
    const text = document.createElement("p");
    text.textContent = item.text;
    li.append(title, text);
    return li;
  }));
}

function onState(s) {
  if (s.error) {
    $("feed-error").textContent = "The engine cannot be sampled: " + s.error;
    $("feed-error").hidden = false;
    return;
  }
  $("feed-error").hidden = true;
  state.lastPool = s.pool;
  state.nowS = s.time_s;
  const last = state.points[state.points.length - 1];
  if (!last || last.time_s < s.time_s) state.points.push(withDerived(s.point)); // a reconnect may repeat one
  while (state.points.length && state.nowS - state.points[0].time_s > HISTORY_S) state.points.shift();
  if (s.replicas) {
    state.replica = s.replica;
    renderReplicas(s.replicas, s.replica, showReplica);
  }
  renderCounters(s.pool, s.point);
  state.map.update(s.map, s.pool.sequences);
  if (state.selected !== null && !s.pool.sequences.some((q) => q.seq_id === state.selected)) select(null);
  renderSequences(s.pool.sequences);
  state.charts.blocks.setMax(s.pool.num_blocks); // the blocks chart spans the whole pool
  for (const chart of Object.values(state.charts)) chart.setData(state.points, state.nowS);
  renderPaging(s.advice.paging, s.advice, s.point);
  renderAdvice(s.advice);
  renderTier(s.tier, s.point);
  document.body.dataset.samples = String(Number(document.body.dataset.samples || 0) + 1);
}

function streamUrl(view, withHistory) {
  const params = new URLSearchParams({ cells: String(cellsFor($("block-map").parentElement.clientWidth)) });
  if (view.start !== null) params.set("start", String(view.start));
  if (view.end !== null) params.set("end", String(view.end));
  if (view.seq !== null) params.set("seq", String(view.seq));
  if (view.replica !== null) params.set("replica", view.replica);
  const panelMap = $("replicas").hidden ? null : document.querySelector(".replica-map-wrap");
  if (panelMap && panelMap.clientWidth) params.set("pcells", String(panelCellsFor(panelMap.clientWidth)));
  if (!withHistory) params.set("history", "0");
  return "/api/admin/stream?" + params;
}

let source = null;

function connect(withHistory) {
  if (source) source.close(); // the old view's stream: closing it fires no error event
  source = new EventSource(streamUrl(state.view, withHistory));
  source.addEventListener("open", () => setFeedStatus("live", "live"));
  source.addEventListener("history", (e) => {
    const history = JSON.parse(e.data);
    state.points = history.points.map(withDerived);
    state.nowS = history.time_s;
  });
  source.addEventListener("state", (e) => onState(JSON.parse(e.data)));
  source.addEventListener("error", (e) => {
    if (e.target.readyState === EventSource.CLOSED) {
      setFeedStatus("down", "disconnected — reload to sign in again");
    } else {
      setFeedStatus("down", "reconnecting…");
    }
  });
}

/** Show `view` ({start, end, seq}) of the block map: the feed reconnects with it, its chart history kept. */
function setView(view) {
  state.view = view;
  const zoomed = view.start !== null;
  $("map-zoom-out").disabled = !zoomed;
  $("map-whole").disabled = !zoomed;
  connect(false);
}

/** Show replica `name` in the page: its whole pool, its sequences and its own chart history. */
function showReplica(name) {
  if (name === state.replica) return;
  state.selected = null;
  state.seqsJson = "";
  state.view = { start: null, end: null, seq: null, replica: name };
  $("map-zoom-out").disabled = true;
  $("map-whole").disabled = true;
  connect(true);
}

function zoomTo(range) {
  setView(Object.assign({}, state.view, range || { start: null, end: null }));
}

function start() {
  state.map = new BlockMap($("block-map"), $("block-info"), $("map-scale"));
  state.map.onSelectSequence = (seqId) => select(seqId);
  state.map.onZoom = zoomTo;
  state.setView = setView;
  $("map-zoom-out").addEventListener("click", () => state.map.zoomOut());
  $("map-whole").addEventListener("click", () => zoomTo(null));
  makeCharts();
  // a much wider or narrower map wants another cell count: reconnect (not on every pixel of a resize)
  let cells = cellsFor($("block-map").parentElement.clientWidth);
  if (window.ResizeObserver) {
    new ResizeObserver(() => {
      const now = cellsFor($("block-map").parentElement.clientWidth);
      if (now > cells * 1.5 || now < cells / 1.5) {
        cells = now;
        connect(false);
      }
    }).observe($("block-map").parentElement);
    new ResizeObserver(() => redrawPanels()).observe($("replica-panels"));
  }
  onThemeChange(() => redrawPanels());
  connect(true);
}

// a module runs once the document is parsed (like `defer`), so the elements are there
start();
