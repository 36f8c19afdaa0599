// Results page: tables and Plotly charts from the JSON the view embeds (textContent only: no HTML injection).
(function () {
  "use strict";
  const res = JSON.parse(document.getElementById("results-data").textContent);
  // Plotly renders a few HTML-like tags (<a>, <b>) inside labels: run names are user text, so they
  // go to the charts entity-escaped (shown literally), and to the tables through textContent.
  const rawLabel = function (s) { return (res.labels && res.labels[s]) || s; };
  const esc = function (t) { return String(t).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;"); };
  const label = rawLabel;
  const chartLabel = function (s) { return esc(rawLabel(s)); };
  const fmt = function (x, d) { return x === null || x === undefined ? "—" : Number(x).toFixed(d === undefined ? 3 : d); };
  function row(tbody, cells) {
    const tr = document.createElement("tr");
    cells.forEach(function (c, i) {
      const td = document.createElement("td");
      td.textContent = c;
      if (i > 0 && /^[-\d.—–\s()]+$/.test(String(c)) && String(c) !== "") td.className = "num";
      tr.appendChild(td);
    });
    tbody.appendChild(tr);
  }
  const plot = function (id, data, layout) {
    const el = document.getElementById(id);
    if (!el || typeof Plotly === "undefined") return;
    Plotly.newPlot(el, data, Object.assign({margin: {t: 30, l: 160, r: 20, b: 80}}, layout), {displaylogo: false, responsive: true});
  };

  if (res.kind === "pairwise") {
    const bt = res.bradley_terry, wr = res.win_rates;
    // The ranking table is rendered on the server (the same template as the leaderboard's); the chart
    // draws the same ratings and intervals.
    const order = bt.systems.map(function (s, i) { return i; }).sort(function (a, b) { return bt.rating[b] - bt.rating[a]; });
    plot("bt-chart", [{
      type: "scatter", mode: "markers", x: order.map(function (i) { return bt.rating[i]; }),
      y: order.map(function (i) { return chartLabel(bt.systems[i]); }),
      error_x: {type: "data", symmetric: false, array: order.map(function (i) { return bt.high[i] - bt.rating[i]; }),
        arrayminus: order.map(function (i) { return bt.rating[i] - bt.low[i]; })},
      marker: {size: 10},
    }], {title: "Bradley–Terry rating (95% CI)", xaxis: {title: "rating"}, yaxis: {autorange: "reversed"}});
    const names = wr.systems.map(chartLabel);
    const text = wr.rate.map(function (r, i) { return r.map(function (v, j) {
      return v === null ? "" : fmt(v, 2) + " [" + fmt(wr.low[i][j], 2) + ", " + fmt(wr.high[i][j], 2) + "] n=" + wr.counts[i][j];
    }); });
    plot("winrate-chart", [{type: "heatmap", z: wr.rate, x: names, y: names, text: text, hoverinfo: "text",
      zmin: 0, zmax: 1, colorscale: "RdBu", texttemplate: "%{z:.2f}"}], {title: "Win rate of row vs column", yaxis: {autorange: "reversed"}});
    if (res.left_win_rate !== null && res.left_win_rate !== undefined) {
      document.getElementById("position-bias").textContent = "Position check: the output shown on the left won " +
        fmt(100 * res.left_win_rate, 1) + "% of decided judgments (50% = no position bias).";
    }
  } else {
    const traces = [];
    const tb = document.querySelector("#likert-table tbody");
    (res.axes || []).forEach(function (ax) {
      const by = res.likert[ax] || {};
      const systems = Object.keys(by);
      systems.forEach(function (s) { const m = by[s]; row(tb, [ax, label(s), fmt(m.mean, 2), fmt(m.low, 2) + " – " + fmt(m.high, 2), String(m.n)]); });
      traces.push({type: "bar", name: esc(ax), x: systems.map(chartLabel), y: systems.map(function (s) { return by[s].mean; }),
        error_y: {type: "data", symmetric: false, array: systems.map(function (s) { return by[s].high - by[s].mean; }),
          arrayminus: systems.map(function (s) { return by[s].mean - by[s].low; })}});
    });
    plot("likert-chart", traces, {barmode: "group", yaxis: {range: [0, 5.5], title: "mean score"}, margin: {l: 60, t: 30}});
  }

  const at = document.querySelector("#agreement-table tbody");
  const ct = document.querySelector("#cohen-table tbody");
  const ag = res.agreement || {};
  if (res.kind === "pairwise") {
    row(at, ["Fleiss' kappa (A/B/tie/both bad)", fmt(ag.fleiss_kappa), ag.n_multi + " items with ≥2 judgments"]);
    row(at, ["Krippendorff's alpha (nominal)", fmt(ag.krippendorff_alpha), "1 = perfect, 0 = chance"]);
    (ag.cohen || []).forEach(function (c) { row(ct, [c.a, c.b, String(c.n), fmt(c.kappa)]); });
  } else {
    Object.keys(ag.per_axis || {}).forEach(function (ax) {
      const a = ag.per_axis[ax];
      row(at, ["Krippendorff's alpha (ordinal), " + ax, fmt(a.krippendorff_alpha), a.n_multi + " items with ≥2 judgments"]);
      row(at, ["Fleiss' kappa, " + ax, fmt(a.fleiss_kappa), "scores as categories"]);
      (a.cohen || []).forEach(function (c) { row(ct, [ax, c.a, c.b, String(c.n), fmt(c.kappa)]); });
    });
  }
  const ann = document.querySelector("#annotator-table tbody");
  (res.annotators || []).forEach(function (a) {
    row(ann, [a.annotator, String(a.count), fmt(a.median_seconds, 1), a.gold_n ? fmt(a.gold_accuracy) + " (" + a.gold_n + ")" : "—",
      a.majority_n ? fmt(a.majority_agreement) + " (" + a.majority_n + ")" : "—"]);
  });
  const mt = document.querySelector("#metric-table tbody");
  const mnames = Object.keys(res.metric_agreement || {});
  mnames.forEach(function (m) { const r = res.metric_agreement[m]; row(mt, [m, String(r.n), fmt(r.agreement), fmt(r.tau), String(r.metric_ties)]); });
  if (mnames.length) {
    plot("metric-chart", [{type: "bar", x: mnames.map(esc), y: mnames.map(function (m) { return res.metric_agreement[m].agreement; })}],
      {title: "Agreement with human preference", yaxis: {range: [0, 1]}, margin: {l: 60, t: 30, b: 100},
       shapes: [{type: "line", xref: "paper", x0: 0, x1: 1, y0: 0.5, y1: 0.5, line: {dash: "dot"}}]});
  } else { row(mt, ["(no automatic metrics stored with these items)", "", "", "", ""]); }
})();
