// Run table: checkbox selection → Compare (the filters themselves are a plain GET form, so the
// URL always holds the table state and works without JavaScript).
(function () {
  "use strict";
  const form = document.getElementById("compare-form");
  if (!form) return;
  const btn = document.getElementById("compare-btn");
  const count = document.getElementById("selected-count");
  const all = document.getElementById("select-all");
  const boxes = () => Array.from(form.querySelectorAll("input.run-select"));
  function update() {
    const n = boxes().filter((b) => b.checked).length;
    count.textContent = n + " selected";
    btn.disabled = n < 2;
  }
  form.addEventListener("change", (ev) => {
    if (ev.target === all) boxes().forEach((b) => { b.checked = all.checked; });
    update();
  });
  // Auto-submit the filter selects so the table reacts at once.
  const filters = document.getElementById("run-filters");
  if (filters) {
    filters.querySelectorAll("select").forEach((s) => s.addEventListener("change", () => filters.submit()));
  }
  update();
})();
