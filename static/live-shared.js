/* localui: one live stream per browser, shared by its tabs.
 * Why: htmx's SSE extension opens an EventSource per page, and a browser opens at most
 * six connections to a server, so six tabs froze every tab. The extension cannot share
 * a stream; this file does only that. In a page it replaces htmx.createEventSource with
 * a stand-in fed by a SharedWorker (this same file), which holds one EventSource on
 * /live/mux for the union of the URLs the tabs watch. Without SharedWorker each page
 * keeps its own stream (the server caps them), and pages say when live updates pause.
 * It also keeps the waiting count in the title ("(3) Approvals · localui"), and, for a
 * person who asked with "Notify me", has one tab of the browser (not every tab) show a
 * notification when the queue grows. */
(function () {
  "use strict";
  if (typeof SharedWorkerGlobalScope !== "undefined" && self instanceof SharedWorkerGlobalScope) {
    var watchers = new Map(); // "port#id" -> {port, id, url, sent: event -> data}
    var latest = new Map(); // url -> (event -> data) from the open stream
    var es = null, urls = [], mux = "", timer = 0, retry = 1000, ports = 0;
    var waiting = -1; // the queue's size as the newest nav badge says; -1 before the first
    var post = function (w, m) { try { w.port.postMessage(m); } catch (e) { /* tab gone */ } };
    var all = function (type) { watchers.forEach(function (w) { post(w, { type: type, id: w.id }); }); };
    var deliver = function (w, event, data) {
      if (w.sent.get(event) === data) return;
      w.sent.set(event, data);
      post(w, { type: "event", id: w.id, event: event, data: data });
    };
    // Every tab's stream carries the badge: the count going up, not each copy of it,
    // is news, told to one tab only.
    var counted = function (html) {
      var found = />\s*(\d+)\s*</.exec(html), n = found ? +found[1] : -1, first = watchers.values().next().value;
      if (waiting >= 0 && n > waiting && first) post(first, { type: "pause", id: first.id, count: n });
      if (n >= 0) waiting = n;
    };
    var schedule = function () { if (!timer) timer = setTimeout(open, 30); }; // tabs opening together share one reconnect
    var open = function () {
      timer = 0;
      var want = Array.from(new Set(Array.from(watchers.values(), function (w) { return w.url; }))).sort();
      if (es && want.join("\n") === urls.join("\n")) return;
      if (es) es.close();
      es = null; urls = want; latest = new Map();
      if (!want.length || !mux) return;
      var source = es = new EventSource(mux + "?" + want.map(function (u) { return "s=" + encodeURIComponent(u); }).join("&"));
      source.onopen = function () { retry = 1000; all("open"); };
      source.onerror = function () {
        all("error");
        if (source.readyState === EventSource.CLOSED && es === source) {
          es = null; urls = []; // refused (429) or gone: try again later
          setTimeout(schedule, retry);
          retry = Math.min(retry * 2, 30000);
        }
      };
      // data: "<url indexes, or *> <event>\n<html>"
      source.addEventListener("m", function (e) {
        var nl = e.data.indexOf("\n"), head = e.data.slice(0, nl), data = e.data.slice(nl + 1);
        var sp = head.indexOf(" "), to = head.slice(0, sp), event = head.slice(sp + 1);
        var mine = to === "*" ? urls : to.split(",").map(function (i) { return urls[+i]; });
        mine.forEach(function (u) {
          if (!latest.has(u)) latest.set(u, new Map());
          latest.get(u).set(event, data);
        });
        watchers.forEach(function (w) { if (mine.indexOf(w.url) >= 0) deliver(w, event, data); });
        if (event === "nav-badge") counted(data);
      });
    };
    self.onconnect = function (c) {
      var port = c.ports[0], pid = ports++;
      port.onmessage = function (m) {
        var msg = m.data, key = pid + "#" + msg.id;
        if (msg.mux) mux = msg.mux;
        if (msg.type === "watch") {
          var w = { port: port, id: msg.id, url: msg.url, sent: new Map() };
          watchers.set(key, w);
          if (es && urls.indexOf(msg.url) >= 0) { // already streamed: hand over what it has
            if (es.readyState === EventSource.OPEN) post(w, { type: "open", id: w.id });
            (latest.get(msg.url) || new Map()).forEach(function (d, ev) { deliver(w, ev, d); });
          } else schedule();
        } else if (msg.type === "unwatch") {
          watchers.delete(key); schedule();
        } else if (msg.type === "bye") {
          watchers.forEach(function (w, k) { if (w.port === port) watchers.delete(k); });
          schedule();
        }
      };
      port.start();
    };
    return;
  }

  var script = document.currentScript;
  var paused = function (yes) {
    var note = document.getElementById("live-paused");
    if (note) note.hidden = !yes;
    document.documentElement.setAttribute("data-live", yes ? "paused" : "open");
  };
  document.addEventListener("htmx:sseError", function () { paused(true); });
  document.addEventListener("htmx:sseOpen", function () { paused(false); });

  var titled = function () {
    var badge = document.getElementById("nav-pending"), n = badge ? +badge.textContent : 0;
    var base = document.title.replace(/^\(\d+\) /, "");
    document.title = n > 0 ? "(" + n + ") " + base : base;
  };
  ["DOMContentLoaded", "htmx:afterSettle", "htmx:sseMessage"].forEach(function (e) { document.addEventListener(e, titled); });
  // "Notify me": chosen per browser (localStorage), shown only once permission is granted.
  var button, on = function () {
    try { return localStorage.getItem("localui-notify") === "on" && Notification.permission === "granted"; } catch (e) { return false; }
  };
  var shown = function () { button.setAttribute("aria-pressed", on()); button.textContent = on() ? "Notifying" : "Notify me"; };
  document.addEventListener("DOMContentLoaded", function () {
    button = document.getElementById("notify-toggle");
    if (!button || !window.Notification) return;
    button.hidden = false;
    shown();
    button.onclick = function () {
      var keep = function (yes) { try { localStorage.setItem("localui-notify", yes ? "on" : "off"); } catch (e) { /* not kept */ } shown(); };
      if (on()) keep(false);
      else Notification.requestPermission().then(function (answer) { keep(answer === "granted"); });
    };
  });
  var notify = function (n) {
    if (!button || !on()) return;
    new Notification((n === 1 ? "1 run waits" : n + " runs wait") + " for a person", {
      body: "A new pause is in the approvals queue.", tag: "localui-approvals"
    }).onclick = function () { window.focus(); location.href = button.getAttribute("data-approvals"); };
  };

  if (typeof SharedWorker === "undefined" || !window.htmx || !script) return;
  var port;
  try { port = new SharedWorker(script.src, { name: "localui-live" }).port; } catch (e) { return; }
  var mux = script.getAttribute("data-mux"), sources = new Map(), next = 0;
  var watch = function (s) { port.postMessage({ type: "watch", id: s.id, url: s.url, mux: mux }); };

  // What htmx's SSE extension uses of an EventSource, fed by the worker.
  function SharedSource(url) {
    var u = new URL(url, location.href);
    this.url = u.pathname + u.search;
    this.id = next++;
    this.readyState = 0; // the worker reconnects by itself: never CLOSED, so htmx never opens another
    this.onopen = this.onerror = null;
    this.listeners = new Map();
    sources.set(this.id, this);
    watch(this);
  }
  SharedSource.prototype.addEventListener = function (type, fn) {
    if (!this.listeners.has(type)) this.listeners.set(type, new Set());
    this.listeners.get(type).add(fn);
  };
  SharedSource.prototype.removeEventListener = function (type, fn) {
    if (this.listeners.has(type)) this.listeners.get(type).delete(fn);
  };
  SharedSource.prototype.close = function () {
    if (this.readyState === 2) return;
    this.readyState = 2;
    sources.delete(this.id);
    port.postMessage({ type: "unwatch", id: this.id });
  };
  port.onmessage = function (m) {
    var msg = m.data, s = sources.get(msg.id);
    if (msg.type === "pause") { notify(msg.count); return; }
    if (!s) return;
    if (msg.type === "event") {
      var e = new MessageEvent(msg.event, { data: msg.data });
      (s.listeners.get(msg.event) || []).forEach(function (fn) { fn(e); });
    } else if (msg.type === "open") {
      s.readyState = 1;
      if (s.onopen) s.onopen(new Event("open"));
    } else if (msg.type === "error") {
      s.readyState = 0;
      if (s.onerror) s.onerror(new Event("error"));
    }
  };
  port.start();
  addEventListener("pagehide", function () { port.postMessage({ type: "bye", id: -1 }); });
  addEventListener("pageshow", function (e) { if (e.persisted) sources.forEach(watch); }); // back from bfcache
  window.htmx.createEventSource = function (url) { return new SharedSource(url); };
})();
