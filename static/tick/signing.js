// Webhook signing page: copy the new secret, and confirm a revocation (no inline handlers,
// so the page works under a Content-Security-Policy without 'unsafe-inline').
(function () {
  document.querySelectorAll("[data-copy]").forEach(function (button) {
    button.addEventListener("click", function () {
      var field = document.getElementById(button.getAttribute("data-copy"));
      field.select();
      if (navigator.clipboard) navigator.clipboard.writeText(field.value);
      button.textContent = "Copied";
    });
  });
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.getAttribute("data-confirm"))) event.preventDefault();
    });
  });
})();
