// Shared chart helpers of the run and compare pages (Plotly is served locally, no CDN).
// A ChartGroup draws several series in one Plotly chart; each series keeps its points in a Map
// keyed by step, so a point delivered twice (page load + websocket catch-up) is stored once.
// Smoothing is an EMA drawn over the raw curve, which stays visible but faint.
(function (global) {
  "use strict";

  const PALETTE = ["#2f6fed", "#d64545", "#1f9d55", "#c77c02", "#8e44ad", "#16a2b8", "#e67e22",
    "#34495e", "#e84393", "#6c5ce7", "#00b894", "#b33939"];

  function ema(ys, alpha) {
    // Debiased exponential moving average (as TensorBoard): nulls stay gaps and do not reset it.
    // Written as a step towards each new value, m += w * (y - m) with w = (1 - alpha) / weight,
    // which equals the usual acc / weight but starts exactly at the first value (w = 1) and keeps a
    // constant series exactly constant (y - m = 0): acc / weight drifts by rounding (0.1 became
    // 0.09999999999999999, and Plotly zoomed the y axis onto that noise).
    const out = new Array(ys.length);
    let m = 0, weight = 0;
    for (let i = 0; i < ys.length; i++) {
      const y = ys[i];
      if (y === null || y === undefined || !isFinite(y)) { out[i] = null; continue; }
      weight = alpha * weight + (1 - alpha);
      m += ((1 - alpha) / weight) * (y - m);
      out[i] = m;
    }
    return out;
  }

  // Tick labels: at most ~6 per axis so they never overlap on a 460 px chart, SI suffixes for large
  // and small numbers (20k steps, 3µ losses) instead of 20,000 or 3e-6.
  const AXIS = { exponentformat: "SI", automargin: true, tickfont: { size: 11 } };

  // Drawing queue shared by every chart of the page: one frame draws the charts on screen first
  // (top to bottom), then the rest, and yields to the browser whenever a task has run for ~50 ms so
  // that the charts already drawn are painted and the page answers input while the others draw.
  const queue = new Set();
  let queued = false;
  const SLICE_MS = 50;

  function queueRender(chart) {
    queue.add(chart);
    if (queued) return;
    queued = true;
    if (global.requestAnimationFrame && !document.hidden) global.requestAnimationFrame(drain);
    else setTimeout(drain, 50);
  }

  function drain() {
    const start = performance.now();
    const height = global.innerHeight || 800;
    const order = Array.from(queue).map((c) => {
      const top = c.el.getBoundingClientRect().top;
      return { c: c, onScreen: top < height && top > -400, top: top };
    });
    order.sort((a, b) => (b.onScreen - a.onScreen) || (a.top - b.top));
    for (const { c } of order) {
      if (!queue.has(c)) continue;
      queue.delete(c);
      c.pending = false;
      c.render();
      if (queue.size && performance.now() - start > SLICE_MS) { setTimeout(drain, 0); return; }
    }
    queued = queue.size > 0;
    if (queued) setTimeout(drain, 0);
  }

  // Plotly renders a subset of HTML in trace names, hover text and titles (<b>, <a href>, <br>):
  // a run named "<b>x</b>" showed a bold x. Names are user text, so they go in escaped; Plotly
  // decodes the entities back to the literal characters.
  function plotlyText(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function sortedXY(map) {
    const xs = Array.from(map.keys()).sort((a, b) => a - b);
    return { x: xs, y: xs.map((k) => map.get(k)) };
  }

  class ChartGroup {
    constructor(el, opts) {
      this.el = el;
      this.title = (opts && opts.title) || "";
      this.onZoom = (opts && opts.onZoom) || null;
      this.series = new Map(); // name -> {points: Map(step -> y), zoom: Map|null, color}
      this.alpha = (opts && opts.alpha) || 0;
      this.zoomRange = null;
      this.pending = false;
      this.plotted = false;
      this.ignoreRelayout = false;
      // lazy: draw only once show() is called (the compare page calls it when the chart scrolls
      // into view, so a page of 40 metric charts draws the few on screen first).
      this.visible = !(opts && opts.lazy);
    }
    show() {
      if (this.visible) return;
      this.visible = true;
      this.schedule();
    }
    // color: the series' fixed colour (the compare page gives each run one for every chart); without
    // it a series takes the next palette colour of this chart.
    _get(name, color) {
      let s = this.series.get(name);
      if (!s) {
        s = { points: new Map(), zoom: null, color: color || PALETTE[this.series.size % PALETTE.length] };
        this.series.set(name, s);
      } else if (color) {
        s.color = color;
      }
      return s;
    }
    setSeries(name, xs, ys, color) {
      const s = this._get(name, color);
      for (let i = 0; i < xs.length; i++) s.points.set(xs[i], ys[i]);
      this.schedule();
    }
    setZoomSeries(name, xs, ys) {
      const s = this._get(name);
      s.zoom = new Map();
      for (let i = 0; i < xs.length; i++) s.zoom.set(xs[i], ys[i]);
      if (this.zoomRange) this.el.dataset.zoomed = this.zoomRange[0] + ":" + this.zoomRange[1];
    }
    addPoint(name, step, value) {
      const s = this._get(name);
      s.points.set(step, value);
      if (s.zoom && this.zoomRange && step >= this.zoomRange[0] && step <= this.zoomRange[1]) s.zoom.set(step, value);
      this.schedule();
    }
    pointCount() {
      let n = 0;
      this.series.forEach((s) => { n += s.points.size; });
      return n;
    }
    setAlpha(alpha) { this.alpha = alpha; this.schedule(); }
    schedule() {
      if (this.pending || !this.visible) return;
      this.pending = true;
      queueRender(this);
    }
    traces() {
      const out = [];
      const smooth = this.alpha > 0;
      // SVG always: WebGL traces (scattergl) compile their draw calls with `new Function`, which the
      // app's Content-Security-Policy forbids, and a zoomed range is capped at 5,000 points per series.
      const kind = "scatter";
      this.series.forEach((s, rawName) => {
        const name = plotlyText(rawName);
        const src = this.zoomRange && s.zoom ? s.zoom : s.points;
        const { x, y } = sortedXY(src);
        out.push({ x: x, y: y, name: name, type: kind, mode: x.length < 40 ? "lines+markers" : "lines",
          line: { color: s.color, width: smooth ? 1 : 1.6 }, marker: { size: 4 },
          opacity: smooth ? 0.25 : 1, showlegend: !smooth, legendgroup: name,
          hovertemplate: name + "<br>step %{x}<br>%{y:.4g}<extra></extra>" });
        if (smooth) {
          out.push({ x: x, y: ema(y, this.alpha), name: name, type: kind, mode: "lines",
            line: { color: s.color, width: 2 }, legendgroup: name,
            hovertemplate: name + " (EMA)<br>step %{x}<br>%{y:.4g}<extra></extra>" });
        }
      });
      return out;
    }
    // Steps are whole numbers: over a span of fewer than 7 steps Plotly's automatic ticks fall between
    // them (two eval points at steps 5 and 6 got ticks 5, 5.2, ... 6), so a short span ticks every step.
    stepAxis() {
      let lo = Infinity, hi = -Infinity;
      this.series.forEach((s) => {
        s.points.forEach((_y, x) => { if (x < lo) lo = x; if (x > hi) hi = x; });
      });
      const axis = { title: { text: "step", font: { size: 11 } }, nticks: 7, type: "linear", tickformat: "~s" };
      if (isFinite(lo) && hi - lo < 7) Object.assign(axis, { tickmode: "linear", tick0: lo, dtick: 1 });
      return Object.assign(axis, AXIS);
    }
    render() {
      if (!global.Plotly) return;
      const layout = {
        margin: { l: 50, r: 10, t: 10, b: 35 }, hovermode: "x unified",
        // The legend sits above the plot: below it, it covered the step axis's title.
        legend: { orientation: "h", x: 0, xanchor: "left", y: 1.02, yanchor: "bottom", font: { size: 11 } },
        // Both axes are numbers: saying so spares Plotly its type detection (it tries every value
        // as a date, then as a category) on each draw.
        xaxis: this.stepAxis(),
        yaxis: Object.assign({ nticks: 6, type: "linear" }, AXIS),
        uirevision: "keep", // keep the user's zoom across live updates
      };
      this.ignoreRelayout = true;
      const p = global.Plotly.react(this.el, this.traces(), layout, { displaylogo: false, responsive: true });
      const done = () => { this.ignoreRelayout = false; };
      if (p && p.then) p.then(done, done); else done();
      this.el.dataset.points = String(this.pointCount());
      if (!this.plotted) {
        this.plotted = true;
        this.el.on("plotly_relayout", (ev) => this._relayout(ev));
      }
    }
    _relayout(ev) {
      if (!ev || !this.onZoom) return;
      if (ev["xaxis.autorange"] || ev.autosize) {
        if (this.zoomRange) {
          this.zoomRange = null;
          delete this.el.dataset.zoomed;
          this.series.forEach((s) => { s.zoom = null; });
          this.schedule();
        }
        return;
      }
      const x0 = ev["xaxis.range[0]"] !== undefined ? ev["xaxis.range[0]"] : (ev["xaxis.range"] || [])[0];
      const x1 = ev["xaxis.range[1]"] !== undefined ? ev["xaxis.range[1]"] : (ev["xaxis.range"] || [])[1];
      if (x0 === undefined || x1 === undefined) return;
      this.zoomRange = [Math.floor(x0), Math.ceil(x1)];
      this.onZoom(this, this.zoomRange[0], this.zoomRange[1]);
    }
  }

  function groupOf(key, groups) {
    for (const g of groups) {
      if ((g.prefixes || []).some((p) => key.startsWith(p))) return g.id;
    }
    return "other";
  }

  function formatDuration(sec) {
    if (sec === null || sec === undefined || !isFinite(sec)) return "";
    sec = Math.max(0, Math.round(sec));
    const h = Math.floor(sec / 3600), m = Math.floor((sec % 3600) / 60), s = sec % 60;
    if (h) return h + "h " + m + "m";
    if (m) return m + "m " + s + "s";
    return s + "s";
  }

  function fmt(v) {
    if (v === null || v === undefined || v === "" || !isFinite(v)) return "—";
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return Number(v).toExponential(3);
    return String(Number(Number(v).toPrecision(4)));
  }

  global.GrueCharts = { ChartGroup: ChartGroup, ema: ema, groupOf: groupOf, formatDuration: formatDuration, fmt: fmt,
    AXIS: AXIS, plotlyText: plotlyText };
})(window);
