// Page behaviour that would otherwise be inline handlers, which the Content-Security-Policy
// refuses (docs/security.md "CSP and headers"). Loaded on every page by tick/base.html.
(function () {
  "use strict";
  // <form data-confirm="question">: ask before submitting.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form instanceof HTMLFormElement && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
      event.preventDefault();
    }
  });
  // <select data-autosubmit>: submit its form on change.
  document.addEventListener("change", function (event) {
    var el = event.target;
    if (el instanceof HTMLSelectElement && el.hasAttribute("data-autosubmit") && el.form) {
      el.form.submit();
    }
  });
  document.addEventListener("click", function (event) {
    var el = event.target;
    if (!(el instanceof HTMLInputElement)) return;
    // <input data-select-on-click>: select the whole value (a key to copy).
    if (el.hasAttribute("data-select-on-click")) el.select();
    // <input type=checkbox data-select-all="name">: tick or untick every input[name].
    var name = el.getAttribute("data-select-all");
    if (name) {
      document.querySelectorAll('input[name="' + name + '"]').forEach(function (box) {
        box.checked = el.checked;
      });
    }
  });
})();
