/* localui: the theme toggle, and focus kept in place across htmx swaps.
 *
 * Loaded in <head> without defer, so a remembered theme is on <html> before the page
 * is painted (the CSP allows no inline script to do it earlier). */
(function () {
  "use strict";
  var KEY = "localui-theme";
  var root = document.documentElement;
  var stored = null;
  try { stored = localStorage.getItem(KEY); } catch (e) { /* storage off: follow the system */ }
  if (stored === "dark" || stored === "light") root.setAttribute("data-theme", stored);

  var systemDark = window.matchMedia ? window.matchMedia("(prefers-color-scheme: dark)") : null;
  var isDark = function () {
    var chosen = root.getAttribute("data-theme");
    if (chosen) return chosen === "dark";
    return !!(systemDark && systemDark.matches);
  };
  var show = function (button) {
    button.setAttribute("aria-pressed", isDark() ? "true" : "false");
  };

  document.addEventListener("DOMContentLoaded", function () {
    var button = document.getElementById("theme-toggle");
    if (!button) return;
    button.hidden = false;
    show(button);
    button.addEventListener("click", function () {
      var next = isDark() ? "light" : "dark";
      root.setAttribute("data-theme", next);
      try { localStorage.setItem(KEY, next); } catch (e) { /* remembered for this page only */ }
      show(button);
    });
    if (systemDark && systemDark.addEventListener) {
      systemDark.addEventListener("change", function () { show(button); });
    }
  });

  // A swap that replaces the focused element (a live push, a decision's answer) would
  // drop focus to the top of the page. Put it back: on the same control in the new
  // content (by id, else by name and value or kind within the nearest element with an
  // id), else on that element itself.
  var last = null;
  document.addEventListener("focusin", function (e) {
    var el = e.target;
    if (!(el instanceof Element)) return;
    var anchor = el.parentElement ? el.parentElement.closest("[id]") : null;
    last = {
      el: el,
      id: el.id,
      anchor: anchor ? anchor.id : "",
      selector: el.name
        ? el.tagName.toLowerCase() + "[name=\"" + CSS.escape(el.name) + "\"]" +
          (el.value && el.type === "radio" ? "[value=\"" + CSS.escape(el.value) + "\"]" : "")
        : el.tagName.toLowerCase() + (el.className ? "." + el.className.split(" ").map(CSS.escape).join(".") : "")
    };
  });
  var restore = function () {
    if (!last || document.contains(last.el)) return;
    var active = document.activeElement;
    if (active && active !== document.body) return;
    var place = last.id ? document.getElementById(last.id) : null;
    var anchor = last.anchor ? document.getElementById(last.anchor) : null;
    if (!place && anchor) place = anchor.querySelector(last.selector) || anchor;
    if (!place) return;
    if (!place.matches("a[href], button, input, select, textarea, summary, [tabindex]")) {
      place.setAttribute("tabindex", "-1");
    }
    place.focus();
  };
  document.addEventListener("htmx:afterSettle", restore);
  document.addEventListener("htmx:sseMessage", restore);
})();
