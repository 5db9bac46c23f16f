// Webhook signing page: copy the new secret (no inline handlers, so the page works under a
// Content-Security-Policy without 'unsafe-inline'). Confirmations: data-confirm, tick.js.
(function () {
  document.querySelectorAll("[data-copy]").forEach(function (button) {
    button.addEventListener("click", function () {
      var field = document.getElementById(button.getAttribute("data-copy"));
      field.select();
      if (navigator.clipboard) navigator.clipboard.writeText(field.value);
      button.textContent = "Copied";
    });
  });
})();
