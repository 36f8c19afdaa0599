// Keyboard-first judging: 1/2/3/4 or a/b/t/x choose, Enter submits, u undoes, s skips.
// Time spent counts only while the page is visible, so a tab left open overnight is not "8 hours".
(function () {
  "use strict";
  const form = document.getElementById("judge-form");
  if (!form) return;
  const kind = form.dataset.kind;
  const hint = document.getElementById("hint");
  const secondsInput = document.getElementById("seconds");
  let visibleMs = 0;
  let since = document.hidden ? null : performance.now();
  document.addEventListener("visibilitychange", function () {
    if (document.hidden && since !== null) { visibleMs += performance.now() - since; since = null; }
    else if (!document.hidden && since === null) { since = performance.now(); }
  });
  function elapsedSeconds() {
    return (visibleMs + (since === null ? 0 : performance.now() - since)) / 1000;
  }
  let submitting = false;

  // ---- pairwise
  const choiceInput = document.getElementById("choice");
  function choose(value) {
    choiceInput.value = value;
    document.querySelectorAll("button.choice").forEach(function (b) {
      b.classList.toggle("selected", b.dataset.choice === value);
      b.setAttribute("aria-pressed", b.dataset.choice === value ? "true" : "false");
    });
    const left = document.getElementById("out-left"), right = document.getElementById("out-right");
    left.classList.toggle("picked", value === "left");
    right.classList.toggle("picked", value === "right");
    hint.textContent = "";
  }
  document.querySelectorAll("button.choice").forEach(function (b) {
    b.addEventListener("click", function () { choose(b.dataset.choice); });
  });

  // ---- likert
  const axes = Array.prototype.slice.call(document.querySelectorAll(".likert-axis"));
  let activeAxis = 0;
  function setActive(i) {
    activeAxis = Math.max(0, Math.min(axes.length - 1, i));
    axes.forEach(function (f, j) { f.classList.toggle("active", j === activeAxis); });
  }
  function score(axisIndex, value) {
    const f = axes[axisIndex];
    f.querySelector("input[type=hidden]").value = String(value);
    f.querySelectorAll(".likert-opt").forEach(function (o) { o.classList.toggle("selected", o.dataset.value === String(value)); });
    hint.textContent = "";
  }
  axes.forEach(function (f, i) {
    f.querySelectorAll(".likert-opt").forEach(function (o) {
      o.addEventListener("click", function () { score(i, o.dataset.value); setActive(i + 1); });
    });
  });

  function ready() {
    if (kind === "pairwise") return choiceInput.value !== "";
    return axes.every(function (f) { return f.querySelector("input[type=hidden]").value !== ""; });
  }
  form.addEventListener("submit", function (ev) {
    if (submitting) { ev.preventDefault(); return; }
    if (!ready()) {
      ev.preventDefault();
      hint.textContent = kind === "pairwise" ? "Choose A, B, tie or both bad first." : "Score every axis first.";
      return;
    }
    secondsInput.value = elapsedSeconds().toFixed(2);
    submitting = true;  // no double submissions from key repeat
  });

  document.addEventListener("keydown", function (ev) {
    if (ev.altKey || ev.metaKey) return;
    const inText = ev.target && (ev.target.tagName === "TEXTAREA" || ev.target.tagName === "INPUT");
    if (ev.key === "Enter") {
      if (inText && !ev.ctrlKey) return;  // newline in the rationale; Ctrl+Enter submits
      ev.preventDefault();
      form.requestSubmit();
      return;
    }
    if (inText || ev.ctrlKey) return;
    const k = ev.key.toLowerCase();
    if (k === "u") { ev.preventDefault(); document.getElementById("undo-form").submit(); return; }
    if (k === "s") { ev.preventDefault(); document.getElementById("skip-form").submit(); return; }
    if (kind === "pairwise") {
      const map = { "1": "left", a: "left", "2": "right", b: "right", "3": "tie", t: "tie", "4": "both_bad", x: "both_bad" };
      if (map[k]) { ev.preventDefault(); choose(map[k]); }
    } else {
      if (/^[1-5]$/.test(k) && axes.length) { ev.preventDefault(); score(activeAxis, k); setActive(activeAxis + 1); }
      else if (ev.key === "Tab" && axes.length) { ev.preventDefault(); setActive(activeAxis + (ev.shiftKey ? -1 : 1)); }
    }
  });
  // Keys pressed before this line would be lost: tell tests (and curious users) we are listening.
  document.body.dataset.annotateReady = "1";
})();
