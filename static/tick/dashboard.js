// Lag percentiles per lane (enqueue lag and start lag), drawn with the vendored Chart.js
// (static/vendor/chartjs).
(function () {
  if (typeof Chart === "undefined") return;
  var colors = { p50: "#2b7a4b", p95: "#c58b00", p99: "#b3261e" };
  ["lag", "start-lag"].forEach(function (chart) {
    var node = document.getElementById(chart + "-data");
    if (!node) return;
    var data = JSON.parse(node.textContent);
    ["strict", "flexible"].forEach(function (lane) {
      var canvas = document.getElementById(chart + "-" + lane);
      if (!canvas) return;
      new Chart(canvas, {
        type: "line",
        data: {
          labels: data.labels,
          datasets: ["p50", "p95", "p99"].map(function (q) {
            return { label: q, data: data.series[lane + "_" + q], borderColor: colors[q],
                     backgroundColor: colors[q], spanGaps: true, tension: 0.2, pointRadius: 2 };
          })
        },
        options: {
          responsive: true, animation: false,
          scales: { y: { beginAtZero: true, title: { display: true, text: "seconds" } } },
          plugins: { legend: { position: "bottom" } }
        }
      });
    });
  });
})();
