// Operator console: keeps the queue live and the countdowns ticking.
// Live updates come from the /ws/v1/approvals/ stream; if it is unavailable the
// page falls back to refreshing the rows every few seconds.
(function () {
  "use strict";

  function tickCountdowns() {
    document.querySelectorAll(".countdown[data-expires]").forEach(function (cell) {
      var left = Math.max(0, Math.round((Date.parse(cell.dataset.expires) - Date.now()) / 1000));
      var minutes = Math.floor(left / 60), seconds = left % 60;
      cell.textContent = left === 0 ? "expired" : (minutes ? minutes + " min " : "") + seconds + " s";
      cell.classList.toggle("urgent", left < 60);
    });
  }
  setInterval(tickCountdowns, 1000);
  tickCountdowns();

  // A decided call's outcome: re-fetched until it is final (the call runs in a worker).
  function followOutcome() {
    var section = document.getElementById("outcome");
    if (!section || section.dataset.final === "true") return;
    setTimeout(function () {
      fetch(section.dataset.outcomeUrl, { credentials: "same-origin" })
        .then(function (response) { return response.ok ? response.text() : Promise.reject(response.status); })
        .then(function (html) { section.outerHTML = html; })
        .finally(followOutcome);
    }, 1500);
  }
  followOutcome();

  var rows = document.getElementById("queue-rows");
  if (!rows) return;
  var counter = document.getElementById("pending-count");

  function showCount(count) {
    // The count leads the title, so a background tab says how many calls wait.
    document.title = (count > 0 ? "(" + count + ") " : "") + rows.dataset.title;
    if (counter) counter.textContent = count + " pending";
  }
  var state = document.getElementById("live-state");
  var refreshing = false, stale = false;

  function refresh() {
    // A change announced while a fetch is in flight may postdate its answer:
    // fetch once more when that one is done instead of dropping the request.
    if (refreshing) { stale = true; return; }
    refreshing = true;
    stale = false;
    fetch(rows.dataset.rowsUrl, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) {
        if (!response.ok) return Promise.reject(response.status);
        var count = parseInt(response.headers.get("X-Pending-Count"), 10);
        return response.text().then(function (html) { return { html: html, count: count }; });
      })
      .then(function (fresh) {
        // Ticked calls stay ticked across a refresh (a decided one just leaves).
        var ticked = {};
        rows.querySelectorAll("input[name=ids]:checked").forEach(function (box) { ticked[box.value] = true; });
        rows.innerHTML = fresh.html;
        rows.querySelectorAll("input[name=ids]").forEach(function (box) { box.checked = !!ticked[box.value]; });
        if (!isNaN(fresh.count)) showCount(fresh.count);
        tickCountdowns();
      })
      .catch(function () { if (state) state.classList.add("offline"); })
      .finally(function () { refreshing = false; if (stale) refresh(); });
  }

  var pickAll = document.getElementById("pick-all");
  if (pickAll) {
    pickAll.addEventListener("change", function () {
      rows.querySelectorAll("input[name=ids]").forEach(function (box) { box.checked = pickAll.checked; });
    });
  }

  var fallback = null;
  function poll() { if (!fallback) fallback = setInterval(refresh, 5000); }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var socket;
    try { socket = new WebSocket(scheme + location.host + "/ws/v1/approvals/"); } catch (e) { poll(); return; }
    socket.onopen = function () {
      if (state) state.classList.remove("offline");
      if (fallback) { clearInterval(fallback); fallback = null; }
      refresh();
    };
    socket.onmessage = function () { refresh(); };
    socket.onclose = function () {
      if (state) state.classList.add("offline");
      poll();
      setTimeout(connect, 3000);
    };
  }
  connect();
})();
