// Builds ../vendor/plotly.min.js: a partial plotly.js bundle with only the traces in entry.js.
// Usage (from this directory): npm ci && npm run build    (see README.md)
import { readFileSync, writeFileSync, copyFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import path from "node:path";
import * as esbuild from "esbuild";

const here = path.dirname(fileURLToPath(import.meta.url));
const vendor = path.join(here, "..", "vendor");
const plotlyDir = path.join(here, "node_modules", "plotly.js");
const version = JSON.parse(readFileSync(path.join(plotlyDir, "package.json"), "utf8")).version;
const traces = [...readFileSync(path.join(here, "entry.js"), "utf8").matchAll(/plotly\.js\/lib\/(\w+)/g)]
  .map((m) => m[1])
  .filter((t) => t !== "core");

// The first line asks V8 to compile every function of the bundle eagerly, on the script-streaming
// thread while the file downloads, instead of lazily on the main thread during the first chart
// (Chrome's explicit compile hints; other engines read a comment). Measured on the run page's first
// visit: the renderer's script time fell by about a third (docs/benchmarks.md).
const banner =
  "//# allFunctionsCalledOnLoad\n" +
  "/**\n" +
  `* plotly.js v${version}, partial bundle of GRUE Studio: scatter (core) + ${traces.join(", ")}\n` +
  "* Copyright 2012-2026, Plotly, Inc. All rights reserved. Licensed under the MIT license (plotly.js-LICENSE.txt)\n" +
  "* Built by webapp/static/build/build.mjs\n" +
  "*/";

const result = await esbuild.build({
  entryPoints: [path.join(here, "entry.js")],
  outfile: path.join(vendor, "plotly.min.js"),
  bundle: true,
  minify: true,
  format: "iife",
  globalName: "Plotly",
  target: "es2016",
  // As plotly.js's own esbuild-config.js: one regl flavour, browser globals.
  alias: { regl: "@plotly/regl" },
  // The only CSS import is maplibre's, reached for map traces alone (not in this bundle).
  loader: { ".css": "empty" },
  define: { global: "window", "define.amd": "false", "process.env.NODE_DEBUG": "false" },
  banner: { js: banner },
  legalComments: "linked", // the bundled packages' license notices: vendor/plotly.min.js.LEGAL.txt
  metafile: true,
  logLevel: "info",
});
copyFileSync(path.join(plotlyDir, "LICENSE"), path.join(vendor, "plotly.js-LICENSE.txt"));
const bytes = Object.entries(result.metafile.outputs).find(([name]) => name.endsWith(".js"))[1].bytes;
writeFileSync(
  path.join(vendor, "plotly.min.js.json"),
  JSON.stringify({ plotly_js: version, esbuild: esbuild.version, traces: ["scatter", ...traces], bytes }, null, 2) + "\n",
);
console.log(`plotly.js ${version}: ${traces.join(", ")} → vendor/plotly.min.js (${(bytes / 1e6).toFixed(2)} MB)`);
