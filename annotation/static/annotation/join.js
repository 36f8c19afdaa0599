// Invite links carry the token in the URL fragment (#...), which browsers never send to the server, so
// it cannot appear in access logs. Post it once, then drop it from the address bar and history.
(function () {
  "use strict";
  var form = document.getElementById("invite-code-form");
  var code = window.location.hash.replace(/^#/, "");
  if (!code) return;
  history.replaceState(null, "", window.location.pathname);
  if (!form) return;
  form.querySelector("input[name=token]").value = decodeURIComponent(code);
  form.submit();
})();
