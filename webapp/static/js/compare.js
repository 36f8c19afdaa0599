// Compare page: the server lays out one chart per metric key inside the run page's groups
// (Reward, KL & β, ...: views.metric_group); this fills each chart with a curve per run, applies
// the shared EMA smoothing and fetches full resolution per run when the user zooms.
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

  // Charts are drawn when they come near the screen: 40 metrics × 12 runs would otherwise all be
  // drawn before the first one shows (and charts in a folded group have no size to draw at).
  const observer = "IntersectionObserver" in window ? new IntersectionObserver((entries) => {
    entries.forEach((e) => {
      const chart = e.isIntersecting && charts.get(e.target.dataset.key);
      if (chart) { chart.show(); observer.unobserve(e.target); }
    });
  }, { rootMargin: "300px 0px" }) : null;

  function makeChart(el) {
    const key = el.dataset.key;
    const chart = new GC.ChartGroup(el, {
      title: key, alpha: alpha, lazy: observer !== null, onZoom: (c, x0, x1) => zoom(key, c, x0, x1),
    });
    charts.set(key, chart);
    if (observer) observer.observe(el);
    return chart;
  }

  function placeholder(key, gid) {
    // A key that appeared after the page was rendered (a live run): add its chart to its group.
    const container = document.getElementById("charts");
    let group = container.querySelector('.chart-group[data-group="' + CSS.escape(gid) + '"] .charts');
    if (!group) {
      const meta = cfg.groups.find((g) => g.id === gid) || { title: gid };
      const details = document.createElement("details");
      details.className = "chart-group many";
      details.dataset.group = gid;
      details.open = true;
      const summary = document.createElement("summary");
      const h = document.createElement("h3");
      h.textContent = meta.title;
      summary.appendChild(h);
      group = document.createElement("div");
      group.className = "charts";
      details.appendChild(summary);
      details.appendChild(group);
      container.appendChild(details);
      const none = document.getElementById("no-metrics");
      if (none) none.remove();
    }
    const card = document.createElement("div");
    card.className = "card chart-card";
    const h4 = document.createElement("h4");
    h4.className = "mono";
    h4.textContent = key;
    const el = document.createElement("div");
    el.className = "chart";
    el.dataset.key = key;
    el.dataset.group = gid;
    card.appendChild(h4);
    card.appendChild(el);
    group.appendChild(card);
    return el;
  }

  function chartFor(key, gid) {
    return charts.get(key) || makeChart(placeholder(key, gid || "other"));
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

  document.querySelectorAll("#charts .chart[data-key]").forEach(makeChart);

  // The legend's swatches take each run's colour (the one its curves have in every chart).
  document.querySelectorAll("#run-legend [data-run]").forEach((li) => {
    const run = cfg.runs.find((r) => String(r.id) === li.dataset.run);
    const swatch = li.querySelector(".swatch");
    if (run && swatch) swatch.style.backgroundColor = run.color;
  });

  Promise.all(cfg.runs.map((run) => fetch(run.series_url, { credentials: "same-origin" })
    .then((r) => r.json()).then((data) => ({ run: run, data: data }))))
    .then((results) => {
      results.forEach(({ run, data }) => {
        Object.values(data.series).forEach((s) => {
          chartFor(s.key, (data.groups || {})[s.key]).setSeries(label(run), s.x, s.y, run.color);
        });
      });
      document.getElementById("charts").dataset.loaded = "1";
    });

  // A chart drawn inside a closed group has no width: redraw when the group opens.
  document.querySelectorAll("#charts details.chart-group").forEach((d) => {
    d.addEventListener("toggle", () => {
      if (!d.open) return;
      d.querySelectorAll(".chart[data-key]").forEach((el) => {
        const c = charts.get(el.dataset.key);
        if (c && c.plotted && window.Plotly) window.Plotly.Plots.resize(el);
      });
    });
  });

  if (slider) {
    slider.addEventListener("input", () => {
      alpha = parseFloat(slider.value);
      sliderValue.textContent = alpha.toFixed(2);
      charts.forEach((c) => c.setAlpha(alpha));
    });
  }

  // Final metrics: filter the rows by a substring of the key.
  const filter = document.getElementById("final-filter");
  if (filter) {
    filter.addEventListener("input", () => {
      const q = filter.value.trim().toLowerCase();
      document.querySelectorAll("#final-metrics tbody").forEach((body) => {
        let shown = 0;
        body.querySelectorAll("tr[data-key]").forEach((tr) => {
          const hit = !q || tr.dataset.key.toLowerCase().includes(q);
          tr.hidden = !hit;
          if (hit) shown++;
        });
        body.hidden = shown === 0;
      });
    });
  }
})();
