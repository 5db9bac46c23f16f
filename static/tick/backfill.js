// The schedule page's backfill dialog: opened by its button (no inline handlers: the page's
// Content-Security-Policy forbids them). The preview and the confirm are plain htmx / form posts.
(function () {
  "use strict";
  var open = document.getElementById("backfill-open");
  var dialog = document.getElementById("backfill-dialog");
  if (!open || !dialog || typeof dialog.showModal !== "function") { return; }
  open.addEventListener("click", function () {
    dialog.showModal();
    var button = document.getElementById("backfill-preview-button");
    if (button) { button.click(); }
  });
})();
