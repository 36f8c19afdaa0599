// Launch form: show one config section at a time (all sections stay in the DOM and are submitted).
// The section with the first error opens first, so a refused config shows its errors at once.
(function () {
  "use strict";
  const nav = document.getElementById("section-tabs");
  if (!nav) return;
  const links = Array.from(nav.querySelectorAll("a[data-section]"));
  const sections = Array.from(document.querySelectorAll("fieldset.section[data-section]"));
  function show(key) {
    sections.forEach((s) => { s.hidden = s.dataset.section !== key; });
    links.forEach((a) => a.classList.toggle("active", a.dataset.section === key));
  }
  links.forEach((a) => a.addEventListener("click", (ev) => {
    ev.preventDefault();
    show(a.dataset.section);
    history.replaceState(null, "", "#section-" + a.dataset.section);
  }));
  const withError = links.find((a) => a.classList.contains("has-errors"));
  const fromHash = location.hash.startsWith("#section-") ? location.hash.slice(9) : null;
  const first = withError ? withError.dataset.section : (fromHash || (links[0] && links[0].dataset.section));
  if (first) show(first);
  document.body.classList.add("js-tabs");
})();
