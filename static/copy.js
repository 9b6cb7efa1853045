/* localui: copy buttons. A button with data-copy puts that text (a run's full id, which
 * the runs list shows short) on the clipboard and says so for a moment. Loaded only by
 * the pages that have such buttons. The clipboard answers on loopback and https.
 * A live update can redraw the table right after the click; the note is kept by the
 * copied text, so the redrawn button says "copied" too until its moment is over. */
(function () {
  "use strict";
  var until = {}; // copied text -> when its "copied" note ends
  var show = function (root) {
    if (!root.querySelectorAll) return;
    var now = Date.now();
    root.querySelectorAll("button[data-copy]").forEach(function (button) {
      var end = until[button.getAttribute("data-copy")];
      if (end !== undefined) button.textContent = end > now ? "copied" : "copy";
    });
  };
  document.addEventListener("click", function (e) {
    var button = e.target.closest ? e.target.closest("button[data-copy]") : null;
    if (!button || !navigator.clipboard) return;
    var text = button.getAttribute("data-copy");
    navigator.clipboard.writeText(text).then(function () {
      until[text] = Date.now() + 1500;
      show(document);
      setTimeout(function () { show(document); delete until[text]; }, 1600);
    });
  });
  document.addEventListener("htmx:afterSwap", function (e) { show(e.target); });
})();
