// The over-optimisation watch's two charts (run page and compare view): proxy reward and gold
// against training progress and against sqrt(KL) from the initial policy (Gao et al. 2022), the
// proxy on the left axis and the gold on the right one, the best evaluation by gold starred.
// Data come from the page's json_script "overopt-data": one watch (run page) or a list (compare).
(function () {
  "use strict";
  const node = document.getElementById("overopt-data");
  if (!node || !window.Plotly) return;
  const parsed = JSON.parse(node.textContent);
  const watches = Array.isArray(parsed) ? parsed : [parsed];
  const PALETTE = ["#2f6fed", "#d64545", "#1f9d55", "#c77c02", "#8e44ad", "#16a2b8"];

  function traces(xKey) {
    const out = [];
    watches.forEach(function (w, i) {
      const color = PALETTE[i % PALETTE.length];
      const pts = w.points.filter(function (p) { return p[xKey] !== null; });
      const label = watches.length > 1 ? "#" + w.run_id + " " : "";
      const xs = pts.map(function (p) { return p[xKey]; });
      out.push({ x: xs, y: pts.map(function (p) { return p.proxy; }), name: label + "proxy (" + w.proxy_key + ")",
        mode: "lines+markers", line: { color: color, dash: "dot" }, yaxis: "y" });
      out.push({ x: xs, y: pts.map(function (p) { return p.gold; }), name: label + "gold (" + w.gold_key + ")",
        mode: "lines+markers", line: { color: color }, yaxis: "y2" });
      if (w.best && w.best[xKey] !== null) {
        out.push({ x: [w.best[xKey]], y: [w.best.gold], name: label + "best by gold (step " + w.best.step + ")",
          mode: "markers", marker: { symbol: "star", size: 14, color: color }, yaxis: "y2" });
      }
    });
    return out;
  }

  function draw(id, xKey, title) {
    const el = document.getElementById(id);
    if (!el) return;
    const data = traces(xKey);
    window.Plotly.newPlot(el, data, {
      margin: { l: 50, r: 50, t: 10, b: 40 }, height: 300, showlegend: true,
      legend: { orientation: "h", y: -0.25, font: { size: 10 } },
      xaxis: { title: { text: title }, exponentformat: "SI", automargin: true },
      yaxis: { title: { text: "proxy" }, automargin: true },
      yaxis2: { title: { text: "gold" }, overlaying: "y", side: "right", automargin: true },
    }, { displaylogo: false, responsive: true });
    el.dataset.traces = String(data.length);
    el.dataset.points = String(data.reduce(function (n, t) { return n + t.x.length; }, 0));
  }

  draw("overopt-by-step", "step", "training step");
  draw("overopt-by-kl", "sqrt_kl", "√KL from the initial policy");
})();
