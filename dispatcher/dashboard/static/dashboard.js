// The overview's live charts: one EventSource on /api/overview/stream feeds three uPlot charts and
// the figures above them. No inline script anywhere: the page's CSP allows only files of this site.
(function () {
  "use strict";
  var KEEP = 120; // points kept on the charts (two minutes at one a second)
  var RATES = ["enqueued", "started", "succeeded", "failed", "dead_lettered"];
  var LATENCY = ["p50", "p95", "p99"];
  var STATES = ["delayed", "ready", "leased", "dead"];
  var COLORS = ["#2563eb", "#7c3aed", "#16a34a", "#dc2626", "#111827"];

  function chart(el, names) {
    var series = [{}].concat(names.map(function (name, i) {
      return { label: name, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true };
    }));
    var data = [[]].concat(names.map(function () { return []; }));
    var width = Math.max(320, el.clientWidth || 480);
    return { plot: new uPlot({ width: width, height: 200, series: series, scales: { x: { time: true } } }, data, el), data: data };
  }

  function push(c, t, values) {
    c.data[0].push(t);
    values.forEach(function (v, i) { c.data[i + 1].push(v); });
    if (c.data[0].length > KEEP) { c.data.forEach(function (column) { column.shift(); }); }
    c.plot.setData(c.data);
  }

  function text(id, value) {
    var el = document.getElementById(id);
    if (el) { el.textContent = value; }
  }

  function seconds(v) { return v === null || v === undefined ? "–" : (v < 1 ? (v * 1000).toFixed(1) + " ms" : v.toFixed(2) + " s"); }

  function start() {
    var ratesEl = document.getElementById("chart-rates");
    if (!ratesEl || typeof uPlot === "undefined" || typeof EventSource === "undefined") { return; }
    var rates = chart(ratesEl, RATES);
    var latency = chart(document.getElementById("chart-latency"), LATENCY);
    var depth = chart(document.getElementById("chart-depth"), STATES);
    var problem = document.getElementById("live-problem");
    var samples = 0;
    var source = new EventSource(ratesEl.getAttribute("data-stream"));
    source.addEventListener("point", function (event) {
      var p = JSON.parse(event.data);
      push(rates, p.t, RATES.map(function (f) { return p.rates[f]; }));
      push(latency, p.t, LATENCY.map(function (q) { return p.latency_s[q]; }));
      push(depth, p.t, STATES.map(function (s) { return p.depth[s]; }));
      RATES.forEach(function (f) { text("rate-" + f, p.rates[f]); });
      LATENCY.forEach(function (q) { text("latency-" + q, seconds(p.latency_s[q])); });
      STATES.forEach(function (s) { text("depth-" + s, p.depth[s]); });
      text("oldest-ready", (p.oldest_ready_age_ms / 1000).toFixed(1) + " s");
      samples += 1;
      text("samples", samples);
      document.body.setAttribute("data-samples", String(samples));
      if (problem) { problem.hidden = true; }
    });
    source.addEventListener("problem", function (event) {
      if (problem) {
        problem.textContent = JSON.parse(event.data).error;
        problem.className = "flash error";
        problem.hidden = false;
      }
    });
  }

  document.addEventListener("DOMContentLoaded", start);
})();
