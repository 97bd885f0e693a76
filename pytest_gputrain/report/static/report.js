/* pytest-gputrain HTML report: the summary table's sorting, the filters, the permalinks and each
 * test's timeline (drawn with uPlot).
 *
 * The page is complete without this script (every verdict, finding and figure is in the HTML);
 * the script sorts and filters it and draws each test's timeline when the test is open and on
 * screen, a lane per task, so that a report of hundreds of tests opens at once and scrolls
 * without long tasks. Opening the page does no more than it must: a test's data is parsed, and
 * uPlot itself run, when the first chart that needs them is drawn; only open tests are watched
 * for coming on screen. A timeline is a stack of lanes on one time axis: zoom and pan move them
 * together, the cursor shows the value of every lane at one moment (a tap does the same on a
 * touch screen). Drawn lanes carry what they drew in data attributes (data-lane, data-range,
 * data-lines, data-failure, data-moments...), which the browser tests read. */
(function () {
  "use strict";

  var DATA = JSON.parse(document.getElementById("gputrain-data").textContent);  // ladders, benchmarks
  var AXIS = 64;  // the width of every lane's y axis, so that the time axes line up
  var LANE_HEIGHT = {util: 84, memory: 128, clock: 64, power: 64, temperature: 64, steps: 136};
  var X_AXIS = 38;  // the bottom lane's time axis
  var PRINT_DRAW_MAX = 40;  // tests whose timelines printing draws (the others say so)
  var drawn = [];
  var stacks = {};
  window.gputrain = {charts: drawn, stacks: stacks, ready: false, drawQueue: 0};

  // uPlot, run when the first chart is drawn: its source is a text block of the page (run at
  // load, it would be tens of milliseconds of script, and Intl's set-up, before the first
  // input could be handled, for a page whose first screen has no chart).
  function charts() {
    if (!window.uPlot) {
      var script = document.createElement("script");
      script.textContent = document.getElementById("uplot-source").textContent;
      document.head.appendChild(script);  // an inline script runs as it is inserted
    }
    return window.uPlot;
  }

  function newPlot(options, data, element) {
    var UPlot = charts();
    return new UPlot(options, data, element);
  }

  // A test's timelines and moments (its own JSON block), parsed when the test is first drawn.
  var testData = {};
  function dataOf(id) {
    if (!(id in testData)) {
      var block = document.getElementById("data-" + id);
      testData[id] = block ? JSON.parse(block.textContent) : null;
    }
    return testData[id];
  }
  function hasData(id) {
    return id in testData ? !!testData[id] : !!document.getElementById("data-" + id);
  }

  function css(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#000";
  }

  function fmt(value, unit) {
    if (value == null || isNaN(value)) return "–";
    var text = Math.abs(value) >= 100 ? value.toFixed(0) :
      Math.abs(value) >= 10 ? value.toFixed(1) : Number(value.toPrecision(3)).toString();
    return unit ? text + " " + unit : text;
  }

  // Tick labels with the same number of decimals on every tick of an axis: 0.5, 1.0, 1.5.
  function ticks(u, splits, axis, space, incr) {
    var decimals = 0;  // as many as the step between ticks needs: 2.5 -> 1, 0.25 -> 2
    while (decimals < 4 && Math.abs(incr * Math.pow(10, decimals) -
                                    Math.round(incr * Math.pow(10, decimals))) > 1e-6) {
      decimals += 1;
    }
    return splits.map(function (v) { return v.toFixed(decimals); });
  }

  function width(element) {
    return Math.max(280, Math.floor(element.getBoundingClientRect().width) || 800);
  }

  function xpos(u, value) {
    return Math.round(u.valToPos(value, "x", true));
  }

  function ypos(u, value) {
    return Math.round(u.valToPos(value, "y", true));
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

  function vspan(u, from, to, fill) {
    var box = u.bbox, a = xpos(u, from), b = xpos(u, to);
    u.ctx.fillStyle = fill;
    u.ctx.fillRect(a, box.top, Math.max(devicePixelRatio, b - a), box.height);
    return a;
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

  function hline(u, value, colour, dash) {
    var box = u.bbox, ctx = u.ctx, y = ypos(u, value);
    if (y < box.top - 1 || y > box.top + box.height + 1) return null;
    ctx.strokeStyle = colour;
    ctx.lineWidth = 1.5 * devicePixelRatio;
    ctx.setLineDash(dash.map(function (d) { return d * devicePixelRatio; }));
    ctx.beginPath();
    ctx.moveTo(box.left, y);
    ctx.lineTo(box.left + box.width, y);
    ctx.stroke();
    ctx.setLineDash([]);
    return y;
  }

  function clip(u) {
    var box = u.bbox, ctx = u.ctx;
    ctx.save();
    ctx.beginPath();
    ctx.rect(box.left, box.top, box.width, box.height);
    ctx.clip();
  }

  function nearest(xs, t) {  // index of the value of xs closest to t (xs sorted)
    var lo = 0, hi = xs.length - 1;
    if (hi < 0) return -1;
    while (lo < hi) {
      var mid = (lo + hi) >> 1;
      if (xs[mid] < t) lo = mid + 1; else hi = mid;
    }
    if (lo > 0 && Math.abs(xs[lo - 1] - t) < Math.abs(xs[lo] - t)) lo -= 1;
    return lo;
  }

  // -- one run's timeline: a stack of lanes on one time axis ---------------------------------

  var BAR_COLOURS = {"DataLoader wait": "--wait", "syncs": "--sync", "GPU busy": "--busy",
                     "host, GPU idle": "--host", "host and GPU (no NVML sample)": "--unsplit"};
  var STYLE = {  // lane -> the colour variables of its series, in order
    util: ["--s1"], memory: ["--s1", "--s2", "--device", "--s3"], clock: ["--s1"],
    power: ["--s2"], temperature: ["--s4"],
  };

  function Stack(details, holder, timeline, moments, key) {
    this.details = details;
    this.timeline = timeline;
    this.moments = moments || {};
    this.active = null;
    this.full = [0, Math.max(timeline.end, 1e-3)];
    this.range = this.full.slice();
    this.plots = [];
    this.lanes = [];
    this.key = key;
    this.pointer = null;
    this.readout = holder.parentNode.querySelector(".readout");
    this.holder = holder;
    timeline.lanes.forEach(function (lane) {  // a table on a shared time axis names it
      (lane.tables || []).forEach(function (table) {
        if (typeof table.x === "string") table.x = timeline.x[table.x];
      });
    });
    this.pending = timeline.lanes.map(function (lane, index) { return index; });
  }

  // One lane drawn: a lane per task keeps every task short while a page scrolls.
  Stack.prototype.buildNext = function () {
    var index = this.pending.shift();
    if (index == null) return false;
    var lanes = this.timeline.lanes, lane = lanes[index];
    var element = document.createElement("figure");
    element.className = "lane";
    element.dataset.lane = lane.id;
    this.holder.appendChild(element);
    var plot = lane.kind === "bars" ? this.bars(element, lane, index === lanes.length - 1)
                                    : this.lines(element, lane, index === lanes.length - 1);
    this.plots.push(plot);
    this.lanes.push({lane: lane, element: element, plot: plot});
    drawn.push(plot);
    this.listen(plot);
    if (!this.pending.length) this.details.dataset.lanesDrawn = String(this.plots.length);
    return this.pending.length > 0;
  };

  Stack.prototype.finish = function () {
    while (this.buildNext()) { /* the rest, now */ }
  };

  Stack.prototype.head = function (element, lane, keys) {
    var head = document.createElement("figcaption");
    head.className = "lane-head";
    var title = document.createElement("span");
    title.className = "lane-title";
    title.textContent = lane.title + " (" + lane.unit + ")";
    head.appendChild(title);
    keys.forEach(function (key) {
      var item = document.createElement("span");
      item.className = "key";
      var swatch = document.createElement("span");
      swatch.className = "swatch " + (key.kind || "");
      swatch.style.borderColor = key.colour;
      if (key.kind === "box") swatch.style.background = key.colour;
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(key.label));
      head.appendChild(item);
    });
    if (lane.note) {
      var note = document.createElement("span");
      note.className = "lane-note note";
      note.textContent = lane.note;
      head.appendChild(note);
    }
    var value = document.createElement("span");
    value.className = "value";
    head.appendChild(value);
    element.appendChild(head);
    return value;
  };

  Stack.prototype.options = function (element, lane, bottom, series, height) {
    var self = this;
    var axes = [
      {stroke: css("--muted"), grid: {stroke: css("--grid"), width: 1},
       ticks: {stroke: css("--grid")}, values: bottom ? ticks : function (u, s) {
         return s.map(function () { return ""; }); },
       size: bottom ? X_AXIS : 6, label: bottom ? "seconds since the test began" : null,
       labelSize: bottom ? 16 : 0, font: "11px sans-serif", labelFont: "11px sans-serif"},
      {stroke: css("--muted"), grid: {stroke: css("--grid"), width: 1},
       ticks: {stroke: css("--grid")}, size: AXIS, values: ticks, space: 22,
       font: "11px sans-serif"},
    ];
    return {
      width: width(element), height: height + (bottom ? X_AXIS + 16 : 6),
      series: series, axes: axes, legend: {show: false},
      scales: {x: {time: false, auto: false, min: self.range[0], max: self.range[1]},
               y: {auto: false, range: lane.range}},
      cursor: {sync: {key: self.key}, points: {show: false},
               drag: {x: true, y: false, setScale: false},
               bind: {dblclick: function () { return function () { self.zoom(null); return null; }; }}},
      hooks: {
        setSelect: [function (u) {
          if (u.select.width > 4) {
            var a = u.posToVal(u.select.left, "x"), b = u.posToVal(u.select.left + u.select.width, "x");
            self.zoom([a, b]);
          }
          u.setSelect({left: 0, top: 0, width: 0, height: 0}, false);
        }],
        setCursor: [function (u) { self.cursorMoved(u); }],
        drawClear: [function (u) { self.under(u, lane); }],
        draw: [function (u) { self.over(u, lane, element); }],
      },
    };
  };

  Stack.prototype.lines = function (element, lane, bottom) {
    var tables = lane.tables.map(function (t) {
      return [t.x].concat(t.series.map(function (s) { return s.values; }));
    });
    var data = tables.length === 1 ? tables[0] : charts().join(tables);
    var colours = STYLE[lane.id] || ["--s1", "--s2", "--s3", "--s4"];
    var series = [{}];
    var keys = [];
    var index = 0;
    lane.tables.forEach(function (table) {
      table.series.forEach(function (s) {
        var colour = css(colours[index % colours.length]);
        index += 1;
        var dash = s.style === "dash" ? [6, 3] : s.style === "dot" ? [2, 3] : undefined;
        series.push({label: s.label, stroke: colour, width: 1.5, dash: dash, spanGaps: true,
                     fill: s.style === "area" ? colour + "33" : undefined,
                     points: {show: s.style === "point" || table.x.length < 3, size: 7,
                              fill: colour}});
        keys.push({label: s.label, colour: colour,
                   kind: s.style === "dash" ? "dash" : s.style === "dot" ? "dot" : ""});
      });
    });
    (lane.lines || []).forEach(function (line) {
      keys.push({label: line.label, colour: css(line.style === "device" ? "--device" :
        line.style === "baseline" ? "--baseline" : "--limit"), kind: "dash"});
    });
    (lane.bands || []).forEach(function (band) {
      keys.push({label: band.label, colour: css("--band"), kind: "box"});
    });
    element._value = this.head(element, lane, keys);
    var plot = newPlot(this.options(element, lane, bottom, series, LANE_HEIGHT[lane.id] || 80),
                         data, element);
    plot._lane = lane;
    this.describe(element, lane, series.length - 1);
    return plot;
  };

  Stack.prototype.bars = function (element, lane, bottom) {
    var totals = lane.x.map(function (x, i) {
      return lane.stack.reduce(function (sum, s) { return sum + (s.values[i] || 0); }, 0);
    });
    var keys = lane.stack.map(function (s) {
      return {label: s.label, colour: css(BAR_COLOURS[s.label] || "--host"), kind: "box"};
    });
    (lane.bands || []).forEach(function (band) {
      keys.push({label: band.label, colour: css("--baseline-band"), kind: "box"});
    });
    element._value = this.head(element, lane, keys);
    var series = [{}, {label: "step time", stroke: "transparent", paths: function () { return null; },
                       points: {show: false}}];
    var plot = newPlot(this.options(element, lane, bottom, series, LANE_HEIGHT.steps),
                         [lane.x, totals], element);
    plot._lane = lane;
    plot._totals = totals;
    this.describe(element, lane, lane.stack.length);
    return plot;
  };

  Stack.prototype.describe = function (element, lane, count) {
    element.dataset.series = String(count);
    element.dataset.range = lane.range.join(",");
    element.dataset.lines = (lane.lines || []).map(function (l) { return l.label; }).join("|");
    element.dataset.bands = (lane.bands || []).map(function (b) { return b.label; }).join("|");
  };

  // Under the series: the profiler window, throttled samples, the findings' moments, value bands.
  Stack.prototype.under = function (u, lane) {
    var markers = this.timeline.markers || {}, self = this;
    clip(u);
    if (markers.window && (lane.id === "util" || lane.id === "steps")) {
      vspan(u, markers.window[0], markers.window[1], css("--window"));
    }
    if (["clock", "power", "temperature"].indexOf(lane.id) >= 0) {
      (markers.throttled || []).forEach(function (span, i) {
        var at = vspan(u, span[0], span[1], css("--throttle"));
        if (i === 0) label(u, "throttled", at, u.bbox.top + 12 * devicePixelRatio, css("--error"));
      });
    }
    var spans = 0;
    Object.keys(this.moments).forEach(function (id) {
      var moment = self.moments[id];
      if (moment.lanes.indexOf(lane.id) < 0) return;
      var strong = id === self.active;
      if (self.active && !strong) return;  // one finding highlighted: only its moments
      moment.spans.forEach(function (span) {
        vspan(u, span[0], span[1], css(strong ? "--moment-strong" : "--moment"));
        spans += 1;
      });
      if (strong && moment.spans.length && lane.id === moment.lanes[0]) {
        label(u, moment.label, xpos(u, moment.spans[0][0]), u.bbox.top + 26 * devicePixelRatio,
              css("--ink"));
      }
    });
    u.root.parentNode.dataset.moments = String(spans);
    (lane.bands || []).forEach(function (band) {
      var top = ypos(u, band.to), bottom = ypos(u, band.from);
      u.ctx.fillStyle = css(band.style === "baseline" ? "--baseline-band" : "--band");
      u.ctx.fillRect(u.bbox.left, top, u.bbox.width, Math.max(devicePixelRatio, bottom - top));
    });
    u.ctx.restore();
  };

  // Over the series: the step bars, limits, the refused allocation, the failure.
  Stack.prototype.over = function (u, lane, element) {
    var markers = this.timeline.markers || {}, ctx = u.ctx, box = u.bbox;
    clip(u);
    if (lane.kind === "bars") this.drawBars(u, lane);
    (lane.lines || []).forEach(function (line) {  // named in the lane's key, above it
      var colour = css(line.style === "device" ? "--device" : line.style === "baseline" ? "--baseline" : "--limit");
      hline(u, line.value, colour, line.style === "device" ? [2, 3] : [8, 4]);
    });
    if (markers.window && lane.id === "util") {
      label(u, "profiler window", xpos(u, markers.window[0]), box.top + 12 * devicePixelRatio, css("--muted"));
    }
    (markers.oom || []).forEach(function (t) { vline(u, t, css("--error"), [4, 3], 1); });
    if (lane.request) {
      var x = xpos(u, lane.request.t), from = ypos(u, lane.request.from);
      var to = Math.max(box.top, ypos(u, lane.request.to));
      ctx.fillStyle = css("--limit");
      ctx.globalAlpha = 0.35;
      ctx.fillRect(x - 5 * devicePixelRatio, to, 10 * devicePixelRatio, Math.max(2, from - to));
      ctx.globalAlpha = 1;
      if (ypos(u, lane.request.to) < box.top) {  // beyond the top: an arrow head
        ctx.beginPath();
        ctx.moveTo(x - 7 * devicePixelRatio, box.top + 8 * devicePixelRatio);
        ctx.lineTo(x, box.top);
        ctx.lineTo(x + 7 * devicePixelRatio, box.top + 8 * devicePixelRatio);
        ctx.fill();
      }
      label(u, lane.request.label, x + 8 * devicePixelRatio, Math.round((from + Math.max(to, box.top)) / 2),
            css("--limit"));
      element.dataset.request = "1";
    }
    element.dataset.failure = markers.failure ? "1" : "0";
    if (markers.failure) {
      var fx = vline(u, markers.failure.t, css("--error"), [], 2);
      if (lane === this.timeline.lanes[0]) {
        label(u, "✖ failure: " + markers.failure.label, fx, box.top + 12 * devicePixelRatio, css("--error"));
      }
    }
    ctx.restore();
  };

  Stack.prototype.drawBars = function (u, lane) {
    var ctx = u.ctx;
    var fills = lane.stack.map(function (s) { return css(BAR_COLOURS[s.label] || "--host"); });
    var top = lane.range[1], box = u.bbox, clipped = [];
    var lo = this.range[0], hi = this.range[1];
    for (var i = 0; i < lane.x.length; i++) {
      // A kept step stands for the steps thinned away before it: its bar starts where the
      // kept step before it ended.
      var end = lane.x[i], start = i > 0 ? Math.min(lane.x[i - 1], end - lane.width[i])
                                         : end - lane.width[i];
      if (end < lo || start > hi) continue;
      var a = xpos(u, start), b = xpos(u, end);
      var w = Math.max(devicePixelRatio, b - a - (b - a > 4 * devicePixelRatio ? devicePixelRatio : 0));
      var level = 0;
      for (var k = 0; k < lane.stack.length; k++) {
        var v = lane.stack[k].values[i] || 0;
        if (v <= 0) continue;
        var y0 = ypos(u, Math.min(level, top)), y1 = ypos(u, Math.min(level + v, top));
        ctx.fillStyle = fills[k];
        ctx.fillRect(a, y1, w, Math.max(0, y0 - y1));
        level += v;
      }
      if (level > top) {  // a step longer than the lane: cut, and its time written
        clipped.push([a + w / 2, level]);
        ctx.fillStyle = css("--ink");
        ctx.fillRect(a, box.top, w, 2 * devicePixelRatio);
      }
    }
    var ink = css("--ink"), last = -Infinity;
    ctx.font = Math.round(11 * devicePixelRatio) + "px sans-serif";
    ctx.textAlign = "center";
    clipped.forEach(function (cut) {  // written on the bar, where there is room
      var text = "▲ " + fmt(cut[1], "ms"), half = ctx.measureText(text).width / 2 + 4;
      var x = Math.min(Math.max(cut[0], box.left + half), box.left + box.width - half);
      if (x - half < last) return;
      ctx.fillStyle = css("--paper");
      ctx.fillRect(x - half, box.top + 3 * devicePixelRatio, 2 * half, 13 * devicePixelRatio);
      ctx.fillStyle = ink;
      ctx.fillText(text, x, box.top + 13 * devicePixelRatio);
      last = x + half;
    });
    ctx.textAlign = "left";
    u.root.parentNode.dataset.clipped = String(clipped.length);
  };

  Stack.prototype.valueAt = function (entry, t) {
    var lane = entry.lane;
    if (lane.kind === "bars") {
      var i = nearest(lane.x, t);
      if (i < 0) return null;
      if (lane.x[i] < t && i + 1 < lane.x.length) i += 1;
      if (t < lane.x[i] - lane.width[i] || t > lane.x[i] + 1e-9) return null;
      var parts = lane.stack.filter(function (s) { return s.values[i] > 0; })
        .map(function (s) { return s.label + " " + fmt(s.values[i], "ms"); });
      return {title: "step " + lane.numbers[i], text: fmt(lane.width[i] * 1000, "ms") + ": " + parts.join(", ")};
    }
    var texts = [];
    lane.tables.forEach(function (table) {
      var j = nearest(table.x, t);
      if (j < 0) return;
      var span = table.x.length > 1 ? (table.x[table.x.length - 1] - table.x[0]) / table.x.length : 1;
      if (Math.abs(table.x[j] - t) > Math.max(span * 2, 0.25)) return;  // no reading near
      table.series.forEach(function (s) {
        if (s.values[j] != null) texts.push(s.label + " " + fmt(s.values[j], s.unit));
      });
    });
    return texts.length ? {title: lane.title, text: texts.join(", ")} : null;
  };

  Stack.prototype.cursorMoved = function (u) {
    if (u !== this.plots[0]) return;  // every lane moves with the first: read once
    var left = u.cursor.left;
    var tooltip = document.getElementById("tooltip");
    if (left == null || left < 0) {
      if (this.readout) this.readout.textContent = "";
      this.lanes.forEach(function (entry) { entry.element._value.textContent = ""; });
      if (tooltip && this.pointer) tooltip.hidden = true;
      return;
    }
    var t = u.posToVal(left, "x"), self = this, lines = [];
    this.lanes.forEach(function (entry) {
      var found = self.valueAt(entry, t);
      entry.element._value.textContent = found ? found.text : "";
      if (found) lines.push([found.title, found.text]);
    });
    var moment = fmt(t, "s");
    if (this.readout) this.readout.textContent = "at " + moment;
    if (tooltip && this.pointer) {
      tooltip.textContent = "";
      var head = document.createElement("b");
      head.textContent = moment;
      tooltip.appendChild(head);
      lines.forEach(function (line) {
        var row = document.createElement("div");
        row.textContent = line[0] + ": " + line[1];
        tooltip.appendChild(row);
      });
      tooltip.hidden = false;
      var x = Math.min(this.pointer.x + 14, window.innerWidth - tooltip.offsetWidth - 4);
      var y = this.pointer.y + 14;
      if (y + tooltip.offsetHeight > window.innerHeight) y = this.pointer.y - tooltip.offsetHeight - 10;
      tooltip.style.left = Math.max(4, x) + "px";
      tooltip.style.top = Math.max(4, y) + "px";
    }
  };

  Stack.prototype.listen = function (plot) {
    var self = this;
    (function () {
      var over = plot.over;
      // Captured on the lane, before uPlot's own listener moves the cursor and reads it.
      plot.root.addEventListener("mousemove", function (e) {
        self.pointer = {x: e.clientX, y: e.clientY};
      }, true);
      over.addEventListener("mouseleave", function () {
        self.pointer = null;
        document.getElementById("tooltip").hidden = true;
      });
      function touch(e) {  // a finger shows the values where it is, as the mouse does
        var point = e.touches[0] || e.changedTouches[0], box = over.getBoundingClientRect();
        if (!point) return;
        self.pointer = {x: point.clientX, y: point.clientY - 60};
        plot.setCursor({left: point.clientX - box.left, top: point.clientY - box.top});
      }
      over.addEventListener("touchstart", touch, {passive: true});
      over.addEventListener("touchmove", touch, {passive: true});
    })();
  };

  Stack.prototype.zoom = function (range) {
    var full = this.full, span = full[1] - full[0];
    var r = range ? [Math.max(full[0], range[0]), Math.min(full[1], range[1])] : full.slice();
    if (r[1] - r[0] < span / 2000) return;
    this.range = r;
    this.plots.forEach(function (plot) {
      plot.setScale("x", {min: r[0], max: r[1]});
    });
    this.details.dataset.zoom = r[0].toFixed(3) + "," + r[1].toFixed(3);
  };

  Stack.prototype.step = function (how) {
    var r = this.range, span = r[1] - r[0], mid = (r[0] + r[1]) / 2, full = this.full;
    if (how === "reset") return this.zoom(null);
    if (how === "in") return this.zoom([mid - span / 4, mid + span / 4]);
    if (how === "out") return this.zoom([mid - span, mid + span]);
    var shift = (how === "left" ? -1 : 1) * span / 2;
    var a = Math.min(Math.max(full[0], r[0] + shift), full[1] - span);
    this.zoom([a, a + span]);
  };

  Stack.prototype.highlight = function (id) {
    this.active = this.active === id ? null : id;
    this.plots.forEach(function (plot) { plot.redraw(false, false); });
    return this.active;
  };

  Stack.prototype.resize = function (w) {
    this.plots.forEach(function (plot) {
      plot.setSize({width: w || width(plot.root.parentNode), height: plot.height});
    });
  };


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
      series.push({label: words, scale: "rank", stroke: palette(i),
                   paths: function () { return null; }, points: {show: false},
                   value: (function (l) {
                     return function () { return (l.steps == null ? "?" : l.steps) + " steps"; };
                   })(lane)});
    });
    function draw(u) {
      var ctx = u.ctx;
      ctx.save();
      lanes.forEach(function (lane, i) {
        var colour = palette(i);
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
    var plot = newPlot({
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
    var aligned = charts().join(tables);
    var series = [{label: xLabel}];
    seriesSpecs.forEach(function (s, i) {
      var colour = palette(i);
      series.push({label: s.label, stroke: colour, dash: s.dash,
                   width: s.line ? 1.5 : 0, spanGaps: true,
                   paths: s.line ? undefined : function () { return null; },
                   points: {show: !s.line, size: 8, fill: s.hollow ? "#fff" : colour},
                   value: function (u, v) { return fmt(v, yUnit); }});
    });
    var plot = newPlot({
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


  // -- drawing on demand, a lane per task ---------------------------------------------------

  var PALETTE = null;  // read when first drawn: at load, reading a style would compute them all
  function palette(i) {
    PALETTE = PALETTE || ["--s1", "--s2", "--s3", "--s4"].map(css);
    return PALETTE[i % PALETTE.length];
  }

  var laneQueue = [];  // stacks whose lanes are drawn a lane per task

  function drawTest(details, deferred) {
    if (details.dataset.drawn) {
      if (!deferred && stacks[details.id]) stacks[details.id].finish();
      return;
    }
    var entry = dataOf(details.id);
    details.dataset.drawn = "1";
    if (observer) observer.unobserve(details);
    if (!entry) return;
    entry.timelines.forEach(function (timeline, t) {
      var box = details.querySelector('.timeline[data-index="' + t + '"]');
      var holder = box && box.querySelector(".charts");
      if (!holder) return;
      holder.textContent = "";
      var key = details.id + "-" + t;
      if (timeline.kind === "lanes") {
        var lane = document.createElement("div");
        lane.className = "chart lanes";
        holder.appendChild(lane);
        drawn.push(lanesChart(lane, timeline, key));
        return;
      }
      box.insertBefore(controls(), box.firstChild);
      var stack = new Stack(details, holder, timeline, entry.moments, key);
      stacks[details.id] = stack;
      if (deferred) laneQueue.push(stack); else stack.finish();
      box.querySelectorAll(".chart-controls button").forEach(function (button) {
        button.addEventListener("click", function () { stack.step(button.dataset.zoom); });
      });
    });
  }

  function controls() {  // zoom and pan, for the keyboard and a touch screen
    var bar = document.createElement("div");
    bar.className = "chart-controls";
    bar.setAttribute("role", "toolbar");
    bar.setAttribute("aria-label", "timeline zoom");
    [["in", "Zoom in", "zoom in (or drag across a lane; double-click for the whole run)"],
     ["out", "Zoom out", "zoom out"], ["left", "◀", "pan left"], ["right", "▶", "pan right"],
     ["reset", "Whole run", "the whole run"]].forEach(function (item) {
      var button = document.createElement("button");
      button.type = "button";
      button.dataset.zoom = item[0];
      button.textContent = item[1];
      button.title = item[2];
      button.setAttribute("aria-label", item[2]);
      bar.appendChild(button);
    });
    var readout = document.createElement("span");
    readout.className = "readout note";
    readout.setAttribute("aria-live", "polite");
    bar.appendChild(readout);
    return bar;
  }

  var queue = [];
  var pumping = false;

  function pump() {  // one lane per task: scrolling never waits for a batch of charts
    if (laneQueue.length) {
      if (!laneQueue[0].buildNext()) laneQueue.shift();
      setTimeout(pump, 0);
      return;
    }
    var details = queue.shift();
    window.gputrain.drawQueue = queue.length + laneQueue.length;
    if (!details) { pumping = false; return; }
    if (details.open && !details.hidden) drawTest(details, true);
    setTimeout(pump, 0);
  }

  function later(details) {
    if (details.dataset.drawn || queue.indexOf(details) >= 0) return;
    queue.push(details);
    window.gputrain.drawQueue = queue.length + laneQueue.length;
    if (!pumping) { pumping = true; setTimeout(pump, 0); }
  }

  // The ladders' and benchmarks' charts, drawn once each when on screen too.
  var sectionCharts = Array.from(document.querySelectorAll(".ladder-fit, .bench-points"));
  function drawSectionChart(element) {
    if (element.dataset.drawn) return;
    element.dataset.drawn = "1";
    drawn.push(element.classList.contains("ladder-fit") ?
      ladderChart(element, DATA.ladders[+element.dataset.ladder][+element.dataset.fit]) :
      benchmarkChart(element, DATA.benchmarks[+element.dataset.index]));
  }

  // Only open tests (and the section charts) are watched: a closed test has nothing to draw,
  // and watching hundreds of them would cost every frame of a scroll.
  var observer = "IntersectionObserver" in window ? new IntersectionObserver(function (entries) {
    entries.forEach(function (entry) {
      if (!entry.isIntersecting) return;
      var target = entry.target;
      if (target.tagName !== "DETAILS") {
        observer.unobserve(target);
        drawSectionChart(target);
      } else if (target.open) {
        later(target);
      }
    });
  }, {rootMargin: "300px"}) : null;

  var allTests = Array.from(document.querySelectorAll("details.test"));
  function watch(details) {
    if (!hasData(details.id) || details.dataset.drawn) return;
    if (observer) observer.observe(details); else later(details);
  }
  allTests.forEach(function (details) { if (details.open) watch(details); });
  sectionCharts.forEach(function (element) {
    if (observer) observer.observe(element); else drawSectionChart(element);
  });
  // One listener for every test (toggle does not bubble, but is seen on its way down): an
  // opened test is watched (observe() reports at once whether it is on screen), a closed one
  // not, nor one drawn already.
  document.addEventListener("toggle", function (event) {
    var details = event.target;
    if (!details.classList || !details.classList.contains("test")) return;
    if (details.open) watch(details); else if (observer) observer.unobserve(details);
  }, true);

  // -- a finding's moments: highlighted on its test's lanes ----------------------------------

  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button.show-moment");
    if (!button) return;
    var details = button.closest("details.test");
    drawTest(details);
    var stack = stacks[details.id];
    if (!stack) return;
    var active = stack.highlight(button.dataset.finding);
    details.querySelectorAll("button.show-moment").forEach(function (other) {
      var on = other.dataset.finding === active;
      other.setAttribute("aria-pressed", on ? "true" : "false");
      var finding = document.getElementById(other.dataset.finding);
      if (finding) finding.classList.toggle("highlighted", on);
    });
    details.dataset.highlight = active || "";
    if (active) {
      var moment = stack.moments[active] || {lanes: []};
      var lane = details.querySelector('.lane[data-lane="' + moment.lanes[0] + '"]');
      if (lane) lane.scrollIntoView({block: "nearest"});
    }
  });

  // -- the summary table: sorted by tablesort ---------------------------------------------

  var summary = document.getElementById("summary-table");
  if (summary && window.Tablesort) new Tablesort(summary);

  // -- filters: the tests, their findings and every summary table ------------------------

  var form = document.getElementById("filters");
  var filterToggle = document.getElementById("filter-toggle");

  function foldFilters(folded) {
    filterToggle.setAttribute("aria-expanded", folded ? "false" : "true");
  }
  filterToggle.addEventListener("click", function () {
    foldFilters(filterToggle.getAttribute("aria-expanded") === "true");
  });

  function filtering() {  // false: every box checked and no code chosen, the page as written
    return form.querySelectorAll("input:not(:checked)").length > 0 || !!form.elements.code.value;
  }

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
    function shows(item) {  // a test (or its row): its outcome, and a finding (or none) wanted
      var codes = item.dataset.codes ? item.dataset.codes.split(" ") : [];
      var severity = item.dataset.severity;
      var byFinding = codes.length ? (!code || codes.indexOf(code) >= 0) &&
        (item.tagName === "DETAILS" ? Array.from(item.querySelectorAll(".finding")).some(wanted)
                                    : severities.indexOf(severity) >= 0 || code)
        : severities.indexOf("none") >= 0 && !code;
      return outcomes.indexOf(item.dataset.outcome) >= 0 && !!byFinding;
    }
    document.querySelectorAll(".finding").forEach(function (finding) {
      finding.hidden = !wanted(finding);
    });
    var shown = 0;
    allTests.forEach(function (test) {
      test.hidden = !shows(test);
      if (!test.hidden) shown += 1;
    });
    document.querySelectorAll("tr.test-row").forEach(function (row) {
      row.hidden = !shows(row);
    });
    document.querySelectorAll("tr.finding-row").forEach(function (row) {
      var found = row.dataset.outcomes ? row.dataset.outcomes.split(" ") : [];
      row.hidden = !(wanted(row) && (!found.length || found.some(function (o) {
        return outcomes.indexOf(o) >= 0; })));
    });
    var total = allTests.length;
    document.getElementById("shown-count").textContent =
      shown === total ? total + " tests" : shown + " of " + total + " tests shown";
    document.getElementById("filter-state").textContent =
      filtering() ? "(" + shown + " of " + total + " tests)" : "";
  }

  form.addEventListener("change", applyFilters);
  form.addEventListener("reset", function () { setTimeout(applyFilters, 0); });
  form.addEventListener("submit", function (event) { event.preventDefault(); });
  document.getElementById("expand-all").addEventListener("click", function () {
    allTests.forEach(function (details) { if (!details.hidden) details.open = true; });
  });
  document.getElementById("collapse-all").addEventListener("click", function () {
    allTests.forEach(function (details) { details.open = false; });
  });
  // The page is written with everything shown; a form the browser restored (back, reload)
  // may say otherwise.
  if (filtering()) applyFilters();

  // -- the filter bar's height: what a jumped-to test is scrolled below ---------------------

  var narrow = window.matchMedia("(max-width: 720px)");
  if (narrow.matches) foldFilters(true);  // a phone starts with the filters folded

  // The root's scroll padding, not a variable every element inherits: changing it restyles the
  // root alone. The observer reports after layout (and once at the start), so nothing here
  // forces a layout while the page opens.
  var padding = "";
  function barHeight() {
    var value = form.offsetHeight + 8 + "px";
    if (value !== padding) document.documentElement.style.scrollPaddingTop = padding = value;
  }
  if ("ResizeObserver" in window) new ResizeObserver(barHeight).observe(form); else barHeight();

  // -- permalinks: open the test a link names, below the filter bar --------------------------

  function openTarget() {
    var id = decodeURIComponent(location.hash.slice(1));
    var target = id && document.getElementById(id);
    if (!target) return;
    if (target.tagName === "DETAILS") {
      target.hidden = false;
      target.open = true;
      drawTest(target);
    }
    if (narrow.matches) foldFilters(true);
    barHeight();
    target.scrollIntoView();
    var link = document.querySelector('#summary-table a[href="#' + id + '"]');
    if (link) link.closest("tr").classList.add("flash");
  }
  window.addEventListener("hashchange", openTarget);
  openTarget();

  // -- resize and print ---------------------------------------------------------------------

  var resizing = null, lastWidth = window.innerWidth;
  window.addEventListener("resize", function () {
    if (window.innerWidth === lastWidth) return;  // a taller window: the lanes are as wide
    lastWidth = window.innerWidth;
    clearTimeout(resizing);
    resizing = setTimeout(function () {
      Object.keys(stacks).forEach(function (id) { stacks[id].resize(); });
      drawn.forEach(function (plot) {
        if (!plot._lane) plot.setSize({width: width(plot.root.parentNode), height: plot.height});
      });
    }, 150);
  });

  var PRINT_WIDTH = 680;  // CSS px of an A4 or Letter page's text column
  function beforePrint() {
    var budget = PRINT_DRAW_MAX;  // the paper shows the page as it is: open tests whole
    allTests.forEach(function (details) {
      if (details.hidden || !details.open) return;
      if (stacks[details.id]) stacks[details.id].finish();
      if (!details.dataset.drawn && hasData(details.id)) {
        if (budget > 0) { drawTest(details); budget -= 1; }
        else details.querySelectorAll(".charts").forEach(function (c) { c.classList.add("chart-unprinted"); });
      }
    });
    sectionCharts.forEach(drawSectionChart);
    Object.keys(stacks).forEach(function (id) { stacks[id].resize(PRINT_WIDTH); });
  }
  function afterPrint() {
    Object.keys(stacks).forEach(function (id) { stacks[id].resize(); });
  }
  window.addEventListener("beforeprint", beforePrint);
  window.addEventListener("afterprint", afterPrint);
  window.gputrain.beforePrint = beforePrint;
  window.gputrain.drawOpen = function () {  // every open test and chart now (screenshots, tests)
    allTests.forEach(function (details) { if (details.open && !details.hidden) drawTest(details); });
    sectionCharts.forEach(drawSectionChart);
  };
  window.gputrain.readyAt = performance.now();
  window.gputrain.ready = true;
})();
