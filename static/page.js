/* localui: the theme toggle, and focus kept in place across htmx swaps. Loaded in
 * <head> without defer, so a remembered theme is set before the first paint (the CSP
 * allows no inline script to do it earlier). */
(function () {
  "use strict";
  var KEY = "localui-theme", root = document.documentElement, stored = null;
  try { stored = localStorage.getItem(KEY); } catch (e) { /* storage off: follow the system */ }
  if (stored === "dark" || stored === "light") root.setAttribute("data-theme", stored);
  var system = matchMedia("(prefers-color-scheme: dark)");
  var dark = function () {
    var chosen = root.getAttribute("data-theme");
    return chosen ? chosen === "dark" : system.matches;
  };
  document.addEventListener("DOMContentLoaded", function () {
    var button = document.getElementById("theme-toggle");
    if (!button) return;
    var show = function () { button.setAttribute("aria-pressed", String(dark())); };
    button.hidden = false;
    show();
    system.addEventListener("change", show);
    button.addEventListener("click", function () {
      var next = dark() ? "light" : "dark";
      root.setAttribute("data-theme", next);
      try { localStorage.setItem(KEY, next); } catch (e) { /* this page only */ }
      show();
    });
  });

  // A swap that replaces the focused control (a live push, a decision's answer) drops
  // focus to the top of the page. Put it back on the same control in the new content:
  // by id, else by name (and a radio's value) or tag and class within the nearest
  // element with an id, else on that element.
  var last = null;
  document.addEventListener("focusin", function (e) {
    var el = e.target, anchor = el.parentElement && el.parentElement.closest("[id]");
    last = {
      el: el, id: el.id, anchor: anchor ? anchor.id : "",
      sel: el.name
        ? el.tagName + '[name="' + CSS.escape(el.name) + '"]' +
          (el.type === "radio" ? '[value="' + CSS.escape(el.value) + '"]' : "")
        : el.tagName + (el.classList.length ? "." + Array.from(el.classList, CSS.escape).join(".") : "")
    };
  });
  var restore = function () {
    var active = document.activeElement;
    if (!last || document.contains(last.el) || (active && active !== document.body)) return;
    var anchor = last.anchor && document.getElementById(last.anchor);
    var place = (last.id && document.getElementById(last.id)) || (anchor && (anchor.querySelector(last.sel) || anchor));
    if (!place) return;
    if (!place.matches("a[href],button,input,select,textarea,summary,[tabindex]")) place.tabIndex = -1;
    place.focus();
  };
  document.addEventListener("htmx:afterSettle", restore);
  document.addEventListener("htmx:sseMessage", restore);
})();
