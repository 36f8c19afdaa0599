// The plotly.js traces GRUE Studio draws, and nothing else (see README.md before adding one).
"use strict";

var Plotly = require("plotly.js/lib/core"); // includes scatter (run page, compare, annotation ratings)

Plotly.register([
  require("plotly.js/lib/scattergl"), // long full-resolution zoom ranges (webapp/static/js/charts.js)
  require("plotly.js/lib/bar"), // GRUE leaderboard, annotation Likert and metric agreement charts
  require("plotly.js/lib/heatmap"), // annotation win-rate matrix
  require("plotly.js/lib/parcoords"), // hyperparameter sweeps (planned)
]);

module.exports = Plotly;
