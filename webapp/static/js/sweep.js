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
  const runs = data.runs.filter((r) => r.metric !== null && r.metric !== undefined);
  if (!runs.length) { el.textContent = "No run has reported " + data.metric + " yet."; return; }
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
  const axes = data.paths.map((p, i) => axis(p, runs.map((r) => r.values[i])));
  axes.push(axis(data.metric, runs.map((r) => r.metric)));
  const xs = axes.map((_, i) => i);
  const traces = runs.map((r, k) => ({
    type: "scatter",
    mode: "lines+markers",
    x: xs,
    y: axes.map((a) => a.pos[k]),
    name: r.name,
    line: { color: r.color, width: 2 },
    marker: { size: 7 },
    text: axes.map((a, i) => `${r.name}<br>${a.label} = ${fmt(i < data.paths.length ? r.values[i] : r.metric)}`),
    hoverinfo: "text",
  }));
  const notes = [];
  axes.forEach((a, i) => {
    notes.push({ x: i, y: 1.04, text: a.high, showarrow: false, yanchor: "bottom", font: { size: 11 } });
    notes.push({ x: i, y: -0.04, text: a.low, showarrow: false, yanchor: "top", font: { size: 11 } });
  });
  const shapes = xs.map((x) => ({ type: "line", x0: x, x1: x, y0: 0, y1: 1, line: { color: "#999", width: 1 } }));
  window.Plotly.newPlot(el, traces, {
    margin: { l: 40, r: 40, t: 30, b: 70 },
    showlegend: false,
    xaxis: { tickvals: xs, ticktext: axes.map((a) => a.label), zeroline: false, showgrid: false, fixedrange: true, side: "bottom" },
    yaxis: { visible: false, range: [-0.15, 1.15], fixedrange: true },
    annotations: notes,
    shapes: shapes,
  }, { displaylogo: false, responsive: true }).then(() => { el.dataset.drawn = String(runs.length); });
})();
