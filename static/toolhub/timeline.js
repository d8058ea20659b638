// A run's timeline: the server rendered the events so far; this appends the ones that
// follow, from /ws/v1/runs/{runId}/?after=<last seq>, and resumes there after a drop.
(function () {
  "use strict";
  var list = document.getElementById("timeline");
  if (!list) return;
  var state = document.getElementById("live-state");
  var empty = document.getElementById("no-events");
  var lastSeq = parseInt(list.dataset.lastSeq, 10) || 0;

  function pad(n, width) { return String(n).padStart(width || 2, "0"); }
  function stamp(iso) {
    var d = new Date(iso);
    if (isNaN(d)) return iso;
    return d.getUTCFullYear() + "-" + pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) + " " +
      pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds());
  }

  function append(message) {
    if (typeof message.seq !== "number" || message.seq <= lastSeq) return;
    lastSeq = message.seq;
    var item = document.createElement("li");
    item.className = "event";
    item.dataset.seq = message.seq;
    var head = document.createElement("div");
    head.className = "call-head";
    head.textContent = "#" + message.seq + " " + stamp(message.at) + " " + message.type + " " +
      (message.toolId || "") + " " + (message.toolCallId || "");
    var body = document.createElement("pre");
    body.className = "call-body";
    body.textContent = JSON.stringify(message, null, 2);
    item.appendChild(head);
    item.appendChild(body);
    list.appendChild(item);
    if (empty) empty.hidden = true;
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var url = scheme + location.host + "/ws/v1/runs/" + encodeURIComponent(list.dataset.runId) +
      "/?after=" + lastSeq + "&tenant=" + encodeURIComponent(list.dataset.tenant);
    var socket = new WebSocket(url);
    socket.onopen = function () { state.textContent = "live"; state.classList.remove("offline"); };
    socket.onmessage = function (event) {
      var message = JSON.parse(event.data);
      // Retention pruned the events asked for; the stream closes (4410): resume after them.
      if (message.type === "events_pruned") lastSeq = Math.max(lastSeq, message.throughSeq);
      else append(message);
    };
    socket.onclose = function (event) {
      state.textContent = "offline";
      state.classList.add("offline");
      if (event.code !== 4403 && event.code !== 4400) setTimeout(connect, 3000);
    };
  }
  connect();
})();
