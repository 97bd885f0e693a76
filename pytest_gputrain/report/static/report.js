/* pytest-gputrain HTML report: filters, permalinks and the charts (drawn with uPlot).
 *
 * The page is complete without this script (every finding and figure is in the HTML); the script
 * filters it and draws each test's timeline when the test is open and on screen, so that a report
 * of hundreds of tests opens at once. Drawn charts carry what they drew in data attributes
 * (data-series, data-step-markers, data-failure-marker), which the browser tests read. */
(function () {
  "use strict";

  var DATA = JSON.parse(document.getElementById("gputrain-data").textContent);
  // Colours tell series apart on screen; the dash patterns and the legend do without colour.
  var PALETTE = ["#1f5fa8", "#c2410c", "#15803d", "#7e22ce", "#0f766e", "#a16207"];
  var AXIS = 60;  // the width of every chart's y axes, so that the time axes line up
  var drawn = [];
  window.gputrain = {charts: drawn, ready: false};

  function css(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#000";
  }

  function fmt(value, unit) {
    if (value == null) return "–";
    var text = Math.abs(value) >= 100 ? value.toFixed(0) : Number(value.toPrecision(3)).toString();
    return unit ? text + " " + unit : text;
  }

  function width(element) {
    return Math.max(320, Math.floor(element.getBoundingClientRect().width) || 800);
  }

  // -- markers: profiler window, throttling, step ends, out-of-memory errors, the failure -----

  function xpos(u, value) {
    return Math.round(u.valToPos(value, "x", true));
  }

  function label(u, text, x, y, colour) {
    var ctx = u.ctx, gap = 3 * devicePixelRatio;
    ctx.fillStyle = colour;
    ctx.font = Math.round(11 * devicePixelRatio) + "px sans-serif";
    var room = u.bbox.left + u.bbox.width - x;  // near the right edge: written to the left
    if (ctx.measureText(text).width + gap > room) {
      ctx.textAlign = "right";
      ctx.fillText(text, x - gap, y);
      ctx.textAlign = "left";
    } else {
      ctx.fillText(text, x + gap, y);
    }
  }

  function band(u, from, to, fill, text, row) {
    var box = u.bbox, ctx = u.ctx;
    var a = xpos(u, from), b = xpos(u, to);
    ctx.fillStyle = fill;
    ctx.fillRect(a, box.top, Math.max(1, b - a), box.height);
    if (text) label(u, text, a, box.top + (12 + 12 * row) * devicePixelRatio, css("--ink"));
  }

  function vline(u, at, colour, dash, lineWidth) {
    var box = u.bbox, ctx = u.ctx, x = xpos(u, at);
    ctx.strokeStyle = colour;
    ctx.lineWidth = lineWidth * devicePixelRatio;
    ctx.setLineDash(dash.map(function (d) { return d * devicePixelRatio; }));
    ctx.beginPath();
    ctx.moveTo(x, box.top);
    ctx.lineTo(x, box.top + box.height);
    ctx.stroke();
    ctx.setLineDash([]);
    return x;
  }

  function drawMarkers(u, markers, element) {
    var ctx = u.ctx, box = u.bbox;
    ctx.save();
    (markers.throttled || []).forEach(function (span, i) {
      band(u, span[0], span[1], "rgba(220, 38, 38, 0.12)", i === 0 ? "throttled" : "", 1);
    });
    if (markers.window) {
      band(u, markers.window[0], markers.window[1], "rgba(100, 100, 100, 0.15)",
           "profiler window", 0);
    }
    var steps = markers.steps || [];
    ctx.strokeStyle = css("--muted");
    ctx.lineWidth = devicePixelRatio;
    ctx.beginPath();
    steps.forEach(function (t) {  // a rug of step ends along the bottom
      var x = xpos(u, t);
      ctx.moveTo(x, box.top + box.height);
      ctx.lineTo(x, box.top + box.height - 5 * devicePixelRatio);
    });
    ctx.stroke();
    (markers.oom || []).forEach(function (t) {
      vline(u, t, css("--error"), [4, 3], 1);
    });
    if (markers.failure) {
      var x = vline(u, markers.failure.t, css("--error"), [], 2);
      label(u, "✖ failure: " + markers.failure.label, x, box.top + 36 * devicePixelRatio,
            css("--error"));
    }
    ctx.restore();
    element.dataset.stepMarkers = String(steps.length);
    element.dataset.failureMarker = markers.failure ? "1" : "0";
    element.dataset.window = markers.window ? "1" : "0";
  }

  // -- one test's run: a chart per group of series, on one time axis -------------------------

  function runChart(element, chart, timeline, syncKey) {
    var tables = chart.tables.map(function (t) {
      return [t.x].concat(t.series.map(function (s) { return s.values; }));
    });
    var aligned = uPlot.join(tables);
    var series = [{label: "time", value: function (u, v) { return fmt(v, "s"); }}];
    var scales = {x: {time: false, range: [0, Math.max(timeline.end, 1e-3)]}};
    var axes = [{label: "seconds since the test began", stroke: css("--ink"),
                 grid: {stroke: css("--grid")}}];
    var index = 0;
    chart.tables.forEach(function (table) {
      table.series.forEach(function (s) {
        var colour = PALETTE[index % PALETTE.length];
        index += 1;
        series.push({label: s.label, scale: s.scale, stroke: colour, width: 1.5,
                     dash: s.dash, spanGaps: true, points: {show: table.x.length < 40},
                     paths: s.stepped ? uPlot.paths.stepped({align: 1}) : undefined,
                     value: (function (unit) {
                       return function (u, v) { return fmt(v, unit); };
                     })(s.unit)});
        if (!scales[s.scale]) {
          scales[s.scale] = {auto: true};
          var side = axes.length === 1 ? 3 : 1;
          axes.push({scale: s.scale, side: side, label: s.unit, stroke: css("--ink"),
                     grid: {show: side === 3, stroke: css("--grid")}, size: AXIS,
                     values: function (u, splits) {
                       return splits.map(function (v) { return fmt(v); });
                     }});
        }
      });
    });
    if (axes.length === 2) {  // an empty right axis: every chart's x axis then lines up
      axes.push({scale: axes[1].scale, side: 1, size: AXIS, label: "", grid: {show: false},
                 ticks: {show: false}, values: function (u, splits) {
                   return splits.map(function () { return ""; });
                 }});
    }
    var plot = new uPlot({
      width: width(element), height: 170, series: series, scales: scales, axes: axes,
      cursor: {sync: {key: syncKey}}, legend: {live: true},
      hooks: {draw: [function (u) { drawMarkers(u, timeline.markers, element); }]},
    }, aligned, element);
    element.dataset.series = String(series.length - 1);
    return plot;
  }

  // -- a launch: one lane per rank, each step split into busy time and waiting for the others

  function lanesChart(element, timeline, syncKey) {
    var lanes = timeline.lanes;
    var xs = [];
    lanes.forEach(function (lane) { xs = xs.concat(lane.ends); });
    xs = Array.from(new Set(xs)).sort(function (a, b) { return a - b; });
    var position = new Map(xs.map(function (x, i) { return [x, i]; }));
    var data = [xs];
    var series = [{label: "time", value: function (u, v) { return fmt(v, "s"); }}];
    lanes.forEach(function (lane, i) {
      var ys = new Array(xs.length);
      lane.ends.forEach(function (t) { ys[position.get(t)] = i; });
      data.push(ys);
      var words = "rank " + lane.rank + (lane.rank === timeline.straggler ? " (straggler)" : "") +
                  (timeline.stuck.indexOf(lane.rank) >= 0 ? " (stuck)" : "");
      series.push({label: words, scale: "rank", stroke: PALETTE[i % PALETTE.length],
                   paths: function () { return null; }, points: {show: false},
                   value: (function (l) {
                     return function () { return (l.steps == null ? "?" : l.steps) + " steps"; };
                   })(lane)});
    });
    function draw(u) {
      var ctx = u.ctx;
      ctx.save();
      lanes.forEach(function (lane, i) {
        var colour = PALETTE[i % PALETTE.length];
        var top = u.valToPos(i + 0.3, "rank", true), bottom = u.valToPos(i - 0.3, "rank", true);
        for (var k = 1; k < lane.ends.length; k++) {
          var start = xpos(u, lane.ends[k - 1]), end = xpos(u, lane.ends[k]);
          var waitStart = xpos(u, lane.ends[k] - (lane.waits[k] || 0));
          ctx.fillStyle = colour;  // busy: solid
          ctx.fillRect(start, top, Math.max(1, waitStart - start), bottom - top);
          ctx.strokeStyle = colour;  // waiting for the other ranks: outlined only
          ctx.lineWidth = devicePixelRatio;
          ctx.strokeRect(waitStart, top, Math.max(1, end - waitStart), bottom - top);
        }
        lane.ends.forEach(function (t) {  // each step's end
          var x = xpos(u, t);
          ctx.fillStyle = css("--ink");
          ctx.fillRect(x, bottom, devicePixelRatio, 4 * devicePixelRatio);
        });
      });
      ctx.restore();
      element.dataset.stepMarkers = String(lanes.reduce(function (n, l) {
        return n + l.ends.length; }, 0));
      element.dataset.failureMarker = "0";
    }
    var plot = new uPlot({
      width: width(element), height: 110 + 44 * lanes.length, series: series,
      scales: {x: {time: false, range: [0, Math.max(timeline.end, 1e-3)]},
               rank: {range: [-0.6, lanes.length - 0.4]}},
      axes: [{label: "seconds since the first rank's first step event", stroke: css("--ink"),
              grid: {stroke: css("--grid")}},
             {scale: "rank", stroke: css("--ink"), size: 90, grid: {show: false},
              splits: function () { return lanes.map(function (l, i) { return i; }); },
              values: function (u, splits) {
                return splits.map(function (v) { return "rank " + lanes[v].rank; });
              }}],
      cursor: {sync: {key: syncKey}, points: {show: false}},
      hooks: {draw: [draw]},
    }, data, element);
    element.dataset.series = String(series.length - 1);
    return plot;
  }

  // -- the ladder's memory per batch, and the benchmarks' session points ---------------------

  function pointsChart(element, tables, seriesSpecs, xLabel, yUnit, extra) {
    var aligned = uPlot.join(tables);
    var series = [{label: xLabel}];
    seriesSpecs.forEach(function (s, i) {
      var colour = PALETTE[i % PALETTE.length];
      series.push({label: s.label, stroke: colour, dash: s.dash,
                   width: s.line ? 1.5 : 0, spanGaps: true,
                   paths: s.line ? undefined : function () { return null; },
                   points: {show: !s.line, size: 8, fill: s.hollow ? "#fff" : colour},
                   value: function (u, v) { return fmt(v, yUnit); }});
    });
    var plot = new uPlot({
      width: width(element), height: 220, series: series,
      scales: {x: {time: false}},
      axes: [{label: xLabel, stroke: css("--ink"), grid: {stroke: css("--grid")}},
             {label: yUnit, stroke: css("--ink"), grid: {stroke: css("--grid")}, size: AXIS}],
      hooks: {draw: [function (u) { if (extra) extra(u); }]},
    }, aligned, element);
    element.dataset.series = String(series.length - 1);
    return plot;
  }

  function ladderChart(element, fit) {
    var GiB = 1073741824;
    var tables = [[fit.probes.map(function (p) { return p[0]; }),
                   fit.probes.map(function (p) { return p[1] / GiB; })]];
    var specs = [{label: "probe (peak memory)"}];
    if (fit.line.length) {
      tables.push([fit.line.map(function (p) { return p[0]; }),
                   fit.line.map(function (p) { return p[1] / GiB; })]);
      specs.push({label: "memory per batch (fit)", line: true, dash: [6, 3]});
    }
    var top = Math.max.apply(null, tables[0][0].concat(fit.predicted ? [fit.predicted] : [1]));
    tables.push([[0, top], [fit.budget / GiB, fit.budget / GiB]]);
    specs.push({label: "budget", line: true, dash: [12, 6]});
    if (fit.verified_peak != null && fit.predicted) {
      tables.push([[fit.predicted], [fit.verified_peak / GiB]]);
      specs.push({label: "verified run", hollow: true});
    }
    return pointsChart(element, tables, specs, "batch size", "GiB", function (u) {
      if (fit.predicted) {
        var x = vline(u, fit.predicted, css("--ink"), [2, 3], 1);
        label(u, "largest batch that fits: " + fit.predicted, x, u.bbox.top + 14 *
              devicePixelRatio, css("--ink"));
      }
    });
  }

  function benchmarkChart(element, points) {
    var base = points.baseline, current = points.current;
    var xs = base.map(function (v, i) { return i + 1; });
    var xc = current.map(function (v, i) { return base.length + i + 1; });
    function mean(values) {
      return values.reduce(function (a, b) { return a + b; }, 0) / Math.max(1, values.length);
    }
    var tables = [[xs, base], [xc, current]];
    var specs = [{label: "baseline sessions"}, {label: "current sessions", hollow: true}];
    if (base.length) {
      tables.push([[0.5, base.length + 0.5], [mean(base), mean(base)]]);
      specs.push({label: "baseline mean", line: true, dash: [6, 3]});
    }
    if (current.length) {
      tables.push([[base.length + 0.5, base.length + current.length + 0.5],
                   [mean(current), mean(current)]]);
      specs.push({label: "current mean", line: true, dash: [2, 3]});
    }
    function strays(u) {  // a session left out as a stray (Dixon's Q test) says so
      [[points.stray[0], 0, base], [points.stray[1], base.length, current]].forEach(function (s) {
        if (s[0] == null) return;
        var x = xpos(u, s[0] + s[1] + 1);
        label(u, "stray, left out", x, Math.round(u.valToPos(s[2][s[0]], "y", true)),
              css("--muted"));
      });
    }
    return pointsChart(element, tables, specs, "session", points.unit, strays);
  }

  // -- drawing on demand --------------------------------------------------------------------

  function drawTest(details) {
    if (details.dataset.drawn) return;
    var timelines = DATA.tests[details.id] || [];
    details.dataset.drawn = "1";
    timelines.forEach(function (timeline, t) {
      var holder = details.querySelector('.timeline[data-index="' + t + '"] .charts');
      if (!holder) return;
      var key = details.id + "-" + t;
      if (timeline.kind === "lanes") {
        var lane = document.createElement("div");
        lane.className = "chart lanes";
        holder.appendChild(lane);
        drawn.push(lanesChart(lane, timeline, key));
        return;
      }
      timeline.charts.forEach(function (chart) {
        var box = document.createElement("figure");
        box.className = "chart";
        var caption = document.createElement("figcaption");
        caption.textContent = chart.title;
        box.appendChild(caption);
        holder.appendChild(box);
        drawn.push(runChart(box, chart, timeline, key));
      });
    });
  }

  var observer = "IntersectionObserver" in window ? new IntersectionObserver(function (entries) {
    entries.forEach(function (entry) {
      if (entry.isIntersecting && entry.target.open) drawTest(entry.target);
    });
  }, {rootMargin: "400px"}) : null;

  document.querySelectorAll("details.test").forEach(function (details) {
    if (!DATA.tests[details.id]) return;
    if (observer) observer.observe(details);
    details.addEventListener("toggle", function () {
      if (details.open) drawTest(details);
    });
  });
  document.querySelectorAll(".ladder-fit").forEach(function (element) {
    drawn.push(ladderChart(element, DATA.ladders[+element.dataset.ladder][+element.dataset.fit]));
  });
  document.querySelectorAll(".bench-points").forEach(function (element) {
    drawn.push(benchmarkChart(element, DATA.benchmarks[+element.dataset.index]));
  });

  // -- filters ------------------------------------------------------------------------------

  var form = document.getElementById("filters");

  function checked(name) {
    return Array.from(form.querySelectorAll('input[name="' + name + '"]:checked'))
      .map(function (input) { return input.value; });
  }

  function applyFilters() {
    var severities = checked("severity"), outcomes = checked("outcome");
    var code = form.elements.code.value;
    function wanted(finding) {
      return severities.indexOf(finding.dataset.severity) >= 0 &&
             (!code || finding.dataset.code === code);
    }
    document.querySelectorAll(".finding").forEach(function (finding) {
      finding.hidden = !wanted(finding);
    });
    var shown = 0, tests = document.querySelectorAll("details.test");
    tests.forEach(function (test) {
      var findings = Array.from(test.querySelectorAll(".finding"));
      var matches = findings.length ? findings.some(wanted)
                                    : severities.indexOf("none") >= 0 && !code;
      test.hidden = !(outcomes.indexOf(test.dataset.outcome) >= 0 && matches);
      if (!test.hidden) shown += 1;
    });
    document.getElementById("shown-count").textContent =
      shown + " of " + tests.length + " tests shown";
  }

  form.addEventListener("change", applyFilters);
  form.addEventListener("reset", function () { setTimeout(applyFilters, 0); });
  applyFilters();

  // -- permalinks: open the test a link names -----------------------------------------------

  function openTarget() {
    var id = decodeURIComponent(location.hash.slice(1));
    var target = id && document.getElementById(id);
    if (target && target.tagName === "DETAILS") {
      target.hidden = false;
      target.open = true;
      drawTest(target);
      target.scrollIntoView();
    }
  }
  window.addEventListener("hashchange", openTarget);
  openTarget();

  // -- resize and print ---------------------------------------------------------------------

  var resizing = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizing);
    resizing = setTimeout(function () {
      drawn.forEach(function (plot) {
        plot.setSize({width: width(plot.root.parentNode), height: plot.height});
      });
    }, 150);
  });
  window.addEventListener("beforeprint", function () {
    document.querySelectorAll("details.test:not([hidden])").forEach(function (details) {
      details.open = true;
      drawTest(details);
    });
  });
  window.gputrain.ready = true;
})();
