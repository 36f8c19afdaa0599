// Sweep page: parallel coordinates, one line per run, from the varied config values to the final
// metric (runs without the metric yet are left out). Drawn with Plotly's SVG scatter, not its
// WebGL `parcoords` trace: that trace compiles shaders with eval (regl), which the app's
// Content-Security-Policy forbids. Each axis is scaled to its own min..max (labelled at both ends);
// text values become evenly spaced categories. Each run's line has the run's colour, the one its curves
// have on the compare page (the table's swatches are the legend).
(function () {
  "use strict";
  const el = document.getElementById("sweep-parcoords");
  const src = document.getElementById("sweep-data");
  if (!el || !src || !window.Plotly) return;
  const data = JSON.parse(src.textContent);
  // Plotly renders a subset of HTML in names and hover text: run names and values go in escaped.
  const esc = (t) => String(t).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  const fmt = (v) => (typeof v === "number" ? Number(v.toPrecision(4)).toString() : String(v));
  function axis(label, values) {
    if (values.every((v) => typeof v === "number")) {
      const lo = Math.min(...values), hi = Math.max(...values);
      const scale = (v) => (hi > lo ? (v - lo) / (hi - lo) : 0.5);
      return { label: label, pos: values.map(scale), low: fmt(lo), high: fmt(hi) };
    }
    const cats = Array.from(new Set(values.map(String))).sort();
    const scale = (v) => (cats.length > 1 ? cats.indexOf(String(v)) / (cats.length - 1) : 0.5);
    return { label: label, pos: values.map(scale), low: cats[0], high: cats[cats.length - 1] };
  }
  function draw() {
  const runs = data.runs.filter((r) => r.metric !== null && r.metric !== undefined);
  if (!runs.length) { el.textContent = "No run has reported " + data.metric + " yet."; return; }
  if (!el.querySelector(".main-svg")) el.textContent = "";
  const axes = data.paths.map((p, i) => axis(p, runs.map((r) => r.values[i])));
  axes.push(axis(data.metric, runs.map((r) => r.metric)));
  const xs = axes.map((_, i) => i);
  const traces = runs.map((r, k) => ({
    type: "scatter",
    mode: "lines+markers",
    x: xs,
    y: axes.map((a) => a.pos[k]),
    name: esc(r.name),
    line: { color: r.color, width: 2 },
    marker: { size: 7 },
    text: axes.map((a, i) => `${esc(r.name)}<br>${esc(a.label)} = ${esc(fmt(i < data.paths.length ? r.values[i] : r.metric))}`),
    hoverinfo: "text",
  }));
  const notes = [];
  axes.forEach((a, i) => {
    notes.push({ x: i, y: 1.04, text: esc(a.high), showarrow: false, yanchor: "bottom", font: { size: 11 } });
    notes.push({ x: i, y: -0.04, text: esc(a.low), showarrow: false, yanchor: "top", font: { size: 11 } });
  });
  const shapes = xs.map((x) => ({ type: "line", x0: x, x1: x, y0: 0, y1: 1, line: { color: "#999", width: 1 } }));
  window.Plotly.react(el, traces, {
    margin: { l: 40, r: 40, t: 30, b: 70 },
    showlegend: false,
    xaxis: { tickvals: xs, ticktext: axes.map((a) => esc(a.label)), zeroline: false, showgrid: false, fixedrange: true, side: "bottom" },
    yaxis: { visible: false, range: [-0.15, 1.15], fixedrange: true },
    annotations: notes,
    shapes: shapes,
  }, { displaylogo: false, responsive: true }).then(() => { el.dataset.drawn = String(runs.length); });
  }
  draw();

  // Live status: while any run is queued or running, ask for the runs' statuses and final metrics
  // every few seconds and update the table, the chart and the cancel button (hidden once nothing
  // is left to cancel). Text goes in with textContent only.
  const liveSrc = document.getElementById("sweep-live-config");
  if (!liveSrc) return;
  const live = JSON.parse(liveSrc.textContent);
  const note = document.getElementById("sweep-live");
  const cancel = document.getElementById("cancel-sweep");
  const POLL_MS = 3000;
  function apply(status) {
    let changed = false;
    status.runs.forEach((r) => {
      const badge = document.querySelector('[data-status-of="' + r.id + '"]');
      if (badge && badge.textContent !== r.status) {
        badge.textContent = r.status;
        badge.className = "badge status-" + r.status;
      }
      const cell = document.querySelector('[data-metric-of="' + r.id + '"]');
      if (cell) cell.textContent = r.metric === null || r.metric === undefined ? "–" : Number(r.metric).toFixed(4);
      const row = data.runs.find((x) => x.id === r.id);
      if (row && row.metric !== r.metric) { row.metric = r.metric; changed = true; }
    });
    if (cancel) cancel.hidden = status.cancellable === 0;
    if (note) note.textContent = status.active ? "Updating while runs are queued or running." : "Every run has finished.";
    if (changed) draw();
    return status.active;
  }
  function poll() {
    fetch(live.status_url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((r) => (r.ok ? r.json() : Promise.reject(r.status)))
      .then((status) => { if (apply(status)) setTimeout(poll, POLL_MS); })
      .catch(() => setTimeout(poll, POLL_MS * 3));
  }
  if (live.active) setTimeout(poll, POLL_MS);
})();
