// API tokens page (issue 26.9): a Copy button for the token shown once after it is created, and a
// confirmation before Revoke (scripts that use the token stop working at once, and it cannot be
// undone). No inline script: the page's CSP allows only files like this one.
(function () {
  "use strict";
  const token = document.getElementById("new-token");
  const copy = document.getElementById("copy-token");
  if (token && copy) {
    copy.hidden = false;
    copy.addEventListener("click", () => {
      const text = token.textContent.trim();
      const done = () => { copy.textContent = "Copied"; };
      const fallback = () => {
        const range = document.createRange();
        range.selectNodeContents(token);
        const sel = window.getSelection();
        sel.removeAllRanges();
        sel.addRange(range);
        copy.textContent = document.execCommand("copy") ? "Copied" : "Selected: press Ctrl+C";
      };
      if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(text).then(done, fallback);
      else fallback();
    });
  }
  document.querySelectorAll("form.revoke-form").forEach((form) => {
    form.addEventListener("submit", (ev) => {
      const name = form.dataset.tokenName || "this token";
      if (!window.confirm("Revoke “" + name + "”? Scripts using it stop working at once; this cannot be undone.")) {
        ev.preventDefault();
      }
    });
  });
})();
