// Sweep page: a parallel-coordinates chart, one line per run, from the varied config values to the
// final metric (runs without the metric yet are left out; non-numeric values become category ticks).
(function () {
  "use strict";
  const el = document.getElementById("sweep-parcoords");
  const src = document.getElementById("sweep-data");
  if (!el || !src || !window.Plotly) return;
  const data = JSON.parse(src.textContent);
  const runs = data.runs.filter((r) => r.metric !== null && r.metric !== undefined);
  if (!runs.length) { el.textContent = "No run has reported " + data.metric + " yet."; return; }
  function dimension(label, values) {
    if (values.every((v) => typeof v === "number")) return { label: label, values: values };
    const cats = Array.from(new Set(values.map(String)));
    return { label: label, values: values.map((v) => cats.indexOf(String(v))), tickvals: cats.map((_, i) => i), ticktext: cats };
  }
  const dims = data.paths.map((p, i) => dimension(p, runs.map((r) => r.values[i])));
  const metric = runs.map((r) => r.metric);
  dims.push({ label: data.metric, values: metric });
  window.Plotly.newPlot(el, [{
    type: "parcoords",
    line: { color: metric, colorscale: "Viridis", showscale: true },
    dimensions: dims,
  }], { margin: { l: 60, r: 60, t: 40, b: 20 } }, { displaylogo: false, responsive: true });
  el.dataset.drawn = String(runs.length);
})();
