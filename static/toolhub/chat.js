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
      node.appendChild(el("ol", "call-events"));
      node.appendChild(el("pre", "call-body"));
      cards[event.toolCallId] = node;
      timeline.appendChild(node);
    }
    return node;
  }

  function at(event) {
    var when = event.at ? new Date(event.at) : new Date();
    return isNaN(when) ? "" : when.toLocaleTimeString();
  }

  // What each event says, one line per event (who decided and why stay visible).
  function describe(event) {
    if (event.type === "approval_required") {
      return "waiting for a human (" + event.effect + ", " + event.consequenceLevel + ")" +
        (event.reason ? ": " + event.reason : "");
    }
    if (event.type === "approval_decided") {
      var word = { approve: "approved", reject: "rejected", expire: "expired", cancel: "cancelled" }[event.decision] || event.decision;
      return word + (event.decidedBy ? " by " + event.decidedBy : "") +
        (event.argsEdited ? " with edited arguments" : "") + (event.reason ? " — " + event.reason : "");
    }
    if (event.type === "tool_call_start") return "running";
    if (event.type === "tool_call_progress") return "progress" + (event.message ? ": " + event.message : "");
    if (event.type === "tool_call_result") {
      return event.ok ? "done in " + event.durationMs + " ms" : "failed — " + event.errorCode + ": " + event.safeMessage;
    }
    return event.type;
  }

  function render(event) {
    var node = card(event);
    var status = node.querySelector(".call-status");
    var body = node.querySelector(".call-body");
    var line = el("li", "call-event " + event.type);
    line.appendChild(el("time", "muted", at(event)));
    line.appendChild(document.createTextNode(" " + describe(event)));
    node.querySelector(".call-events").appendChild(line);
    node.dataset.lastType = event.type;
    status.textContent = describe(event);
    if (event.type === "approval_required") {
      body.textContent = JSON.stringify(event.args, null, 2);
    } else if (event.type === "tool_call_start") {
      if (event.args) body.textContent = JSON.stringify(event.args, null, 2);
    } else if (event.type === "tool_call_result") {
      node.classList.add(event.ok ? "ok" : "failed");
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
      // Not an event (stream_lagging before 4008): the reconnect resumes after lastSeq.
      if (typeof event.seq !== "number" || event.seq <= lastSeq) return;
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

  function refuse(text) {
    callError.textContent = text;
    callError.hidden = false;
  }

  // Picking a tool fills in its arguments' template (from its schema), unless the
  // arguments were typed by hand since the last template.
  var form = document.getElementById("call-form");
  var templates = JSON.parse(document.getElementById("arg-templates").textContent);
  var lastTemplate = null;
  function fillTemplate() {
    var template = JSON.stringify(templates[form.toolId.value] || {}, null, 2);
    if (lastTemplate === null || form.args.value.trim() === "{}" || form.args.value === lastTemplate) {
      form.args.value = template;
      lastTemplate = template;
    }
  }
  form.toolId.addEventListener("change", fillTemplate);
  fillTemplate();

  form.addEventListener("submit", function (submit) {
    submit.preventDefault();
    var args;
    try {
      args = JSON.parse(form.args.value || "{}");
    } catch (e) {
      form.args.setAttribute("aria-invalid", "true");
      refuse("The arguments are not valid JSON (" + e.message + "); nothing was sent.");
      return;
    }
    if (args === null || typeof args !== "object" || Array.isArray(args)) {
      form.args.setAttribute("aria-invalid", "true");
      refuse("The arguments must be a JSON object, e.g. {\"text\": \"hi\"}; nothing was sent.");
      return;
    }
    form.args.removeAttribute("aria-invalid");
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
        refuse("Call refused (" + response.status + "): " + (body.detail || body.safeMessage || response.statusText));
      });
    });
  });
})();
