/* LoG-Reranker explanation page: one renderer for one "log" record (RerankResult.to_dict()).
 *
 * Everything comes from the record JSON embedded in the page (the application/json block
 * #log-record), or from an answer of the HTTP server's POST /log/rerank on the form page;
 * text is only ever inserted as text (textContent / createTextNode), never parsed as HTML.
 * No request is made to anything but the form's own endpoint. Exposed as window.LoGExplain
 * ({render, renderError, initForm}) so other pages can reuse it.
 */
(function () {
  "use strict";

  var ROLES = ["background", "method", "result"];
  // Okabe-Ito colours: distinguishable under the common colour-vision deficiencies.
  var ROLE_COLOUR = {background: "#0072B2", method: "#E69F00", result: "#009E73"};
  var ROLE_RGB = {background: [0, 114, 178], method: [230, 159, 0], result: [0, 158, 115]};
  var ROLE_LETTER = {background: "B", method: "M", result: "R"};
  var LETTER_INK = {background: "#ffffff", method: "#000000", result: "#000000"};
  var SVGNS = "http://www.w3.org/2000/svg";
  var MOVED_MOST = 5;          // sentences marked as moved most by the graph stage
  var OPEN_PASSAGES = 10;      // passages shown open at first (the rest one click/Enter away)
  var GROUP_COLUMNS = 3;       // passage groups per row of the graph drawing (fits its column)

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }

  function add(parent) {
    for (var i = 1; i < arguments.length; i++) {
      var c = arguments[i];
      if (c === null || c === undefined) { continue; }
      parent.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    }
    return parent;
  }

  function svgEl(tag, attrs) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in attrs) {
      if (Object.prototype.hasOwnProperty.call(attrs, k)) { e.setAttribute(k, String(attrs[k])); }
    }
    return e;
  }

  function fmt(x) { return (x === null || x === undefined) ? "n/a" : Number(x).toFixed(3); }

  function sentName(p, s) { return "P" + (p + 1) + " S" + (s + 1); }

  function roleChip(role) {
    var c = el("span", "chip role-" + role, ROLE_LETTER[role] || "?");
    c.title = role;
    return c;
  }

  function shiftText(shift) {
    if (shift > 0) { return "\u2191" + shift; }
    if (shift < 0) { return "\u2193" + (-shift); }
    return "=";
  }

  /* Everything the drawing needs, derived once from the record. */
  function analyse(rec) {
    var sents = rec.ranked_sentences || [];
    var byPassage = {};
    var byKey = {};
    var hasGlobal = sents.length > 0;
    var lo = Infinity, hi = -Infinity;
    sents.forEach(function (s) {
      (byPassage[s.passage] = byPassage[s.passage] || []).push(s);
      byKey[s.passage + ":" + s.sentence] = s;
      if (s.global_score === null || s.global_score === undefined) { hasGlobal = false; }
      lo = Math.min(lo, s.score);
      hi = Math.max(hi, s.score);
    });
    Object.keys(byPassage).forEach(function (p) {
      byPassage[p].sort(function (a, b) { return a.sentence - b.sentence; });
    });
    // Rank under the local scores alone (ties by passage, then sentence order, as
    // logrerank_jax.ranking does), so each sentence's move by the graph stage is visible.
    var localRank = {};
    var moved = {};
    if (hasGlobal) {
      sents.slice().sort(function (a, b) {
        return (b.local_score - a.local_score) || (a.passage - b.passage) || (a.sentence - b.sentence);
      }).forEach(function (s, i) { localRank[s.passage + ":" + s.sentence] = i + 1; });
      sents.map(function (s) {
        return {key: s.passage + ":" + s.sentence, shift: localRank[s.passage + ":" + s.sentence] - s.rank, rank: s.rank};
      }).filter(function (m) { return m.shift !== 0; }).sort(function (a, b) {
        return (Math.abs(b.shift) - Math.abs(a.shift)) || (a.rank - b.rank);
      }).slice(0, MOVED_MOST).forEach(function (m) { moved[m.key] = m.shift; });
    }
    var graph = rec.graph || {nodes: [], edges: []};
    var nodeRole = {};   // "p:s" -> "evidence" (heads a unit) | "expansion"
    graph.nodes.forEach(function (n) {
      nodeRole[n.passage + ":" + n.sentence] = (n.unit === null || n.unit === undefined) ? "expansion" : "evidence";
    });
    var position = {};
    (rec.passage_ranking || []).forEach(function (p, i) { position[p] = i + 1; });
    return {byPassage: byPassage, byKey: byKey, hasGlobal: hasGlobal, lo: lo, hi: hi,
            localRank: localRank, moved: moved, graph: graph, nodeRole: nodeRole,
            position: position};
  }

  /* Evidence shading: the sentence's final score within this query's range, in its role colour. */
  function shade(a, s) {
    var t = a.hi > a.lo ? (s.score - a.lo) / (a.hi - a.lo) : 0.5;
    var rgb = ROLE_RGB[s.role] || [128, 128, 128];
    return "rgba(" + rgb.join(",") + "," + (0.06 + 0.4 * t).toFixed(3) + ")";
  }

  function legend(a) {
    var box = el("section", "legend");
    box.setAttribute("aria-label", "Legend");
    add(box, el("h2", null, "Legend"));
    var roles = el("ul", "legend-roles");
    ROLES.forEach(function (r) {
      var li = el("li", "role legend-role-" + r);
      li.setAttribute("data-role", r);
      add(li, roleChip(r), " " + r);
      roles.appendChild(li);
    });
    add(box, el("p", "legend-caption", "Roles (predicted, argmax):"), roles);
    var notes = el("ul", "legend-notes");
    add(notes,
        add(el("li"), el("span", "swatch-scale"),
            " shade: a sentence's final score within this question's range (" + fmt(a.lo) +
            " \u2013 " + fmt(a.hi) + "), in its role colour"),
        add(el("li"), el("span", "mark-evidence", "U1"),
            " evidence: heads a structured context unit (numbered in generator order)"),
        add(el("li"), el("span", "mark-expansion", "ctx"),
            " context expansion: a unit's neighbour (adjacency) or similar sentence"),
        a.hasGlobal ? add(el("li"), el("span", "mark-moved", "\u219112"),
            " moved most by the graph stage: rank change from the local scores alone to the final scores (top " +
            MOVED_MOST + ")") : add(el("li"), "local-only model: no global score, so no graph-stage changes"),
        add(el("li"), el("span", "edge-key adjacency-key"),
            " adjacency edge (in-passage, text order), typed by its roles: same role, or source\u2192target"),
        add(el("li"), el("span", "edge-key similarity-key"), " similarity edge (cross-passage, type 7)"));
    add(box, notes);
    return box;
  }

  function graphSection(rec, a, onReveal) {
    var sec = el("section", "graph-section");
    sec.id = "graph";
    var g = a.graph;
    var nAdj = g.edges.filter(function (e) { return e.kind === "adjacency"; }).length;
    add(sec, el("h2", null, "Sentence graph of the context units"),
        el("p", "hint", g.nodes.length + " sentences, " + nAdj + " adjacency and " +
           (g.edges.length - nAdj) + " similarity edges. Hover over a node, or reach it with Tab, to see " +
           "its sentence and scores; Enter shows it in its passage."));
    if (!g.nodes.length) {
      add(sec, el("p", "empty", "No context units: the question has no scored sentence."));
      return sec;
    }
    // Layout: one box per passage (in LoG's order), its nodes stacked in text order.
    var groups = [], groupOf = {};
    g.nodes.forEach(function (n) {
      if (!(n.passage in groupOf)) {
        groupOf[n.passage] = groups.length;
        groups.push({passage: n.passage, nodes: []});
      }
      groups[groupOf[n.passage]].nodes.push(n);
    });
    var GW = 190, GAPX = 46, GAPY = 40, HEAD = 34, STEP = 50, PAD = 14, R = 13;
    var cols = Math.min(GROUP_COLUMNS, groups.length);
    var pos = {}, y = PAD, boxes = [];
    for (var row = 0; row * cols < groups.length; row++) {
      var rowGroups = groups.slice(row * cols, row * cols + cols), rowH = 0;
      rowGroups.forEach(function (grp, c) {
        var x = PAD + c * (GW + GAPX), h = HEAD + grp.nodes.length * STEP;
        boxes.push({grp: grp, x: x, y: y, h: h});
        grp.nodes.forEach(function (n, i) { pos[n.id] = {x: x + 52, y: y + HEAD + STEP / 2 + i * STEP}; });
        rowH = Math.max(rowH, h);
      });
      y += rowH + GAPY;
    }
    var width = PAD * 2 + cols * GW + (cols - 1) * GAPX, height = y - GAPY + PAD;
    var svg = svgEl("svg", {viewBox: "0 0 " + width + " " + height, width: width, height: height,
                            "class": "graph", role: "group",
                            "aria-label": "Sentence graph: " + g.nodes.length + " nodes grouped by passage"});
    var defs = svgEl("defs", {});
    // Arrow heads in user units: the same size when a focused edge is drawn thicker.
    var marker = svgEl("marker", {id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5,
                                  markerWidth: 11, markerHeight: 11, markerUnits: "userSpaceOnUse",
                                  orient: "auto-start-reverse"});
    marker.appendChild(svgEl("path", {d: "M0,0 L10,5 L0,10 z", "class": "arrow-head"}));
    defs.appendChild(marker);
    svg.appendChild(defs);
    svg.style.setProperty("max-width", width + "px");  // scale down to the column, never up
    boxes.forEach(function (b) {
      var info = rec.passages[b.grp.passage] || {};
      var box = svgEl("g", {"class": "group"});
      box.appendChild(svgEl("rect", {x: b.x, y: b.y, width: GW, height: b.h, rx: 8, "class": "group-box"}));
      var head = svgEl("text", {x: b.x + 10, y: b.y + 21, "class": "group-head"});
      var title = info.title ? " " + (info.title.length > 14 ? info.title.slice(0, 13) + "\u2026" : info.title) : "";
      head.textContent = "#" + a.position[b.grp.passage] + " \u00b7 P" + (b.grp.passage + 1) + title;
      box.appendChild(head);
      svg.appendChild(box);
    });
    var edgeLayer = svgEl("g", {"class": "edges"});
    svg.appendChild(edgeLayer);
    var edgesOf = {};
    g.edges.forEach(function (e, i) {
      var s = pos[e.source], t = pos[e.target], path;
      if (e.kind === "adjacency") {
        var dir = t.y >= s.y ? 1 : -1;
        path = svgEl("line", {x1: s.x, y1: s.y + dir * R, x2: t.x, y2: t.y - dir * (R + 2),
                              "class": "edge adjacency type-" + e.type, "marker-end": "url(#arrow)"});
        var label = svgEl("text", {x: s.x - R - 5, y: (s.y + t.y) / 2 + 4, "class": "edge-label"});
        label.textContent = e.type === 0 ? "same" : abbreviate(e.type_name);
        edgeLayer.appendChild(label);
      } else {
        // A curve that bows away from the straight line, so parallel links stay apart.
        var mx = (s.x + t.x) / 2, my = (s.y + t.y) / 2, dx = t.x - s.x, dy = t.y - s.y;
        var len = Math.sqrt(dx * dx + dy * dy) || 1, bow = Math.min(60, 0.18 * len);
        path = svgEl("path", {d: "M" + s.x + "," + s.y + " Q" + (mx - dy / len * bow) + "," +
                                 (my + dx / len * bow) + " " + t.x + "," + t.y,
                              "class": "edge similarity type-" + e.type});
      }
      path.setAttribute("data-edge", i);
      var tip = svgEl("title", {});
      tip.textContent = e.kind + " edge, type " + e.type + " (" + e.type_name + "): " +
          nodeName(g.nodes[e.source]) + (e.kind === "adjacency" ? " \u2192 " : " \u2014 ") + nodeName(g.nodes[e.target]);
      path.appendChild(tip);
      edgeLayer.appendChild(path);
      (edgesOf[e.source] = edgesOf[e.source] || []).push(i);
      (edgesOf[e.target] = edgesOf[e.target] || []).push(i);
    });
    var info = el("div", "node-info");
    info.id = "node-info";
    info.setAttribute("aria-live", "polite");
    add(info, el("p", "hint", "Hover over or focus a node to see its sentence and scores."));
    var nodeLayer = svgEl("g", {"class": "nodes"});
    svg.appendChild(nodeLayer);
    g.nodes.forEach(function (n) {
      var p = pos[n.id];
      var head = n.unit !== null && n.unit !== undefined;
      var node = svgEl("g", {"class": "node " + (head ? "evidence" : "expansion") + " role-" + n.role,
                             tabindex: 0, role: "button", "data-node": n.id,
                             "aria-label": nodeName(n) + ", " + n.role + (head ? ", context unit " + (n.unit + 1) : ", expansion") +
                                 ", score " + fmt(n.score) + ": " + n.text});
      node.appendChild(svgEl("circle", {cx: p.x, cy: p.y, r: R, fill: ROLE_COLOUR[n.role] || "#888",
                                        "class": "node-dot"}));
      var letter = svgEl("text", {x: p.x, y: p.y + 4, "class": "node-letter", fill: LETTER_INK[n.role] || "#000"});
      letter.textContent = ROLE_LETTER[n.role] || "?";
      node.appendChild(letter);
      var lab = svgEl("text", {x: p.x + R + 7, y: p.y + 4, "class": "node-label"});
      lab.textContent = "S" + (n.sentence + 1) + " \u00b7 #" + n.rank + (head ? " \u00b7 U" + (n.unit + 1) : "");
      node.appendChild(lab);
      var show = function () { showNode(rec, a, n, info, edgesOf[n.id] || [], svg); };
      node.addEventListener("mouseenter", show);
      node.addEventListener("focus", show);
      node.addEventListener("keydown", function (ev) {
        if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); onReveal(n.passage, n.sentence); }
      });
      node.addEventListener("click", function () { onReveal(n.passage, n.sentence); });
      nodeLayer.appendChild(node);
    });
    var wrap = el("div", "graph-wrap");
    add(wrap, add(el("div", "graph-scroll"), svg), info);
    add(sec, wrap);
    return sec;
  }

  function abbreviate(name) {
    return name.split("->").map(function (r) { return ROLE_LETTER[r] || r; }).join("\u2192");
  }

  function nodeName(n) { return sentName(n.passage, n.sentence); }

  function showNode(rec, a, n, info, edgeIds, svg) {
    Array.prototype.forEach.call(svg.querySelectorAll(".active"), function (x) { x.classList.remove("active"); });
    var mine = svg.querySelector('[data-node="' + n.id + '"]');
    if (mine) { mine.classList.add("active"); }
    edgeIds.forEach(function (i) {
      var e = svg.querySelector('[data-edge="' + i + '"]');
      if (e) { e.classList.add("active"); }
    });
    info.textContent = "";
    var head = n.unit !== null && n.unit !== undefined;
    add(info, add(el("p", "info-head"), roleChip(n.role), " " + nodeName(n) + " \u00b7 " + n.role +
                  " \u00b7 rank " + n.rank + (head ? " \u00b7 context unit " + (n.unit + 1) : " \u00b7 expansion")));
    add(info, el("blockquote", "info-text", n.text));
    var key = n.passage + ":" + n.sentence;
    add(info, el("p", "info-scores", "local " + fmt(n.local_score) + " \u00b7 global " + fmt(n.global_score) +
                 " \u00b7 final " + fmt(n.score) + (a.hasGlobal ? " \u00b7 rank from local " + a.localRank[key] +
                 " to " + n.rank + " (" + shiftText(a.localRank[key] - n.rank) + ")" : "")));
    if (edgeIds.length) {
      var ul = el("ul", "info-edges");
      edgeIds.forEach(function (i) {
        var e = a.graph.edges[i], other = a.graph.nodes[e.source === n.id ? e.target : e.source];
        add(ul, el("li", null, e.kind + " (type " + e.type + ", " + e.type_name + ") " +
                   (e.source === n.id ? "to " : "from ") + nodeName(other)));
      });
      add(info, ul);
    }
  }

  function contextSection(rec, a, onReveal) {
    var sec = el("section", "context-section");
    sec.id = "context";
    add(sec, el("h2", null, "Structured context units (the order a generator receives them)"));
    var units = rec.context || [];
    if (!units.length) {
      add(sec, el("p", "empty", "No context units."));
      return sec;
    }
    var ol = el("ol", "units");
    units.forEach(function (u, i) {
      var li = el("li", "unit");
      add(li, add(el("p", "unit-head"), roleChip(u.role), " Unit " + (i + 1) + " \u00b7 " + sentName(u.passage, u.sentence) +
                  " (passage #" + a.position[u.passage] + ") \u00b7 score " + fmt(u.score)));
      add(li, el("p", "unit-text", u.text));
      if (u.similar === undefined) {
        add(li, el("p", "flat", "Flat list (the \u201cw/o structured context\u201d model): no expansion."));
      } else {
        var ex = el("ul", "expansions");
        [["before", u.predecessor], ["after", u.successor]].forEach(function (pair) {
          if (pair[1]) { add(ex, expansion(pair[0], pair[1])); }
        });
        (u.similar || []).forEach(function (r) { add(ex, expansion("similar", r)); });
        if (!ex.childNodes.length) { add(ex, el("li", "none", "no neighbour or similar sentence")); }
        add(li, ex);
      }
      ol.appendChild(li);
    });
    add(sec, ol);
    return sec;
  }

  function expansion(kind, ref) {
    var li = el("li", "expansion-" + kind);
    add(li, el("span", "ex-kind", kind + " \u00b7 " + sentName(ref.passage, ref.sentence) + ": "), ref.text);
    return li;
  }

  function passageSection(rec, a) {
    var sec = el("section", "passages-section");
    sec.id = "passages";
    var skipped = rec.passages.filter(function (p) { return p.skipped; }).length;
    add(sec, el("h2", null, "Passages in LoG's order (" + rec.passages.length + (skipped ? ", " + skipped + " skipped" : "") + ")"));
    var tools = el("p", "tools");
    var openAll = el("button", "open-all", "Open all passages");
    openAll.type = "button";
    openAll.addEventListener("click", function () {
      Array.prototype.forEach.call(sec.querySelectorAll("details.passage"), function (d) { d.open = true; });
    });
    add(sec, add(tools, openAll));
    var list = document.createDocumentFragment();
    (rec.passage_ranking || []).forEach(function (p, i) {
      list.appendChild(passageBlock(rec, a, p, i + 1));
    });
    sec.appendChild(list);
    return sec;
  }

  function passageBlock(rec, a, p, rank) {
    var info = rec.passages[p];
    var d = el("details", "passage" + (info.skipped ? " skipped" : ""));
    d.id = "p-" + p;
    d.setAttribute("data-index", p);
    d.open = rank <= OPEN_PASSAGES || !!info.skipped;
    var moved = (p + 1) - rank;
    var sents = a.byPassage[p] || [];
    var sum = el("summary", "passage-head");
    add(sum, el("span", "p-rank", "#" + rank), " ",
        el("span", "p-title" + (info.title ? "" : " untitled"), info.title ? info.title : "(untitled)"), " ",
        el("span", "p-pos", "P" + (p + 1) + " \u00b7 input position " + (p + 1) + " \u00b7 " +
           (info.skipped ? "unranked" : moved > 0 ? "moved up " + moved : moved < 0 ? "moved down " + (-moved) : "not moved")),
        info.skipped ? null : el("span", "p-best", " \u00b7 best " + fmt(sents.length ? Math.max.apply(null, sents.map(function (s) { return s.score; })) : null)));
    d.appendChild(sum);
    if (info.skipped) {
      add(d, el("p", "skip-reason", "Skipped, not scored: " + info.skipped + ". Kept, unranked, at the end."));
      return d;
    }
    if (!sents.length) {
      add(d, el("p", "skip-reason", "No sentence to score."));
      return d;
    }
    if (info.num_windows > 1) {
      add(d, el("p", "p-note", "Encoded in " + info.num_windows + " windows (each repeats the question)."));
    }
    var ol = el("ol", "sentences");
    sents.forEach(function (s) {
      var key = s.passage + ":" + s.sentence, kind = a.nodeRole[key];
      var li = el("li", "sent" + (kind ? " " + kind : "") + (key in a.moved ? " moved" : ""));
      li.id = "s-" + s.passage + "-" + s.sentence;
      li.tabIndex = -1;
      li.style.setProperty("background-color", shade(a, s));
      li.style.setProperty("border-left-color", ROLE_COLOUR[s.role] || "#888");
      add(li, roleChip(s.role));
      if (kind === "evidence") {
        var unit = a.graph.nodes.filter(function (n) { return n.passage === s.passage && n.sentence === s.sentence; })[0].unit;
        add(li, el("span", "mark-evidence", "U" + (unit + 1)));
      } else if (kind === "expansion") {
        add(li, el("span", "mark-expansion", "ctx"));
      }
      add(li, el("span", "s-text", s.text));
      if (s.truncated) { add(li, el("span", "flag", "cut to fit the row")); }
      var sc = el("span", "s-scores");
      if (a.hasGlobal) {
        var shift = a.localRank[key] - s.rank;
        add(sc, "local " + fmt(s.local_score) + " \u2192 global " + fmt(s.global_score) + " ",
            el("span", "s-shift" + (key in a.moved ? " mark-moved" : ""), shiftText(shift)));
        sc.title = "rank " + a.localRank[key] + " by local score, " + s.rank + " by final score";
      } else {
        add(sc, "local " + fmt(s.local_score) + " \u00b7 rank " + s.rank);
      }
      add(li, sc);
      ol.appendChild(li);
    });
    add(d, ol);
    return d;
  }

  function header(title, opts) {
    var h = el("header", "page-head");
    if (opts && opts.indexHref) {
      var back = el("a", "back", "\u2190 All records");
      back.href = opts.indexHref;
      add(h, back);
    }
    add(h, el("h1", null, title));
    return h;
  }

  function renderError(rec, root, opts) {
    root.textContent = "";
    var main = el("main", "log-page error-page");
    add(main, header("LoG-Reranker: record not processed", opts));
    var box = el("section", "error-record");
    box.setAttribute("role", "alert");
    add(box, el("h2", null, "This record could not be processed"),
        el("p", "error-message", rec.error),
        el("p", "error-where", "Input line " + (rec.line === null || rec.line === undefined ? "?" : rec.line) +
           (rec.id ? " \u00b7 id " + rec.id : "")));
    if (rec.query) { add(box, el("h3", null, "Question"), el("p", "question", rec.query)); }
    add(main, box);
    root.appendChild(main);
  }

  function render(rec, root, opts) {
    var t0 = performance.now();
    if (rec.error !== null && rec.error !== undefined) {
      renderError(rec, root, opts);
      return performance.now() - t0;
    }
    var a = analyse(rec);
    root.textContent = "";
    var main = el("main", "log-page");
    add(main, header("Why LoG ranked it", opts));
    var q = el("section", "question-section");
    add(q, el("h2", null, "Question"), el("p", "question", rec.query));
    if (rec.query_truncated) { add(q, el("p", "flag", "The question was cut to the model's query-token limit.")); }
    var skipped = rec.passages.filter(function (p) { return p.skipped; });
    add(q, el("p", "summary", rec.passages.length + " passages (" + skipped.length + " skipped), " +
              rec.ranked_sentences.length + " scored sentences, " + (rec.context || []).length + " context units; " +
              (a.hasGlobal ? "scores from the graph stage (global)" : "local-only model: final score = local score") +
              (rec.id ? " \u00b7 id " + rec.id : "") + (rec.line !== null && rec.line !== undefined ? " \u00b7 input line " + rec.line : "")));
    if (skipped.length) {
      add(q, el("p", "skip-summary", "Skipped passages: " + skipped.map(function (p) {
        return "P" + (p.index + 1) + " (" + p.skipped + ")";
      }).join("; ")));
    }
    add(main, q, legend(a));
    var passages = passageSection(rec, a);
    var reveal = function (p, s) {
      var d = passages.querySelector("#p-" + p), row = passages.querySelector("#s-" + p + "-" + s);
      if (d) { d.open = true; }
      if (row) {
        row.scrollIntoView({block: "center"});
        row.focus({preventScroll: true});
        row.classList.add("flash");
        setTimeout(function () { row.classList.remove("flash"); }, 1200);
      }
    };
    var top = el("div", "top-grid");
    add(top, graphSection(rec, a, reveal), contextSection(rec, a, reveal));
    add(main, top, passages);
    root.appendChild(main);
    return performance.now() - t0;
  }

  /* The form page (GET / of the HTTP server): a question and passages, or a shipped demo pool,
   * POSTed as one input record to `endpoint`; the answer is drawn by `render`. */
  function initForm(root, cfg) {
    var form = root.querySelector("form.rerank-form");
    var out = root.querySelector("#result");
    var pick = form.querySelector("select[name=pool]");
    (cfg.pools || []).forEach(function (pool, i) {
      var o = el("option", null, (pool.id ? pool.id + ": " : "") + (pool.input || pool.question || ""));
      o.value = String(i);
      pick.appendChild(o);
    });
    pick.addEventListener("change", function () {
      var pool = cfg.pools[Number(pick.value)];
      if (!pool) { return; }
      form.elements.question.value = pool.input || pool.question || "";
      form.elements.passages.value = (pool.ctxs || pool.passages || []).map(function (c) {
        return typeof c === "string" ? c : c.text;
      }).join("\n\n");
    });
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var passages = form.elements.passages.value.split(/\n\s*\n/).map(function (b) {
        return b.trim();
      }).filter(Boolean).map(function (b) { return {title: "", text: b}; });
      var body = {question: form.elements.question.value, passages: passages};
      out.textContent = "Reranking\u2026";
      fetch(cfg.endpoint, {method: "POST", headers: {"Content-Type": "application/json"},
                           body: JSON.stringify(body)})
        .then(function (r) {
          return r.json().then(function (j) {
            if (!r.ok) { throw new Error((j && (j.error || j.detail || j.message)) || ("HTTP " + r.status)); }
            return j;
          });
        })
        .then(function (j) {
          var rec = Array.isArray(j) ? j[0] : (j && j.results ? j.results[0] : j);
          render(rec, out, {});
        })
        .catch(function (e) { renderError({error: String(e.message || e), query: body.question}, out, {}); });
    });
  }

  window.LoGExplain = {render: render, renderError: renderError, initForm: initForm};

  function boot() {
    var root = document.getElementById("app");
    var data = document.getElementById("log-record");
    var conf = document.getElementById("log-page");
    var opts = conf ? JSON.parse(conf.textContent) : {};
    if (data && root) {
      var ms = render(JSON.parse(data.textContent), root, opts);
      window.logExplainTiming = {renderMs: ms};
      // Two frames later the drawn page has been laid out and painted.
      requestAnimationFrame(function () {
        requestAnimationFrame(function () {
          window.logExplainTiming.paintedAt = performance.now();
          document.documentElement.setAttribute("data-rendered", "painted");
        });
      });
    } else if (root && opts.form) {
      initForm(root, opts.form);
      document.documentElement.setAttribute("data-rendered", "form");
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", boot);
  } else {
    boot();
  }
})();
