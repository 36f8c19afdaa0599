// Progress of the over-optimisation watch's jobs on the run page (webapp/runs/gold_jobs.py): while a
// gold is being scored or a checkpoint exported, poll the run's jobs.json and update the rows; when a
// job ends, reload the page so the panel shows the new gold (selected) or the export's links. A gold
// job's cancel and retry buttons (and a failed export's retry) ask for confirmation first; a job being
// cancelled is polled until it stops, and a job that ends failed or cancelled reloads the page so its
// retry button shows. The reload waits while the researcher is clicking or typing.
(function () {
  "use strict";
  const table = document.getElementById("gold-jobs");
  const panel = document.getElementById("overopt-panel");
  if (!panel) return;
  const url = (table && table.dataset.url) || panel.dataset.jobsUrl;
  if (!url) return;
  const ACTIVE = ["queued", "running", "cancelling"];
  const ENDED_WITH_GOLD = ["succeeded", "cancelled"];

  // Set once a confirmed form is being sent: its response (a redirect) wins over the poll's reload.
  let submitting = false;

  // The page is reloaded (or switched to a new gold) when a job ends. Not under the researcher's
  // hand: while a pointer is pressed, or within a second of a press or a key, the reload waits
  // (data-reload="deferred" on the panel), so a click being made lands on the page it was aimed at.
  const QUIET_MS = 1000;
  let pressed = false;
  let lastInput = 0;
  document.addEventListener("pointerdown", function () { pressed = true; lastInput = Date.now(); }, true);
  document.addEventListener("pointerup", function () { pressed = false; lastInput = Date.now(); }, true);
  document.addEventListener("pointercancel", function () { pressed = false; }, true);
  document.addEventListener("keydown", function () { lastInput = Date.now(); }, true);
  function whenQuiet(go) {
    if (submitting) return;
    if (pressed || Date.now() - lastInput < QUIET_MS) {
      panel.dataset.reload = "deferred";
      setTimeout(function () { whenQuiet(go); }, 250);
      return;
    }
    go();
  }

  // A job's state-changing form is sent only once the researcher confirms (verb, job, what follows).
  function confirmFirst(selector, verb, what, consequence) {
    panel.querySelectorAll(selector).forEach(function (form) {
      form.addEventListener("submit", function (ev) {
        const name = form.dataset.jobName || "this job";
        if (!window.confirm(verb + " " + what + " “" + name + "”? " + consequence)) ev.preventDefault();
        else submitting = true;
      });
    });
  }
  confirmFirst("form.gold-cancel-form", "Cancel", "the gold", "The worker stops before the next evaluation step; the steps already scored are kept.");
  confirmFirst("form.gold-retry-form", "Retry", "the gold", "It is queued again with the same gold; the steps already scored are kept and the rest are scored.");
  confirmFirst("form.ckpt-retry-form", "Retry", "the export of", "It is queued again on the same row; the earlier attempt stays listed.");

  function shown() {
    const out = {};
    panel.querySelectorAll("#gold-jobs tr[data-job]").forEach(function (tr) {
      out["g" + tr.dataset.job] = tr.querySelector(".job-status").textContent.trim();
    });
    panel.querySelectorAll("#overopt-checkpoints tr[data-step] td.export").forEach(function (td) {
      out["s" + td.parentNode.dataset.step] = td.dataset.status || "";
    });
    return out;
  }

  function anyActive(statuses) {
    return Object.values(statuses).some(function (s) { return ACTIVE.indexOf(s) >= 0; });
  }

  function poll() {
    const before = shown();
    if (!anyActive(before)) return;
    fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        if (submitting) return;
        if (!data) { setTimeout(poll, 2000); return; }
        let finishedGold = null;
        let endedOther = false;
        data.jobs.forEach(function (j) {
          if (j.kind === "gold-job") {
            const tr = panel.querySelector('#gold-jobs tr[data-job="' + j.id + '"]');
            if (!tr) return;
            const was = before["g" + j.id];
            tr.querySelector(".job-status").textContent = j.status;
            tr.querySelector(".job-progress").textContent = j.done + " / " + j.total;
            tr.querySelector(".job-error").textContent = j.error || "";
            if (ACTIVE.indexOf(j.status) < 0) {
              const form = tr.querySelector("form.gold-cancel-form");
              if (form) form.remove();
            }
            if (ACTIVE.indexOf(was) >= 0 && ENDED_WITH_GOLD.indexOf(j.status) >= 0 && j.done > 0) {
              finishedGold = j.key;
            }
            if (ACTIVE.indexOf(was) >= 0 && ACTIVE.indexOf(j.status) < 0) endedOther = true; // reload: its retry button shows
          } else {
            const was = before["s" + j.step];
            if (ACTIVE.indexOf(was) >= 0 && ACTIVE.indexOf(j.status) < 0) endedOther = true;
          }
        });
        if (finishedGold) {
          const params = new URLSearchParams(window.location.search);
          params.set("gold", finishedGold);
          whenQuiet(function () {
            window.location.assign(window.location.pathname + "?" + params.toString() + "#overopt-panel");
          });
        } else if (endedOther) {
          whenQuiet(function () { window.location.reload(); });
        } else {
          setTimeout(poll, 1000);
        }
      })
      .catch(function () { setTimeout(poll, 2000); });
  }
  setTimeout(poll, 500);
})();
