// The overview: five charts drawn with Chart.js (static/vendor/chartjs), redrawn from
// /console/overview/data/ every 5 seconds. window.toolhubOverview exposes the charts and
// the last answer, for the browser tests and for curious operators.
(function () {
  "use strict";
  var root = document.getElementById("overview");
  if (!root || !window.Chart) return;
  var state = document.getElementById("live-state");
  var pendingNow = document.getElementById("pending-now");
  var COLORS = {
    succeeded: "#2e9d55", failed: "#c62828", cancelled: "#8d6e63", pending_approval: "#e0a100",
    queued: "#5b8def", running: "#2454d6"
  };
  Chart.defaults.animation = false;
  Chart.defaults.maintainAspectRatio = false;

  function minuteLabel(iso) {
    var d = new Date(iso);
    return String(d.getUTCHours()).padStart(2, "0") + ":" + String(d.getUTCMinutes()).padStart(2, "0");
  }
  function make(id, type, options) {
    return new Chart(document.getElementById(id), { type: type, data: { labels: [], datasets: [] }, options: options || {} });
  }
  var charts = {
    calls: make("chart-calls", "bar", { scales: { x: { stacked: true }, y: { stacked: true, beginAtZero: true, ticks: { precision: 0 } } } }),
    latency: make("chart-latency", "bar", { indexAxis: "y", scales: { x: { beginAtZero: true } } }),
    pending: make("chart-pending", "line", { scales: { y: { beginAtZero: true, ticks: { precision: 0 } } }, plugins: { legend: { display: false } } }),
    deniedTools: make("chart-denied-tools", "bar", { indexAxis: "y", plugins: { legend: { display: false } }, scales: { x: { beginAtZero: true, ticks: { precision: 0 } } } }),
    deniedPrincipals: make("chart-denied-principals", "bar", { indexAxis: "y", plugins: { legend: { display: false } }, scales: { x: { beginAtZero: true, ticks: { precision: 0 } } } })
  };
  window.toolhubOverview = { charts: charts, last: null, draws: 0 };

  function draw(data) {
    var minutes = data.minutes.map(minuteLabel);
    charts.calls.data.labels = minutes;
    charts.calls.data.datasets = data.callsPerMinute.map(function (series) {
      return { label: series.label, data: series.data, backgroundColor: COLORS[series.label] || "#9aa5b8" };
    });
    charts.latency.data.labels = data.latencyByTool.map(function (row) { return row.tool; });
    charts.latency.data.datasets = [
      { label: "p50", data: data.latencyByTool.map(function (row) { return row.p50Ms; }), backgroundColor: "#5b8def" },
      { label: "p99", data: data.latencyByTool.map(function (row) { return row.p99Ms; }), backgroundColor: "#e0a100" }
    ];
    charts.pending.data.labels = minutes;
    charts.pending.data.datasets = [{ label: "pending", data: data.pendingOverTime, borderColor: "#e0a100", backgroundColor: "rgba(224,161,0,.2)", fill: true, stepped: true }];
    // Counts on a scale of their own size: a lone denial is a short bar, not a full one.
    [[charts.deniedTools, data.topDeniedTools], [charts.deniedPrincipals, data.topDeniedPrincipals]].forEach(function (pair) {
      var most = pair[1].reduce(function (top, row) { return Math.max(top, row.count); }, 0);
      pair[0].options.scales.x.suggestedMax = Math.max(5, Math.ceil(most * 1.2));
    });
    charts.deniedTools.data.labels = data.topDeniedTools.map(function (row) { return row.name; });
    charts.deniedTools.data.datasets = [{ label: "denied", data: data.topDeniedTools.map(function (row) { return row.count; }), backgroundColor: "#c62828" }];
    charts.deniedPrincipals.data.labels = data.topDeniedPrincipals.map(function (row) { return row.name; });
    charts.deniedPrincipals.data.datasets = [{ label: "denied", data: data.topDeniedPrincipals.map(function (row) { return row.count; }), backgroundColor: "#c62828" }];
    Object.keys(charts).forEach(function (name) { charts[name].update("none"); });
    pendingNow.textContent = data.pendingNow + " call" + (data.pendingNow === 1 ? "" : "s") + " waiting for a decision now.";
    window.toolhubOverview.last = data;
    window.toolhubOverview.draws += 1;
  }

  function refresh() {
    fetch(root.dataset.url, { credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.json() : Promise.reject(response.status); })
      .then(function (data) { draw(data); state.textContent = "live"; state.classList.remove("offline"); })
      .catch(function () { state.textContent = "offline"; state.classList.add("offline"); });
  }
  refresh();
  setInterval(refresh, 5000);
})();
