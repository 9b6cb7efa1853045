/* localui: one live stream per browser, shared by its tabs.
 * Why: htmx's SSE extension opens an EventSource per page, and a browser opens at most
 * six connections to a server, so six tabs froze every tab. The extension cannot share
 * a stream; this file does only that. In a page it replaces htmx.createEventSource with
 * a stand-in fed by a SharedWorker (this same file), which holds one EventSource on
 * /live/mux for the union of the URLs the tabs watch. Without SharedWorker each page
 * keeps its own stream (the server caps them), and pages say when live updates pause. */
(function () {
  "use strict";
  if (typeof SharedWorkerGlobalScope !== "undefined" && self instanceof SharedWorkerGlobalScope) {
    var watchers = new Map(); // "port#id" -> {port, id, url, sent: event -> data}
    var latest = new Map(); // url -> (event -> data) from the open stream
    var es = null, urls = [], mux = "", timer = 0, retry = 1000, ports = 0;
    var post = function (w, m) { try { w.port.postMessage(m); } catch (e) { /* tab gone */ } };
    var all = function (type) { watchers.forEach(function (w) { post(w, { type: type, id: w.id }); }); };
    var deliver = function (w, event, data) {
      if (w.sent.get(event) === data) return;
      w.sent.set(event, data);
      post(w, { type: "event", id: w.id, event: event, data: data });
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
