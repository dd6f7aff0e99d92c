// Charts drawn with uPlot (npm, static/vendor) from the JSON API: the run page's time series
// (/api/runs/{id}/timeseries), length histograms (/api/runs/{id}/lengths) and the compare page.
// Hover shows exact values in the legend; drag across a time chart zooms every time chart to that range
// (double-click or "Reset zoom" goes back); the window and the zoom are kept in the URL.
"use strict";
(function () {
  if (typeof uPlot === "undefined") { return; }
  var C = { blue: "#1f5fbf", green: "#2e7d32", red: "#c62828", amber: "#d08a00", purple: "#6a3fb5",
            grey: "#7a808a", teal: "#00838f", pink: "#ad1457" };
  var FONT = "12px system-ui, 'DejaVu Sans', sans-serif";  // chart text: at least 11 px on screen
  var EP_COLORS = ["amber", "teal", "pink", "grey"];

  function num(v, digits) {
    if (v === null || v === undefined || !isFinite(v)) { return "–"; }
    var a = Math.abs(v);
    if (digits === undefined) { digits = a >= 100 ? 0 : a >= 10 ? 1 : a >= 1 ? 2 : 3; }
    return v.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: 0 });
  }
  function hms(t) { return t === null || t === undefined ? "–" : new Date(t * 1000).toTimeString().slice(0, 8); }
  function two(n) { return (n < 10 ? "0" : "") + n; }
  // time axis labels in the browser's local time: seconds for short spans, dates for long ones
  function timeTicks(u, splits) {
    var span = (u.scales.x.max || 0) - (u.scales.x.min || 0);
    return splits.map(function (t) {
      var d = new Date(t * 1000), hm = two(d.getHours()) + ":" + two(d.getMinutes());
      if (span <= 900) { return hm + ":" + two(d.getSeconds()); }
      if (span <= 2 * 86400) { return hm; }
      return two(d.getMonth() + 1) + "-" + two(d.getDate()) + " " + hm;
    });
  }
  function pct(v) { return v === null || v === undefined ? null : v * 100; }

  // ---------------------------------------------------------------- time charts (one spec per chart)
  function specs(ts) {
    var pts = ts.points;
    var col = function (k) { return pts.map(function (p) { return p[k] === undefined ? null : p[k]; }); };
    var share = function (k) { return pts.map(function (p) { return pct(p[k]); }); };
    var eps = {};
    pts.forEach(function (p) { Object.keys(p.server_by_endpoint || {}).forEach(function (e) { eps[e] = 1; }); });
    var names = Object.keys(eps).sort();
    names = names.length > 1 ? names.slice(0, 4) : [];
    var perEp = function (ep, k, scale) {
      return pts.map(function (p) {
        var v = ((p.server_by_endpoint || {})[ep] || {})[k];
        return v === null || v === undefined ? null : v * (scale || 1);
      });
    };
    var per = ts.bucket_s > 5 ? " (per " + ts.bucket_s + " s bucket)" : "";
    var out = [
      { id: "requests", title: "Completed requests/s" + per, unit: "requests / s", series: [
        ["ok/s", col("ok_s"), "green"], ["finished/s (ok + failed)", col("req_s"), "blue", true]] },
      { id: "tokens", title: "Output tokens/s: reasoning vs content", unit: "tokens / s", series: [
        ["reasoning tok/s", col("reasoning_tok_s"), "purple"], ["content tok/s", col("content_tok_s"), "teal"],
        ["all output tok/s", col("tok_s"), "grey", true]] },
      { id: "failures", title: "Failures/s", unit: "events / s", series: [
        ["timeouts (final)", col("timeouts_s"), "red"], ["errors (final)", col("errors_s"), "pink"],
        ["attempt timeouts", col("attempt_timeouts_s"), "amber", true], ["429", col("http_429_s"), "purple", true],
        ["5xx", col("http_5xx_s"), "grey", true], ["dropped", col("dropped_s"), "teal", true]] },
      { id: "shares", title: "Timeout and empty-reasoning share (%)", unit: "percent", threshold: [5, "5% alarm line"],
        ymin: 10, series: [["timeouts % of finished", share("timeout_share"), "red"],
                           ["empty reasoning % of ok", share("empty_reasoning_share"), "amber"]] },
      { id: "latency", title: "Mean end-to-end latency", unit: "seconds", series: [
        ["mean latency (s)", col("mean_latency_s"), "blue"]] },
      { id: "inflight", title: "In flight vs concurrency", unit: "requests", series: [
        ["in flight", col("in_flight"), "green"], ["concurrency limit", col("concurrency"), "grey", true]]
        .concat(ts.server ? [["server: running", col("server_running"), "blue", true],
                             ["server: waiting (queue)", col("server_waiting"), "red"]] : [])
        .concat(names.map(function (ep, i) { return ["waiting @" + ep, perEp(ep, "waiting"), EP_COLORS[i], true]; })) }
    ];
    if (ts.server) {
      out.push({ id: "server", title: "Server: KV cache and preemptions, per endpoint", unit: "percent", ymin: 100,
        series: [["KV cache used (%)", share("server_kv_usage"), "purple"],
                 ["preemptions/s x100", share("server_preemptions_s"), "red"]]
          .concat(names.map(function (ep, i) { return ["KV % @" + ep, perEp(ep, "kv_usage", 100), EP_COLORS[i], true]; })) });
      out.push({ id: "server_tokens", title: "Output tokens/s: server vs client", unit: "tokens / s", series: [
        ["server generated", col("server_gen_tok_s"), "grey", true], ["client received", col("tok_s"), "teal"]] });
    }
    return out;
  }

  function axis(extra) {
    var a = { font: FONT, labelFont: FONT, stroke: "#444", grid: { stroke: "#e3e5e9", width: 1 },
              ticks: { stroke: "#bbb", width: 1 } };
    for (var k in extra) { a[k] = extra[k]; }
    return a;
  }

  function drawThreshold(u, value, label) {
    var ctx = u.ctx, y = u.valToPos(value, "y", true), pr = uPlot.pxRatio;
    ctx.save();
    ctx.strokeStyle = C.red; ctx.setLineDash([6 * pr, 4 * pr]); ctx.lineWidth = pr;
    ctx.beginPath(); ctx.moveTo(u.bbox.left, y); ctx.lineTo(u.bbox.left + u.bbox.width, y); ctx.stroke();
    ctx.fillStyle = C.red; ctx.font = (12 * pr) + "px system-ui, sans-serif"; ctx.textAlign = "right";
    ctx.fillText(label, u.bbox.left + u.bbox.width - 4 * pr, y - 4 * pr);
    ctx.restore();
  }

  // Each alarm's time span (the time-series JSON's "alarms": from its first failing record to its last, or to
  // now while it is open) as a band behind the series, so a stretch of bad records stays visible after it ended.
  function drawAlarmSpans(u, spans) {
    if (!spans || !spans.length) { return; }
    var ctx = u.ctx, pr = uPlot.pxRatio, xmin = u.scales.x.min, xmax = u.scales.x.max;
    ctx.save();
    spans.forEach(function (a) {
      var t0 = Math.max(a.t0, xmin), t1 = Math.min(a.t1 === null || a.t1 === undefined ? xmax : a.t1, xmax);
      if (!(t1 >= t0)) { return; }
      var x0 = u.valToPos(t0, "x", true), x1 = Math.max(u.valToPos(t1, "x", true), x0 + 2 * pr);
      ctx.fillStyle = a.severity === "warning" ? "rgba(214, 140, 0, 0.16)" : "rgba(200, 30, 30, 0.14)";
      ctx.fillRect(x0, u.bbox.top, x1 - x0, u.bbox.height);
    });
    ctx.restore();
  }

  function zoomInUrl() {
    var params = new URLSearchParams(location.search);
    var from = parseFloat(params.get("from")), to = parseFloat(params.get("to"));
    return isFinite(from) && isFinite(to) && to > from ? { min: from, max: to } : null;
  }

  function TimeGroup(section) {
    this.section = section;
    this.grid = section.querySelector(".chart-grid");
    this.src = section.getAttribute("data-src");
    this.windowName = section.getAttribute("data-window");
    this.pollMs = parseInt(section.getAttribute("data-poll-ms") || "10000", 10);
    this.live = section.getAttribute("data-live") === "1";
    this.charts = {};
    this.syncKey = "time-" + Math.random().toString(36).slice(2);  // one cursor across the group's charts
    this.ts = null;
    this.zoom = zoomInUrl();
    var self = this;
    window.addEventListener("popstate", function () {  // Back / Forward: the window and zoom of that URL
      var w = new URLSearchParams(location.search).get("window") || "5m";
      if (w !== self.windowName) { self.setWindow(w, false); } else { self.zoom = zoomInUrl(); self.applyScale(); }
    });
    section.querySelectorAll(".windows a[data-window]").forEach(function (a) {
      a.addEventListener("click", function (e) { e.preventDefault(); self.setWindow(a.getAttribute("data-window")); });
    });
    this.resetBtn = section.querySelector("[data-reset-zoom]");
    if (this.resetBtn) { this.resetBtn.addEventListener("click", function () { self.setZoom(null); }); }
    this.ro = new ResizeObserver(function () { self.resize(); });
    this.ro.observe(this.grid);
    this.load(false);
    if (this.live) { this.timer = setInterval(function () { if (!document.hidden) { self.load(true); } }, this.pollMs); }
  }

  TimeGroup.prototype.url = function (incremental) {
    var u = this.src + "?window=" + encodeURIComponent(this.windowName);
    if (incremental && this.ts && this.ts.final_before !== undefined) { u += "&since=" + this.ts.final_before; }
    return u;
  };

  TimeGroup.prototype.load = function (incremental) {
    var self = this, win = this.windowName;
    return fetch(this.url(incremental), { headers: { Accept: "application/json" } }).then(function (r) {
      if (!r.ok) { throw new Error("HTTP " + r.status); }
      return r.json();
    }).then(function (ts) {
      if (win !== self.windowName) { return; }  // the window changed while this was on its way
      self.section.classList.remove("is-stale");
      if (incremental && self.ts && ts.bucket_s === self.ts.bucket_s) {
        var keep = self.ts.points.filter(function (p) { return p.t < ts.since && p.t >= ts.start; });
        ts.points = keep.concat(ts.points);
      } else if (incremental && self.ts) {  // the buckets grew wider ('whole run'): everything again
        return self.load(false);
      }
      self.ts = ts;
      self.draw();
      if (!ts.live && self.timer) { clearInterval(self.timer); self.timer = null; }
    }).catch(function () { self.section.classList.add("is-stale"); });
  };

  TimeGroup.prototype.setWindow = function (w, push) {
    this.windowName = w;
    this.zoom = push === false ? zoomInUrl() : null;
    this.section.setAttribute("data-window", w);
    this.section.querySelectorAll(".windows a[data-window]").forEach(function (a) {
      a.classList.toggle("active", a.getAttribute("data-window") === w);
    });
    if (push !== false) { this.pushUrl(true); }
    this.ts = null;
    this.load(false);
  };

  TimeGroup.prototype.pushUrl = function (push) {
    var params = new URLSearchParams(location.search);
    params.set("window", this.windowName);
    if (this.zoom) { params.set("from", String(Math.floor(this.zoom.min))); params.set("to", String(Math.ceil(this.zoom.max))); }
    else { params.delete("from"); params.delete("to"); }
    var url = location.pathname + "?" + params.toString();
    if (push) { history.pushState(null, "", url); } else { history.replaceState(null, "", url); }
  };

  TimeGroup.prototype.setZoom = function (z) {
    this.zoom = z;
    this.pushUrl(false);
    this.applyScale();
  };

  TimeGroup.prototype.applyScale = function () {
    var ts = this.ts, z = this.zoom, self = this;
    if (!ts) { return; }
    this.section.classList.toggle("zoomed", !!z);
    if (this.resetBtn) { this.resetBtn.hidden = !z; }
    Object.keys(this.charts).forEach(function (id) {
      var u = self.charts[id].u;
      u.setScale("x", z ? { min: z.min, max: z.max } : { min: ts.start, max: ts.end });
    });
  };

  TimeGroup.prototype.width = function () {
    var cell = this.grid.querySelector(".chart-cell");
    return Math.max(240, Math.floor((cell ? cell.clientWidth : this.grid.clientWidth) - 2));
  };

  TimeGroup.prototype.resize = function () {
    var self = this, w = this.width();
    Object.keys(this.charts).forEach(function (id) { self.charts[id].u.setSize({ width: w, height: 220 }); });
  };

  TimeGroup.prototype.draw = function () {
    var self = this, ts = this.ts, half = ts.bucket_s / 2;
    var xs = ts.points.map(function (p) { return p.t + half; });
    var seen = {};
    this.section.setAttribute("data-n-points", String(ts.points.length));
    this.section.setAttribute("data-last-t", String(ts.points.length ? ts.points[ts.points.length - 1].t : 0));
    this.section.setAttribute("data-alarm-spans", String((ts.alarms || []).length));
    this.listSpans(ts.alarms || []);
    specs(ts).forEach(function (spec) {
      seen[spec.id] = 1;
      var key = spec.series.map(function (s) { return s[0]; }).join("|");
      var data = [xs].concat(spec.series.map(function (s) { return s[1]; }));
      var entry = self.charts[spec.id];
      if (entry && entry.key !== key) { entry.u.destroy(); entry.cell.remove(); entry = null; }
      if (!entry) { entry = self.make(spec, key, data); self.charts[spec.id] = entry; }
      else { entry.u.setData(data, false); }
      entry.cell.setAttribute("data-points", String(xs.length));
    });
    Object.keys(this.charts).forEach(function (id) {
      if (!seen[id]) { self.charts[id].u.destroy(); self.charts[id].cell.remove(); delete self.charts[id]; }
    });
    this.applyScale();
  };

  // The shaded spans in words too, under the charts (what a screen reader and a test read)
  TimeGroup.prototype.listSpans = function (spans) {
    var box = this.section.querySelector(".alarm-spans");
    if (!box) {
      box = document.createElement("p");
      box.className = "alarm-spans muted";
      box.setAttribute("data-testid", "alarm-spans");
      this.grid.parentNode.insertBefore(box, this.grid.nextSibling);
    }
    box.textContent = spans.length ? "Shaded: " + spans.map(function (a) {
      return a.title + " (alarm #" + a.id + ") " + hms(a.t0) + "–" + (a.t1 === null || a.t1 === undefined ? "now" : hms(a.t1));
    }).join("; ") : "";
  };

  TimeGroup.prototype.make = function (spec, key, data) {
    var self = this;
    var cell = document.createElement("div");
    cell.className = "chart-cell";
    cell.setAttribute("data-chart", spec.id);
    this.grid.appendChild(cell);
    var series = [{ label: "time", value: function (u, v) { return hms(v); } }].concat(spec.series.map(function (s) {
      return { label: s[0], stroke: C[s[2]] || s[2], width: 2, dash: s[3] ? [5, 3] : undefined, spanGaps: false,
               points: { show: false }, value: function (u, v) { return num(v); } };
    }));
    var opts = {
      title: spec.title, width: this.width(), height: 220, series: series,
      scales: { x: { time: true }, y: { range: function (u, lo, hi) {
        var top = Math.max(hi || 0, spec.ymin || 0, spec.threshold ? spec.threshold[0] * 1.2 : 0) || 1;
        return [0, uPlot.rangeNum(0, top, 0.1, true)[1]];
      } } },
      axes: [axis({ values: timeTicks, space: 70 }), axis({ label: spec.unit, size: 56, labelSize: 20, values: function (u, vals) {
        return vals.map(function (v) { return num(v); });
      } })],
      cursor: { y: false, drag: { x: true, y: false, setScale: false }, sync: { key: this.syncKey },
                bind: { dblclick: function () { return function () { self.setZoom(null); return null; }; } } },
      legend: { live: true },
      hooks: {
        setSelect: [function (u) {
          if (u.select.width < 4) { return; }
          var min = u.posToVal(u.select.left, "x"), max = u.posToVal(u.select.left + u.select.width, "x");
          u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
          self.setZoom({ min: min, max: max });
        }],
        drawAxes: [function (u) { drawAlarmSpans(u, self.ts && self.ts.alarms); }],
        draw: spec.threshold ? [function (u) { drawThreshold(u, spec.threshold[0], spec.threshold[1]); }] : []
      }
    };
    var u = new uPlot(opts, data, cell);
    cell._uplot = u;
    return { u: u, cell: cell, key: key };
  };

  // ---------------------------------------------------------------- length histograms
  // One chart per kind (reasoning, content, all output): a bar per bin, the max_tokens limit drawn as a
  // dashed line before its own bar. On the compare page each run is a series (share of its records).
  function binLabel(b) {
    if (b.hi === null || b.hi === undefined) { return b.lo + "+ (max_tokens)"; }
    return b.lo === b.hi ? String(b.lo) : b.lo + "–" + b.hi;
  }

  // The x ticks of a histogram: bin edges every S tokens, S a round step (1, 2 or 5 x 10^k, a whole number of bins),
  // at most one per ~60 px; the limit bar keeps its own tick. Without this uPlot steps through bin indexes, which
  // put ticks at edges such as 181 and 1958 (#28).
  function histSplits(u, bins, width) {
    var last = bins[bins.length - 1], limitBar = last.hi === null || last.hi === undefined;
    var n = bins.length - (limitBar ? 2 : 1), hi = n >= 1 ? bins[n].hi : 0, w = width || 1;
    var room = Math.max(2, Math.floor(u.bbox.width / uPlot.pxRatio / 60));
    var step = w;
    search: for (var e = 1; e <= 1e15; e *= 10) {
      for (var m = 1; m <= 5; m += (m === 1 ? 1 : 3)) {
        var s = m * e;
        if (s >= w && s % w === 0 && hi / s <= room) { step = s; break search; }
      }
    }
    var out = [0];
    for (var k = step; k <= hi; k += step) { out.push(k / w); }
    if (limitBar) { out.push(bins.length - 1); }
    return out;
  }

  function HistGroup(el) {
    this.el = el;
    this.grid = el.querySelector(".hist-grid");
    this.src = el.getAttribute("data-src");
    this.formSel = el.getAttribute("data-filter-form");
    this.key = el.getAttribute("data-key");  // the histograms inside a larger answer (the compare page)
    this.pollMs = parseInt(el.getAttribute("data-poll-ms") || "10000", 10);
    this.live = el.getAttribute("data-live") === "1";
    this.charts = {};
    var self = this;
    this.ro = new ResizeObserver(function () { self.resize(); });
    this.ro.observe(this.grid);
    if (this.formSel) {  // follow the records table's filter as it changes
      document.body.addEventListener("htmx:afterRequest", function (e) {
        var form = document.querySelector(self.formSel);
        if (form && e.detail.elt === form) { self.load(); }
      });
    }
    this.load();
    if (this.live) { this.timer = setInterval(function () { if (!document.hidden) { self.load(); } }, this.pollMs); }
  }

  HistGroup.prototype.url = function () {
    if (!this.formSel) { return this.src; }
    var form = document.querySelector(this.formSel), params = new URLSearchParams();
    if (form) {
      new FormData(form).forEach(function (v, k) {
        if (v !== "" && ["sort", "order"].indexOf(k) < 0) { params.append(k, v); }
      });
    }
    var qs = params.toString();
    return this.src + (qs ? (this.src.indexOf("?") < 0 ? "?" : "&") + qs : "");
  };

  HistGroup.prototype.load = function () {
    var self = this, url = this.url();
    this.pending = url;
    return fetch(url, { headers: { Accept: "application/json" } }).then(function (r) {
      return r.json().then(function (body) { return { ok: r.ok, body: body }; });
    }).then(function (res) {
      if (self.pending !== url) { return; }
      var note = self.el.querySelector("[data-hist-note]");
      if (!res.ok) { if (note) { note.textContent = res.body.detail || "not available"; } return; }
      self.el.classList.remove("is-stale");
      self.data = self.key ? res.body[self.key] : res.body;
      self.draw();
      if (note) { note.textContent = res.body.note || ""; }
      if (res.body.live === false && self.timer) { clearInterval(self.timer); self.timer = null; }
    }).catch(function () { self.el.classList.add("is-stale"); });
  };

  HistGroup.prototype.width = function () {
    var cell = this.grid.querySelector(".chart-cell");
    return Math.max(220, Math.floor((cell ? cell.clientWidth : this.grid.clientWidth / 3) - 2));
  };

  HistGroup.prototype.resize = function () {
    var self = this, w = this.width();
    Object.keys(this.charts).forEach(function (id) { self.charts[id].u.setSize({ width: w, height: 200 }); });
  };

  HistGroup.prototype.draw = function () {
    var self = this, d = this.data, runs = d.runs || [d];
    var bins = d.bins, xs = bins.map(function (b, i) { return i; });
    var shares = runs.length > 1;
    this.el.setAttribute("data-records", runs.map(function (r) { return r.records; }).join(","));
    d.kinds.forEach(function (kind) {
      var ys = runs.map(function (r) {
        var total = r.records || 1;
        return r.counts[kind].map(function (k) { return shares ? k * 100 / total : k; });
      });
      var key = bins.length + "|" + runs.length;
      var entry = self.charts[kind];
      if (entry && entry.key !== key) { entry.u.destroy(); entry.cell.remove(); entry = null; }
      if (!entry) { entry = self.make(kind, key, runs, shares); self.charts[kind] = entry; }
      entry.bins = bins;
      entry.width = d.bin_width;
      entry.u.setData([xs].concat(ys));
      entry.cell.setAttribute("data-limit", d.max_tokens ? String(runs.map(function (r) { return r.counts[kind][bins.length - 1]; }).join(",")) : "");
    });
  };

  HistGroup.prototype.make = function (kind, key, runs, shares) {
    var self = this, d = this.data;
    var cell = document.createElement("div");
    cell.className = "chart-cell";
    cell.setAttribute("data-hist", kind);
    this.grid.appendChild(cell);
    var colors = [C.purple, C.teal];
    if (kind === "content") { colors = [C.teal, C.purple]; }
    if (kind === "output") { colors = [C.blue, C.amber]; }
    if (runs.length > 1) { colors = [runColor("a"), runColor("b")]; }  // one colour per run on every panel
    var entry = { cell: cell, key: key, bins: d.bins, width: d.bin_width };
    var bars = uPlot.paths.bars;
    var series = [{ label: "tokens", value: function (u, i) { return i === null ? "–" : binLabel(entry.bins[i]); } }]
      .concat(runs.map(function (r, j) {
        return { label: (runs.length > 1 ? r.label + ": " : "") + (shares ? "% of records" : "records"),
                 stroke: colors[j], fill: colors[j] + "99", width: 1,
                 paths: bars({ size: [runs.length > 1 ? 0.45 : 0.9, 40], align: runs.length > 1 ? (j ? 1 : -1) : 0 }),
                 points: { show: false },
                 value: function (u, v) { return v === null ? "–" : shares ? num(v, 2) + "%" : num(v, 0); } };
      }));
    var opts = {
      title: d.kind_labels[kind], width: this.width(), height: 200, series: series,
      scales: { x: { time: false, range: function () { return [-0.5, entry.bins.length - 0.5]; } },
                y: { range: function (u, lo, hi) { return [0, uPlot.rangeNum(0, Math.max(hi || 0, 1), 0.1, true)[1]]; } } },
      axes: [axis({ splits: function (u) { return histSplits(u, entry.bins, entry.width); }, values: function (u, vals) {
        // a bin is named by its upper edge (0, 200, 400, ... with the server's round bin widths), the limit bar by max_tokens
        return vals.map(function (v) {
          var b = entry.bins[Math.round(v)];
          if (!b || v !== Math.round(v)) { return ""; }
          return b.hi === null || b.hi === undefined ? num(b.lo, 0) + "+" : num(b.hi, 0);
        });
      } }), axis({ size: 50, values: function (u, vals) { return vals.map(function (v) { return num(v); }); } })],
      cursor: { y: false, drag: { x: false, y: false } },
      legend: { live: true },
      hooks: { draw: [function (u) {
        (d.limits || (d.max_tokens ? [[d.max_tokens, null]] : [])).forEach(function (lim, j) {
          var idx = entry.bins.length - 1;
          if (lim[1] !== null && lim[1] !== undefined) { idx = lim[1]; }
          var x = u.valToPos(idx - 0.5, "x", true), ctx = u.ctx, pr = uPlot.pxRatio;
          ctx.save(); ctx.strokeStyle = C.red; ctx.setLineDash([5 * pr, 3 * pr]); ctx.lineWidth = 1.5 * pr;
          ctx.beginPath(); ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height); ctx.stroke();
          ctx.fillStyle = C.red; ctx.font = (12 * pr) + "px system-ui, sans-serif"; ctx.textAlign = "right";
          ctx.fillText((lim[2] ? lim[2] + " " : "") + "max_tokens " + lim[0], x - 4 * pr, u.bbox.top + (14 + 14 * j) * pr);
          ctx.restore();
        });
      }] }
    };
    entry.u = new uPlot(opts, [[0]].concat(runs.map(function () { return [0]; })), cell);
    cell._uplot = entry.u;
    return entry;
  };

  // ---------------------------------------------------------------- compare: two runs' time series overlaid
  // Each run's whole time series (/api/runs/{id}/timeseries?window=all), on one axis of minutes since its own first
  // bucket, so two runs made at different times overlay; run A and run B keep their colours (--run-a, --run-b).
  function runColor(side) {
    return getComputedStyle(document.documentElement).getPropertyValue("--run-" + side).trim() || (side === "a" ? C.blue : C.amber);
  }

  function CompareSeries(el) {
    this.el = el;
    this.grid = el.querySelector(".chart-grid");
    this.ids = el.getAttribute("data-runs").split(",");
    this.labels = el.getAttribute("data-labels").split("|");
    this.pollMs = parseInt(el.getAttribute("data-poll-ms") || "10000", 10);
    this.charts = {};
    var self = this;
    this.ro = new ResizeObserver(function () { self.resize(); });
    this.ro.observe(this.grid);
    this.load();
    if (el.getAttribute("data-live") === "1") {
      this.timer = setInterval(function () { if (!document.hidden) { self.load(); } }, this.pollMs);
    }
  }

  CompareSeries.prototype.load = function () {
    var self = this;
    return Promise.all(this.ids.map(function (id) {
      return fetch("/api/runs/" + id + "/timeseries?window=all", { headers: { Accept: "application/json" } })
        .then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.json(); });
    })).then(function (answers) {
      self.el.classList.remove("is-stale");
      self.answers = answers;
      self.draw();
      // both runs over (the numbers' 5-s refresh says so): this was the last poll
      var body = document.getElementById("compare-body");
      if (self.timer && body && body.getAttribute("data-live") === "0") { clearInterval(self.timer); self.timer = null; }
    }).catch(function () { self.el.classList.add("is-stale"); });
  };

  CompareSeries.prototype.width = function () {
    var cell = this.grid.querySelector(".chart-cell");
    return Math.max(260, Math.floor((cell ? cell.clientWidth : this.grid.clientWidth / 2) - 2));
  };

  CompareSeries.prototype.resize = function () {
    var self = this, w = this.width();
    Object.keys(this.charts).forEach(function (id) { self.charts[id].setSize({ width: w, height: 200 }); });
  };

  CompareSeries.prototype.draw = function () {
    var self = this, runs = this.answers;
    // x: minutes since each run's first bucket (the bucket's middle); one x array holding both runs' points
    var xsets = runs.map(function (ts) {
      var t0 = ts.points.length ? ts.points[0].t : 0, half = (ts.bucket_s || 5) / 2;
      return ts.points.map(function (p) { return Math.round((p.t + half - t0) / 6) / 10; });
    });
    var xs = Array.from(new Set(xsets[0].concat(xsets[1]))).sort(function (p, q) { return p - q; });
    function col(j, f) {
      var at = {};
      runs[j].points.forEach(function (p, i) { at[xsets[j][i]] = f(p); });
      return xs.map(function (x) { return at[x] === undefined ? null : at[x]; });
    }
    var specs = [
      { id: "throughput", title: "ok records/s", unit: "records / s", series: [["ok/s", function (p) { return p.ok_s; }, false]] },
      { id: "latency", title: "Mean end-to-end latency", unit: "seconds", series: [["latency s", function (p) { return p.mean_latency_s; }, false]] },
      { id: "checks", title: "Check rates: timeouts and empty reasoning", unit: "% of records", series: [
        ["timeouts %", function (p) { return pct(p.timeout_share); }, false],
        ["empty reasoning %", function (p) { return pct(p.empty_reasoning_share); }, true]] }
    ];
    specs.forEach(function (spec) {
      var series = [{ label: "minutes", value: function (u, v) { return v === null ? "–" : num(v, 1) + " min"; } }];
      var data = [xs];
      [0, 1].forEach(function (j) {
        spec.series.forEach(function (s) {
          series.push({ label: self.labels[j] + " " + s[0], stroke: runColor("ab"[j]), width: 2, dash: s[2] ? [5, 3] : undefined,
                        spanGaps: true, points: { show: false }, value: function (u, v) { return num(v); } });
          data.push(col(j, s[1]));
        });
      });
      var u = self.charts[spec.id];
      if (u && u.series.length === series.length) { u.setData(data); return; }
      if (u) { u.destroy(); u.root.parentNode.remove(); }
      var cell = document.createElement("div");
      cell.className = "chart-cell";
      cell.setAttribute("data-compare-chart", spec.id);
      self.grid.appendChild(cell);
      u = new uPlot({ title: spec.title, width: self.width(), height: 200, series: series,
        scales: { x: { time: false }, y: { range: function (uu, lo, hi) { return [0, uPlot.rangeNum(0, Math.max(hi || 0, 1e-9), 0.1, true)[1]]; } } },
        axes: [axis({ label: "minutes since the run's first record", labelSize: 20, values: function (uu, vals) { return vals.map(function (v) { return num(v, 1); }); } }),
               axis({ label: spec.unit, size: 56, labelSize: 20, values: function (uu, vals) { return vals.map(function (v) { return num(v); }); } })],
        legend: { live: true }, cursor: { drag: { x: false, y: false } } }, data, cell);
      cell._uplot = u;
      self.charts[spec.id] = u;
    });
  };

  function init(root) {
    (root || document).querySelectorAll("[data-time-charts]").forEach(function (el) {
      if (!el._charts) { el._charts = new TimeGroup(el); }
    });
    (root || document).querySelectorAll("[data-hist-charts]").forEach(function (el) {
      if (!el._charts) { el._charts = new HistGroup(el); }
    });
    (root || document).querySelectorAll("[data-compare-series]").forEach(function (el) {
      if (!el._charts) { el._charts = new CompareSeries(el); }
    });
  }
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", function () { init(); }); }
  else { init(); }
})();
