// The plotly.js traces GRUE Studio draws, and nothing else (see README.md before adding one).
// No WebGL trace (scattergl, parcoords): regl compiles its draw calls with `new Function`, which the
// app's Content-Security-Policy forbids (no 'unsafe-eval'), so they could never draw here.
"use strict";

var Plotly = require("plotly.js/lib/core"); // includes scatter (run page, compare, annotation ratings)

Plotly.register([
  require("plotly.js/lib/bar"), // GRUE leaderboard, annotation Likert and metric agreement charts
  require("plotly.js/lib/heatmap"), // annotation win-rate matrix
]);

module.exports = Plotly;
