// mechopd explorer, part 2: the items (texts, generations, outcomes, diffs, probe panels), the controls, the tables.
(function () {
  "use strict";
  var X = window.__explore, data = X.data, el = X.el, fmt = X.fmt, outcome = X.outcome, hash = X.hash, cSel = null;

  // --- one item: texts, one row per model (both views side by side, word diff, flags, other contexts), probe panel
  function texts(it, div) {
    var dl = el("dl", {"class": "texts"});
    [["prompt", it.prompt], ["context", it.context], ["target", it.target]].forEach(function (p) {
      dl.appendChild(el("dt", {}, p[0]));
      dl.appendChild(el("dd", {"data-field": p[0]}, p[1] === null || p[1] === undefined ? "(not recorded in the eval report: rerun mechopd eval)" : p[1]));
    });
    div.appendChild(dl);
  }
  function flagsOf(o) { return o.harm ? "Harm" : o.help ? "Help" : o.both_wrong ? "both wrong" : "both right"; }
  function outcomes(it, div) {
    var ms = data.models.filter(function (m) { return it.out[m]; });
    if (!ms.length) return;
    var t = el("table", {"class": "outcomes"}), head = el("tr");
    ["model", "without the context (x)", "with the context (c, x)", "outcome"].forEach(function (h) { head.appendChild(el("th", {}, h)); });
    var anyOther = ms.some(function (m) { return it.out[m].other.length; });
    if (anyOther) head.appendChild(el("th", {}, "under other contexts (follow: right for that context; stick: the distilled context's answer)"));
    t.appendChild(head);
    ms.forEach(function (m) {
      var o = it.out[m], f = outcome(o), k = X.diff(X.words(o.x), X.words(o.xc));
      var tr = el("tr", {"class": "orow", "data-model": m, "data-correct-x": o.cx ? "1" : "0", "data-correct-xc": o.cxc ? "1" : "0", "data-flag": flagsOf(f)});
      var name = el("td", {"class": "name"}, m);
      name.style.color = X.colourOf(m);
      tr.appendChild(name);
      tr.appendChild(X.genCell(o.x, k[0], "del", o.cx));
      tr.appendChild(X.genCell(o.xc, k[1], "ins", o.cxc));
      tr.appendChild(el("td", {"class": "flag " + flagsOf(f).replace(" ", "_")}, flagsOf(f)));
      if (anyOther) {
        var td = el("td", {"class": "other"});
        o.other.forEach(function (r) {
          var line = el("div", {"data-label": r[0]});
          line.appendChild(el("b", {}, r[0] + ": "));
          line.appendChild(el("span", {"class": r[2] ? "ok" : "bad"}, (r[2] ? "✓ follow" : "✗") + (r[3] ? " · stick" : "") + " "));
          line.appendChild(document.createTextNode(r[1]));
          td.appendChild(line);
        });
        tr.appendChild(td);
      }
      t.appendChild(tr);
    });
    div.appendChild(t);
  }
  function probePanel(it, i, div) {
    var p = it.probe;
    if (!p) return;
    var det = el("details", {"class": "probe", "open": ""});
    det.appendChild(el("summary", {}, "probes on one response (sampled " + (data.probe_source ? "from " + data.probe_source + " " : "") + "without the context, scored by every model in both views)"));
    var ms = data.models.filter(function (m) { return p.m[m]; });
    ms.forEach(function (m) {
      var d = p.m[m], row = el("div", {"class": "model", "data-model": m});
      var nm = el("span", {"class": "mname"}, m + " ");
      nm.style.color = X.colourOf(m);
      row.appendChild(nm);
      p.tokens.forEach(function (tok, t) {
        var v = d.kl.final_norm ? d.kl.final_norm[t] : NaN;
        var span = el("span", {"class": "tok", "data-kl": String(v)}, tok);
        X.spans.push({span: span, d: d, t: t});
        span.addEventListener("mouseenter", function () { X.show(it, m, t); });
        row.appendChild(span);
      });
      det.appendChild(row);
    });
    var charts = el("div", {"class": "charts"});
    charts.appendChild(X.lineChart("mean lens KL by depth (this item)", data.sites, ms.map(function (m) {
      return {name: m, colour: X.colourOf(m), values: data.sites.map(function (s) { return X.mean(p.m[m].kl[s]); })};
    }), "KL(p_c‖p_x) (nats)"));
    var psites = Object.keys(p.m[ms[0]].patched || {});
    if (psites.length) charts.appendChild(X.lineChart("KL after patching c→x (this item)", psites, ms.map(function (m) {
      return {name: m, colour: X.colourOf(m), values: psites.map(function (s) { return X.mean((p.m[m].patched || {})[s]); })};
    }), "KL (nats)"));
    det.appendChild(charts);
    attention(p, ms, det);
    div.appendChild(det);
  }
  function attention(p, ms, parent) {
    if (!ms.some(function (m) { return Object.keys(p.m[m].ctx || {}).length; })) return;
    var det = el("details", {"class": "attn-all"});
    det.appendChild(el("summary", {}, "attention from the response tokens onto the context, per head and layer (context view)"));
    parent.appendChild(det);
    ms.forEach(function (m) {
      var d = p.m[m], layers = Object.keys(d.ctx || {});
      if (!layers.length) return;
      var box = el("div", {"class": "attn", "data-model": m});
      box.appendChild(el("div", {"class": "mname"}, m + ": attention on the context (context view)"));
      var heads = Object.keys(d.heads || {});
      if (heads.length) {
        heads.forEach(function (l) {
          var H = d.heads[l][0] ? d.heads[l][0].length : 0, rows = [];
          for (var h = 0; h < H; h++) rows.push(d.heads[l].map(function (r) { return r[h]; }));
          box.appendChild(X.heat("layer " + l + ": share of each head's attention on the context, per response token", rows, rows.map(function (_, h) { return "head " + h; }), p.tokens.map(function (t, i) { return i + ":" + t; })));
          if (d.keys && d.keys[l] && d.ctx_tokens.length) box.appendChild(X.heat("layer " + l + ": attention on each context token, mean over response tokens", d.keys[l], d.keys[l].map(function (_, h) { return "head " + h; }), d.ctx_tokens));
        });
      } else {
        box.appendChild(X.heat("share of attention on the context per layer (mean over heads; this probe file has no per-head values: rerun mechopd probe attention)", layers.map(function (l) { return d.ctx[l]; }), layers.map(function (l) { return "layer " + l; }), p.tokens.map(function (t, i) { return i + ":" + t; })));
      }
      det.appendChild(box);
    });
  }
  function item(it, i) {
    var div = el("div", {"class": "item", "id": "item-" + i, "data-item": String(i), "data-uid": it.uid});
    var head = el("div", {"class": "uid"});
    head.appendChild(el("a", {"href": "#item-" + i}, "item " + i));
    head.appendChild(document.createTextNode(" · uid "));
    head.appendChild(el("code", {}, it.uid));
    data.models.forEach(function (m) {
      var f = outcome(it.out[m]);
      if (f && (f.harm || f.help)) head.appendChild(el("span", {"class": "badge " + (f.harm ? "Harm" : "Help")}, m + ": " + (f.harm ? "Harm" : "Help")));
    });
    div.appendChild(head);
    texts(it, div);
    outcomes(it, div);
    probePanel(it, i, div);
    return div;
  }

  // --- the controls: outcome x model filter, sort, text search
  var box = document.getElementById("items"), controls = document.getElementById("controls");
  function select(id, label, options) {
    var s = el("select", {"id": id});
    options.forEach(function (o) { s.appendChild(el("option", {"value": o[0]}, o[1])); });
    controls.appendChild(el("label", {"for": id}, label));
    controls.appendChild(s);
    return s;
  }
  var fSel = select("filter", "show ", [["all", "all items"], ["harm", "Harm: right without c, wrong with c"], ["help", "Help: wrong without c, right with c"], ["both_wrong", "both views wrong"], ["both_right", "both views right"], ["differ", "views disagree"]]);
  var mSel = select("model", " for ", [["any", "any model"]].concat(data.models.map(function (m) { return [m, m]; })));
  var sSel = select("sort", " sort by ", [["order", "item order"], ["kl", "output KL (probe), largest first"], ["uid", "uid"]]);
  var search = el("input", {"id": "search", "type": "search", "placeholder": "uid, prompt or context contains"});
  controls.appendChild(search);
  var count = el("span", {"id": "count", "class": "legend"});
  controls.appendChild(count);
  controls.appendChild(el("br"));
  if (data.items.some(function (it) { return it.probe; })) {
    controls.appendChild(el("label", {"for": "colour"}, "colour probe tokens by "));
    cSel = el("select", {"id": "colour"});
    X.choices.forEach(function (c, k) { cSel.appendChild(el("option", {"value": String(k)}, c[2])); });
    controls.appendChild(cSel);
    controls.appendChild(X.legend);
    cSel.addEventListener("change", function () { X.recolour(X.choices[Number(cSel.value)]); });
  }
  var nodes = data.items.map(function (it, i) { return {it: it, i: i, node: item(it, i)}; });
  function matches(n, f, m) {
    var ms = m === "any" ? data.models : [m];
    var q = search.value.toLowerCase();
    if (q && [n.it.uid, n.it.prompt || "", n.it.context || ""].join("\n").toLowerCase().indexOf(q) < 0) return false;
    if (f === "all") return m === "any" || !!n.it.out[m] || !!(n.it.probe && n.it.probe.m[m]);
    return ms.some(function (x) { var o = outcome(n.it.out[x]); return o && o[f]; });
  }
  function klKey(n, m) {
    var ms = m === "any" ? data.models : [m], v = -Infinity;
    ms.forEach(function (x) { var k = X.outputKL(n.it, x); if (isFinite(k) && k > v) v = k; });
    return v;
  }
  function apply(keepHash) {
    var f = fSel.value, m = mSel.value, s = sSel.value;
    var shown = nodes.filter(function (n) { return matches(n, f, m); });
    if (s === "kl") shown.sort(function (a, b) { return klKey(b, m) - klKey(a, m) || a.i - b.i; });
    if (s === "uid") shown.sort(function (a, b) { return a.it.uid < b.it.uid ? -1 : a.it.uid > b.it.uid ? 1 : a.i - b.i; });
    X.clear(box);
    shown.forEach(function (n) {
      n.node.querySelectorAll("tr.orow").forEach(function (tr) { tr.style.display = m === "any" || tr.getAttribute("data-model") === m ? "" : "none"; });
      box.appendChild(n.node);
    });
    count.textContent = " showing " + shown.length + " of " + data.items.length + " items";
    box.setAttribute("data-shown", String(shown.length));
    if (keepHash !== true) location.replace("#filter=" + f + "&model=" + encodeURIComponent(m) + "&sort=" + s + (cSel ? "&colour=" + cSel.value : ""));
  }
  [fSel, mSel, sSel].forEach(function (s) { s.addEventListener("change", apply); });
  search.addEventListener("input", apply);
  // #item-<i> (the reports' links): show the item (clearing a filter that hides it), open its panels, scroll to it
  function focusItem(i) {
    var n = nodes[i];
    if (!n) { document.getElementById("errors").textContent += "no item " + i + " on this page (" + nodes.length + " items)\n"; return; }
    if (!n.node.parentNode) { fSel.value = "all"; mSel.value = "any"; search.value = ""; apply(true); }
    nodes.forEach(function (m) { m.node.classList.remove("target"); });
    n.node.classList.add("target");
    n.node.querySelectorAll("details").forEach(function (d) { d.open = true; });
    n.node.scrollIntoView({block: "start"});
    document.body.setAttribute("data-target", String(i));
  }
  function itemHash() { var m = /^#item-(\d+)$/.exec(location.hash); return m ? Number(m[1]) : null; }
  window.addEventListener("hashchange", function () { if (itemHash() !== null) focusItem(itemHash()); });

  // --- per-head context share of every model (attention.csv), and the CSVs themselves
  function headsSection() {
    var t = data.tables.attention;
    if (!t) return;
    var holder = document.getElementById("heads");
    holder.appendChild(el("h2", {}, "attention on the context per head (attention.csv: mean over every scored token)"));
    var byModel = {};
    t.rows.forEach(function (r) { (byModel[r[0]] = byModel[r[0]] || {})[r[1]] = (byModel[r[0]][r[1]] || []).concat([[Number(r[2]), Number(r[3])]]); });
    var wrap = el("div", {"class": "charts"});
    Object.keys(byModel).forEach(function (m) {
      var layers = Object.keys(byModel[m]).sort(function (a, b) { return a - b; });
      var H = Math.max.apply(null, layers.map(function (l) { return byModel[m][l].length; }));
      var rows = layers.map(function (l) { var row = new Array(H).fill(NaN); byModel[m][l].forEach(function (p) { row[p[0]] = p[1]; }); return row; });
      var hb = X.heat(m + ": context share, layer × head", rows, layers.map(function (l) { return "layer " + l; }), rows[0].map(function (_, h) { return "h" + h; }));
      hb.setAttribute("data-model", m);
      wrap.appendChild(hb);
    });
    holder.appendChild(wrap);
  }
  function tables() {
    var holder = document.getElementById("tables");
    Object.keys(data.tables).forEach(function (name) {
      var t = data.tables[name];
      holder.appendChild(el("h2", {}, name + ".csv"));
      var table = el("table", {"data-table": name}), head = el("tr");
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
      holder.appendChild(table);
    });
  }
  function curves() {  // the run's lens and patching curves (lens.csv, patching.csv c→x over every item)
    var holder = document.getElementById("heads"), wrap = el("div", {"class": "charts"});
    var lens = data.tables.lens, patch = data.tables.patching;
    function series(t, key, yIdx, filter) {
      var xs = [], by = {};
      t.rows.forEach(function (r) { if (filter && !filter(r)) return; if (xs.indexOf(r[1]) < 0) xs.push(r[1]); (by[key(r)] = by[key(r)] || {})[r[1]] = Number(r[yIdx]); });
      return {xs: xs, series: Object.keys(by).map(function (k, i) { var m = k.split(" · ")[0]; return {name: k, colour: X.colourOf(m), dash: i % 2 ? "4 2" : "", values: xs.map(function (x) { return by[k][x]; })}; })};
    }
    if (lens) { var a = series(lens, function (r) { return r[0]; }, 2); wrap.appendChild(X.lineChart("lens: KL(p_c‖p_x) by site (lens.csv)", a.xs, a.series, "KL (nats)", {w: 420, h: 210})); }
    if (patch) { var b = series(patch, function (r) { return r[0] + " · " + r[2]; }, 5); wrap.appendChild(X.lineChart("patching c→x: share of KL recovered (patching.csv)", b.xs, b.series, "recovered", {w: 420, h: 210})); }
    if (lens || patch) { holder.appendChild(el("h2", {}, "the run's curves over every probe item")); holder.appendChild(wrap); }
  }

  X.summaryTable();
  curves();
  headsSection();
  tables();
  if (hash.filter) fSel.value = hash.filter;
  if (hash.model) mSel.value = hash.model;
  if (hash.sort) sSel.value = hash.sort;
  var start = hash.colour && Number(hash.colour) < X.choices.length ? Number(hash.colour) : 0;
  if (cSel) cSel.value = String(start);
  var target = itemHash();
  apply(target !== null);
  if (X.spans.length) X.recolour(X.choices[start]);
  var first = data.items.filter(function (it) { return it.probe; })[0];
  if (first && first.probe.tokens.length) X.show(first, data.models.filter(function (m) { return first.probe.m[m]; })[0], 0);
  if (target !== null) focusItem(target);
  document.body.setAttribute("data-ready", "1");
})();
