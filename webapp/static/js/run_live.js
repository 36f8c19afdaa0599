// Live run page: charts from the downsampled series endpoint, then a websocket that sends its
// cursors on every (re)connect so that the server replays exactly what this page has not seen.
// Model and user text is only ever inserted with textContent (never innerHTML).
(function () {
  "use strict";
  const cfgEl = document.getElementById("run-live-config");
  if (!cfgEl) return;
  const cfg = JSON.parse(cfgEl.textContent);
  const GC = window.GrueCharts;
  const FINISHED = ["succeeded", "failed", "cancelled", "lost"];
  const MAX_SAMPLES = 50, MAX_LOG = 500;

  const state = {
    metricCursor: 0,
    sampleCursor: cfg.sample_cursor || 0,
    logCursor: cfg.log_cursor || 0,
    seenPoints: new Set(),
    charts: new Map(), // group id -> ChartGroup
    keyGroup: new Map(),
    status: cfg.status,
    ws: null,
    attempts: 0,
    connected: false,
    messages: 0,
    // The buttons the server rendered with the page: no fragment fetch until the status changes.
    actionsKey: cfg.status + ":" + Boolean(cfg.cancel_requested),
  };
  const slider = document.getElementById("smoothing");
  const sliderValue = document.getElementById("smoothing-value");
  let alpha = slider ? parseFloat(slider.value) : 0;

  // Charts are drawn when they come near the screen (the compare page's rule): a first visit draws
  // the first screen's charts only, and those below it as the page scrolls (300 px ahead).
  const observer = "IntersectionObserver" in window ? new IntersectionObserver((entries) => {
    entries.forEach((e) => {
      const chart = e.isIntersecting && state.charts.get(e.target.dataset.chart);
      if (chart) { chart.show(); observer.unobserve(e.target); }
    });
  }, { rootMargin: "300px 0px" }) : null;

  // Which chart a key goes to: its group's, or (per-key groups: eval metrics, training stats, DPO's
  // preference rewards) a chart of its own, since those quantities do not share a unit or a scale.
  function chartIdOf(key) {
    let id = state.keyGroup.get(key);
    if (!id) {
      const gid = GC.groupOf(key, cfg.groups);
      const meta = cfg.groups.find((g) => g.id === gid) || {};
      id = meta.per_key ? gid + ":" + key : gid;
      state.keyGroup.set(key, id);
    }
    return id;
  }

  // The value model's keys of an algorithm that has none (GRPO logs value/mean 0): not charted.
  function hiddenKey(key) {
    return (cfg.hidden_keys || []).some((p) => key.startsWith(p));
  }

  function hasValue(ys) {
    return ys.some((y) => y !== null && y !== undefined && isFinite(y));
  }

  // The chart of a key; null when the key is hidden, or when it has no chart yet and ``ys`` holds no
  // number (a series of NaNs would be an empty card).
  function chartFor(key, ys) {
    if (hiddenKey(key)) return null;
    const cid = chartIdOf(key);
    let chart = state.charts.get(cid);
    if (!chart) {
      if (ys && !hasValue(ys)) return null;
      const none = document.getElementById("no-metrics");
      if (none) none.remove();
      const gid = cid.split(":")[0];
      const meta = cfg.groups.find((g) => g.id === gid) || { title: gid };
      const card = document.createElement("div");
      card.className = "card chart-card";
      const h = document.createElement("h3");
      h.textContent = cid === gid ? meta.title : meta.title + " · " + key;
      const el = document.createElement("div");
      el.className = "chart";
      el.dataset.group = gid;
      el.dataset.chart = cid;
      if (cid !== gid) el.dataset.key = key;
      el.id = "chart-" + cid.replace(/[^A-Za-z0-9_-]/g, "_");
      card.appendChild(h);
      card.appendChild(el);
      // Keep charts in the configured group order (a per-key group's charts in order of arrival).
      const container = document.getElementById("charts");
      const order = cfg.groups.map((g) => g.id);
      const before = Array.from(container.children).find((c) => {
        const other = c.querySelector(".chart");
        return other && order.indexOf(other.dataset.group) > order.indexOf(gid);
      });
      container.insertBefore(card, before || null);
      chart = new GC.ChartGroup(el, { title: meta.title, alpha: alpha, onZoom: zoom, lazy: observer !== null });
      chart.keys = new Set();
      state.charts.set(cid, chart);
      if (observer) observer.observe(el);
    }
    chart.keys.add(key);
    return chart;
  }

  function zoom(chart, x0, x1) {
    // Full resolution for the visible range (the overview may be downsampled).
    const keys = Array.from(chart.keys).join(",");
    const url = cfg.series_url + "?keys=" + encodeURIComponent(keys) + "&x0=" + x0 + "&x1=" + x1 + "&max_points=5000";
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((r) => r.json())
      .then((data) => {
        if (!chart.zoomRange || chart.zoomRange[0] !== x0 || chart.zoomRange[1] !== x1) return;
        Object.values(data.series).forEach((s) => chart.setZoomSeries(s.key, s.x, s.y));
        chart.schedule();
      })
      .catch(() => {});
  }

  function applySeries(series) {
    // One entry per key: parallel arrays, ids ascending (see webapp/runs/protocol.py).
    series.forEach((s) => {
      const chart = chartFor(s.key, s.values);
      for (let i = 0; i < s.ids.length; i++) {
        const id = s.ids[i];
        if (state.seenPoints.has(id)) continue;
        state.seenPoints.add(id);
        if (id > state.metricCursor) state.metricCursor = id;
        if (chart) chart.addPoint(s.key, s.steps[i], s.values[i]);
      }
    });
  }

  // While the run is queued, ask once whether any live worker can take it (the launch form said so
  // before queueing; a run queued by the API, a sweep or YAML, or whose worker left, says it here).
  let placementAsked = false;
  function checkPlacement(status) {
    const note = document.getElementById("placement-note");
    if (!note) return;
    if (status !== "queued") { note.hidden = true; return; }
    if (placementAsked || !cfg.placement_url) return;
    placementAsked = true;
    fetch(cfg.placement_url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((r) => r.json())
      .then((data) => {
        if (data.reason && state.status === "queued") {
          note.textContent = "Waiting for a worker: " + data.reason + ".";
          note.hidden = false;
        }
      })
      .catch(() => {});
  }

  function setStatus(msg) {
    const badge = document.getElementById("status-badge");
    if (msg.status) {
      state.status = msg.status;
      badge.textContent = msg.status + (msg.cancel_requested && msg.status === "running" ? " (cancelling…)" : "");
      badge.className = "badge status-" + msg.status;
      badge.dataset.status = msg.status;
      checkPlacement(msg.status);
      // The launch's "Run #N queued." no longer holds once the run left the queue (issue 26.9).
      if (msg.status !== "queued") document.querySelectorAll(".msg.run-queued").forEach((m) => m.remove());
    }
    // Started / finished times in the details, as the server renders them (UTC), without a reload.
    [["started-at", msg.started_at], ["finished-at", msg.finished_at]].forEach(([id, iso]) => {
      const el = document.getElementById(id);
      if (el && iso) el.textContent = String(iso).slice(0, 19).replace("T", " ");
    });
    const progress = typeof msg.progress === "number" ? msg.progress : null;
    if (progress !== null) {
      document.getElementById("progress-bar").style.width = Math.round(progress * 100) + "%";
      let text = Math.round(progress * 100) + "%";
      if (msg.current_iter !== null && msg.current_iter !== undefined && msg.total_iters) {
        text += " · iteration " + msg.current_iter + " / " + msg.total_iters;
      }
      document.getElementById("progress-text").textContent = text;
    }
    if (msg.phase !== undefined) document.getElementById("phase-text").textContent = msg.phase || "";
    const eta = document.getElementById("eta-text");
    eta.textContent = msg.status === "running" && msg.eta_seconds ? "ETA " + GC.formatDuration(msg.eta_seconds) : "";
    if (msg.error) {
      document.getElementById("error-box").hidden = false;
      document.getElementById("error-text").textContent = msg.error;
    }
    if (msg.status) {
      // Show the actions that apply now (cancel while active; retry/delete once finished).
      const finished = FINISHED.indexOf(msg.status) >= 0;
      document.querySelectorAll("[data-show]").forEach((el) => {
        el.hidden = msg.status === "draft" ? false : (el.dataset.show === "active" ? finished : !finished);
      });
      // The server decides which buttons apply (lifecycle.can_*): swap in its fragment when the
      // status changes, so e.g. Resume appears after a cancel without a reload.
      const actionsKey = msg.status + ":" + Boolean(msg.cancel_requested);
      if (cfg.actions_url && actionsKey !== state.actionsKey) {
        state.actionsKey = actionsKey;
        fetch(cfg.actions_url, { credentials: "same-origin" })
          .then((r) => (r.ok ? r.text() : Promise.reject(new Error("HTTP " + r.status))))
          .then((html) => { document.getElementById("run-actions").innerHTML = html; })
          .catch(() => {}); // the data-show toggling above stays in effect
      }
    }
  }

  // A row's per-sample scores by name (as the server renders them), e.g. the maths reward's
  // "correct 1 · extracted 18 · gold 18".
  // A per-sample detail: whole numbers exactly (an extracted answer must read as extracted), others
  // to 4 decimals (4 significant digits below 1); the same rule as the server's |detail filter.
  function detailNum(v) {
    if (v === null || v === undefined || v === "") return "—";
    if (typeof v !== "number") return String(v);
    if (!isFinite(v)) return "—";
    if (Number.isInteger(v)) return String(v);
    if (Math.abs(v) < 1) return String(Number(v.toPrecision(4)));
    return String(Number(v.toFixed(4)));
  }

  function detailText(metrics) {
    return Object.entries(metrics || {}).sort((a, b) => (a[0] < b[0] ? -1 : 1)).map(([k, v]) => {
      const num = detailNum(v); // as the server's |detail (issue 26.9)
      return k + " " + num;
    }).join(" · ");
  }

  function addSamples(rows) {
    const body = document.getElementById("samples-body");
    rows.forEach((r) => {
      if (r.id <= state.sampleCursor && body.querySelector('tr[data-sample-id="' + r.id + '"]')) return;
      if (r.id > state.sampleCursor) state.sampleCursor = r.id;
      const tr = document.createElement("tr");
      tr.dataset.sampleId = r.id;
      [[String(r.step), "num"], [r.split || "", ""], [r.prompt || "", "prompt"],
        [r.generation || "", "generation"], [GC.fmt(r.reward), "num"],
        [detailText(r.metrics), "details small"]].forEach(([text, cls]) => {
        const td = document.createElement("td");
        if (cls) td.className = cls;
        td.textContent = text; // model text: never innerHTML
        tr.appendChild(td);
      });
      body.insertBefore(tr, body.firstChild);
    });
    while (body.children.length > MAX_SAMPLES) body.removeChild(body.lastChild);
  }

  function addLogs(lines) {
    const box = document.getElementById("log-tail");
    const atBottom = box.scrollTop + box.clientHeight >= box.scrollHeight - 5;
    lines.forEach((l) => {
      if (l.id <= state.logCursor) return;
      state.logCursor = l.id;
      const div = document.createElement("div");
      div.className = "line";
      div.dataset.logId = l.id;
      div.textContent = l.line;
      box.appendChild(div);
    });
    while (box.children.length > MAX_LOG) box.removeChild(box.firstChild);
    if (atBottom) box.scrollTop = box.scrollHeight;
  }

  function addCheckpoint(msg) {
    const ul = document.getElementById("checkpoints");
    const none = document.getElementById("no-checkpoints");
    if (none) none.remove();
    const li = document.createElement("li");
    li.textContent = "step " + msg.step + " · ";
    const code = document.createElement("code");
    code.textContent = msg.path;
    li.appendChild(code);
    ul.appendChild(li);
  }

  function wsState(text, cls) {
    const el = document.getElementById("ws-state");
    el.textContent = text;
    el.className = "ws-state " + (cls || "muted");
  }

  const PING_MS = (cfg.ping_seconds || 5) * 1000;

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const ws = new WebSocket(scheme + location.host + cfg.ws_path);
    state.ws = ws;
    ws.onopen = () => {
      // The cursor goes with every (re)connect: the server replays only what we have not seen.
      ws.send(JSON.stringify({ type: "subscribe", after: {
        metric_cursor: state.metricCursor, sample_cursor: state.sampleCursor, log_cursor: state.logCursor } }));
      wsState("syncing…");
    };
    ws.onmessage = (ev) => {
      let msg;
      try { msg = JSON.parse(ev.data); } catch (e) { return; }
      state.messages += 1;
      handle(msg);
    };
    ws.onclose = (ev) => {
      state.connected = false;
      state.ws = null;
      // Refusals (protocol.py close codes): retrying cannot help, so stop and say why.
      const final = FINAL_CLOSE[ev.code];
      if (final) { state.stopped = final; wsState(final, "down"); return; }
      // Anything else (server restart, Redis down or hung, network): retry with backoff.
      const delay = Math.min(30000, 1000 * Math.pow(2, state.attempts)) * (0.75 + Math.random() * 0.5);
      state.attempts += 1;
      state.retryIn = delay;
      wsState("live updates unavailable, retrying in " + Math.round(delay / 1000) + "s…", "down");
      setTimeout(connect, delay);
    };
  }

  // Every few seconds while live, a ping: the server compares the run's newest rows with this
  // socket's cursors and sends what a lost broadcast left out (consumers.py), so a gap after a Redis
  // restart is filled even when no later message arrives to reveal it.
  setInterval(() => {
    if (state.ws && state.connected && state.ws.readyState === WebSocket.OPEN) {
      state.ws.send(JSON.stringify({ type: "ping" }));
    }
  }, PING_MS);

  const FINAL_CLOSE = {
    4403: "live updates stopped: not allowed (log in again as a researcher)",
    4404: "live updates stopped: this run no longer exists",
    4409: "live updates stopped: duplicate subscription",
  };

  function handle(msg) {
    switch (msg.type) {
      case "batch": (msg.messages || []).forEach(handle); break; // one recorder flush
      case "status": setStatus(msg); break;
      case "metrics": applySeries(msg.series || []); break;
      case "samples": addSamples(msg.rows || []); break;
      case "log": addLogs(msg.lines || []); break;
      case "checkpoint": addCheckpoint(msg); break;
      case "caught_up": state.connected = true; state.attempts = 0; wsState("live", "live"); break;
      default: break;
    }
  }

  if (slider) {
    slider.addEventListener("input", () => {
      alpha = parseFloat(slider.value);
      sliderValue.textContent = alpha.toFixed(2);
      state.charts.forEach((c) => c.setAlpha(alpha));
    });
    sliderValue.textContent = alpha.toFixed(2);
  }

  // 1) overview series (cursor read before the series on the server), 2) websocket from that cursor.
  // cfg.overview_points per series (min/max buckets) is more than a chart's pixel width; zooming in
  // fetches full resolution for the visible range.
  fetch(cfg.series_url + "?max_points=" + cfg.overview_points, { credentials: "same-origin", headers: { Accept: "application/json" } })
    .then((r) => { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
    .then((data) => {
      state.metricCursor = data.cursor || 0;
      Object.values(data.series).forEach((s) => {
        const chart = chartFor(s.key, s.y);
        if (chart) chart.setSeries(s.key, s.x, s.y);
      });
      if (data.status) setStatus(data.status);
    })
    .catch((e) => wsState("could not load metrics: " + e.message, "down"))
    // Connect once the first charts are drawn: the websocket's catch-up then does not compete with
    // the first paint for the CPU, and nothing is lost by waiting (it replays after the cursor).
    .then(() => afterFirstDraw(connect));

  function afterFirstDraw(fn) {
    if (window.requestAnimationFrame && !document.hidden) window.requestAnimationFrame(() => setTimeout(fn, 0));
    else setTimeout(fn, 0);
  }

  window.grueRun = {
    state: state,
    pointCount: () => { let n = 0; state.charts.forEach((c) => { n += c.pointCount(); }); return n; },
    disconnect: () => { if (state.ws) state.ws.close(); },
  };
})();
