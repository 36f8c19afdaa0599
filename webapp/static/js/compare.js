// Compare page: one chart per metric key, one curve per run (overlaid), EMA smoothing as on the
// run page, full resolution fetched per run when the user zooms.
(function () {
  "use strict";
  const cfgEl = document.getElementById("compare-config");
  if (!cfgEl) return;
  const cfg = JSON.parse(cfgEl.textContent);
  const GC = window.GrueCharts;
  const charts = new Map(); // metric key -> ChartGroup
  const slider = document.getElementById("smoothing");
  const sliderValue = document.getElementById("smoothing-value");
  let alpha = slider ? parseFloat(slider.value) : 0;
  const label = (run) => "#" + run.id + " " + run.name;

  function chartFor(key) {
    let chart = charts.get(key);
    if (chart) return chart;
    const none = document.getElementById("no-metrics");
    if (none) none.remove();
    const card = document.createElement("div");
    card.className = "card chart-card";
    const h = document.createElement("h3");
    h.textContent = key;
    const el = document.createElement("div");
    el.className = "chart";
    el.dataset.key = key;
    card.appendChild(h);
    card.appendChild(el);
    // Sort charts by metric group, then key.
    const container = document.getElementById("charts");
    const rank = (k) => cfg.groups.findIndex((g) => g.id === GC.groupOf(k, cfg.groups)) + "|" + k;
    const before = Array.from(container.children).find((c) => {
      const other = c.querySelector(".chart");
      return other && rank(other.dataset.key) > rank(key);
    });
    container.insertBefore(card, before || null);
    chart = new GC.ChartGroup(el, { title: key, alpha: alpha, onZoom: (c, x0, x1) => zoom(key, c, x0, x1) });
    charts.set(key, chart);
    return chart;
  }

  function zoom(key, chart, x0, x1) {
    cfg.runs.forEach((run) => {
      const url = run.series_url + "?keys=" + encodeURIComponent(key) + "&x0=" + x0 + "&x1=" + x1 + "&max_points=5000";
      fetch(url, { credentials: "same-origin" }).then((r) => r.json()).then((data) => {
        const s = data.series[key];
        if (s && chart.zoomRange) { chart.setZoomSeries(label(run), s.x, s.y); chart.schedule(); }
      }).catch(() => {});
    });
  }

  Promise.all(cfg.runs.map((run) => fetch(run.series_url, { credentials: "same-origin" })
    .then((r) => r.json()).then((data) => ({ run: run, data: data }))))
    .then((results) => {
      results.forEach(({ run, data }) => {
        Object.values(data.series).forEach((s) => chartFor(s.key).setSeries(label(run), s.x, s.y));
      });
      if (!charts.size) {
        const none = document.getElementById("no-metrics");
        if (none) none.textContent = "These runs have no metrics yet.";
      }
    });

  if (slider) {
    slider.addEventListener("input", () => {
      alpha = parseFloat(slider.value);
      sliderValue.textContent = alpha.toFixed(2);
      charts.forEach((c) => c.setAlpha(alpha));
    });
  }
})();
