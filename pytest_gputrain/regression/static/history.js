/* pytest-gputrain history site: one chart per series (drawn with uPlot), each step marked with
 * a vertical line and its size. Drawn charts carry what they drew in data attributes
 * (data-points, data-changes), which the browser tests read. */
(function () {
  "use strict";

  var DATA = JSON.parse(document.getElementById("gputrain-history").textContent);
  var drawn = [];
  window.gputrain = {charts: drawn, ready: false};

  function css(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#000";
  }

  function fmt(value, unit) {
    if (value == null) return "–";
    var text = Math.abs(value) >= 100 ? value.toFixed(1) : Number(value.toPrecision(4)).toString();
    return unit ? text + " " + unit : text;
  }

  function markChanges(u, changes) {
    var ctx = u.ctx, box = u.bbox;
    ctx.save();
    ctx.strokeStyle = css("--error");
    ctx.fillStyle = css("--error");
    ctx.lineWidth = 2 * devicePixelRatio;
    ctx.font = Math.round(11 * devicePixelRatio) + "px sans-serif";
    changes.forEach(function (change, i) {
      // Between the last session before the step and the first after it.
      var x = Math.round(u.valToPos(change.x - 0.5, "x", true));
      ctx.beginPath();
      ctx.moveTo(x, box.top);
      ctx.lineTo(x, box.top + box.height);
      ctx.stroke();
      var room = box.left + box.width - x;
      var text = change.label;
      var y = box.top + (12 + 12 * (i % 3)) * devicePixelRatio;
      if (ctx.measureText(text).width + 6 > room) {
        ctx.textAlign = "right";
        ctx.fillText(text, x - 3 * devicePixelRatio, y);
        ctx.textAlign = "left";
      } else {
        ctx.fillText(text, x + 3 * devicePixelRatio, y);
      }
    });
    ctx.restore();
  }

  function chart(element, series) {
    var width = Math.max(320, Math.floor(element.getBoundingClientRect().width) || 800);
    var plot = new uPlot({
      width: width, height: 240,
      series: [
        {label: "session", value: function (u, v) {
          return v == null ? "–" : "#" + v + " (run #" + series.runs[v - 1] + ")";
        }},
        {label: series.label, stroke: "#1f5fa8", width: 1.5, points: {show: true, size: 5},
         value: function (u, v) { return fmt(v, series.unit); }},
      ],
      scales: {x: {time: false, range: [0.5, series.x.length + 0.5]}},
      axes: [{label: "session (oldest first)", stroke: css("--ink"), grid: {stroke: css("--grid")}},
             {label: series.unit, stroke: css("--ink"), grid: {stroke: css("--grid")}, size: 60,
              values: function (u, splits) { return splits.map(function (v) { return fmt(v); }); }}],
      hooks: {draw: [function (u) { markChanges(u, series.changes); }]},
    }, [series.x, series.y], element);
    element.dataset.points = String(series.x.length);
    element.dataset.changes = String(series.changes.length);
    return plot;
  }

  document.querySelectorAll("figure.history-chart").forEach(function (element) {
    drawn.push(chart(element, DATA.series[+element.dataset.index]));
  });
  window.addEventListener("resize", function () {
    drawn.forEach(function (plot) {
      plot.setSize({width: Math.max(320, Math.floor(plot.root.parentNode.getBoundingClientRect().width)),
                    height: plot.height});
    });
  });
  window.gputrain.ready = true;
})();
