// Small hand-drawn line charts on canvas (no library): a few series over the last minutes, newest at the right.
// A line breaks where a value is missing and where sampling resumed after a gap (no admin page listened), rather
// than drawing a diagonal across time nobody measured. A sample late behind a long engine step joins its line.
import { hidpiContext, onThemeChange, themeColor } from "./canvas.js";
const PAD = { left: 8, right: 8, top: 26, bottom: 16 };
const MIN_SPAN_S = 30;
/** The runs of `points` to draw as one line each: split where `key` is missing and before a `resumed` point. */
export function segments(points, key) {
  const runs = [];
  let run = [];
  for (const p of points) {
    const v = p[key];
    if (v == null || p.resumed) {
      if (run.length) runs.push(run);
      run = [];
    }
    if (v != null) run.push(p);
  }
  if (run.length) runs.push(run);
  return runs;
}

function niceMax(value) {
  if (!(value > 0)) return 1;
  const exp = Math.pow(10, Math.floor(Math.log10(value)));
  for (const step of [1, 2, 2.5, 5, 10]) {
    if (value <= step * exp) return step * exp;
  }
  return 10 * exp;
}

export function compact(value) {
  if (value == null || !Number.isFinite(value)) return "–";
  const abs = Math.abs(value);
  if (abs >= 1e6) return (value / 1e6).toFixed(1) + "M";
  if (abs >= 1e4) return (value / 1e3).toFixed(0) + "k";
  if (abs >= 1e3) return (value / 1e3).toFixed(1) + "k";
  if (abs >= 100 || Number.isInteger(value)) return String(Math.round(value));
  return value.toFixed(1);
}

export class LineChart {
  /** series: [{key, label, color, colorVar, fill}] (colorVar: a CSS property that overrides color), options:
   * {maxSpanS, yMax, format} */
  constructor(canvas, series, options) {
    this.canvas = canvas;
    this.series = series;
    this.maxSpanS = (options && options.maxSpanS) || 180;
    this.spanS = MIN_SPAN_S;
    this.fixedMax = options && options.yMax;
    this.format = (options && options.format) || compact;
    this.points = [];
    this.nowS = 0;
    if (window.ResizeObserver) new ResizeObserver(() => this.draw()).observe(canvas);
    onThemeChange(() => this.draw());
  }

  /** A fixed top of the y axis (null: fit the data). */
  setMax(value) {
    this.fixedMax = value;
  }

  /** points: [{time_s, <key>: number|null}], nowS: the feed's clock. */
  setData(points, nowS) {
    this.points = points;
    this.nowS = nowS;
    // the x axis grows with the history, from MIN_SPAN_S up to maxSpanS, so a fresh page is not one spike
    const oldest = points.length ? nowS - points[0].time_s : 0;
    this.spanS = Math.min(this.maxSpanS, Math.max(MIN_SPAN_S, Math.ceil(oldest / 10) * 10));
    this.draw();
  }

  draw() {
    const canvas = this.canvas;
    const width = canvas.clientWidth;
    const height = canvas.clientHeight;
    if (!width || !height) return;
    const ctx = hidpiContext(canvas, width, height);
    const plotW = width - PAD.left - PAD.right;
    const plotH = height - PAD.top - PAD.bottom;
    let max = 0;
    for (const p of this.points) {
      for (const s of this.series) if (p[s.key] != null) max = Math.max(max, p[s.key]);
    }
    max = this.fixedMax || niceMax(max);
    const x = (t) => PAD.left + plotW * (1 - (this.nowS - t) / this.spanS);
    const y = (v) => PAD.top + plotH * (1 - Math.min(v, max) / max);
    // grid and scale, in the theme's colours
    const grid = themeColor("--chart-grid", "#eef0f4");
    const axisText = themeColor("--chart-text", "#5f6678");
    ctx.font = "10px system-ui, sans-serif";
    ctx.textBaseline = "bottom";
    ctx.lineWidth = 1;
    for (let i = 0; i <= 2; i++) {
      const gy = Math.round(PAD.top + (plotH * i) / 2) + 0.5;
      ctx.strokeStyle = grid;
      ctx.beginPath();
      ctx.moveTo(PAD.left, gy);
      ctx.lineTo(PAD.left + plotW, gy);
      ctx.stroke();
    }
    ctx.fillStyle = axisText;
    ctx.textAlign = "right";
    ctx.fillText(this.format(max), PAD.left + plotW, PAD.top - 1);
    ctx.textAlign = "left";
    ctx.textBaseline = "top";
    const span = this.spanS >= 120 ? Math.round(this.spanS / 60) + " min" : Math.round(this.spanS) + " s";
    ctx.fillText("−" + span, PAD.left, PAD.top + plotH + 3);
    ctx.textAlign = "right";
    ctx.fillText("now", PAD.left + plotW, PAD.top + plotH + 3);
    // series, each a polyline per segment (see `segments`), filled below when asked
    const visible = this.points.filter((p) => this.nowS - p.time_s <= this.spanS);
    let numSegments = 0;
    for (const s of this.series) {
      const color = themeColor(s.colorVar, s.color);
      ctx.strokeStyle = color;
      ctx.fillStyle = color;
      ctx.lineWidth = 1.75;
      ctx.lineJoin = "round";
      for (const run of segments(visible, s.key)) {
        numSegments++;
        ctx.beginPath();
        run.forEach((p, i) => (i ? ctx.lineTo(x(p.time_s), y(p[s.key])) : ctx.moveTo(x(p.time_s), y(p[s.key]))));
        ctx.stroke();
        if (s.fill && run.length > 1) {
          ctx.lineTo(x(run[run.length - 1].time_s), PAD.top + plotH);
          ctx.lineTo(x(run[0].time_s), PAD.top + plotH);
          ctx.closePath();
          ctx.globalAlpha = 0.12;
          ctx.fill();
          ctx.globalAlpha = 1;
        }
      }
    }
    this.canvas.dataset.segments = String(numSegments);
    this.drawLegend(ctx, visible[visible.length - 1]);
  }

  drawLegend(ctx, last) {
    ctx.font = "11px system-ui, sans-serif";
    ctx.textAlign = "left";
    ctx.textBaseline = "middle";
    let lx = PAD.left;
    const text = themeColor("--chart-legend", "#3b4151");
    for (const s of this.series) {
      const value = last ? this.format(last[s.key]) : "–";
      ctx.fillStyle = themeColor(s.colorVar, s.color);
      ctx.fillRect(lx, 6, 8, 8);
      lx += 12;
      ctx.fillStyle = text;
      const label = s.label + " " + value;
      ctx.fillText(label, lx, 10);
      lx += ctx.measureText(label).width + 12;
    }
  }
}
