/* gatherlens explorer: draws the attention figures of the `explain` page for any layer, head,
   query and k, from the JSON data block the page carries (gatherlens.report.explore). The same
   script runs the offline page and `gatherlens serve`'s live page (text box, model switch,
   generation). Text only ever enters the page through textContent / setAttribute. */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var MARGIN = 16;
  var D, M, P, T, S, st = {}, steps = [], genInfo = null, source = null, pending = null, seq = 0;
  var denseSteps = null, picked = null;   // the dense choice of every step (the "dense" event); the clicked step

  // -- data -------------------------------------------------------------------------------------
  function bytes(b64) {
    var s = atob(b64), a = new Uint8Array(s.length);
    for (var i = 0; i < s.length; i++) { a[i] = s.charCodeAt(i); }
    return a;
  }
  function half(h) {
    var sign = (h & 0x8000) ? -1 : 1, e = (h >> 10) & 0x1f, f = h & 0x3ff;
    if (e === 0) { return sign * f * Math.pow(2, -24); }
    if (e === 31) { return f ? NaN : sign * Infinity; }
    return sign * (1 + f / 1024) * Math.pow(2, e - 15);
  }
  // the page's own data (report/explore.py): every layer's own masks, 8-bit score codes of the stored rows
  function Model(x) {
    var R = x.rows[1] - x.rows[0], self = this, off = 0;
    this.x = x; this.r0 = x.rows[0]; this.R = R;
    this.masks = x.masks.map(function (m) {
      var a = bytes(m), idx = new Int32Array(R * x.L), n = 0;
      for (var i = 0; i < a.length; i++) { idx[i] = a[i] ? n++ : -1; }
      return {idx: idx, cells: n};
    });
    this.base = x.mask_of.map(function (m) { var b = off; off += x.heads * self.masks[m].cells; return b; });
    this.codes = bytes(x.scores);
    this.lo = new DataView(bytes(x.score_lo).buffer); this.hi = new DataView(bytes(x.score_hi).buffer);
    this.picksView = new DataView(bytes(x.picks).buffer);
    this.valuesView = new DataView(bytes(x.values).buffer);
  }
  Model.prototype.row = function (l, h, i) {
    var x = this.x, r = i - this.r0, m = this.masks[x.mask_of[l]], out = new Float64Array(x.L);
    var base = this.base[l] + h * m.cells, at = ((l * x.heads + h) * this.R + r) * 4;
    var lo = this.lo.getFloat32(at, true), span = this.hi.getFloat32(at, true) - lo;
    for (var j = 0; j < x.L; j++) {
      var c = m.idx[r * x.L + j];
      out[j] = c < 0 ? -Infinity : lo + this.codes[base + c] * span / 255;   // report/explore.py: dequantize_rows
    }
    return out;
  };
  Model.prototype.has = function (l, h, i) { return i >= this.x.rows[0] && i < this.x.rows[1]; };
  Model.prototype.rowSpan = function () { return this.x.rows; };
  Model.prototype.keySpan = function () { return this.x.keys; };
  // a long text (report/window.py): the full score rows of a window of queries, fetched per choice
  function Remote(x) { this.x = x; this.remote = true; this.set(x.window); }
  Remote.prototype.set = function (w) { this.w = w; this.sc = new DataView(bytes(w.scores).buffer); };
  Remote.prototype.has = function (l, h, i, k) {
    var w = this.w;
    return w.layer === l && w.head === h && w.query === i && w.k === k;
  };
  Remote.prototype.rowSpan = function () { return this.w.rows; };
  Remote.prototype.keySpan = function () { return this.w.keys; };
  Remote.prototype.row = function (l, h, i) {
    var L = this.x.L, out = new Float64Array(L), base = (i - this.w.rows[0]) * L;
    for (var j = 0; j < L; j++) { out[j] = this.sc.getFloat32((base + j) * 4, true); }
    return out;
  };
  Remote.prototype.picks = function (l, h, i) {
    return this.w.picks[i - this.w.rows[0]].filter(function (j) { return j >= 0; });
  };
  Remote.prototype.value = function (l, g, j, c) {
    var r = this.w.values[String(j)];
    return r ? r[c] : NaN;
  };
  Model.prototype.picks = function (l, h, i) {
    var x = this.x, ks = x.k_stored, base = ((l * x.heads + h) * this.R + i - this.r0) * ks, out = [];
    for (var m = 0; m < ks; m++) {
      var j = this.picksView.getInt16((base + m) * 2, true);
      if (j >= 0) { out.push(j); }
    }
    return out;
  };
  Model.prototype.value = function (l, g, j, c) {
    var x = this.x, C = x.value_cols.length;
    return half(this.valuesView.getUint16((((l * x.kv_heads + g) * x.L + j) * C + c) * 2, true));
  };
  function topk(row, k) {
    var idx = [];
    for (var j = 0; j < row.length; j++) { if (row[j] > -Infinity) { idx.push(j); } }
    idx.sort(function (a, b) { return row[b] - row[a] || a - b; });
    return idx.slice(0, k);
  }
  // the keys query row i keeps at k: the model's own picks at its k, else chosen from the scores
  function select(l, h, i, k, row) {
    if (k === D.explore.run_k) { return M.picks(l, h, i).slice(0, k); }
    return topk(row || M.row(l, h, i), k);
  }
  function softmax(xs) {
    var m = -Infinity, s = 0, out = [];
    xs.forEach(function (v) { if (v > m) { m = v; } });
    xs.forEach(function (v) { var e = v > -Infinity ? Math.exp(v - m) : 0; out.push(e); s += e; });
    return out.map(function (e) { return s > 0 ? e / s : 0; });
  }

  // -- formatting (the Python renderer's rules) -------------------------------------------------
  function fill(template, args) {
    return template.replace(/\{(\w+)\}/g, function (m, name) {
      return Object.prototype.hasOwnProperty.call(args, name) ? String(args[name]) : m;
    });
  }
  function stripZeros(s) { return s.indexOf(".") < 0 ? s : s.replace(/0+$/, "").replace(/\.$/, ""); }
  function expo(s) { return s.replace(/e([+-])(\d)$/, "e$10$2"); }
  function fmtG(v, p) {
    if (v === 0) { return "0"; }
    if (!isFinite(v)) { return isNaN(v) ? "nan" : (v > 0 ? "inf" : "-inf"); }
    var r = Number(v.toPrecision(p)), e = Math.floor(Math.log10(Math.abs(r)));
    if (e < -4 || e >= p) { return expo(r.toExponential(p - 1).replace(/\.?0+e/, "e")); }
    return stripZeros(r.toFixed(Math.max(0, p - 1 - e)));
  }
  function pyfmt(v, spec) {
    var m = /^\.(\d+)([gf%])$/.exec(spec || "");
    if (typeof v !== "number" || !m) { return String(v); }
    var p = +m[1];
    if (m[2] === "f") { return v.toFixed(p); }
    if (m[2] === "%") { return (v * 100).toFixed(p) + "%"; }
    return fmtG(v, p);
  }
  function fmtValue(v) {
    if (isNaN(v)) { return ""; }
    if (!isFinite(v)) { return v > 0 ? "∞" : "-∞"; }
    if (v === Math.trunc(v) && Math.abs(v) < 1e6) { return String(v); }
    var a = Math.abs(v), s;
    if (a >= 1e6 || a < 1e-3) { return v.toExponential(0).replace("e+", "e"); }   // '8e-4': theme.fmt_value's rule
    if (a < 0.01) { return v.toFixed(3).replace(/0+$/, ""); }
    if (a >= 100) { return v.toFixed(0); }
    s = stripZeros(v.toFixed(a >= 10 ? 1 : 2));
    return s === "-0" ? "0" : s;
  }
  // a score as precise as the page holds it: the offline page's 8-bit codes are score_err off at most, so
  // no digit finer than that is printed (3 decimals for the exact float32 rows a server sends)
  function fmtScore(v) {
    var err = M.remote ? 0 : D.explore.score_err || 0;
    var digits = err > 0 ? Math.max(0, Math.min(3, Math.floor(-Math.log10(err)))) : 3, s = v.toFixed(digits);
    return /^-0\.?0*$/.test(s) ? s.slice(1) : s;
  }
  function textWidth(s, size) {
    var w = 0;
    Array.from(s).forEach(function (ch) { w += ch.codePointAt(0) >= 0x2e80 ? size : size * 0.62; });
    return Math.floor(w + 0.999);
  }
  function short(s, n) {
    var c = Array.from(s.replace(/\n/g, "\\n").replace(/\t/g, "\\t"));
    return c.length <= n ? c.join("") : c.slice(0, n - 1).join("") + "…";
  }
  function weightColour(w) {
    w = Math.pow(Math.min(Math.max(w, 0), 1), 0.6);
    var lo = [255, 255, 255], hi = [33, 84, 160];
    return "#" + lo.map(function (a, i) {
      return ("0" + Math.round(a + (hi[i] - a) * w).toString(16)).slice(-2);
    }).join("");
  }
  // one distinct colour per key of a figure (render/theme.py: palette, figure_colours, the same rule)
  function hslHex(h, s, l) {
    var a = s * Math.min(l, 1 - l);
    return "#" + [0, 8, 4].map(function (n) {
      var k = (n + h * 12) % 12, v = Math.round(255 * (l - a * Math.max(-1, Math.min(k - 3, 9 - k, 1))));
      return ("0" + v.toString(16)).slice(-2);
    }).join("");
  }
  function palette(n) {
    if (n <= T.palette.length) { return T.palette.slice(0, n); }
    var out = [], seen = {}, L = [0.80, 0.70, 0.88], G = 0.6180339887498949;
    for (var i = 0; i < n; i++) {
      var c = hslHex((i * G) % 1, 0.62, L[i % 3]), j = i;
      for (var nudge = 1; nudge < 8 && seen[c]; nudge++) { c = hslHex((i * G + nudge * 0.37 / n) % 1, 0.62, L[(i + nudge) % 3]); }
      while (seen[c]) {                  // past ~1,000 light hues: a distinct light RGB (theme.palette's rule)
        c = "#" + [0, 7, 14].map(function (s) { return (128 + Math.floor(j / Math.pow(2, s)) % 128).toString(16); }).join("");
        j += 1;
      }
      seen[c] = 1; out.push(c);
    }
    return out;
  }
  function figureColours(keys) {
    var ks = Array.from(new Set(keys.filter(function (k) { return k !== null && k >= 0; }))).sort(function (a, b) { return a - b; });
    var cs = ks.length && ks[ks.length - 1] >= T.palette.length ? palette(ks.length) : null, map = {};
    ks.forEach(function (k, r) { map[k] = cs ? cs[r] : T.palette[k]; });
    return function (k) { return map[k] || "#ffffff"; };
  }

  // -- SVG ----------------------------------------------------------------------------------------
  function E(tag, attrs, text) {
    var e = document.createElementNS(NS, tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined && text !== null) { e.textContent = text; }
    return e;
  }
  function root(w, h, title, cls) {
    var s = E("svg", {width: w, height: h, viewBox: "0 0 " + w + " " + h, "font-family": T.font,
                      role: "img", "aria-label": title, "class": "gl-report-figure " + cls});
    s.appendChild(E("title", {}, title));
    s.appendChild(E("rect", {x: 0, y: 0, width: w, height: h, fill: "#ffffff"}));
    s.appendChild(E("text", {x: MARGIN, y: MARGIN + 8, "font-size": 13, "font-weight": "bold",
                             "font-family": T.mono, "class": "gl-fig-title"}, title));
    return s;
  }
  function cell(parent, x, y, w, h, fillc, top, bottom, cls) {
    var g = E("g", {"class": cls || "gl-c"});
    g.appendChild(E("rect", {x: x, y: y, width: w, height: h, fill: fillc, stroke: "#888888",
                             "stroke-width": 0.6}));
    if (bottom === undefined) {
      g.appendChild(E("text", {x: x + w / 2, y: y + h / 2 + 4, "font-size": 10,
                               "text-anchor": "middle"}, top));
    } else {
      g.appendChild(E("text", {x: x + w / 2, y: y + 12, "font-size": 10, "font-weight": "bold",
                               "text-anchor": "middle"}, top));
      g.appendChild(E("text", {x: x + w / 2, y: y + h - 4, "font-size": 8,
                               "text-anchor": "middle"}, bottom));
    }
    parent.appendChild(g);
  }
  function label(parent, x, y, s, attrs) {
    var a = {x: x, y: y, "font-size": 11, fill: "#333333", "xml:space": "preserve"};
    Object.keys(attrs || {}).forEach(function (k) { a[k] = attrs[k]; });
    parent.appendChild(E("text", a, s));
  }
  // a pointer's place in the SVG's own units: a figure scaled to a phone's width keeps its hit boxes
  function point(svg, ev) {
    var r = svg.getBoundingClientRect(), vb = svg.viewBox && svg.viewBox.baseVal;
    var sx = vb && vb.width && r.width ? vb.width / r.width : 1, sy = vb && vb.height && r.height ? vb.height / r.height : 1;
    return {x: (ev.clientX - r.left) * sx, y: (ev.clientY - r.top) * sy};
  }
  function place(name, svg) {
    var box = document.querySelector('.gl-draw[data-draw="' + name + '"]');
    if (!box) { return null; }
    box.replaceChildren(svg);
    return box;
  }
  function info(box, s) {
    var el = box && box.parentNode.querySelector(".gl-figinfo");
    if (el) { el.textContent = s; }
  }

  // -- the view ------------------------------------------------------------------------------------
  function tokens() { return D.tokens; }
  // how a layer attends (report/run_tensors.py: its kind and window): "global", "sliding 512"
  function kindOf(l) { return (D.explore.kinds || [])[l] || {kind: "full", window: null}; }
  function kindText(l) {
    var k = kindOf(l), name = S["layer_" + k.kind] || k.kind;
    return k.window ? fill(S.layer_window, {kind: name, window: k.window}) : name;
  }
  function qoff() { return tokens().length - D.explore.Q; }
  function keyLabel(j) { return tokens()[tokens().length - D.explore.L + j]; }
  function view() {
    var x = D.explore, qrow = st.query - qoff(), row = M.row(st.layer, st.head, qrow);
    var picked = select(st.layer, st.head, qrow, st.k, row);
    var dense = softmax(Array.from(row));
    return {qrow: qrow, row: row, picked: picked, dense: dense,
            weights: softmax(picked.map(function (j) { return row[j]; })),
            kvh: Math.floor(st.head / (x.heads / x.kv_heads))};
  }

  // 4. the score grid (render/report_figures.py: scores_svg)
  function grid(qlab, klab, L) {
    var cw = L <= 16 ? 44 : Math.max(12, Math.min(44, Math.floor(720 / L)));
    var ch = cw < 44 ? Math.max(Math.floor(cw * 2 / 3), 12) : 28;
    if (cw < 24) { ch = cw; }
    var font = ch >= 14 ? 11 : 9, angle = cw >= 24 ? -45 : -90;
    var left = Math.max.apply(null, qlab.map(function (s) { return textWidth(s, font); })) + 28;
    var widest = Math.max.apply(null, klab.map(function (s) { return textWidth(s, font); }));
    var topH = (angle === -45 ? Math.floor(widest * 71 / 100) : widest) + 24;
    return {cw: cw, ch: ch, font: font, angle: angle, x0: MARGIN + left,
            y0: MARGIN + 24 + topH, numbers: cw >= 34};
  }
  function drawScores(v) {
    var x = D.explore, rs = M.rowSpan(), ks = M.keySpan(), r0 = rs[0], c0 = ks[0];
    var Q = rs[1] - r0, L = ks[1] - c0, off = qoff(), i, j;
    var qlab = [], klab = [];
    for (i = 0; i < Q; i++) { qlab.push((off + r0 + i) + " " + short(tokens()[off + r0 + i], 12)); }
    for (j = 0; j < L; j++) { klab.push((c0 + j) + " " + short(keyLabel(c0 + j), 12)); }
    var g = grid(qlab, klab, L);
    var title = fill(S.ex_scores_title, {layer: st.layer, head: st.head, k: st.k}) + " · " + kindText(st.layer);
    var kind = kindOf(st.layer), legend = fill(S.scores_legend, {k: st.k}) + (rs[1] - rs[0] < x.Q || L < x.L ? " · " + fill(S.ex_window, {r0: off + r0,
                      r1: off + rs[1] - 1, c0: c0, c1: ks[1] - 1, L: x.L}) : "");
    if (kind.window) { legend += " " + fill(S.scores_window_legend, {window: kind.window, kind: S["layer_" + kind.kind]}); }
    var width = Math.max(g.x0 + L * g.cw + MARGIN, textWidth(title, 13) + 2 * MARGIN,
                         textWidth(legend, 11) + 2 * MARGIN);
    var svg = root(width, g.y0 + Q * g.ch + 44, title, "gl-scores");
    var f = {g: g, r0: r0, c0: c0, Q: Q, L: L, off: off, mid: Math.floor(g.ch / 2) + Math.floor(g.font / 3)};
    var rows = [], outlines = [];
    label(svg, MARGIN, MARGIN + 26, S.scores_axes, {"font-size": 10, fill: "#555555"});
    for (j = 0; j < L; j++) {
      var cx = g.x0 + j * g.cw + Math.floor(g.cw / 2) + (g.angle === -45 ? 0 : Math.floor(g.font / 3));
      label(svg, cx, g.y0 - 6, klab[j], {"font-size": g.font,
            transform: "rotate(" + g.angle + " " + cx + " " + (g.y0 - 6) + ")"});
    }
    for (i = 0; i < Q; i++) { rows.push(scoreRow(svg, v, f, i, qlab[i], outlines)); }
    outlines.forEach(function (p) {
      svg.appendChild(E("rect", {"class": "gl-kept-outline", x: p[0] + 1, y: p[1] + 1, width: g.cw - 2,
                                 height: g.ch - 2, fill: "none", stroke: T.picked, "stroke-width": 2.5,
                                 "pointer-events": "none"}));
    });
    if (kind.window) { windowEdge(svg, f, rows); }
    svg.appendChild(E("rect", {x: g.x0, y: g.y0, width: L * g.cw, height: Q * g.ch, fill: "none",
                               stroke: "#999999", "stroke-width": 1}));
    label(svg, MARGIN, g.y0 + (v.qrow - r0) * g.ch + f.mid, "▶", {"font-size": 12, fill: T.picked, "font-weight": "bold"});
    label(svg, MARGIN, g.y0 + Q * g.ch + 22, legend, {fill: "#555555"});
    bindScores(svg, place("scores", svg), f, rows);
  }
  // a local layer's window edge: a step line left of each row's first allowed key (report_figures.py: _band)
  function windowEdge(svg, f, rows) {
    var g = f.g, d = [];
    rows.forEach(function (r, i) {
      var first = -1;
      for (var j = 0; j < f.L && first < 0; j++) { if (r.row[f.c0 + j] > -Infinity) { first = j; } }
      if (first > 0) { d.push("M" + (g.x0 + first * g.cw) + "," + (g.y0 + i * g.ch) + " V" + (g.y0 + (i + 1) * g.ch)); }
    });
    if (d.length) {
      svg.appendChild(E("path", {"class": "gl-window-edge", d: d.join(" "), fill: "none", stroke: T.band,
                                 "stroke-width": 3, "pointer-events": "none"}));
    }
  }
  // one query row of the score grid: its label and cells (the kept ones' corners go to outlines)
  function scoreRow(svg, v, f, i, qlab, outlines) {
    var g = f.g, ri = f.r0 + i, row = ri === v.qrow ? v.row : M.row(st.layer, st.head, ri);
    var dense = ri === v.qrow ? v.dense : softmax(Array.from(row));
    var kept = {}, j, local = !!kindOf(st.layer).window;
    (ri === v.qrow ? v.picked : select(st.layer, st.head, ri, st.k, row)).forEach(function (k) { kept[k] = 1; });
    label(svg, g.x0 - 6, g.y0 + i * g.ch + f.mid, qlab, {"font-size": g.font, "text-anchor": "end",
          "font-weight": ri === v.qrow ? "bold" : "normal"});
    for (j = 0; j < f.L; j++) {
      var kj = f.c0 + j, ok = row[kj] > -Infinity, xx = g.x0 + j * g.cw, yy = g.y0 + i * g.ch;
      var hidden = !ok && local && tokens().length - D.explore.L + kj <= f.off + ri;   // before the query: the window hid it
      var gg = E("g", {"class": "gl-score" + (kept[kj] ? " gl-kept" : "") + (hidden ? " gl-outside" : ""),
                       "data-q": f.off + ri, "data-k": kj, "data-ok": ok ? 1 : 0});
      gg.appendChild(E("rect", {x: xx, y: yy, width: g.cw, height: g.ch,
                                fill: ok ? weightColour(dense[kj]) : (hidden ? T.outside : T.masked), stroke: "#ffffff", "stroke-width": 1}));
      if (g.numbers && ok) {
        gg.appendChild(E("text", {x: xx + Math.floor(g.cw / 2), y: yy + Math.floor(g.ch / 2) + 4,
                                  "font-size": 10, "text-anchor": "middle",
                                  fill: dense[kj] > 0.45 ? "#ffffff" : "#1a1a1a"}, fmtValue(row[kj])));
      }
      svg.appendChild(gg);
      if (kept[kj]) { outlines.push([xx, yy]); }
    }
    return {row: row, dense: dense, kept: kept};
  }
  // hover a score cell: its query, key, score and weight; click it: that query becomes the chosen one
  function bindScores(svg, box, f, rows) {
    var g = f.g, off = f.off, r0 = f.r0, c0 = f.c0;
    function at(ev) {
      var pt = point(svg, ev);
      var a = Math.floor((pt.y - g.y0) / g.ch), b = Math.floor((pt.x - g.x0) / g.cw);
      return (a >= 0 && a < f.Q && b >= 0 && b < f.L) ? [a, b] : null;
    }
    function tell(ev) {
      var p = at(ev);
      if (!p) { info(box, ""); return; }
      var r = rows[p[0]], kj = c0 + p[1], qi = off + r0 + p[0], ok = r.row[kj] > -Infinity;
      info(box, fill(S.ex_scores_info, {q: qi, qt: tokens()[qi], j: kj, kt: keyLabel(kj),
                     s: ok ? fmtScore(r.row[kj]) : S.ex_not_allowed, w: r.dense[kj].toFixed(3)})
                + (r.kept[kj] ? " " + S.ex_kept : ""));
    }
    svg.addEventListener("mousemove", tell);
    svg.addEventListener("click", function (ev) {          // a click (a tap): that query, and the cell's line
      var p = at(ev), line;
      if (!p) { return; }
      tell(ev); line = box.parentNode.querySelector(".gl-figinfo").textContent;
      st.query = off + r0 + p[0]; syncControls(); update(); info(box, line);
    });
  }

  // 4b. the same selection as scores.gather(-1, topk_idx): index and output, rows near the query
  function windowRows(n, centre, size) {
    var w = Math.min(n, size), start = Math.min(Math.max(centre - Math.floor(w / 2), 0), n - w), out = [];
    for (var i = start; i < start + w; i++) { out.push(i); }
    return out;
  }
  function drawGather(v) {
    var x = D.explore, rs = M.rowSpan(), kShow = Math.min(st.k, 12), off = qoff();
    var rows = windowRows(rs[1] - rs[0], v.qrow - rs[0], 12).map(function (i) { return rs[0] + i; });
    var title = fill(S.ex_gather_title, {layer: st.layer, head: st.head, k: st.k});
    var cw = 40, ch = 28, lab = rows.map(function (i) { return (off + i) + " " + short(tokens()[off + i], 12); });
    var left = MARGIN + Math.max.apply(null, lab.map(function (s) { return textWidth(s, 11); })) + 10;
    var x1 = left, x2 = left + kShow * cw + 60, y0 = MARGIN + 62;
    var width = Math.max(x2 + kShow * cw + MARGIN + 70, textWidth(title, 13) + 2 * MARGIN);
    var svg = root(width, y0 + rows.length * ch + 40, title, "gl-gather");
    label(svg, x1, y0 - 26, "topk_idx · " + S.panel_index, {"font-weight": "bold", "font-size": 12});
    label(svg, x2, y0 - 26, "picked · " + S.panel_output, {"font-weight": "bold", "font-size": 12});
    for (var m = 0; m < kShow; m++) {
      label(svg, x1 + m * cw + cw / 2, y0 - 6, String(m), {"font-size": 10, "text-anchor": "middle"});
      label(svg, x2 + m * cw + cw / 2, y0 - 6, String(m), {"font-size": 10, "text-anchor": "middle"});
    }
    var picks = rows.map(function (i) { var row = M.row(st.layer, st.head, i); return [row, select(st.layer, st.head, i, st.k, row)]; });
    var colour = figureColours([].concat.apply([], picks.map(function (p) { return p[1].slice(0, kShow); })));
    rows.forEach(function (i, r) {
      var row = picks[r][0], picked = picks[r][1], y = y0 + r * ch;
      label(svg, left - 8, y + ch / 2 + 4, lab[r], {"text-anchor": "end", "font-weight": i === v.qrow ? "bold" : "normal"});
      for (var m = 0; m < kShow; m++) {
        var j = m < picked.length ? picked[m] : -1;
        cell(svg, x1 + m * cw, y, cw, ch, j < 0 ? "#ffffff" : colour(j), String(j), undefined, "gl-c gl-idx");
        cell(svg, x2 + m * cw, y, cw, ch, j < 0 ? "#ffffff" : colour(j), String(j),
             j < 0 ? "-∞" : fmtValue(row[j]), "gl-c gl-out");
      }
    });
    var more = st.k > kShow ? "  " + fill(S.ex_more, {n: st.k - kShow}) : "";
    var cap = "(Q, k) = (" + x.Q + ", " + st.k + ")" + more;
    label(svg, x1, y0 + rows.length * ch + 18, cap, {"font-size": 10, fill: "#555555", "font-family": T.mono});
    label(svg, x2, y0 + rows.length * ch + 18, cap, {"font-size": 10, fill: "#555555", "font-family": T.mono});
    place("gather", svg);
  }

  // 5. the value rows one query gathers, their weights, and the weighted sum
  function sourceRows(L, picked) {
    if (L <= 12) { return Array.from({length: L}, function (_, j) { return j; }); }
    var set = {0: 1};
    picked.slice(0, 10).forEach(function (j) { set[j] = 1; });
    return Object.keys(set).map(Number).sort(function (a, b) { return a - b; });
  }
  function drawValues(v) {
    var x = D.explore, cols = x.value_cols, C = cols.length, gap = x.dv > C ? 1 : 0, cw = 44, ch = 24;
    var shown = v.picked.slice(0, 12), src = sourceRows(x.L, v.picked), isPicked = {}, colour = figureColours(src.concat(shown));
    v.picked.forEach(function (j) { isPicked[j] = 1; });
    var qt = tokens()[st.query];
    var title = fill(S.ex_value_title, {layer: st.layer, head: st.head, kvh: v.kvh, q: st.query, tok: qt});
    var labs = src.concat(shown).map(function (j) { return j + " " + short(keyLabel(j), 12); });
    var left = MARGIN + Math.max.apply(null, labs.map(function (s) { return textWidth(s, 11); })) + 10;
    var panelW = (C + gap) * cw, x2 = left + panelW + 40, x3 = x2 + Math.min(v.picked.length, 12) * cw + 40 + left - MARGIN;
    var y0 = MARGIN + 62, rowsY = [], gaps = [], y = y0, prev = -1;
    src.forEach(function (j) { if (prev >= 0 && j > prev + 1) { gaps.push(y); y += 14; } rowsY.push(y); y += ch; prev = j; });
    if (src.length && src[src.length - 1] < x.L - 1) { gaps.push(y); y += 14; }   // rows after the last one shown
    var height = Math.max(y, y0 + (shown.length + 1) * ch + 10) + 40;
    var width = Math.max(x3 + (C + gap + 1) * cw + MARGIN, textWidth(title, 13) + 2 * MARGIN);
    var svg = root(width, height, title, "gl-values");
    function colX(x0, c) { return x0 + (c + (gap && c === C - 1 ? 1 : 0)) * cw; }
    function header(x0) {
      cols.forEach(function (col, c) { label(svg, colX(x0, c) + cw / 2, y0 - 6, String(col), {"font-size": 10, "text-anchor": "middle"}); });
      if (gap) { label(svg, x0 + (C - 1) * cw + cw / 2, y0 - 6, "…", {"text-anchor": "middle"}); }
    }
    label(svg, left, y0 - 26, "V · " + S.panel_source, {"font-weight": "bold", "font-size": 12});
    gaps.forEach(function (gy) {                  // elided rows are marked, never silently skipped
      label(svg, left + (C + gap) * cw / 2, gy + 11, "⋮", {"font-size": 12, "text-anchor": "middle", fill: "#555555", "class": "gl-elided"});
    });
    header(left);
    src.forEach(function (j, r) {
      label(svg, left - 8, rowsY[r] + ch / 2 + 4, j + " " + short(keyLabel(j), 12), {"text-anchor": "end"});
      cols.forEach(function (col, c) {
        cell(svg, colX(left, c), rowsY[r], cw, ch, isPicked[j] ? colour(j) : T.unpicked,
             fmtValue(M.value(st.layer, v.kvh, j, c)), undefined, "gl-c gl-src");
      });
    });
    label(svg, x2, y0 - 26, "topk_idx · " + S.panel_index, {"font-weight": "bold", "font-size": 12});
    shown.forEach(function (j, m) { cell(svg, x2 + m * cw, y0, cw, ch, colour(j), String(j), undefined, "gl-c gl-idx"); });
    label(svg, x3, y0 - 26, "out · " + S.panel_output, {"font-weight": "bold", "font-size": 12});
    header(x3);
    var wx = colX(x3, C - 1) + cw + 6;
    label(svg, wx + cw / 2, y0 - 6, S.ex_weight, {"font-size": 10, "text-anchor": "middle", "font-weight": "bold"});
    var sum = cols.map(function () { return 0; });
    v.picked.forEach(function (j, m) {
      cols.forEach(function (col, c) { sum[c] += v.weights[m] * M.value(st.layer, v.kvh, j, c); });
    });
    shown.forEach(function (j, m) {
      var yy = y0 + m * ch;
      label(svg, x3 - 8, yy + ch / 2 + 4, j + " " + short(keyLabel(j), 12), {"text-anchor": "end"});
      cols.forEach(function (col, c) {
        cell(svg, colX(x3, c), yy, cw, ch, colour(j), String(j), fmtValue(M.value(st.layer, v.kvh, j, c)), "gl-c gl-out");
      });
      cell(svg, wx, yy, cw, ch, weightColour(v.weights[m]), v.weights[m].toFixed(3), undefined, "gl-c gl-weight");
    });
    var ys = y0 + shown.length * ch + 8;
    label(svg, x3 - 8, ys + ch / 2 + 4, S.ex_sum, {"text-anchor": "end", "font-weight": "bold"});
    sum.forEach(function (s, c) { cell(svg, colX(x3, c), ys, cw, ch, "#ffffff", fmtValue(s), undefined, "gl-c gl-sum"); });
    label(svg, left, height - 14, "(L, Dv) = (" + x.L + ", " + x.dv + ")   (k,) = (" + v.picked.length + ",)   (k, Dv) = (" +
          v.picked.length + ", " + x.dv + ")", {"font-size": 10, fill: "#555555", "font-family": T.mono});
    place("values", svg);
  }

  // 3. which query heads read which KV head (render/report_figures.py: heads_svg)
  function drawHeads(v) {
    var x = D.explore, Hq = x.heads, Hkv = x.kv_heads, g = Hq / Hkv, bw = 44, bh = 26, gap = 10;
    var lw = Math.max(textWidth(S.heads_q, 11), textWidth(S.heads_kv, 11)) + 16;
    var x0 = MARGIN + lw, qy = MARGIN + 30, kvy = qy + bh + 70;
    var title = fill(S.ex_heads_title, {q: Hq, kv: Hkv, layer: st.layer, head: st.head, kvh: v.kvh});
    var width = Math.max(x0 + Hq * bw + (Hq - 1) * gap + MARGIN, textWidth(title, 13) + 2 * MARGIN);
    var svg = root(width, kvy + bh + MARGIN, title, "gl-heads");
    var boxes = [], fills = palette(Hkv);
    for (var kv = 0; kv < Hkv; kv++) {
      var first = x0 + kv * g * (bw + gap), last = x0 + ((kv + 1) * g - 1) * (bw + gap);
      var cx = Math.floor((first + last + bw) / 2);
      for (var m = kv * g; m < (kv + 1) * g; m++) {
        var chosen = m === st.head;
        svg.appendChild(E("line", {x1: x0 + m * (bw + gap) + bw / 2, y1: qy + bh, x2: cx, y2: kvy,
                                   stroke: chosen ? T.picked : "#888888", "stroke-width": chosen ? 2.5 : 1.2}));
        boxes.push([x0 + m * (bw + gap), qy, "q" + m, fills[kv], chosen]);
      }
      boxes.push([cx - bw / 2, kvy, "kv" + kv, fills[kv], kv === v.kvh]);
    }
    label(svg, MARGIN, qy + bh / 2 + 4, S.heads_q, {fill: "#555555"});
    label(svg, MARGIN, kvy + bh / 2 + 4, S.heads_kv, {fill: "#555555"});
    boxes.forEach(function (b) {
      var gg = E("g", {"class": b[4] ? "gl-head gl-chosen" : "gl-head"});
      gg.appendChild(E("rect", {x: b[0], y: b[1], width: bw, height: bh, rx: 4, fill: b[3],
                                stroke: b[4] ? T.picked : "#666666", "stroke-width": b[4] ? 2.5 : 1}));
      gg.appendChild(E("text", {x: b[0] + bw / 2, y: b[1] + bh / 2 + 4, "font-size": 11, "text-anchor": "middle",
                                "font-family": T.mono, "font-weight": b[4] ? "bold" : "normal"}, b[2]));
      svg.appendChild(gg);
    });
    place("heads", svg);
  }

  // the table of the kept keys, the sentences' values, the note on k
  function fillTable(v) {
    var body = document.querySelector("#table-values tbody");
    if (!body) { return; }
    body.replaceChildren();
    v.picked.forEach(function (j, m) {
      var tr = document.createElement("tr");
      [String(j), keyLabel(j), fmtScore(v.row[j]), v.weights[m].toFixed(3), v.dense[j].toFixed(3)].forEach(function (s, c) {
        var td = document.createElement("td");
        td.textContent = s;
        if (c !== 1) { td.className = "num"; }
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
  }
  function fillSlots(v) {
    var allowed = 0, mass = 0;
    v.row.forEach(function (s) { if (s > -Infinity) { allowed++; } });
    v.picked.forEach(function (j) { mass += v.dense[j]; });
    var values = {layer: st.layer, head: st.head, kvh: v.kvh, k: st.k, scale: D.explore.scales[st.layer],
                  query: st.query, query_token: tokens()[st.query], n: v.picked.length, mass: mass, allowed: allowed,
                  keys: v.picked.map(function (j) { return j + " " + keyLabel(j); }).join(", "),
                  formula: v.picked.map(function (j, m) { return fmtG(v.weights[m], 3) + "·V[" + j + "]"; }).join(" + "),
                  sink: v.dense[0], sink_token: keyLabel(0)};
    document.querySelectorAll(".gl-slot").forEach(function (el) {
      var name = el.getAttribute("data-slot");
      if (Object.prototype.hasOwnProperty.call(values, name)) { el.textContent = pyfmt(values[name], el.getAttribute("data-fmt")); }
    });
    document.querySelectorAll(".gl-sink").forEach(function (el) { el.hidden = !(v.dense[0] > 0.5 && st.query > 0); });
    var note = document.getElementById("gl-knote"), x = D.explore;
    if (note) {
      var key = x.dense_run ? "ex_k_dense" : (st.k === x.run_k ? "ex_k_run" : "ex_k_moved");
      note.textContent = fill(S[key], {k: st.k, run: x.run_k}) +
        (v.picked.length >= allowed ? " " + fill(S.ex_k_all, {k: st.k, n: allowed}) : "");   // no choice to see
      note.className = "gl-knote" + (key === "ex_k_run" ? "" : " moved");
    }
  }

  // -- 5b. a sparse prefill's block map (report/prefill.py packs it; render/prefill_map.py draws the file) ------
  function bit(a, i) { return (a[i >> 3] >> (i & 7)) & 1; }
  // the packed maps: per layer, the allowed cells' index (one per distinct allowed map) and its first bit
  function Prefill(x) {
    var masks = x.allowed.map(function (m) {
      var a = bytes(m), idx = new Int32Array(x.nq * x.nk), c = 0;
      for (var i = 0; i < idx.length; i++) { idx[i] = bit(a, i) ? c++ : -1; }
      return {idx: idx, cells: c};
    });
    var off = 0, at = {};
    x.layers.forEach(function (l, n) {
      var m = masks[x.allowed_of[n]];
      at[l] = {off: off, cells: m.cells, idx: m.idx};
      off += m.cells * x.heads;
    });
    this.x = x; this.bits = bytes(x.kept); this.at = at;
  }
  Prefill.prototype.group = function (h) { return Math.floor(h / (this.x.q_heads / this.x.heads)); };
  // block (i, j) of layer l's map for selection head g: 2 gathered, 1 allowed and skipped, 0 not allowed
  Prefill.prototype.state = function (l, g, i, j) {
    var m = this.at[l], c = m.idx[i * this.x.nk + j];
    return c < 0 ? 0 : 1 + bit(this.bits, m.off + g * m.cells + c);
  };
  Prefill.prototype.count = function (l, g) {
    var m = this.at[l], n = 0;
    for (var c = 0; c < m.cells; c++) { n += bit(this.bits, m.off + g * m.cells + c); }
    return [n, m.cells];
  };
  function drawPrefill() {
    var box = document.querySelector('.gl-draw[data-draw="prefill"]');
    if (!box || !P) { return; }
    var x = P.x, g = P.group(st.head);
    if (!P.at[st.layer]) {
      box.replaceChildren(); info(box, fill(S.ex_prefill_dense, {layer: st.layer})); prefillSlots(null, g);
      return;
    }
    var n = P.count(st.layer, g), cw = Math.max(2, Math.min(28, Math.floor(560 / Math.max(x.nq, x.nk))));
    var f = {cw: cw, x0: MARGIN + textWidth(String(x.nq - 1), 10) + 10, y0: MARGIN + 46, every: tickStep(x.nk, cw), g: g};
    var title = fill(S.ex_prefill_title, {layer: st.layer, head: st.head, group: g, block: x.block,
                                          share: pyfmt(n[1] ? n[0] / n[1] : 0, ".0%")});
    var width = Math.max(f.x0 + x.nk * cw + MARGIN, textWidth(title, 13) + 2 * MARGIN,
                         textWidth(S.prefill_map_axes, 10) + 2 * MARGIN);
    var svg = root(width, f.y0 + x.nq * cw + 34, title, "gl-prefill");
    prefillCells(svg, f);
    prefillAxes(svg, f);
    box = place("prefill", svg);
    bindPrefill(svg, box, f);
    info(box, "");
    prefillSlots(n, g);
  }
  // the map as runs of equal blocks per query row (a long prompt has hundreds a side), white underneath
  function prefillCells(svg, f) {
    var x = P.x, cw = f.cw, cls = ["", "gl-pf-skipped", "gl-pf-kept"], colours = ["", T.block.skipped, T.block.kept];
    svg.appendChild(E("rect", {x: f.x0, y: f.y0, width: x.nk * cw, height: x.nq * cw, fill: T.block.outside}));
    for (var i = 0; i < x.nq; i++) {
      for (var a = 0, j = 1; j <= x.nk; j++) {
        var s = P.state(st.layer, f.g, i, a);
        if (j < x.nk && P.state(st.layer, f.g, i, j) === s) { continue; }
        if (s > 0) {
          svg.appendChild(E("rect", {"class": cls[s], x: f.x0 + a * cw, y: f.y0 + i * cw, width: (j - a) * cw,
                                     height: cw, fill: colours[s], "data-n": j - a}));
        }
        a = j;
      }
    }
    for (var k = 1; cw >= 8 && k < Math.max(x.nq, x.nk); k++) {   // cell borders when cells are big enough
      if (k < x.nk) { svg.appendChild(E("line", {x1: f.x0 + k * cw, y1: f.y0, x2: f.x0 + k * cw, y2: f.y0 + x.nq * cw, stroke: "#ffffff"})); }
      if (k < x.nq) { svg.appendChild(E("line", {x1: f.x0, y1: f.y0 + k * cw, x2: f.x0 + x.nk * cw, y2: f.y0 + k * cw, stroke: "#ffffff"})); }
    }
    svg.appendChild(E("rect", {x: f.x0, y: f.y0, width: x.nk * cw, height: x.nq * cw, fill: "none",
                               stroke: "#999999", "stroke-width": 0.5}));
  }
  // a round step of block numbers whose labels (9 px) do not touch: 1, 2, 5, 10, 20, 50, ...
  function tickStep(n, cw) {
    var need = (textWidth(String(n - 1), 9) + 6) / cw, step = 1;
    for (var i = 0; step < need; i++) { step = [1, 2, 5][i % 3] * Math.pow(10, Math.floor(i / 3)); }
    return step;
  }
  // block numbers along both sides (every f.every-th), and what the axes are
  function prefillAxes(svg, f) {
    var x = P.x, cw = f.cw;
    for (var j = 0; j < x.nk; j += f.every) {
      label(svg, f.x0 + j * cw + cw / 2, f.y0 - 4, String(j), {"font-size": 9, "text-anchor": "middle"});
    }
    for (var i = 0; i < x.nq; i += f.every) {
      label(svg, f.x0 - 4, f.y0 + i * cw + cw / 2 + 3, String(i), {"font-size": 9, "text-anchor": "end"});
    }
    label(svg, MARGIN, MARGIN + 26, S.prefill_map_axes, {"font-size": 10, fill: "#555555"});
    label(svg, MARGIN, f.y0 + x.nq * cw + 20, "(nq, nk) = (" + x.nq + ", " + x.nk + ") · " + x.rule,
          {"font-size": 10, fill: "#555555", "font-family": T.mono});
  }
  // hover a block: its query and key tokens, and whether it was gathered
  function bindPrefill(svg, box, f) {
    var x = P.x, states = [S.ex_prefill_outside, S.ex_prefill_skipped, S.ex_prefill_kept];
    function tell(ev) {
      var pt = point(svg, ev);
      var i = Math.floor((pt.y - f.y0) / f.cw), j = Math.floor((pt.x - f.x0) / f.cw);
      if (i < 0 || i >= x.nq || j < 0 || j >= x.nk) { info(box, ""); return; }
      info(box, fill(S.ex_prefill_info, {i: i, qa: x.q_spans[i][0], qb: x.q_spans[i][1], j: j, ka: x.k_spans[j][0],
                                         kb: x.k_spans[j][1], state: states[P.state(st.layer, f.g, i, j)]}));
    }
    svg.addEventListener("mousemove", tell);
    svg.addEventListener("click", tell);           // a tap on a phone
  }
  function prefillSlots(n, g) {
    var values = {pf_group: g, pf_kept: n ? n[0] : 0, pf_allowed: n ? n[1] : 0, pf_share: n && n[1] ? n[0] / n[1] : 0};
    document.querySelectorAll('.gl-slot[data-slot^="pf_"]').forEach(function (el) {
      el.textContent = pyfmt(values[el.getAttribute("data-slot")], el.getAttribute("data-fmt"));
    });
  }

  // -- the head gallery (render/gallery.py): a click opens that layer and head below ---------------
  function thumb(l, h) { return document.querySelector('.gl-thumb[data-layer="' + l + '"][data-head="' + h + '"]'); }
  function bindGallery() {
    document.querySelectorAll(".gl-thumb").forEach(function (g) {
      var l = parseInt(g.getAttribute("data-layer"), 10), h = parseInt(g.getAttribute("data-head"), 10);
      function open() {
        st.layer = l; st.head = h; syncControls(); update(); galleryInfo(g, l, h);
        var f = controls();
        if (f && f.scrollIntoView) { f.scrollIntoView({block: "start"}); }
      }
      g.addEventListener("mouseenter", function () { galleryInfo(g, l, h); });
      g.addEventListener("focus", function () { galleryInfo(g, l, h); });
      g.addEventListener("click", open);
      g.addEventListener("keydown", function (ev) {
        if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); open(); }
      });
    });
  }
  function galleryInfo(g, l, h) {
    var el = document.querySelector("#fig-02-heads-gallery .gl-figinfo"), t = g.querySelectorAll("text");
    if (!el || t.length < 2) { return; }
    el.textContent = fill(S.gal_info, {layer: l, head: h, tag: S["gal_tag_" + g.getAttribute("data-tag")] || "",
                                       k: D.explore.run_k, kept: t[1].textContent});
  }
  function markGallery() {
    var sel = document.querySelector(".gl-gallery-sel"), g = thumb(st.layer, st.head);
    document.querySelectorAll(".gl-thumb.gl-chosen").forEach(function (x) { x.classList.remove("gl-chosen"); });
    if (!g) { return; }
    g.classList.add("gl-chosen");
    if (sel) { sel.setAttribute("transform", g.getAttribute("transform")); }
  }

  // -- controls ----------------------------------------------------------------------------------
  function controls() { return document.getElementById("gl-controls"); }
  function readControls() {
    var f = controls(), x = D.explore;
    if (!f) { return; }
    st.layer = clamp(parseInt(f.elements.layer.value, 10), 0, x.layers - 1, st.layer);
    st.head = clamp(parseInt(f.elements.head.value, 10), 0, x.heads - 1, st.head);
    st.query = clamp(parseInt(f.elements.query.value, 10), qoff(), tokens().length - 1, st.query);
    st.k = clamp(parseInt(f.elements.k.value, 10), 1, x.L, st.k);
  }
  function clamp(v, lo, hi, fallback) { return isNaN(v) ? fallback : Math.min(Math.max(v, lo), hi); }
  function syncControls() {
    var f = controls();
    if (!f) { return; }
    ["layer", "head", "query"].forEach(function (n) { f.elements[n].value = String(st[n]); });
    if (document.activeElement !== f.elements.k) { f.elements.k.value = String(st.k); }
  }
  function update() {
    drawPrefill();                                                          // from the page's own data: no wait
    if (!M.has(st.layer, st.head, st.query - qoff(), st.k)) { ask(0); return; }   // a long text: fetch first
    var v = view();
    drawHeads(v); drawScores(v); drawGather(v); drawValues(v); fillTable(v); fillSlots(v);
    drawSteps(); markGallery();
    if (D.live && !M.remote) { ask(120); }                                  // the dense / top-k / sparse figure
  }
  function bind() {
    var f = controls();
    bindGallery(); bindSampling();
    if (!f) { return; }
    f.addEventListener("submit", function (ev) { ev.preventDefault(); });
    f.addEventListener("input", onControl);
    f.addEventListener("change", onControl);
  }
  function onControl(ev) {
    var kBefore = st.k;
    readControls(); update();
    if (D.live && ev.target.name === "k" && st.k !== kBefore && !D.explore.dense_run) { schedule(350, {}); }
  }
  function load(doc) {
    D = JSON.parse(doc.getElementById("gl-data").textContent);
    M = D.explore.remote ? new Remote(D.explore) : new Model(D.explore); T = D.theme; S = D.strings;
    P = D.prefill ? new Prefill(D.prefill) : null;
    st = {layer: D.sel.layer, head: D.sel.head, query: D.sel.query, k: D.sel.k};
  }

  // -- live: the served page -----------------------------------------------------------------------
  function live() { return document.getElementById("gl-live"); }
  function status(id, s, bad) {
    var el = document.getElementById(id);
    if (el) { el.textContent = s; el.className = "gl-status" + (bad ? " error" : ""); }
  }
  function params(extra) {
    var f = live().elements, p = new URLSearchParams();
    p.set("text", f.text.value); p.set("model", f.model.value); p.set("topk", f.topk.checked ? "1" : "0");
    p.set("prefill", f.prefill.checked ? "1" : "0");
    p.set("k", String(st.k));
    if (!extra.reset) { p.set("layer", String(st.layer)); p.set("head", String(st.head)); }  // another model: its defaults
    p.set("query", String(extra.query !== undefined ? extra.query : st.query)); p.set("lang", D.lang);
    return p;
  }
  function schedule(ms, extra) {
    if (pending) { clearTimeout(pending); }
    pending = setTimeout(function () { pending = null; refresh(extra); }, ms);
  }
  function refresh(extra) {
    var mine = ++seq, p = params(extra);
    p.set("html", "1");
    status("gl-status", S.ex_busy);
    getJSON("/api/explain", p, function () { return mine === seq; }, function (body) {
      swap(body.html);
      status("gl-status", "");
    });
  }
  // GET path?p as JSON: done(body) while current() (no newer request), else nothing; errors in gl-status
  function getJSON(path, p, current, done) {
    fetch(path + "?" + p.toString(), {headers: {Accept: "application/json"}})
      .then(function (r) { return r.json().then(function (body) { return {ok: r.ok, body: body}; }); })
      .then(function (res) {
        if (!current()) { return; }
        if (!res.ok) { status("gl-status", fill(S.ex_error, {message: res.body.error || "?"}), true); return; }
        done(res.body);
      })
      .catch(function (err) { if (current()) { status("gl-status", fill(S.ex_error, {message: String(err)}), true); } });
  }
  function swap(html) {
    var doc = new DOMParser().parseFromString(html, "text/html");
    var active = document.activeElement && document.activeElement.name, fresh = doc.getElementById("gl-report");
    var node = document.importNode(fresh, true);
    document.getElementById("gl-report").replaceWith(node);
    node.querySelectorAll("script:not([type])").forEach(function (old) {  // the hover scripts
      var s = document.createElement("script");
      s.textContent = old.textContent;
      old.replaceWith(s);
    });
    load(document); bind(); bindMap(); update();
    var again = active && controls() && controls().elements[active];
    if (again && again.focus) { again.focus(); }
  }
  // -- live: a long text's window and the dense / top-k / sparse figure (GET /api/attention) ----------
  var asking = null, aseq = 0;
  function ask(ms) {
    if (!D.live) { return; }
    if (asking) { clearTimeout(asking); }
    asking = setTimeout(function () { asking = null; fetchWindow(); }, ms);
  }
  function fetchWindow() {
    var mine = ++aseq, p = params({}), t0 = performance.now();
    p.set("text", D.text); p.set("model", D.live.model); p.set("topk", D.live.topk ? "1" : "0");   // the run shown
    p.set("run_k", String(D.explore.dense_run ? st.k : D.explore.run_k));
    if (M.remote) { status("gl-status", S.ex_busy); }
    getJSON("/api/attention", p, function () { return mine === aseq; }, function (body) {
      placeCompare(body.svg);
      if (M.remote) {
        var w = body.window;
        M.set(w); st.layer = w.layer; st.head = w.head; st.query = w.query + qoff(); st.k = w.k;
        syncControls(); update(); status("gl-status", "");
      }
      document.body.setAttribute("data-answer-ms", String(Math.round(performance.now() - t0)));
    });
  }
  function placeCompare(svgText) {
    var fig = document.getElementById("fig-06-compare"), old = fig && fig.querySelector("svg");
    if (!old || !svgText) { return; }
    var doc = new DOMParser().parseFromString(svgText, "image/svg+xml");
    old.replaceWith(document.importNode(doc.documentElement, true));
    document.querySelectorAll(".gl-kc-offline").forEach(function (el) { el.hidden = true; });
  }
  function bindLive() {
    var f = live();
    if (!f) { return; }
    f.addEventListener("submit", function (ev) { ev.preventDefault(); });
    f.elements.text.addEventListener("input", function () { schedule(350, {query: -1}); });
    f.elements.model.addEventListener("change", function () { clearGeneration(); schedule(0, {query: -1, reset: true}); });
    f.elements.topk.addEventListener("change", function () { schedule(0, {}); });
    f.elements.prefill.addEventListener("change", function () { schedule(0, {}); });
    f.elements.lang.addEventListener("change", function () {   // the whole page in the other language
      var p = params({});
      p.set("lang", f.elements.lang.value);
      window.location.assign("/?" + p.toString());
    });
    var g = document.getElementById("gl-gen");
    g.addEventListener("submit", function (ev) { ev.preventDefault(); generate(); });
    g.elements.stop.addEventListener("click", function () { stop(S.ex_stopped); });
  }

  // -- live: generation, the pages x steps picture ----------------------------------------------------
  function stop(message) {
    if (source) { source.close(); source = null; }
    var g = document.getElementById("gl-gen");
    g.elements.generate.disabled = false; g.elements.stop.disabled = true;
    if (message !== undefined) { status("gl-gen-status", message); }
  }
  // another model: the last generation was another model's, so it goes (its steps, text, clicked step)
  function clearGeneration() {
    stop();
    steps = []; genInfo = null; denseSteps = null; picked = null;
    var box = document.querySelector('.gl-draw[data-draw="steps"]'), t = document.getElementById("gl-gen-text");
    if (box) { box.replaceChildren(); }
    if (t) { t.textContent = ""; }
    status("gl-gen-status", S.ex_no_steps);
    showStep();
    if (chatSource) { chatSource.close(); chatSource = null; }
    chatLog = []; chatPick = null; drawChat(); showChatStep();
  }
  function generate() {
    stop();
    var g = document.getElementById("gl-gen"), p = params({});
    p.set("max_new", g.elements.max_new.value);
    steps = []; genInfo = null; denseSteps = null; picked = null; showStep();
    g.elements.generate.disabled = true; g.elements.stop.disabled = false;
    status("gl-gen-status", S.ex_busy);
    document.getElementById("gl-gen-text").textContent = "";
    source = new EventSource("/api/generate?" + p.toString());
    source.addEventListener("start", function (ev) {
      genInfo = JSON.parse(ev.data);
      document.getElementById("gl-gen-text").textContent = genInfo.prompt + genInfo.token;
      drawSteps();
    });
    source.addEventListener("step", function (ev) {
      var s = JSON.parse(ev.data);
      steps.push(s);
      document.getElementById("gl-gen-text").textContent += s.token;
      status("gl-gen-status", fill(S.ex_step_status, {step: s.step, tok: JSON.stringify(s.token)}));
      drawSteps();
    });
    source.addEventListener("done", function (ev) {
      var d = JSON.parse(ev.data);
      denseSteps = d.dense || null; stop(d.message); showStep();
    });
    source.addEventListener("failure", function (ev) { stop(); status("gl-gen-status", fill(S.ex_error, {message: JSON.parse(ev.data).error}), true); });
    source.onerror = function () { if (source) { stop(S.ex_stopped); } };
  }
  function drawSteps() {
    var box = document.querySelector('.gl-draw[data-draw="steps"]');
    if (!box || !genInfo) { return; }
    var layer = Math.min(st.layer, genInfo.layers - 1), P = genInfo.page_size;
    var pages = Math.max.apply(null, [genInfo.pages].concat(steps.map(function (s) { return s.pages_total; })));
    var labs = [S.ex_steps_prefill + " → " + short(genInfo.shown, 10)].concat(steps.map(function (s) { return s.step + " " + short(s.shown, 14); }));
    var left = MARGIN + Math.max.apply(null, labs.map(function (s) { return textWidth(s, 11); })) + 10;
    var cw = Math.max(10, Math.min(28, Math.floor(760 / Math.max(pages, 1)))), ch = 18, y0 = MARGIN + 44;
    var title = fill(S.ex_steps_title, {layer: layer, P: P, budget: genInfo.budget});
    var svg = root(Math.max(left + pages * cw + MARGIN, textWidth(title, 13) + 2 * MARGIN), y0 + labs.length * ch + 40, title, "gl-steps");
    label(svg, MARGIN, MARGIN + 26, S.ex_pages_axis, {"font-size": 10, fill: "#555555"});
    for (var p = 0; p < pages; p++) {
      if (pages <= 40 || p % 5 === 0) { label(svg, left + p * cw + cw / 2, y0 - 4, String(p), {"font-size": 9, "text-anchor": "middle"}); }
    }
    var ring = stepRing(layer);
    labs.forEach(function (s, r) {
      label(svg, left - 6, y0 + r * ch + ch / 2 + 4, s, {"text-anchor": "end", "font-family": T.mono, "font-size": 10});
      var have = r === 0 ? genInfo.pages : steps[r - 1].pages_total, share = {}, inRing = {};
      if (r > 0 && ring) {                         // a local layer: its ring, read whole, no page chosen
        ringPages(steps[r - 1].length, ring, P).forEach(function (q) { inRing[q] = 1; });
      } else if (r > 0) {
        var heads = steps[r - 1].layers[layer] || [];
        heads.forEach(function (ids) { ids.forEach(function (id) { share[id] = (share[id] || 0) + 1 / heads.length; }); });
      }
      for (var q = 0; q < pages; q++) {
        var w = r === 0 ? (q < have ? 1 : 0) : (share[q] || 0), rq = !!inRing[q];
        svg.appendChild(E("rect", {x: left + q * cw, y: y0 + r * ch, width: cw, height: ch,
                                   "class": rq ? "gl-page gl-read gl-ring" : (w > 0 ? "gl-page gl-read" : "gl-page"),
                                   fill: q < have ? (rq ? T.ring : (w > 0 ? weightColour(w) : T.unpicked)) : "#ffffff",
                                   stroke: "#ffffff", "stroke-width": 1}));
      }
    });
    if (picked !== null && picked <= steps.length) {
      svg.appendChild(E("rect", {"class": "gl-step-picked", x: MARGIN - 4, y: y0 + picked * ch, width: left + pages * cw - MARGIN + 4,
                                 height: ch, fill: "none", stroke: T.picked, "stroke-width": 2, "pointer-events": "none"}));
    }
    svg.addEventListener("click", function (ev) {
      var r = Math.floor((point(svg, ev).y - y0) / ch);
      if (r >= 0 && r < labs.length) { picked = r; drawSteps(); }
    });
    box.replaceChildren(svg);
    box.scrollLeft = box.scrollWidth;              // the newest pages in view
    var note = document.getElementById("gl-ring-note");
    if (note) { note.textContent = ring ? fill(S.ex_steps_ring, {layer: layer, kind: kindText(layer), window: ring}) : ""; }
    showStep();
  }
  // the window of layer l when it is local (its ring), else 0
  function stepRing(l) { var k = (genInfo.kinds || [])[l]; return k && k.kind !== "full" && k.window ? k.window : 0; }
  // the pages a ring of `window` tokens covers in a cache of n tokens (pages of P)
  function ringPages(n, window, P) {
    var out = [];
    for (var p = Math.floor(Math.max(0, n - window) / P); p * P < n; p++) { out.push(p); }
    return out;
  }

  // -- live: a clicked generation step: the tokens its pages hold, their dense weight, the dense choice --
  function ranges(ids, P, n) {
    var out = [], a = -1, b = -1;
    ids.forEach(function (p) {
      var lo = p * P, hi = Math.min((p + 1) * P, n);
      if (lo === b) { b = hi; } else { if (a >= 0) { out.push([a, b]); } a = lo; b = hi; }
    });
    if (a >= 0) { out.push([a, b]); }
    return out;
  }
  function stepTokens(n, covered) {
    var box = document.getElementById("gl-step-tokens"), all = genInfo.tokens.concat([genInfo.shown],
              steps.map(function (s) { return s.shown; }));
    if (!box) { return; }
    box.replaceChildren();
    for (var j = 0; j < n; j++) {
      var span = document.createElement("span");
      span.textContent = all[j] + " ";
      span.className = "gl-tok" + (covered(j) ? " gl-covered" : "");
      box.appendChild(span);
    }
  }
  function showStep() {
    var el = document.getElementById("gl-step-detail");
    if (!el) { return; }
    if (picked === null || !genInfo) { el.textContent = ""; var b = document.getElementById("gl-step-tokens"); if (b) { b.replaceChildren(); } return; }
    var lines = [], n = picked === 0 ? genInfo.prompt_tokens : steps[picked - 1].length;
    if (picked === 0) {
      lines.push(S.st_prefill);
      stepTokens(n, function () { return true; });
    } else {
      var s = steps[picked - 1], layer = Math.min(st.layer, genInfo.layers - 1), heads = s.layers[layer] || [];
      var g = heads.length ? D.explore.heads / heads.length : 1, ids = heads.length ? heads[Math.floor(st.head / g)] : [];
      var ring = stepRing(layer), rs = heads.length ? ranges(ids, genInfo.page_size, n) : [[ring ? Math.max(0, n - ring) : 0, n]];
      var mass = s.mass ? s.mass[layer][st.head] : 1, spans = rs.map(function (r) { return r[1] - r[0] > 1 ? r[0] + "–" + (r[1] - 1) : String(r[0]); }).join(", ");
      lines.push(ring ? fill(S.st_ring, {step: s.step, tok: JSON.stringify(s.token), layer: layer, kind: kindText(layer), ranges: spans}) :
        fill(S.st_detail, {step: s.step, tok: JSON.stringify(s.token), layer: layer, head: st.head,
                           kvh: Math.floor(st.head / g), n: heads.length ? ids.length : s.pages_total,
                           ranges: spans, mass: pyfmt(mass, ".1%")}));
      stepTokens(n, function (j) { return rs.some(function (r) { return j >= r[0] && j < r[1]; }); });
    }
    var d = denseSteps && denseSteps[picked];
    if (!d) { lines.push(S.st_dense_wait); } else {
      lines.push(fill(S.st_dense, {dtok: JSON.stringify(d.token), p: pyfmt(d.p, ".1%"),
                                   verdict: d.same ? S.st_same : fill(S.st_diff, {tok: JSON.stringify(picked === 0 ? genInfo.token : steps[picked - 1].token)})}));
    }
    el.replaceChildren();
    lines.forEach(function (t) { var p = document.createElement("p"); p.textContent = t; el.appendChild(p); });
  }

  // -- live: the sampling sliders (GET /api/sample redraws render/sampling.py's figure) -------------------
  var sampling = null, sseq = 0;
  function samplingParams(p) {
    var f = document.getElementById("gl-sampling");
    if (!f) { return p; }
    ["temperature", "top_k", "top_p", "min_p", "seed"].forEach(function (n) { p.set(n, f.elements[n].value); });
    return p;
  }
  function bindSampling() {
    var f = document.getElementById("gl-sampling");
    if (!f || !D.live) { return; }
    f.addEventListener("submit", function (ev) { ev.preventDefault(); });
    f.addEventListener("input", function () {
      ["temperature", "top_k", "top_p", "min_p"].forEach(function (n) { f.elements[n + "_out"].value = f.elements[n].value; });
      if (sampling) { clearTimeout(sampling); }
      sampling = setTimeout(function () { sampling = null; fetchSample(); }, 150);
    });
  }
  function fetchSample() {
    var mine = ++sseq, p = samplingParams(params({}));
    p.set("text", D.text); p.set("model", D.live.model); p.set("topk", D.live.topk ? "1" : "0");
    p.set("k", String(D.explore.run_k));                                    // the kept run: its k
    getJSON("/api/sample", p, function () { return mine === sseq; }, function (body) {
      var fig = document.getElementById("fig-08-sampling"), old = fig && fig.querySelector("svg");
      if (!old) { return; }
      var doc = new DOMParser().parseFromString(body.svg, "image/svg+xml");
      old.replaceWith(document.importNode(doc.documentElement, true));
      fig.setAttribute("data-token", String(body.token));
    });
  }

  // -- live: the chat (GET /api/chat: each token with its candidates and the pages it read) ---------------
  var chatLog = [], chatSource = null, chatPick = null;
  function chatStatus(s, bad) { status("gl-chat-status", s, bad); }
  function bindChat() {
    var f = document.getElementById("gl-chat");
    if (!f) { return; }
    f.addEventListener("submit", function (ev) { ev.preventDefault(); sendChat(); });
    f.elements.reset.addEventListener("click", function () {
      if (chatSource) { chatSource.close(); chatSource = null; }
      chatLog = []; chatPick = null; drawChat(); showChatStep(); chatStatus("");
    });
  }
  function sendChat() {
    var f = document.getElementById("gl-chat"), text = f.elements.message.value.trim();
    if (!text || chatSource) { return; }
    chatLog.push({role: "user", content: text, steps: []});
    var reply = {role: "assistant", content: "", steps: []}, p = samplingParams(new URLSearchParams());
    p.set("messages", JSON.stringify(chatLog.map(function (m) { return {role: m.role, content: m.content}; })));
    chatLog.push(reply);
    f.elements.message.value = ""; drawChat(); chatStatus(S.ex_busy);
    p.set("model", live().elements.model.value); p.set("lang", D.lang);
    p.set("max_new", document.getElementById("gl-gen").elements.max_new.value);
    chatSource = new EventSource("/api/chat?" + p.toString());
    function token(ev) { var s = JSON.parse(ev.data); reply.content += s.token; reply.steps.push(s); drawChat(); }
    chatSource.addEventListener("start", token);
    chatSource.addEventListener("step", token);
    chatSource.addEventListener("done", function () { chatSource.close(); chatSource = null; chatStatus(""); });
    chatSource.addEventListener("failure", function (ev) {
      chatSource.close(); chatSource = null; chatStatus(fill(S.ex_error, {message: JSON.parse(ev.data).error}), true);
    });
    chatSource.onerror = function () { if (chatSource) { chatSource.close(); chatSource = null; chatStatus(S.ex_stopped); } };
  }
  function drawChat() {
    var box = document.getElementById("gl-chat-log");
    if (!box) { return; }
    box.replaceChildren();
    chatLog.forEach(function (m, n) {
      var div = document.createElement("div");
      div.className = "gl-chat-msg " + m.role;
      if (m.role === "user") { div.textContent = m.content; }
      m.steps.forEach(function (s, i) {
        var span = document.createElement("span");
        span.className = "gl-chat-tok" + (chatPick && chatPick[0] === n && chatPick[1] === i ? " gl-on" : "");
        span.textContent = s.token; span.setAttribute("data-i", String(i)); span.tabIndex = 0;
        span.addEventListener("click", function () { chatPick = [n, i]; drawChat(); showChatStep(); });
        div.appendChild(span);
      });
      box.appendChild(div);
    });
  }
  // the clicked token: its candidates (the sampler's record) and the pages the chosen layer read
  function showChatStep() {
    var el = document.getElementById("gl-chat-detail");
    if (!el) { return; }
    el.replaceChildren();
    if (!chatPick) { return; }
    var s = chatLog[chatPick[0]].steps[chatPick[1]], p = document.createElement("p");
    p.textContent = fill(S.chat_tok, {i: chatPick[1], tok: JSON.stringify(s.token), kept: s.kept,
                                      u: s.uniform === null ? S.chat_greedy : fill(S.chat_u, {u: s.uniform.toFixed(4)})});
    el.appendChild(p); el.appendChild(candidateTable(s.candidates));
    var q = document.createElement("p");
    q.className = "gl-chat-pages"; q.textContent = chatPages(s); el.appendChild(q);
  }
  function candidateTable(cands) {
    var t = document.createElement("table"), head = document.createElement("tr");
    t.className = "data gl-chat-cands";
    [S.col_id, S.col_token, S.col_logit, S.col_prob, ""].forEach(function (h) { var th = document.createElement("th"); th.textContent = h; head.appendChild(th); });
    t.appendChild(head);
    cands.forEach(function (c) {
      var tr = document.createElement("tr");
      [String(c.id), c.text, c.logit.toFixed(2), c.kept ? c.p.toFixed(3) : "–",
       c.chosen ? S.chat_chosen : (c.kept ? S.chat_kept : S.chat_cut)].forEach(function (v) {
        var td = document.createElement("td"); td.textContent = v; tr.appendChild(td);
      });
      if (c.chosen) { tr.className = "gl-chosen"; }
      t.appendChild(tr);
    });
    return t;
  }
  function chatPages(s) {
    var steps0 = chatLog[chatPick[0]].steps[0], kinds = (steps0 && steps0.kinds) || [];
    var layer = Math.min(st.layer, Math.max(kinds.length, (s.layers || []).length, 1) - 1), k = kinds[layer];
    if (s.step === 0) { return S.chat_prefill; }
    if (k && k.kind !== "full") { return fill(S.chat_ring, {layer: layer, kind: fill(S.layer_window, {kind: S["layer_" + k.kind], window: k.window})}); }
    var heads = (s.layers || [])[layer] || [];
    if (!heads.length) { return fill(S.chat_dense, {layer: layer}); }
    var g = Math.max(1, Math.floor(D.explore.heads / heads.length)), kvh = Math.min(Math.floor(st.head / g), heads.length - 1);
    return fill(S.chat_pages, {layer: layer, kvh: kvh, pages: heads[kvh].join(", "), total: s.pages_total,
                               P: steps0.page_size});
  }

  // -- the model map (render/model_map.py): the tag of the section in view is marked ----------------------
  function markMap(id) {
    document.querySelectorAll(".gl-map-gather").forEach(function (g) {
      var t = document.getElementById(g.getAttribute("data-target") || ""), sec = t && t.closest("section");
      g.classList.toggle("gl-here", !!t && (t.id === id || (!!sec && sec.id === id)));
    });
  }
  // the section in view: the one a clicked tag went to while it is on screen; else the last one whose top
  // passed a third of the screen (the last one at the page's end)
  function hereNow() {
    var all = Array.from(document.querySelectorAll("main section[id]")), here = null;
    var hashed = location.hash && document.getElementById(location.hash.slice(1)), r = hashed && hashed.getBoundingClientRect();
    if (r && r.bottom > 0 && r.top < window.innerHeight) {
      here = (hashed.closest("section") || hashed).id;
    } else {
      all.forEach(function (s) { if (s.getBoundingClientRect().top <= window.innerHeight / 3) { here = s.id; } });
      if (window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 2 && all.length) {
        here = all[all.length - 1].id;
      }
    }
    if (here) { markMap(here); document.body.setAttribute("data-here", here); }
  }
  var mapBound = false, mapFrame = 0;
  function bindMap() {
    if (mapBound || !document.querySelector(".gl-map-gather")) { hereNow(); return; }
    mapBound = true;
    window.addEventListener("hashchange", hereNow);
    window.addEventListener("scroll", function () {
      if (!mapFrame) { mapFrame = requestAnimationFrame(function () { mapFrame = 0; hereNow(); }); }
    }, {passive: true});
    hereNow();
  }

  // -- start -----------------------------------------------------------------------------------------
  function start() {
    if (!document.getElementById("gl-data")) { return; }
    load(document); bind(); bindLive(); bindMap(); bindChat(); syncControls(); update();
  }
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", start); } else { start(); }
})();
