// mechopd explorer: renders the inline JSON (#data). Every string of the data is set with textContent or as an
// attribute value, never parsed as HTML. Errors go into #errors (read by the browser test).
(function () {
  "use strict";
  var errors = document.getElementById("errors");
  function report(msg) { errors.textContent += msg + "\n"; }
  window.addEventListener("error", function (e) { report("error: " + e.message); });
  var origError = console.error;
  console.error = function () { report("console.error: " + Array.prototype.join.call(arguments, " ")); origError.apply(console, arguments); };

  var data = JSON.parse(document.getElementById("data").textContent);
  var SVG = "http://www.w3.org/2000/svg";
  var PALETTE = ["#1b6ca8", "#d1495b", "#2e933c", "#8e5ea2", "#e08e0b", "#555555", "#17becf", "#a0522d"];
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function svg(tag, attrs, text) {
    var e = document.createElementNS(SVG, tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  function fmt(v) { var x = Number(v); if (v === null || v === undefined || v === "" || !isFinite(x)) return "n/a"; return Math.abs(x) < 1e-3 && x !== 0 ? x.toExponential(2) : x.toFixed(3); }
  function mean(a) { if (!a || !a.length) return NaN; var s = 0; for (var i = 0; i < a.length; i++) s += a[i]; return s / a.length; }
  function short(site) { return String(site).replace(/^layers\.(\d+)\.resid_post$/, "L$1").replace(/^layers\.(\d+)\./, "L$1."); }
  function colourOf(m) { return (data.colours && data.colours[m]) || PALETTE[data.models.indexOf(m) % PALETTE.length]; }  // the figures' colour
  var hash = {};
  location.hash.replace(/^#/, "").split("&").forEach(function (kv) { var p = kv.split("="); if (p[0]) hash[p[0]] = decodeURIComponent(p[1] || ""); });

  // --- outcomes per item and model: right / wrong in each view, Harm (right without c, wrong with c), Help (reverse)
  function outcome(o) {
    if (!o) return null;
    return {harm: o.cx && !o.cxc, help: !o.cx && o.cxc, both_wrong: !o.cx && !o.cxc, both_right: o.cx && o.cxc, differ: o.cx !== o.cxc};
  }
  function outputKL(it, m) { var d = it.probe && it.probe.m[m]; return d && d.kl.final_norm ? mean(d.kl.final_norm) : NaN; }

  // --- the models' summaries (the reports' numbers, data-value = the JSON's)
  function summaryTable() {
    var box = document.getElementById("summary");
    var keys = ["acc_x", "acc_xc", "harm", "help", "both_correct", "delta_len", "follow_other"];
    var names = Object.keys(data.summary);
    if (!names.length) { box.appendChild(el("p", {"class": "legend"}, "no evaluation reports (eval/*.json) in this run: outcomes are not shown")); return; }
    box.appendChild(el("h2", {}, "evaluation (eval/<model>.json): both views, paired per item"));
    var table = el("table", {"id": "summary-table"}), head = el("tr");
    ["model"].concat(keys, ["regime", "items: Harm", "Help", "both wrong"]).forEach(function (k) { head.appendChild(el("th", {}, k)); });
    table.appendChild(head);
    names.forEach(function (m) {
      var s = data.summary[m], tr = el("tr", {"data-model": m});
      tr.appendChild(el("td", {"class": "name"}, m));
      keys.forEach(function (k) {
        var e = s[k], v = e && typeof e === "object" ? e.value : e;
        var td = el("td", {"data-key": k, "data-value": v === null || v === undefined ? "" : String(v)}, e === undefined ? "" : fmt(v));
        if (e && e.low !== null && e.low !== undefined) td.appendChild(el("div", {"class": "ci"}, "[" + fmt(e.low) + ", " + fmt(e.high) + "]"));
        tr.appendChild(td);
      });
      tr.appendChild(el("td", {}, s.regime || ""));
      ["harm", "help", "both_wrong"].forEach(function (k) {
        var n = data.items.filter(function (it) { var o = outcome(it.out[m]); return o && o[k]; }).length;
        tr.appendChild(el("td", {"data-count": k}, String(n)));
      });
      table.appendChild(tr);
    });
    box.appendChild(table);
  }

  // --- charts: SVG line charts with axes, ticks and labels; heat tables with the values as text
  function lineChart(title, xlabels, series, ylabel, opts) {
    opts = opts || {};
    var W = opts.w || 330, H = opts.h || 170, L = 52, R = 14, T = 20, B = 34;
    var s = svg("svg", {"width": W, "height": H, "class": "chart", "role": "img", "aria-label": title});
    var vals = [];
    series.forEach(function (se) { se.values.forEach(function (v) { if (isFinite(v)) vals.push(v); }); });
    var lo = Math.min.apply(null, vals.concat([0])), hi = Math.max.apply(null, vals.concat([lo + 1e-9]));
    if (opts.ymax !== undefined) hi = Math.max(hi, opts.ymax);
    function X(i) { return L + (xlabels.length > 1 ? i * (W - L - R) / (xlabels.length - 1) : (W - L - R) / 2); }
    function Y(v) { return T + (hi - v) / (hi - lo) * (H - T - B); }
    s.appendChild(svg("text", {"x": W / 2, "y": 12, "text-anchor": "middle", "class": "ctitle"}, title));
    s.appendChild(svg("line", {"x1": L, "x2": L, "y1": T, "y2": H - B, "class": "axis"}));
    s.appendChild(svg("line", {"x1": L, "x2": W - R, "y1": H - B, "y2": H - B, "class": "axis"}));
    [lo, (lo + hi) / 2, hi].forEach(function (v) {
      s.appendChild(svg("text", {"x": L - 3, "y": Y(v) + 3, "text-anchor": "end", "class": "tick"}, fmt(v)));
    });
    var step = Math.max(1, Math.ceil(xlabels.length / 10));
    xlabels.forEach(function (lab, i) {
      if (i % step && i !== xlabels.length - 1) return;
      var anchor = xlabels.length > 1 && i === 0 ? "start" : xlabels.length > 1 && i === xlabels.length - 1 ? "end" : "middle";
      var t = svg("text", {"x": X(i), "y": H - B + 12, "text-anchor": anchor, "class": "tick"}, short(lab));
      t.appendChild(svg("title", {}, lab));
      s.appendChild(t);
    });
    s.appendChild(svg("text", {"x": (L + W - R) / 2, "y": H - B + 26, "text-anchor": "middle", "class": "tick"}, opts.xlabel || "site (L<i> = layers.<i>.resid_post)"));
    s.appendChild(svg("text", {"x": 10, "y": (T + H - B) / 2, "text-anchor": "middle", "class": "tick", "transform": "rotate(-90 10 " + (T + H - B) / 2 + ")"}, ylabel));
    series.forEach(function (se) {
      var pts = [];
      se.values.forEach(function (v, i) { if (isFinite(v)) pts.push(X(i).toFixed(1) + "," + Y(v).toFixed(1)); });
      s.appendChild(svg("polyline", {"points": pts.join(" "), "fill": "none", "stroke": se.colour, "stroke-width": 1.6, "stroke-dasharray": se.dash || "", "data-series": se.name}));
      se.values.forEach(function (v, i) { if (isFinite(v)) s.appendChild(svg("circle", {"cx": X(i), "cy": Y(v), "r": 2.2, "fill": se.colour})); });
    });
    var wrap = el("div", {"class": "chartbox"});
    wrap.appendChild(s);
    var leg = el("div", {"class": "legend"});
    series.forEach(function (se) { var k = el("span", {"class": "key"}, "— " + se.name); k.style.color = se.colour; leg.appendChild(k); });
    wrap.appendChild(leg);
    return wrap;
  }
  function heat(title, rows, rowLabels, colLabels, note) {
    var hi = 1e-12;
    rows.forEach(function (r) { r.forEach(function (v) { if (isFinite(v) && v > hi) hi = v; }); });
    var box = el("div", {"class": "heatbox"});
    box.appendChild(el("div", {"class": "ctitle"}, title + " (colour scale 0 – " + fmt(hi) + (note ? "; " + note : "") + ")"));
    var t = el("table", {"class": "heat"}), head = el("tr");
    head.appendChild(el("th"));
    colLabels.forEach(function (c) { head.appendChild(el("th", {"class": "tokh"}, c)); });
    t.appendChild(head);
    rows.forEach(function (r, i) {
      var tr = el("tr");
      tr.appendChild(el("th", {}, rowLabels[i]));
      r.forEach(function (v) {
        var td = el("td", {"data-value": String(v), "title": String(v)}, fmt(v));
        td.style.background = "rgba(27,108,168," + (isFinite(v) ? Math.max(0, v) / hi * 0.85 : 0).toFixed(3) + ")";
        tr.appendChild(td);
      });
      t.appendChild(tr);
    });
    box.appendChild(t);
    return box;
  }

  // --- word diff of the two views' generations (longest common subsequence over words and spaces)
  function words(s) { return (s || "").split(/(\s+)/).filter(function (w) { return w !== ""; }); }
  function diff(a, b) {
    var n = a.length, m = b.length, L = [];
    for (var i = 0; i <= n; i++) { L.push(new Array(m + 1).fill(0)); }
    for (i = n - 1; i >= 0; i--) for (var j = m - 1; j >= 0; j--) L[i][j] = a[i] === b[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
    var keepA = new Array(n).fill(false), keepB = new Array(m).fill(false);
    i = 0; j = 0;
    while (i < n && j < m) {
      if (a[i] === b[j]) { keepA[i++] = true; keepB[j++] = true; } else if (L[i + 1][j] >= L[i][j + 1]) i++; else j++;
    }
    return [keepA, keepB];
  }
  function genCell(text, keep, cls, right) {
    var td = el("td", {"class": "gen"});
    var mark = el("span", {"class": right ? "ok" : "bad", "data-correct": right ? "1" : "0"}, right ? "✓ " : "✗ ");
    td.appendChild(mark);
    words(text).forEach(function (w, i) { td.appendChild(keep && !keep[i] ? el("span", {"class": cls}, w) : document.createTextNode(w)); });
    if (!text) td.appendChild(el("span", {"class": "legend"}, "(empty)"));
    return td;
  }

  // --- the tooltip of a probe token
  var tip = document.getElementById("tip");
  function tops(list) { return (list || []).map(function (p) { return JSON.stringify(p[0]) + " " + Number(p[1]).toFixed(3); }).join(", "); }
  function show(it, m, t) {
    var d = it.probe.m[m];
    clear(tip);
    tip.appendChild(el("div", {"class": "mname"}, m + " · token " + t + " " + JSON.stringify(it.probe.tokens[t])));
    tip.appendChild(el("div", {}, "KL(p_c‖p_x) at the output: " + fmt(d.kl.final_norm ? d.kl.final_norm[t] : NaN)));
    tip.appendChild(el("div", {}, "with context: " + tops(d.top_c[t])));
    tip.appendChild(el("div", {}, "without: " + tops(d.top_x[t])));
    tip.appendChild(lineChart("this token's lens KL by depth", data.sites, [{name: m, colour: colourOf(m), values: data.sites.map(function (s) { return d.kl[s] ? d.kl[s][t] : NaN; })}], "KL (nats)", {w: 310, h: 150}));
    var ls = Object.keys(d.ctx);
    if (ls.length) tip.appendChild(el("div", {}, "context share by layer: " + ls.map(function (l) { return "L" + l + " " + fmt(d.ctx[l][t]); }).join(" · ")));
    tip.style.display = "block";
  }

  // --- what colours the probe tokens
  var choices = [["kl", "final_norm", "KL(p_c‖p_x) at the output"]];
  data.sites.forEach(function (s) { if (s !== "final_norm") choices.push(["kl", s, "lens KL at " + s]); });
  var firstProbe = data.items.filter(function (it) { return it.probe; })[0];
  var fp = firstProbe && firstProbe.probe.m[Object.keys(firstProbe.probe.m)[0]];
  Object.keys((fp && fp.patched) || {}).forEach(function (s) { choices.push(["patched", s, "KL after patching c→x at " + s]); });
  function value(d, c, t) { var a = d[c[0]] && d[c[0]][c[1]]; return a ? a[t] : NaN; }
  var spans = [], legend = el("div", {"class": "legend", "id": "colour-legend"});
  function recolour(c) {
    var hi = 1e-12;
    spans.forEach(function (x) { var v = value(x.d, c, x.t); if (v > hi) hi = v; });
    spans.forEach(function (x) {
      var v = value(x.d, c, x.t), a = isFinite(v) ? Math.sqrt(Math.max(0, v) / hi) : 0;
      x.span.style.background = "rgba(220,40,40," + a.toFixed(3) + ")";
    });
    legend.textContent = "probe tokens coloured by " + c[2] + " of the position predicting them (max " + fmt(hi) + "; hover a token)";
  }

  window.__explore = {data: data, outcome: outcome, outputKL: outputKL, choices: choices, recolour: recolour, spans: spans, el: el, clear: clear, fmt: fmt, mean: mean, lineChart: lineChart, heat: heat, diff: diff, words: words, genCell: genCell, show: show, colourOf: colourOf, hash: hash, summaryTable: summaryTable, legend: legend};
})();
