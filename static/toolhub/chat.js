// A minimal run-stream client: connect, render events, resume after the last seq.
(function () {
  "use strict";
  var timeline = document.getElementById("timeline");
  var state = document.getElementById("live-state");
  var runId = timeline.dataset.runId;
  var tenant = timeline.dataset.tenant;  // named on the stream and on every call
  var callError = document.getElementById("call-error");
  var lastSeq = 0;
  var cards = {};  // toolCallId -> card element

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function card(event) {
    var node = cards[event.toolCallId];
    if (!node) {
      node = el("li", "call");
      node.appendChild(el("div", "call-head", event.toolId));
      node.appendChild(el("div", "call-status muted", "…"));
      node.appendChild(el("pre", "call-body"));
      cards[event.toolCallId] = node;
      timeline.appendChild(node);
    }
    return node;
  }

  function render(event) {
    var node = card(event);
    var status = node.querySelector(".call-status");
    var body = node.querySelector(".call-body");
    node.dataset.lastType = event.type;
    if (event.type === "approval_required") {
      status.textContent = "waiting for a human (" + event.effect + ", " + event.consequenceLevel + ")";
      body.textContent = JSON.stringify(event.args, null, 2);
    } else if (event.type === "approval_decided") {
      status.textContent = "decision: " + event.decision + (event.reason ? " — " + event.reason : "");
    } else if (event.type === "tool_call_start") {
      status.textContent = "running";
      if (event.args) body.textContent = JSON.stringify(event.args, null, 2);
    } else if (event.type === "tool_call_result") {
      node.classList.add(event.ok ? "ok" : "failed");
      status.textContent = event.ok ? "done in " + event.durationMs + " ms" : event.errorCode + ": " + event.safeMessage;
      if (event.ok) body.textContent = JSON.stringify(event.result, null, 2);
    }
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var socket = new WebSocket(scheme + location.host + "/ws/v1/runs/" + encodeURIComponent(runId) + "/?after=" + lastSeq +
      "&tenant=" + encodeURIComponent(tenant));
    socket.onopen = function () { state.textContent = "live"; state.classList.remove("offline"); };
    socket.onmessage = function (message) {
      var event = JSON.parse(message.data);
      // Retention pruned the events asked for; the stream closes (4410): resume after them.
      if (event.type === "events_pruned") { lastSeq = Math.max(lastSeq, event.throughSeq); return; }
      if (event.seq <= lastSeq) return;
      lastSeq = event.seq;
      render(event);
    };
    socket.onclose = function (close) {
      state.textContent = "reconnecting (" + close.code + ")";
      state.classList.add("offline");
      if (close.code !== 4403 && close.code !== 4400) setTimeout(connect, 2000);
    };
  }
  connect();

  function cookie(name) {
    var match = document.cookie.match("(^|;)\\s*" + name + "=([^;]+)");
    return match ? decodeURIComponent(match[2]) : "";
  }

  document.getElementById("call-form").addEventListener("submit", function (submit) {
    submit.preventDefault();
    var form = submit.target;
    var args;
    try { args = JSON.parse(form.args.value || "{}"); } catch (e) { alert("Arguments are not valid JSON"); return; }
    fetch("/api/v1/invocations/", {
      method: "POST",
      credentials: "same-origin",
      headers: {
        "Content-Type": "application/json",
        "X-CSRFToken": cookie("csrftoken"),
        "X-Toolhub-Tenant": tenant
      },
      body: JSON.stringify({ toolId: form.toolId.value, args: args, runId: runId })
    }).then(function (response) {
      // The stream shows calls that ran; a refused request (403, 400...) is said here.
      if (response.ok) { callError.hidden = true; return; }
      return response.json().catch(function () { return {}; }).then(function (body) {
        callError.textContent = "Call refused (" + response.status + "): " + (body.detail || response.statusText);
        callError.hidden = false;
      });
    });
  });
})();
