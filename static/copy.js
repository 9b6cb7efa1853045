/* localui: copy buttons. A button with data-copy puts that text (a run's full id, which
 * the runs list shows short) on the clipboard and says so for a moment. Loaded only by
 * the pages that have such buttons. The clipboard answers on loopback and https. */
(function () {
  "use strict";
  document.addEventListener("click", function (e) {
    var button = e.target.closest ? e.target.closest("button[data-copy]") : null;
    if (!button || !navigator.clipboard) return;
    navigator.clipboard.writeText(button.getAttribute("data-copy")).then(function () {
      button.textContent = "copied";
      setTimeout(function () { button.textContent = "copy"; }, 1500);
    });
  });
})();
