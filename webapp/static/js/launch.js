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

// Component lists (eval.metrics, reward.components) are YAML text areas; offer the registered ids
// as an "add" select that appends an entry, so nobody has to remember the ids.
(function () {
  "use strict";
  document.querySelectorAll("textarea[data-registry-ids]").forEach((area) => {
    const ids = area.dataset.registryIds.split(",").filter(Boolean);
    if (!ids.length) return;
    const select = document.createElement("select");
    select.className = "add-component";
    select.setAttribute("aria-label", "Add a component to " + area.name);
    const first = document.createElement("option");
    first.value = "";
    first.textContent = "+ add…";
    select.appendChild(first);
    ids.forEach((id) => {
      const opt = document.createElement("option");
      opt.value = id;
      opt.textContent = id;
      select.appendChild(opt);
    });
    select.addEventListener("change", () => {
      if (!select.value) return;
      let text = area.value.replace(/\s+$/, "");
      if (text === "[]") text = "";
      const entry = "- id: " + select.value + (area.dataset.weighted ? "\n  weight: 1.0" : "") + "\n  args: {}";
      area.value = (text ? text + "\n" : "") + entry + "\n";
      select.value = "";
      area.dispatchEvent(new Event("input", { bubbles: true }));
    });
    area.insertAdjacentElement("afterend", select);
  });
})();

// A reward choice offered by another app (e.g. a reward model trained from human judgments) replaces
// the whole reward section: while one is selected, the fields it replaces are hidden (they are still
// submitted, and the server ignores them when a choice is set).
(function () {
  "use strict";
  const select = document.querySelector("select[data-replaces-section]");
  if (!select) return;
  const section = document.querySelector(
    'fieldset.section[data-section="' + select.dataset.replacesSection + '"]'
  );
  if (!section) return;
  const own = select.closest(".field");
  function sync() {
    const replaced = Boolean(select.value);
    section.querySelectorAll(".field").forEach((f) => { if (f !== own) f.hidden = replaced; });
    section.querySelectorAll("fieldset.subsection").forEach((fs) => { fs.hidden = replaced; });
    section.classList.toggle("reward-replaced", replaced);
  }
  select.addEventListener("change", sync);
  sync();
})();

// Resources panel: the live workers, their device kinds and free slots (GET workers.json after the
// page loads), marking those the form's resources.devices would be routed to.
(function () {
  "use strict";
  const card = document.getElementById("workers-card");
  if (!card) return;
  const list = document.getElementById("workers-list");
  const status = document.getElementById("workers-status");
  const devicesField = document.querySelector("[name='resources__devices']");
  const processesField = document.querySelector("[name='resources__processes']");
  const gpusField = document.querySelector("[name='resources__gpus_per_process']");
  let workers = [];
  // GPUs the run needs on one worker: processes × gpus_per_process (webapp/runs/workers.py gpus_needed).
  function gpusNeeded(wanted) {
    if (wanted !== "cuda") return 0;
    const procs = parseInt(processesField ? processesField.value : "1", 10) || 1;
    const per = parseInt(gpusField ? gpusField.value : "0", 10) || 0;
    return procs * per;
  }
  function render() {
    const wanted = devicesField ? devicesField.value : "cpu";
    const need = gpusNeeded(wanted);
    list.replaceChildren();
    let able = 0;
    workers.forEach((w) => {
      const li = document.createElement("li");
      const fits = w.devices.includes(wanted) && (w.gpus || 0) >= need;
      if (fits) able += 1;
      li.className = fits ? "worker-fits" : "muted";
      let text = `${w.name} — ${w.devices.join(", ")} — ${w.free} of ${w.slots} slot${w.slots === 1 ? "" : "s"} free`;
      if (w.devices.includes("cuda")) text += ` — ${w.free_gpus || 0} of ${w.gpus || 0} GPU${w.gpus === 1 ? "" : "s"} free`;
      li.textContent = text;
      list.appendChild(li);
    });
    const what = need ? `${wanted} run needing ${need} GPU${need === 1 ? "" : "s"}` : `${wanted} run`;
    if (!workers.length) status.textContent = "No worker answered: the run will wait in its queue until one starts.";
    else if (able) status.textContent = `${able} of ${workers.length} worker${workers.length === 1 ? "" : "s"} can take a ${what}.`;
    else status.textContent = `No live worker can take a ${what}: it will wait in its queue until one that fits joins.`;
  }
  fetch(card.dataset.url, { headers: { Accept: "application/json" }, credentials: "same-origin" })
    .then((r) => r.json())
    .then((data) => {
      workers = data.workers || [];
      if (data.error) status.textContent = data.error;
      else render();
    })
    .catch(() => { status.textContent = "Could not ask the workers."; });
  [devicesField, processesField, gpusField].forEach((f) => { if (f) f.addEventListener("input", render); });
  if (devicesField) devicesField.addEventListener("change", render);
})();

// The algorithm tab shows only the settings of the chosen algorithm (fields and groups carry
// data-algorithms, the ids they apply to; none = every algorithm). Hidden inputs are still
// submitted, so switching back and forth loses nothing and the config is the same without JS.
(function () {
  "use strict";
  const select = document.querySelector("select[name='algorithm__id']");
  if (!select) return;
  const scoped = Array.from(document.querySelectorAll("fieldset.section[data-section='algorithm'] [data-algorithms]"));
  function sync() {
    const id = select.value;
    scoped.forEach((el) => {
      const ids = el.dataset.algorithms.split(" ").filter(Boolean);
      // A field with an error stays visible whatever is picked, so no error is ever hidden.
      const hasError = el.classList.contains("field-error") || Boolean(el.querySelector(".field-error"));
      el.hidden = ids.length > 0 && !ids.includes(id) && !hasError;
    });
    document.querySelectorAll("fieldset.section[data-section='algorithm'] fieldset.subsection").forEach((fs) => {
      if (fs.dataset.algorithms) return;
      const fields = Array.from(fs.querySelectorAll(".field"));
      fs.hidden = fields.length > 0 && fields.every((f) => f.hidden);
    });
  }
  select.addEventListener("change", sync);
  sync();
})();
