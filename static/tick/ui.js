// Small behaviours of the tenant pages, bound by data attributes instead of inline handlers
// (the Content-Security-Policy allows no inline script; docs/ui.md).
"use strict";
// <form data-confirm="question">: submitted only after the person confirms.
document.addEventListener("submit", function (event) {
  var form = event.target;
  var question = form.getAttribute && form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});
// <input type="checkbox" data-select-all>: checks or clears every ids checkbox of its form.
document.addEventListener("change", function (event) {
  var box = event.target;
  if (!box.hasAttribute || !box.hasAttribute("data-select-all") || !box.form) {
    return;
  }
  box.form.querySelectorAll("input[type=checkbox][name=ids]").forEach(function (c) {
    c.checked = box.checked;
  });
});
// <input data-select-on-focus>: a click selects the whole value (a key to copy).
document.addEventListener("focusin", function (event) {
  var input = event.target;
  if (input.hasAttribute && input.hasAttribute("data-select-on-focus") && input.select) {
    input.select();
  }
});
