/* localui: one live stream per browser, shared by its tabs.
 *
 * Why this file exists: htmx's SSE extension opens one EventSource per page, and a
 * browser opens at most six HTTP/1.1 connections to one server, so six open tabs froze
 * every tab. The extension cannot share a stream between tabs; this file does only
 * that. In a page it replaces htmx.createEventSource with a stand-in that asks a
 * SharedWorker (this same file) for the page's events. The worker holds one
 * EventSource on /live/mux carrying the union of what the open tabs watch, and hands
 * each tab its fragments; the extension swaps them as before. Where SharedWorker is
 * missing, pages keep their own streams (the server caps them per browser, and the
 * page says when its live updates are paused).
 */
(function () {
  "use strict";

  /* ---- the worker: one EventSource for every tab ---------------------------------- */
  if (typeof SharedWorkerGlobalScope !== "undefined" && self instanceof SharedWorkerGlobalScope) {
    var watchers = new Map(); // "port#id" -> {port, id, url, sent: Map(event -> data)}
    var latest = new Map(); // url -> Map(event -> data), from the open stream
    var source = null;
    var openUrls = []; // the URLs the open stream carries, by index
    var mux = "";
    var reopenTimer = 0;
    var retryMs = 1000;
    var nextPort = 0;

    var post = function (w, msg) {
      try { w.port.postMessage(msg); } catch (e) { /* the tab is gone */ }
    };
    var deliver = function (w, event, data) {
      if (w.sent.get(event) === data) return;
      w.sent.set(event, data);
      post(w, { type: "event", id: w.id, event: event, data: data });
    };
    var wanted = function () {
      var urls = new Set();
      watchers.forEach(function (w) { urls.add(w.url); });
      return Array.from(urls).sort();
    };
    var reopen = function () {
      reopenTimer = 0;
      var urls = wanted();
      if (source && urls.join("\n") === openUrls.join("\n")) return;
      if (source) source.close();
      source = null;
      openUrls = urls;
      latest = new Map();
      if (!urls.length || !mux) return;
      var query = urls.map(function (u) { return "s=" + encodeURIComponent(u); }).join("&");
      var es = new EventSource(mux + "?" + query);
      source = es;
      es.onopen = function () {
        retryMs = 1000;
        watchers.forEach(function (w) { post(w, { type: "open", id: w.id }); });
      };
      es.onerror = function () {
        watchers.forEach(function (w) { post(w, { type: "error", id: w.id }); });
        if (es.readyState === EventSource.CLOSED && source === es) {
          // Refused (too many streams, a bad URL) or the server is gone: try again later.
          source = null;
          openUrls = [];
          setTimeout(schedule, retryMs);
          retryMs = Math.min(retryMs * 2, 30000);
        }
      };
      es.addEventListener("m", function (e) {
        var text = e.data;
        var nl = text.indexOf("\n");
        var head = nl < 0 ? text : text.slice(0, nl);
        var data = nl < 0 ? "" : text.slice(nl + 1);
        var sp = head.indexOf(" ");
        var to = head.slice(0, sp);
        var event = head.slice(sp + 1);
        var urls = to === "*" ? openUrls : to.split(",").map(function (i) { return openUrls[+i]; });
        urls.forEach(function (url) {
          if (!latest.has(url)) latest.set(url, new Map());
          latest.get(url).set(event, data);
        });
        watchers.forEach(function (w) {
          if (urls.indexOf(w.url) >= 0) deliver(w, event, data);
        });
      });
    };
    var schedule = function () {
      // Tabs opening together (a restored session) share one reconnect.
      if (!reopenTimer) reopenTimer = setTimeout(reopen, 30);
    };

    self.onconnect = function (connect) {
      var port = connect.ports[0];
      var portId = nextPort++;
      port.onmessage = function (m) {
        var msg = m.data;
        if (msg.mux) mux = msg.mux;
        var key = portId + "#" + msg.id;
        if (msg.type === "watch") {
          var w = { port: port, id: msg.id, url: msg.url, sent: new Map() };
          watchers.set(key, w);
          if (source && openUrls.indexOf(msg.url) >= 0) {
            // Already streamed: hand the tab the current fragments at once.
            if (source.readyState === EventSource.OPEN) post(w, { type: "open", id: w.id });
            (latest.get(msg.url) || new Map()).forEach(function (data, event) {
              deliver(w, event, data);
            });
          } else {
            schedule();
          }
        } else if (msg.type === "unwatch") {
          watchers.delete(key);
          schedule();
        } else if (msg.type === "bye") {
          watchers.forEach(function (w, k) { if (w.port === port) watchers.delete(k); });
          schedule();
        }
      };
      port.start();
    };
    return;
  }

  /* ---- the page: a stand-in EventSource for htmx's SSE extension ------------------- */
  var script = document.currentScript;
  var banner = function (paused) {
    var note = document.getElementById("live-paused");
    if (note) note.hidden = !paused;
    document.documentElement.setAttribute("data-live", paused ? "paused" : "open");
  };
  // Shown while a stream is down (refused, or the server unreachable); every tab says
  // so rather than quietly going stale.
  document.addEventListener("htmx:sseError", function () { banner(true); });
  document.addEventListener("htmx:sseOpen", function () { banner(false); });

  if (typeof SharedWorker === "undefined" || !window.htmx || !script) return;
  var worker;
  try {
    worker = new SharedWorker(script.src, { name: "localui-live" });
  } catch (e) {
    return; // the page keeps its own stream
  }
  var port = worker.port;
  var mux = script.getAttribute("data-mux");
  var sources = new Map();
  var nextId = 0;

  function SharedSource(url) {
    this.url = new URL(url, location.href).pathname + new URL(url, location.href).search;
    this.id = nextId++;
    this.readyState = 0;
    this.withCredentials = true;
    this.onopen = null;
    this.onerror = null;
    this.onmessage = null;
    this.listeners = new Map();
    sources.set(this.id, this);
    port.postMessage({ type: "watch", id: this.id, url: this.url, mux: mux });
  }
  SharedSource.prototype.addEventListener = function (type, fn) {
    if (!this.listeners.has(type)) this.listeners.set(type, new Set());
    this.listeners.get(type).add(fn);
  };
  SharedSource.prototype.removeEventListener = function (type, fn) {
    var set = this.listeners.get(type);
    if (set) set.delete(fn);
  };
  SharedSource.prototype.close = function () {
    if (this.readyState === 2) return;
    this.readyState = 2;
    sources.delete(this.id);
    port.postMessage({ type: "unwatch", id: this.id });
  };
  SharedSource.prototype.dispatch = function (type, data) {
    var e = new MessageEvent(type, { data: data });
    (this.listeners.get(type) || new Set()).forEach(function (fn) { fn(e); });
  };

  port.onmessage = function (m) {
    var msg = m.data;
    var s = sources.get(msg.id);
    if (!s) return;
    if (msg.type === "event") {
      s.dispatch(msg.event, msg.data);
    } else if (msg.type === "open") {
      s.readyState = 1;
      if (s.onopen) s.onopen(new Event("open"));
    } else if (msg.type === "error") {
      // The worker reconnects by itself: stay CONNECTING so htmx does not open another.
      s.readyState = 0;
      if (s.onerror) s.onerror(new Event("error"));
    }
  };
  port.start();
  window.addEventListener("pagehide", function () {
    port.postMessage({ type: "bye", id: -1 });
  });
  window.addEventListener("pageshow", function (e) {
    if (!e.persisted) return; // back from the back/forward cache: watch again
    sources.forEach(function (s) {
      port.postMessage({ type: "watch", id: s.id, url: s.url, mux: mux });
    });
  });
  window.htmx.createEventSource = function (url) { return new SharedSource(url); };
})();
