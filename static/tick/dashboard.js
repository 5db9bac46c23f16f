// Lag percentiles per lane, drawn with the vendored Chart.js (static/vendor/chartjs).
(function () {
  var node = document.getElementById("lag-data");
  if (!node || typeof Chart === "undefined") return;
  var data = JSON.parse(node.textContent);
  var colors = { p50: "#2b7a4b", p95: "#c58b00", p99: "#b3261e" };
  ["strict", "flexible"].forEach(function (lane) {
    var canvas = document.getElementById("lag-" + lane);
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
})();
