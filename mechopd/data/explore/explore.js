// mechopd explorer: renders the inline JSON (#data). Errors go into #errors (read by the browser test).
(function () {
  "use strict";
  var errors = document.getElementById("errors");
  function report(msg) { errors.textContent += msg + "\n"; }
  window.addEventListener("error", function (e) { report("error: " + e.message); });
  var origError = console.error;
  console.error = function () { report("console.error: " + Array.prototype.join.call(arguments, " ")); origError.apply(console, arguments); };

  var data = JSON.parse(document.getElementById("data").textContent);
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function fmt(v) { var x = Number(v); return isFinite(x) ? (Math.abs(x) < 1e-3 && x !== 0 ? x.toExponential(2) : x.toFixed(4)) : String(v); }
  function mean(a) { if (!a || !a.length) return NaN; var s = 0; for (var i = 0; i < a.length; i++) s += a[i]; return s / a.length; }

  // --- the tables: every number with the CSV's exact text in data-value
  var tables = document.getElementById("tables");
  Object.keys(data.tables).forEach(function (name) {
    var t = data.tables[name];
    tables.appendChild(el("h2", {}, name + ".csv"));
    var table = el("table", {"data-table": name});
    var head = el("tr");
    t.columns.forEach(function (c) { head.appendChild(el("th", {}, c)); });
    table.appendChild(head);
    t.rows.forEach(function (r) {
      var tr = el("tr", {"class": "csvrow"});
      r.forEach(function (v, j) {
        var num = j === t.columns.length - 1 || (name === "lens" && j >= 2);
        tr.appendChild(el("td", num ? {"data-col": t.columns[j], "data-value": v} : {"data-col": t.columns[j]}, num ? fmt(v) : v));
      });
      table.appendChild(tr);
    });
    tables.appendChild(table);
  });

  // --- sparklines
  function spark(values, w, h, colour) {
    var ns = "http://www.w3.org/2000/svg", svg = document.createElementNS(ns, "svg");
    svg.setAttribute("width", w); svg.setAttribute("height", h); svg.setAttribute("class", "spark");
    var finite = values.filter(isFinite), hi = Math.max.apply(null, finite.concat([1e-12]));
    var pts = values.map(function (v, i) {
      var x = values.length > 1 ? i * (w - 4) / (values.length - 1) + 2 : w / 2;
      return x.toFixed(1) + "," + (h - 2 - (isFinite(v) ? v / hi : 0) * (h - 4)).toFixed(1);
    });
    var line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", pts.join(" ")); line.setAttribute("fill", "none");
    line.setAttribute("stroke", colour || "#c33"); line.setAttribute("stroke-width", "1.5");
    svg.appendChild(line);
    return svg;
  }

  // --- the tooltip
  var tip = document.getElementById("tip");
  function tops(list) { return (list || []).map(function (p) { return JSON.stringify(p[0]) + " " + Number(p[1]).toFixed(3); }).join(", "); }
  function show(ev, it, m, t) {
    var d = it.models[m];
    tip.innerHTML = "";
    tip.appendChild(el("div", {"class": "mname"}, m + " · token " + t + " " + JSON.stringify(it.tokens[t])));
    var out = d.kl.final_norm ? d.kl.final_norm[t] : NaN;
    tip.appendChild(el("div", {}, "KL(p_c‖p_x) at the output: " + fmt(out)));
    tip.appendChild(el("div", {}, "with context: " + tops(d.top_c[t])));
    tip.appendChild(el("div", {}, "without: " + tops(d.top_x[t])));
    tip.appendChild(el("div", {"class": "legend"}, "lens KL by depth (" + data.sites.length + " sites)"));
    tip.appendChild(spark(data.sites.map(function (s) { return d.kl[s] ? d.kl[s][t] : NaN; }), 300, 40));
    var ps = Object.keys(d.patched);
    if (ps.length) {
      tip.appendChild(el("div", {"class": "legend"}, "KL after patching c→x at each site"));
      tip.appendChild(spark(ps.map(function (s) { return d.patched[s][t]; }), 300, 40, "#36c"));
    }
    var ls = Object.keys(d.ctx);
    if (ls.length) tip.appendChild(el("div", {}, "context share by layer: " + ls.map(function (l) { return fmt(d.ctx[l][t]); }).join(" ")));
    tip.style.display = "block";
  }

  // --- what colours the tokens: the output KL (default), the lens KL at a site, the KL after a c→x patch at a site
  var choices = [["kl", "final_norm", "KL(p_c‖p_x) at the output"]];
  data.sites.forEach(function (s) { if (s !== "final_norm") choices.push(["kl", s, "lens KL at " + s]); });
  var first0 = data.items[0] && data.items[0].models[data.models[0]];
  Object.keys((first0 && first0.patched) || {}).forEach(function (s) { choices.push(["patched", s, "KL after patching c→x at " + s]); });
  function value(d, c, t) { var a = d[c[0]] && d[c[0]][c[1]]; return a ? a[t] : NaN; }
  var spans = [];
  function recolour(c) {
    var hi = 1e-12;
    spans.forEach(function (x) { var v = value(x.d, c, x.t); if (v > hi) hi = v; });
    spans.forEach(function (x) {
      var v = value(x.d, c, x.t), a = isFinite(v) ? Math.sqrt(Math.max(0, v) / hi) : 0;
      x.span.style.background = "rgba(220,40,40," + a.toFixed(3) + ")";
    });
    legend.textContent = data.items.length + " items · tokens coloured by " + c[2] + " of the position predicting them (max " + fmt(hi) + ")";
  }
  var box = document.getElementById("items");
  var legend = el("h2");
  var select = el("select", {"id": "colour"});
  choices.forEach(function (c, k) { select.appendChild(el("option", {"value": k}, c[2])); });
  select.addEventListener("change", function () { recolour(choices[Number(select.value)]); });
  box.appendChild(legend);
  box.appendChild(el("label", {}, "colour by "));
  box.appendChild(select);
  data.items.forEach(function (it, i) {
    var div = el("div", {"class": "item", "data-item": i, "data-uid": it.uid});
    div.appendChild(el("div", {"class": "uid"}, "item " + i + " · " + it.uid));
    var row = el("div", {"class": "row"});
    data.models.forEach(function (m) {
      var d = it.models[m];
      if (!d) return;
      var col = el("div", {"class": "model", "data-model": m});
      col.appendChild(el("span", {"class": "mname"}, m + " "));
      col.appendChild(spark(data.sites.map(function (s) { return mean(d.kl[s]); }), 120, 22));
      col.appendChild(el("br"));
      it.tokens.forEach(function (tok, t) {
        var v = d.kl.final_norm ? d.kl.final_norm[t] : NaN;
        var span = el("span", {"class": "tok", "data-kl": String(v)}, tok);
        spans.push({span: span, d: d, t: t});
        span.addEventListener("mouseenter", function (ev) { show(ev, it, m, t); });
        col.appendChild(span);
      });
      row.appendChild(col);
    });
    div.appendChild(row);
    box.appendChild(div);
  });
  var wanted = /colour=(\d+)/.exec(location.hash);  // e.g. explore.html#colour=3 (the selector's index)
  var start = wanted && Number(wanted[1]) < choices.length ? Number(wanted[1]) : 0;
  select.value = String(start);
  recolour(choices[start]);
  var first = data.items[0], m0 = first && data.models.filter(function (m) { return first.models[m]; })[0];
  if (m0 && first.tokens.length) show(null, first, m0, 0);  // the panel starts on the first token
  document.body.setAttribute("data-ready", "1");
})();
