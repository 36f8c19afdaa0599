// Campaign page: progress bars of AI judges, polled while a judge is queued or running (textContent only).
(function () {
  "use strict";
  function eta(s) {
    if (s === null || s === undefined) return "";
    s = Math.round(s);
    if (s < 60) return "about " + s + " s left";
    if (s < 3600) return "about " + Math.round(s / 60) + " min left";
    return "about " + (s / 3600).toFixed(1) + " h left";
  }
  document.querySelectorAll("#ai-judge-table tr[data-judge]").forEach(function (tr) {
    var bar = tr.querySelector(".bar");
    bar.style.width = (100 * Number(bar.dataset.progress || 0)) + "%";
    var status = tr.dataset.status;
    if (status !== "queued" && status !== "running") return;
    var poll = function () {
      fetch(tr.dataset.url, {headers: {Accept: "application/json"}, credentials: "same-origin"})
        .then(function (r) { return r.json(); })
        .then(function (s) {
          bar.style.width = (100 * s.progress) + "%";
          tr.querySelector(".ai-status").textContent = s.status;
          // A queued judge has counted no items yet: "0 of 0 items" would read as an empty campaign.
          tr.querySelector(".ai-progress-text").textContent = s.n_total ?
            s.n_done + " of " + s.n_total + " items" + (s.n_errors ? ", " + s.n_errors + " errors" : "") :
            "not started yet";
          tr.querySelector(".ai-eta").textContent = s.status === "running" ? eta(s.eta_seconds) : "";
          tr.querySelector(".ai-error").textContent = s.error || "";
          if (s.status === "queued" || s.status === "running") setTimeout(poll, 1500);
          else window.location.reload();  // finished: show the buttons of a stopped judge
        })
        .catch(function () { setTimeout(poll, 5000); });
    };
    setTimeout(poll, 1000);
  });
})();
