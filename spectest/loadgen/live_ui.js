// spectest's live charts in Locust's web UI: on the "Speculative decoding" tab, above the table,
// one row of charts per workload — acceptance, TPOT p50 with speculation on and off, and the
// running step's TPOT speedup (off / on) with its interval, marked where it settled. Data from
// /spectest/live.json (spectest/loadgen/live.py), redrawn every two seconds. Plain SVG: the page
// fetches nothing else.
(function () {
  "use strict";
  var TAB = "spectest", BOX = "spectest-live-charts", W = 370, H = 170, PAD = 36;
  var GREEN = "#1a9850", GREY = "#6b6b6b", BLUE = "#2166ac";

  function activeTab() {
    return new URLSearchParams(window.location.search).get("tab") === TAB;
  }

  function el(name, attrs, text) {
    var e = document.createElementNS("http://www.w3.org/2000/svg", name);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function fmt(v, digits) {
    return v === null || v === undefined ? "–" : Number(v).toFixed(digits);
  }

  function chart(title, points, series, opts) {
    var svg = el("svg", {width: W, height: H, viewBox: "0 0 " + W + " " + H,
                         "font-family": "sans-serif", "font-size": "10"});
    svg.appendChild(el("text", {x: PAD, y: 11, "font-weight": "bold", fill: "currentColor"}, title));
    var xs = points.map(function (p) { return p.t; });
    var ys = [];
    series.forEach(function (s) {
      points.forEach(function (p) {
        [s.key, s.low, s.high].forEach(function (k) {
          if (k && p[k] !== null && p[k] !== undefined) ys.push(p[k]);
        });
      });
    });
    (opts.fixed || []).forEach(function (v) { ys.push(v); });
    if (!xs.length || !ys.length) {
      svg.appendChild(el("text", {x: PAD, y: H / 2, fill: GREY}, opts.empty || "waiting for data"));
      return svg;
    }
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    if (x1 === x0) x1 = x0 + 1;
    var y0 = opts.min !== undefined ? opts.min : Math.min.apply(null, ys);
    var y1 = opts.max !== undefined ? opts.max : Math.max.apply(null, ys);
    if (y1 === y0) { y1 = y0 + 1; y0 = Math.max(0, y0 - 1); }
    var pad = (y1 - y0) * 0.08; y0 -= opts.min !== undefined ? 0 : pad; y1 += pad;
    function sx(t) { return PAD + (t - x0) / (x1 - x0) * (W - PAD - 8); }
    function sy(v) { return H - 18 - (v - y0) / (y1 - y0) * (H - 50); }
    svg.appendChild(el("line", {x1: PAD, x2: W - 8, y1: H - 18, y2: H - 18, stroke: "#999"}));
    svg.appendChild(el("text", {x: PAD, y: H - 5, fill: GREY}, fmt(x0, 0) + " s"));
    svg.appendChild(el("line", {x1: PAD, x2: PAD, y1: 16, y2: H - 18, stroke: "#999"}));
    [y0 + pad, (y0 + y1) / 2, y1 - pad].forEach(function (v) {
      svg.appendChild(el("text", {x: PAD - 3, y: sy(v) + 3, "text-anchor": "end", fill: GREY},
                         fmt(v, opts.digits || 2)));
    });
    svg.appendChild(el("text", {x: W - 8, y: H - 5, "text-anchor": "end", fill: GREY},
                       fmt(x1, 0) + " s"));
    (opts.boundaries || []).forEach(function (b) {
      if (b.t <= x0 || b.t >= x1) return;
      svg.appendChild(el("line", {x1: sx(b.t), x2: sx(b.t), y1: 16, y2: H - 18,
                                  stroke: "#bbb", "stroke-dasharray": "2,3"}));
      svg.appendChild(el("text", {x: sx(b.t) + 2, y: 24, fill: GREY}, "c=" + b.users));
    });
    (opts.fixed || []).forEach(function (v) {
      svg.appendChild(el("line", {x1: PAD, x2: W - 8, y1: sy(v), y2: sy(v), stroke: "#d62728",
                                  "stroke-dasharray": "4,3"}));
    });
    series.forEach(function (s) {
      if (s.low) {  // the interval: a band per step
        var band = "";
        points.forEach(function (p, i) {
          if (p[s.low] === null || p[s.low] === undefined) return;
          band += (band ? "L" : "M") + sx(p.t) + "," + sy(p[s.high]);
        });
        var back = points.slice().reverse().filter(function (p) {
          return p[s.low] !== null && p[s.low] !== undefined;
        });
        back.forEach(function (p) { band += "L" + sx(p.t) + "," + sy(p[s.low]); });
        if (band) svg.appendChild(el("path", {d: band + "Z", fill: s.colour, opacity: 0.15}));
      }
      var d = "", prevStep = null;
      points.forEach(function (p) {
        var v = p[s.key];
        if (v === null || v === undefined) { prevStep = null; return; }
        d += (prevStep === p.step ? "L" : "M") + sx(p.t) + "," + sy(v);
        prevStep = p.step;
      });
      if (d) svg.appendChild(el("path", {d: d, fill: "none", stroke: s.colour, "stroke-width": 2}));
      if (s.label) {  // a legend under the title
        svg.appendChild(el("text", {x: PAD + 6 + 95 * series.indexOf(s), y: 26, fill: s.colour,
                                    "font-weight": "bold"}, "— " + s.label));
      }
    });
    (opts.marks || []).forEach(function (m) {  // where the running step's verdict settled
      svg.appendChild(el("circle", {cx: sx(m.t), cy: sy(m.v), r: 5, fill: "none",
                                    stroke: "#000", "stroke-width": 2}));
      var right = sx(m.t) > W - 90;
      svg.appendChild(el("text", {x: sx(m.t) + (right ? -7 : 7), y: sy(m.v) - 8,
                                  "text-anchor": right ? "end" : "start",
                                  "font-weight": "bold", fill: "currentColor"},
                         "settled: " + m.judgement));
    });
    return svg;
  }

  function row(name, points, data) {
    var div = document.createElement("div");
    div.style.margin = "6px 0 12px 0";
    var last = points[points.length - 1] || {};
    var head = document.createElement("div");
    head.style.fontWeight = "bold";
    var ratio = last.ratio !== undefined && last.ratio !== null
      ? " · TPOT speedup " + fmt(last.ratio, 2) + "× [" + fmt(last.low, 2) + "–" +
        fmt(last.high, 2) + "] (n = " + last.n_on + " on / " + last.n_off + " off, z = " +
        fmt(last.z, 2) + ") " + (last.settled ? "settled: " + last.judgement : last.judgement)
      : "";
    head.textContent = name + " — step " + (last.step + 1) + " (c=" + last.users + ")" + ratio;
    div.appendChild(head);
    var marks = points.filter(function (p) { return p.settles_here; })
      .map(function (p) { return {t: p.t, v: p.ratio, judgement: p.judgement}; });
    var b = data.steps || [];
    div.appendChild(chart("Acceptance", points, [{key: "acceptance", colour: GREEN}],
                          {min: 0, max: 1, boundaries: b, empty: "no draft statistics"}));
    div.appendChild(chart("TPOT p50 (ms)", points, [
      {key: "tpot_on", colour: GREEN, label: "speculation on"},
      {key: "tpot_off", colour: GREY, label: "off"}], {min: 0, digits: 1, boundaries: b}));
    div.appendChild(chart("TPOT speedup, off ÷ on (running step)", points,
                          [{key: "ratio", low: "low", high: "high", colour: BLUE}],
                          {fixed: [1], boundaries: b, marks: marks,
                           empty: "needs --speculative ab (on and off requests)"}));
    return div;
  }

  function draw(box, data) {
    while (box.firstChild) box.removeChild(box.firstChild);
    var names = Object.keys(data.workloads || {});
    var title = document.createElement("div");
    title.style.margin = "8px 0";
    title.textContent = names.length
      ? "Live, per workload: a point every " + data.look_s + " s; the speedup's interval " +
        "keeps its 95 % over the step's " + data.looks + " looks (repeated confidence " +
        "intervals), ○ where it settled. With --speculative ab both kinds of request share " +
        "the server: above c = 1 the ones without speculation wait on rounds that verify " +
        "the others' drafts, so the live speedup there is per request on a mixed server; " +
        "the sweep's separate arms compare all-on with all-off."
      : "Live charts appear once requests finish.";
    box.appendChild(title);
    names.forEach(function (n) { box.appendChild(row(n, data.workloads[n], data)); });
  }

  function place() {
    var box = document.getElementById(BOX);
    if (!activeTab()) { if (box) box.remove(); return null; }
    if (box) return box;
    var table = document.querySelector("table");
    var anchor = table ? (table.closest(".MuiPaper-root") || table.parentElement) : null;
    if (!anchor || !anchor.parentElement) return null;
    box = document.createElement("div");
    box.id = BOX;
    anchor.parentElement.insertBefore(box, anchor);
    return box;
  }

  function tick() {
    var box = place();
    if (!box) return;
    fetch("/spectest/live.json").then(function (r) { return r.json(); })
      .then(function (data) { draw(box, data); })
      .catch(function () {});
  }

  setInterval(tick, 2000);
  document.addEventListener("DOMContentLoaded", tick);
})();
