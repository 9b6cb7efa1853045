// The approvals desk: a queue that stays still under the pointer, a name typed once,
// keys to move between cards. Pages work without it: every decision is a plain form.
(function () {
  "use strict";

  // The pointer rule: for GUARD_MS after the queue's layout changes (a card turns into
  // a note, new cards are shown, a note is dismissed), clicks on the queue's buttons
  // and checkboxes are ignored, so a click aimed before the change cannot land on
  // whatever the change put under the pointer.
  var GUARD_MS = 300;
  var lastChange = -Infinity;
  // The newest queue push whose new cards wait behind the "show them" banner.
  var held = null;

  function queue() { return document.getElementById("approvals-queue"); }
  function items(root) { return root.querySelectorAll(".queue-items > .queue-item"); }
  function changed() { lastChange = performance.now(); }

  document.addEventListener("click", function (event) {
    var target = event.target;
    if (!(target instanceof Element)) return;
    var hit = target.closest("#approvals-queue button, #approvals-queue input[type=checkbox]");
    if (hit && performance.now() - lastChange < GUARD_MS) {
      event.preventDefault();
      event.stopImmediatePropagation();
      return;
    }
    // An empty reject reason is caught here, before htmx posts (the server still
    // refuses it with a 400).
    var reject = target.closest("button.reject");
    var reason = reject && reject.form && reject.form.elements.namedItem("reason");
    if (reason && !reason.value.trim()) {
      reason.setCustomValidity("Say why you reject: the agent gets your reason.");
      reason.reportValidity();
      event.preventDefault();
      event.stopImmediatePropagation();
    }
  }, true);

  function ago(iso) {
    var s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
    if (isNaN(s)) return "";
    if (s < 60) return s + " s ago";
    if (s < 3600) return Math.round(s / 60) + " min ago";
    return Math.round(s / 3600) + " h ago";
  }
  function stampAges(root) {
    root.querySelectorAll("time[data-ago]").forEach(function (t) {
      var words = ago(t.getAttribute("datetime"));
      if (words) t.textContent = words;
    });
  }
  setInterval(function () { var q = queue(); if (q) stampAges(q); }, 5000);

  function plainNote(item) {
    var p = document.createElement("p");
    p.className = "note";
    p.textContent = "No longer waiting · ";
    var link = item.querySelector("article.approval header a[href]");
    if (link) { var a = link.cloneNode(true); a.textContent = "see the run"; p.append(a, " "); }
    var b = document.createElement("button");
    b.type = "button"; b.className = "dismiss"; b.textContent = "Dismiss";
    p.append(b);
    return p;
  }

  function approverName() {
    var input = document.querySelector("#approvals-queue input[name=approver]");
    return input ? input.value : null;
  }

  // Brings the page's queue up to a pushed one without moving what is shown: cards
  // still waiting stay as they are (typed text included); a card decided elsewhere
  // becomes a note of its height; new cards wait behind the banner unless asked for
  // (showNew) or nothing else is waiting on the page.
  function apply(html, showNew) {
    var q = queue();
    if (!q) return;
    var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("approvals-queue");
    if (!fresh) return;
    var freshItems = Array.prototype.slice.call(items(fresh));
    var freshIds = new Set(freshItems.map(function (i) { return i.id; }));
    var notes = {};
    fresh.querySelectorAll("template.gone-note").forEach(function (t) { notes[t.dataset.for] = t; });

    var freshById = {};
    freshItems.forEach(function (f) { freshById[f.id] = f; });

    items(q).forEach(function (item) {
      if (freshIds.has(item.id) && !item.classList.contains("gone")) {
        // Still waiting: only what the card says of its rule (a vote cast elsewhere)
        // is brought up to date; what the person typed stays.
        var rule = item.querySelector("p.rule");
        var freshRule = freshById[item.id].querySelector("p.rule");
        if (rule && freshRule && rule.textContent !== freshRule.textContent) {
          rule.replaceWith(document.importNode(freshRule, true));
        }
        // Its notes too (a note left elsewhere); a note being typed stays.
        var shownNotes = item.querySelector(".pause-notes .notes-shown");
        var freshNotes = freshById[item.id].querySelector(".pause-notes .notes-shown");
        if (shownNotes && freshNotes && shownNotes.innerHTML !== freshNotes.innerHTML) {
          shownNotes.replaceWith(document.importNode(freshNotes, true));
        }
        return;
      }
      if (item.classList.contains("gone")) return;
      var height = item.getBoundingClientRect().height;
      item.classList.add("gone");
      if (item.classList.contains("deciding") || item.querySelector(".outcome")) {
        // Decided on this page: its outcome stays where the card is until dismissed.
        item.classList.add("decided-here");
        return;
      }
      var note = notes[item.dataset.run];
      item.replaceChildren(note ? note.content.cloneNode(true) : plainNote(item));
      item.style.height = height + "px";  // CSSOM, which the page's CSP allows
      item.removeAttribute("hx-preserve");
      stampAges(item);
      changed();
    });

    var shown = new Set(Array.prototype.map.call(items(q), function (i) { return i.id; }));
    var incoming = freshItems.filter(function (i) { return !shown.has(i.id); });
    var waitingShown = q.querySelectorAll(".queue-items > .queue-item:not(.gone)").length;
    if (incoming.length && (showNew || waitingShown === 0)) {
      var list = q.querySelector(".queue-items");
      var name = approverName();
      var prev = null;
      freshItems.forEach(function (f) {
        var here = document.getElementById(f.id);
        if (here) { prev = here; return; }
        var node = document.importNode(f, true);
        var input = node.querySelector("input[name=approver]");
        if (input && name) input.value = name;
        if (prev) prev.after(node); else list.prepend(node);
        if (window.htmx) window.htmx.process(node);
        prev = node;
      });
      incoming = [];
      changed();
    }
    held = incoming.length ? html : null;
    var news = q.querySelector(".queue-news");
    news.replaceChildren();
    if (incoming.length) {
      var show = document.createElement("button");
      show.type = "button"; show.className = "show-new"; show.textContent = "show them";
      news.append(incoming.length + " new waiting — ", show);
    }
    var count = fresh.querySelector(".queue-count");
    if (count) q.querySelector(".queue-count").replaceWith(document.importNode(count, true));
    var empty = q.querySelector(".queue-items > p.empty");
    if (items(q).length === 0 && !empty) {
      var p = document.createElement("p");
      p.className = "empty"; p.textContent = "Nothing is waiting for a person.";
      q.querySelector(".queue-items").append(p);
    } else if (items(q).length && empty) {
      empty.remove();
    }
  }

  // A card's own page: notes left elsewhere join the card's, and a note being typed stays.
  document.addEventListener("htmx:sseBeforeMessage", function (event) {
    var listener = event.target;
    if (!(listener instanceof Element) || listener.getAttribute("sse-swap") !== "pause-notes") return;
    event.preventDefault();
    var target = document.querySelector(listener.getAttribute("hx-target"));
    var fresh = new DOMParser().parseFromString(event.detail.data, "text/html").querySelector(".notes-shown");
    var shown = target && target.querySelector(".notes-shown");
    if (shown && fresh && shown.innerHTML !== fresh.innerHTML) {
      shown.replaceWith(document.importNode(fresh, true));
    }
  });

  document.addEventListener("htmx:sseBeforeMessage", function (event) {
    var listener = event.target;
    if (!(listener instanceof Element) || listener.getAttribute("sse-swap") !== "queue") return;
    if (!queue()) return;
    event.preventDefault();
    apply(event.detail.data, false);
  });

  // A card being decided on this page keeps its place until its outcome arrives.
  // (A note is not a decision: its form leaves the card where it is.)
  document.addEventListener("htmx:beforeRequest", function (event) {
    var item = event.target instanceof Element && !event.target.closest(".pause-notes") &&
      event.target.closest(".queue-item");
    if (item) item.classList.add("deciding");
  });
  // The outcome is where the person looks next: focus moves there, and it stays.
  document.addEventListener("htmx:afterSwap", function (event) {
    var target = event.target;
    if (!(target instanceof Element) || !target.classList.contains("result")) return;
    var outcome = target.querySelector(".outcome, .error, [role=status], [role=alert]") || target;
    if (!outcome.hasAttribute("tabindex")) outcome.setAttribute("tabindex", "-1");
    outcome.focus();
    var item = target.closest(".queue-item");
    if (item) item.classList.remove("deciding");
    if (item && target.querySelector(".outcome") && !target.querySelector(".dismiss")) {
      var b = document.createElement("button");
      b.type = "button"; b.className = "dismiss"; b.textContent = "Dismiss";
      target.append(b);
    }
  });

  document.addEventListener("click", function (event) {
    var target = event.target;
    if (!(target instanceof Element)) return;
    if (target.matches("#approvals-queue .show-new") && held) {
      apply(held, true);
    } else if (target.matches("#approvals-queue .queue-item .dismiss")) {
      var item = target.closest(".queue-item");
      var next = item.nextElementSibling;
      item.remove();
      changed();
      var focusable = next && next.querySelector("article.approval");
      if (focusable) select(focusable);
      if (items(queue()).length === 0 && held) apply(held, true);
    }
  });

  document.addEventListener("input", function (event) {
    var input = event.target;
    if (!(input instanceof HTMLInputElement)) return;
    if (input.name === "reason") input.setCustomValidity("");
    // The approver's name, typed once, fills every card on the page.
    if (input.name === "approver") {
      document.querySelectorAll("input[name=approver]").forEach(function (other) {
        if (other !== input) other.value = input.value;
      });
    }
  });

  // Keys: j/k move between cards, a/r focus Approve/Reject (a second key, Enter or
  // Space, decides: never one keypress), ? shows the keys.
  function cards() {
    return Array.prototype.slice.call(document.querySelectorAll("main article.approval"));
  }
  function select(card) {
    document.querySelectorAll("article.approval.current").forEach(function (c) { c.classList.remove("current"); });
    card.classList.add("current");
    if (!card.hasAttribute("tabindex")) card.setAttribute("tabindex", "-1");
    card.focus();
    card.scrollIntoView({block: "nearest"});
  }
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    var t = event.target;
    if (t instanceof Element && t.closest("input, textarea, select, [contenteditable]")) return;
    var all = cards();
    var current = document.querySelector("article.approval.current");
    var at = current ? all.indexOf(current) : -1;
    if (event.key === "j" || event.key === "k") {
      if (!all.length) return;
      var to = event.key === "j" ? Math.min(at + 1, all.length - 1) : Math.max(at - 1, 0);
      select(all[to]);
    } else if ((event.key === "a" || event.key === "r") && all.length) {
      var card = current || all[0];
      var button = card.querySelector(event.key === "a" ? "button.approve" : "button.reject");
      if (!current) select(card);
      if (button) button.focus();
    } else if (event.key === "?") {
      var keys = document.getElementById("desk-keys");
      if (keys) { keys.open = !keys.open; if (keys.open) keys.querySelector("summary").focus(); }
    } else {
      return;
    }
    event.preventDefault();
  });

  // "Select all shown": every card still waiting on the page, none of the notes.
  document.addEventListener("change", function (event) {
    var box = event.target;
    if (!(box instanceof HTMLInputElement) || box.id !== "select-all") return;
    document.querySelectorAll("#approvals-queue .queue-item:not(.gone) input[name=pick]").forEach(
      function (pick) { pick.checked = box.checked; });
  });

  document.addEventListener("DOMContentLoaded", function () {
    var q = queue();
    if (q) stampAges(q);
    var selectAll = document.querySelector("label.select-all");
    if (selectAll) selectAll.hidden = false;
  });
})();
