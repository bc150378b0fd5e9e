// The atgrpo report: draws the overview, the tree browser and the held-out transcripts from the embedded JSON.
// Everything is built with DOM calls and textContent (model text is never parsed as HTML); views are addressed
// by the URL hash (#overview, #trees/RUN/STEP/PROBLEM/NODE, #transcripts/RUN/FILTER), so a link or a headless
// browser can open any node. Errors are shown at the top of the page as well as on the console.
"use strict";
(function () {
  var D = JSON.parse(document.getElementById("report-data").textContent);
  var PALETTE = ["#1f6feb", "#d1242f", "#1a7f37", "#8250df", "#bc4c00", "#0a7f8c", "#7d4e24", "#bf3989"];
  var DASHES = ["", "6 3", "2 3", "8 3 2 3"];
  var FOLD_CHARS = 600, FOLD_LINES = 14;
  var roleColor = {};
  D.agents.forEach(function (a, i) { roleColor[a] = PALETTE[i % PALETTE.length]; });

  function h(tag, attrs) {
    var el = document.createElement(tag);
    if (attrs) Object.keys(attrs).forEach(function (k) {
      if (k === "text") el.textContent = attrs[k];
      else if (k === "style") el.setAttribute("style", attrs[k]);
      else if (k.slice(0, 2) === "on") el.addEventListener(k.slice(2), attrs[k]);
      else el.setAttribute(k, attrs[k]);
    });
    for (var i = 2; i < arguments.length; i++) add(el, arguments[i]);
    return el;
  }
  function add(el, c) {
    if (c === null || c === undefined || c === false) return;
    if (Array.isArray(c)) { c.forEach(function (x) { add(el, x); }); return; }
    el.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
  }
  function svg(tag, attrs) {
    var el = document.createElementNS("http://www.w3.org/2000/svg", tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") el.textContent = attrs[k]; else el.setAttribute(k, attrs[k]);
    });
    return el;
  }
  function fmt(v, digits) {
    if (v === null || v === undefined) return "-";
    if (typeof v !== "number") return String(v);
    if (v !== 0 && (Math.abs(v) >= 1e5 || Math.abs(v) < 1e-3)) return v.toExponential(2);
    return v.toFixed(digits === undefined ? 3 : digits);
  }
  function signed(v) { return h("span", {"class": v > 0 ? "pos" : (v < 0 ? "neg" : ""), text: (v > 0 ? "+" : "") + fmt(v)}); }
  function roleSpan(a) { return h("span", {"class": "role", style: "--c:" + (roleColor[a] || "#555"), text: a}); }
  // a long text is folded: its first lines are shown, the rest opens on a click
  function folded(text) {
    text = text === null || text === undefined ? "" : String(text);
    var lines = text.split("\n");
    if (text.length <= FOLD_CHARS && lines.length <= FOLD_LINES) return h("pre", null, text);
    var head = lines.slice(0, 4).join("\n").slice(0, 240);
    return h("details", {"class": "fold"}, h("summary", {text: head.replace(/\n/g, " \u21b5 ") + " \u2026 (" + text.length + " characters, " + lines.length + " lines)"}), h("pre", null, text));
  }

  // ---- errors: shown at the top of the page too ----------------------------------------------------------
  var errorBox = h("div", {"class": "errors", id: "errors", hidden: ""});
  window.addEventListener("error", function (e) { showError(e.message + (e.lineno ? " (line " + e.lineno + ")" : "")); });
  function showError(msg) { errorBox.hidden = false; errorBox.textContent += msg + "\n"; }

  // ---- layout ------------------------------------------------------------------------------------------
  var tabs = {overview: "Overview", trees: "Trees", transcripts: "Held-out transcripts"};
  var sections = {}, links = {};
  var nav = h("nav");
  Object.keys(tabs).forEach(function (k) {
    links[k] = h("a", {href: "#" + k, id: "tab-" + k, text: tabs[k]});
    nav.appendChild(links[k]);
    sections[k] = h("section", {id: k});
  });
  var main = h("main", null, sections.overview, sections.trees, sections.transcripts);
  document.body.appendChild(h("header", null, h("h1", {text: "atgrpo report"}),
    h("span", {"class": "runs", text: D.runs.map(function (r) { return r.name; }).join("  \u00b7  ")})));
  document.body.appendChild(nav);
  document.body.appendChild(errorBox);
  document.body.appendChild(main);

  // ---- overview ----------------------------------------------------------------------------------------
  function series(run, name) {
    var xs = [], ys = [], m = run.metrics, col = m.series[name] || [];
    for (var i = 0; i < col.length; i++) if (typeof col[i] === "number") { xs.push(m.steps[i]); ys.push(col[i]); }
    return {xs: xs, ys: ys};
  }
  function runStyle(i) { return {color: PALETTE[i % PALETTE.length], dash: DASHES[0]}; }
  function multi() { return D.runs.length > 1; }

  function chart(title, lines, note) {
    lines = lines.filter(function (l) { return l.xs.length > 0; });
    var box = h("div", {"class": "chart", "data-title": title}, h("div", {"class": "title", text: title}));
    if (note) box.appendChild(h("div", {"class": "note", text: note}));
    if (!lines.length) { box.appendChild(h("div", {"class": "note", text: "no values logged"})); return box; }
    var W = 420, H = 210, L = 46, R = 8, T = 8, B = 22;
    var xs = [], ys = [];
    lines.forEach(function (l) { xs = xs.concat(l.xs); ys = ys.concat(l.ys); });
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs), y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 === y0) { y0 -= Math.abs(y0) * 0.1 + 0.5; y1 += Math.abs(y1) * 0.1 + 0.5; }
    var pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
    function X(x) { return L + (x - x0) / (x1 - x0) * (W - L - R); }
    function Y(y) { return T + (1 - (y - y0) / (y1 - y0)) * (H - T - B); }
    var s = svg("svg", {viewBox: "0 0 " + W + " " + H, preserveAspectRatio: "none", role: "img"});
    var digits = Math.max(0, Math.min(6, Math.ceil(-Math.log(Math.max((y1 - y0) / 4, 1e-12)) / Math.LN10) + 1));
    for (var i = 0; i <= 4; i++) {
      var yv = y0 + (y1 - y0) * i / 4;
      s.appendChild(svg("line", {x1: L, x2: W - R, y1: Y(yv), y2: Y(yv), "class": "grid"}));
      s.appendChild(svg("text", {x: L - 4, y: Y(yv) + 3, "text-anchor": "end", "class": "tick", text: fmt(Math.abs(yv) < (y1 - y0) * 1e-9 ? 0 : yv, digits)}));
    }
    [x0, (x0 + x1) / 2, x1].forEach(function (xv) {
      s.appendChild(svg("text", {x: X(xv), y: H - 6, "text-anchor": "middle", "class": "tick", text: String(Math.round(xv))}));
    });
    s.appendChild(svg("line", {x1: L, x2: L, y1: T, y2: H - B, "class": "axis"}));
    s.appendChild(svg("line", {x1: L, x2: W - R, y1: H - B, y2: H - B, "class": "axis"}));
    var legend = h("div", {"class": "legend"});
    lines.forEach(function (l) {
      var pts = l.xs.map(function (x, j) { return X(x).toFixed(1) + "," + Y(l.ys[j]).toFixed(1); }).join(" ");
      s.appendChild(svg("polyline", {points: pts, fill: "none", stroke: l.color, "stroke-width": 1.6,
        "stroke-dasharray": l.dash || "", "vector-effect": "non-scaling-stroke"}));
      if (l.points || l.xs.length === 1) l.xs.forEach(function (x, j) {
        s.appendChild(svg("circle", {cx: X(x), cy: Y(l.ys[j]), r: 3, fill: l.color}));
      });
      legend.appendChild(h("span", {style: "--c:" + l.color, "class": l.dash ? "dashed" : "", text: l.label}));
    });
    var readout = h("div", {"class": "readout"});
    s.addEventListener("mousemove", function (ev) {
      var r = s.getBoundingClientRect(), x = x0 + ((ev.clientX - r.left) / r.width * W - L) / (W - L - R) * (x1 - x0);
      readout.textContent = lines.map(function (l) {
        var best = 0;
        for (var j = 1; j < l.xs.length; j++) if (Math.abs(l.xs[j] - x) < Math.abs(l.xs[best] - x)) best = j;
        return l.label + " @" + l.xs[best] + ": " + fmt(l.ys[best]);
      }).join("   ");
    });
    box.appendChild(s); box.appendChild(legend); box.appendChild(readout);
    return box;
  }

  // one line per run of one metric
  function perRun(name, label) {
    return D.runs.map(function (run, i) {
      var st = runStyle(i), sr = series(run, name);
      return {xs: sr.xs, ys: sr.ys, color: st.color, dash: st.dash, label: multi() ? run.name : (label || name)};
    });
  }
  // one line per role (and per run: dashes) of metrics named prefix/<role>
  function perRole(prefix) {
    var out = [];
    D.runs.forEach(function (run, i) {
      run.agents.forEach(function (a) {
        var sr = series(run, prefix + a);
        out.push({xs: sr.xs, ys: sr.ys, color: roleColor[a], dash: DASHES[i % DASHES.length],
                  label: a + (multi() ? " (" + run.name + ")" : "")});
      });
    });
    return out;
  }
  function heldOutLines() {
    var out = [];
    D.runs.forEach(function (run, i) {
      var c = PALETTE[i % PALETTE.length];
      out.push({xs: run.held_out.map(function (p) { return p[0]; }), ys: run.held_out.map(function (p) { return p[1]; }),
                color: c, dash: "", points: true, label: "held-out" + (multi() ? " (" + run.name + ")" : "")});
      var tr = series(run, "rollout/success_rate");
      out.push({xs: tr.xs, ys: tr.ys, color: c, dash: "3 3", label: "training (tree)" + (multi() ? " (" + run.name + ")" : "")});
    });
    return out;
  }
  function phaseLines(prefix) {  // one line per metric under prefix (a phase), per run
    var out = [], phases = {};
    D.runs.forEach(function (run) { Object.keys(run.metrics.series).forEach(function (k) { if (k.indexOf(prefix) === 0) phases[k] = 1; }); });
    Object.keys(phases).sort().forEach(function (k, j) {
      D.runs.forEach(function (run, i) {
        var sr = series(run, k);
        out.push({xs: sr.xs, ys: sr.ys, color: PALETTE[j % PALETTE.length], dash: DASHES[i % DASHES.length],
                  label: k.slice(prefix.length) + (multi() ? " (" + run.name + ")" : "")});
      });
    });
    return out;
  }

  function summaryCard(run, i) {
    var s = run.summary, card = h("div", {"class": "card", style: "border-top:4px solid " + PALETTE[i % PALETTE.length]});
    card.appendChild(h("h3", {text: run.name}));
    card.appendChild(h("div", {"class": "note", text: run.path}));
    var last = run.metrics.steps.length ? run.metrics.steps[run.metrics.steps.length - 1] : 0;
    if (s && s.eval_before && s.eval_after) {
      card.appendChild(h("div", null, "held-out success ", h("span", {"class": "big", text: fmt(s.eval_before.success_rate) + " \u2192 " + fmt(s.eval_after.success_rate)}),
        " (" + fmt(s.eval_after.problems, 0) + " problems)"));
    } else {
      var ho = run.held_out, latest = ho.length ? ho[ho.length - 1] : null;
      card.appendChild(h("div", null, h("span", {"class": "big", text: "in progress"}), " step " + last + " of " + (run.total_steps || "?") +
        (latest ? "; held-out success " + fmt(latest[1]) + (latest[0] === 0 ? " before training" : " after step " + latest[0]) : "") +
        "; summary.json is written at the end"));
    }
    var cfg = run.config || {}, rows = [];
    function row(k, v) { rows.push(h("tr", null, h("th", {text: k}), h("td", {text: v}))); }
    if (cfg.env) row("environment", cfg.env.name + " (" + (cfg.env.style || "") + ")");
    if (cfg.model) row("model", cfg.model.kind + (cfg.model.preset ? " " + cfg.model.preset : "") + (cfg.model.path ? " " + cfg.model.path : ""));
    if (cfg.policy) row("sharing", cfg.policy.sharing);
    if (cfg.rollout) row("rollout", cfg.rollout.mode + ", K=" + cfg.rollout.K + ", " + cfg.rollout.problems_per_step + " problems/step");
    if (cfg.algo) row("algo", "alpha=" + cfg.algo.alpha + ", lr=" + cfg.algo.lr + ", group key " + cfg.algo.group_key);
    row("steps", last + " of " + (run.total_steps || "?"));
    if (s) {
      if (s.wall_seconds !== undefined) row("wall time", fmt(s.wall_seconds, 0) + " s");
      if (s.agent_to_policy) row("agents \u2192 policies", Object.keys(s.agent_to_policy).map(function (a) { return a + "\u2192" + s.agent_to_policy[a]; }).join(", "));
      if (s.peak_rss_mb) row("peak memory (MiB)", Object.keys(s.peak_rss_mb).map(function (k) { return k + " " + fmt(s.peak_rss_mb[k], 0); }).join(", "));
      if (s.eval_after) row("held-out after", Object.keys(s.eval_after).map(function (k) { return k + "=" + fmt(s.eval_after[k]); }).join(", "));
    }
    card.appendChild(h("table", null, rows));
    card.appendChild(h("details", null, h("summary", {text: "the whole config"}), h("pre", {text: JSON.stringify(run.config, null, 1)})));
    if (s) card.appendChild(h("details", null, h("summary", {text: "summary.json"}), h("pre", {text: JSON.stringify(s, null, 1)})));
    var bad = Object.keys(run.skipped_lines || {});
    if (bad.length) card.appendChild(h("div", {"class": "note", text: "lines that were not valid JSON (skipped): " + bad.map(function (f) { return f + ": " + run.skipped_lines[f]; }).join(", ")}));
    return card;
  }

  function drawOverview() {
    var sec = sections.overview;
    sec.appendChild(h("div", {"class": "cards"}, D.runs.map(summaryCard)));
    if (multi()) {
      sec.appendChild(h("h2", {text: "Config differences"}));
      if (!D.config_diff.length) sec.appendChild(h("div", {"class": "note", text: "the runs have the same config"}));
      else sec.appendChild(h("table", {id: "config-diff"}, h("tr", null, h("th", {text: "key"}), D.runs.map(function (r) { return h("th", {text: r.name}); })),
        D.config_diff.map(function (d) { return h("tr", null, h("td", {text: d.key}), d.values.map(function (v) { return h("td", {text: v === null ? "(absent)" : JSON.stringify(v)}); })); })));
    }
    sec.appendChild(h("h2", {text: "Per step"}));
    sec.appendChild(h("div", {"class": "note", text: "Every logged step. Training success is the kept trajectories' (tree sampling at the rollout temperature); held-out success is greedy, on problems never trained on (step 0: before training)." +
      (multi() ? " Runs: colours (one per run), or dash patterns on the role colours." : "")}));
    var grid = h("div", {"class": "charts"});
    grid.appendChild(chart("success rate", heldOutLines()));
    grid.appendChild(chart("reward per role (alpha * team + local)", perRole("rollout/reward/"), "mean over all K candidates of all nodes"));
    grid.appendChild(chart("team term per role", perRole("rollout/reward_team/")));
    grid.appendChild(chart("local term per role", perRole("rollout/reward_local/")));
    grid.appendChild(chart("loss (policy gradient)", perRun("loss/pg")));
    grid.appendChild(chart("KL (approx, to the sampling policy)", perRun("loss/approx_kl")));
    grid.appendChild(chart("clip fraction", perRun("loss/clipfrac")));
    grid.appendChild(chart("zero-variance group fraction", perRun("group/zero_variance_frac")));
    grid.appendChild(chart("tokens/s", perRun("perf/tokens_per_s")));
    grid.appendChild(chart("phase times (s)", phaseLines("time/")));
    grid.appendChild(chart("peak memory per phase (MiB)", phaseLines("perf/peak_rss_mb/"), "this process's resident memory at its highest in each phase"));
    sec.appendChild(grid);
    // any other metric
    var names = {};
    D.runs.forEach(function (r) { Object.keys(r.metrics.series).forEach(function (k) { names[k] = 1; }); });
    var pick = h("select", {id: "metric-pick"}, Object.keys(names).sort().map(function (k) { return h("option", {value: k, text: k}); }));
    var slot = h("div", {"class": "charts"});
    function drawPicked() { slot.textContent = ""; slot.appendChild(chart(pick.value, perRun(pick.value))); }
    pick.addEventListener("change", drawPicked);
    sec.appendChild(h("h2", {text: "Any metric"}));
    sec.appendChild(h("div", {"class": "controls"}, pick));
    sec.appendChild(slot);
    if (pick.options.length) drawPicked();
  }

  // ---- tree browser ------------------------------------------------------------------------------------
  var view = {run: 0, step: null, problem: 0, node: 0, filter: "all"};

  function feedback(info) {
    var keys = Object.keys(info || {}).filter(function (k) { return k !== "stdout" && k !== "stderr"; });
    var out = h("div", {"class": "feedback"});
    if (keys.length) out.appendChild(h("div", null, keys.map(function (k, j) {
      var v = info[k];
      return [j ? "; " : "", h("b", {text: k}), "=" + (typeof v === "string" ? v : JSON.stringify(v))];
    })));
    ["stdout", "stderr"].forEach(function (k) { if (info && info[k]) out.appendChild(h("div", null, h("b", {text: k + ":"}), folded(info[k]))); });
    return out;
  }

  function nodeDetail(node, run, step) {
    var c = roleColor[node.agent] || "#555";
    var det = h("div", {"class": "detail", id: "node-detail", style: "--c:" + c});
    det.appendChild(h("h3", null, "turn " + node.turn + " \u00b7 ", roleSpan(node.agent), " \u00b7 " + node.cands.length + " candidates"));
    var traj = (run.config.rollout || {}).mode === "trajectory";
    det.appendChild(h("div", {"class": "note", text: "group " + (node.cands[0] ? node.cands[0].group : "") + " \u00b7 policy " + (node.cands[0] ? node.cands[0].policy : "") +
      (traj ? " \u00b7 trajectory mode: candidate k is step " + node.turn + " of the k-th independent episode (all are kept), its advantage from that episode's return"
            : " \u00b7 the kept candidate (\u2605) is the best by alpha * team + local (ties: the lowest index); its state is what every branch continues from")}));
    det.appendChild(h("div", null, h("b", {text: "prompt"}), folded(node.prompt)));
    var head = h("tr", null, ["k", "kept", "response", "team", "local", "reward", "advantage", "environment's feedback"].map(function (t, j) {
      return h("th", {"class": j >= 3 && j <= 6 ? "num" : "", text: t});
    }));
    var rows = node.cands.map(function (cd) {
      return h("tr", {"class": "cand" + (cd.kept ? " kept" : ""), "data-branch": cd.branch},
        h("td", {"class": "num", text: cd.branch}),
        h("td", {"class": "star", text: cd.kept ? "\u2605 kept" : ""}),
        h("td", null, cd.prompt !== undefined ? h("details", null, h("summary", {text: "its own prompt (trajectory mode)"}), h("pre", {text: cd.prompt})) : null,
          folded(cd.response), cd.finished ? null : h("div", {"class": "note", text: "(cut at max_new_tokens)"})),
        h("td", {"class": "num", text: fmt(cd.team)}), h("td", {"class": "num", text: fmt(cd.local)}),
        h("td", {"class": "num", text: fmt(cd.reward)}), h("td", {"class": "num"}, signed(cd.advantage)),
        h("td", null, feedback(cd.info)));
    });
    det.appendChild(h("table", {"class": "cands"}, head, rows));
    return det;
  }

  function treesNote(run) {
    var t = run.trees;
    if (!t.dumped.length) return "This run dumped no rollouts (train.dump_rollouts; by default the first and the last step are dumped).";
    var s = "Trees of " + t.shown.length + " of the " + t.dumped.length + " dumped steps";
    if (t.shown.length < t.dumped.length) s += " (the first, the last and evenly spaced ones between, to keep this file small; all are in rollouts/step_N.jsonl)";
    return s + ". Texts over " + D.limits.max_text_chars + " characters are cut.";
  }

  function drawTrees() {
    var sec = sections.trees, run = D.runs[view.run], t = run.trees;
    sec.textContent = "";
    var runSel = h("select", {id: "tree-run"}, D.runs.map(function (r, i) { return h("option", {value: i, text: r.name}); }));
    runSel.value = view.run;
    runSel.addEventListener("change", function () { go("trees", +runSel.value, null, 0, 0); });
    var stepSel = h("select", {id: "tree-step"}, t.shown.map(function (s) { return h("option", {value: s, text: "step " + s}); }));
    if (view.step !== null) stepSel.value = view.step;
    stepSel.addEventListener("change", function () { go("trees", view.run, +stepSel.value, 0, 0); });
    sec.appendChild(h("div", {"class": "controls"}, multi() ? ["run ", runSel] : null, t.shown.length ? ["step ", stepSel] : null));
    sec.appendChild(h("div", {"class": "note", id: "trees-note", text: treesNote(run)}));
    if (!t.shown.length) return;
    var problems = t.steps[String(view.step)] || [];
    var list = h("div", {"class": "problems", id: "problem-list"});
    problems.forEach(function (p, i) {
      var kept = 0;
      p.nodes.forEach(function (n) { n.cands.forEach(function (c) { if (c.kept) kept += c.reward; }); });
      list.appendChild(h("a", {href: hash("trees", view.run, view.step, i, 0), "class": i === view.problem ? "on" : ""},
        p.problem, h("div", {"class": "sub", text: p.nodes.length + " nodes \u00b7 kept reward " + fmt(kept, 2)})));
    });
    var right = h("div");
    var p = problems[view.problem];
    if (p) {
      right.appendChild(h("h3", {text: p.problem}));
      right.appendChild(h("div", {"class": "note", text: "Nodes in the order they were sampled; each shows its kept candidate's reward. Click a node for its K candidates."}));
      var path = h("div", {"class": "path", id: "node-path"});
      p.nodes.forEach(function (n, j) {
        var kept = n.cands.filter(function (c) { return c.kept; })[0];
        path.appendChild(h("a", {href: hash("trees", view.run, view.step, view.problem, j), "class": "node" + (j === view.node ? " on" : ""),
          "data-node": j, style: "--c:" + (roleColor[n.agent] || "#555")},
          "t" + n.turn + " " + n.agent, h("div", {"class": "sub", text: kept ? "kept " + fmt(kept.reward, 2) : "none kept"})));
      });
      right.appendChild(path);
      if (p.nodes[view.node]) right.appendChild(nodeDetail(p.nodes[view.node], run, view.step));
    }
    sec.appendChild(h("div", {"class": "browser"}, list, right));
  }

  // ---- held-out transcripts ----------------------------------------------------------------------------
  function drawTranscripts() {
    var sec = sections.transcripts, run = D.runs[view.run], tr = run.transcripts;
    sec.textContent = "";
    var runSel = h("select", {id: "tx-run"}, D.runs.map(function (r, i) { return h("option", {value: i, text: r.name}); }));
    runSel.value = view.run;
    runSel.addEventListener("change", function () { go("transcripts", +runSel.value, view.filter); });
    var filt = h("select", {id: "tx-filter"}, [["all", "all episodes"], ["success", "successes"], ["failure", "failures"]].map(function (o) {
      return h("option", {value: o[0], text: o[1]});
    }));
    filt.value = view.filter;
    filt.addEventListener("change", function () { go("transcripts", view.run, filt.value); });
    var eps = tr.episodes.filter(function (e) { return view.filter === "all" || (view.filter === "success") === !!e.success; });
    var nOk = tr.episodes.filter(function (e) { return e.success; }).length;
    sec.appendChild(h("div", {"class": "controls"}, multi() ? ["run ", runSel] : null, "show ", filt,
      h("span", {"class": "note", text: eps.length + " shown; " + nOk + " of " + tr.shown + " succeeded" +
        (tr.shown < tr.total ? " (the first " + tr.shown + " of " + tr.total + " episodes fit in this file)" : "")})));
    sec.appendChild(h("div", {"class": "note", text: "The kept trajectory of each held-out episode of the latest evaluation (eval_transcripts.jsonl; greedy, K = 1)."}));
    var box = h("div", {id: "episodes"});
    eps.forEach(function (e) {
      var ep = h("details", {"class": "episode"}, h("summary", null, h("span", {"class": "badge " + (e.success ? "ok" : "fail"), text: e.success ? "success" : "failure"}),
        " " + e.problem + " \u00b7 " + (e.transcript || []).length + " agent turns \u00b7 return " +
          fmt((e.transcript || []).reduce(function (a, t) { return a + (t.reward || 0); }, 0), 2) + (e.step === 0 ? " \u00b7 evaluated before training" : (e.step !== undefined ? " \u00b7 evaluated after step " + e.step : ""))));
      (e.transcript || []).forEach(function (t) {
        ep.appendChild(h("div", {"class": "turn", style: "--c:" + (roleColor[t.agent] || "#555")},
          h("div", null, "turn " + t.turn + " \u00b7 ", roleSpan(t.agent), " \u00b7 reward " + fmt(t.reward) +
            (t.team !== undefined ? " (team " + fmt(t.team) + ", local " + fmt(t.local) + ")" : "")),
          h("details", null, h("summary", {text: "prompt"}), h("pre", {text: t.prompt})), folded(t.response)));
      });
      box.appendChild(ep);
    });
    sec.appendChild(box);
  }

  // ---- routing -----------------------------------------------------------------------------------------
  function hash() { return "#" + Array.prototype.map.call(arguments, function (x) { return x === null ? "" : encodeURIComponent(x); }).join("/"); }
  function go() { location.hash = hash.apply(null, arguments); }
  function route() {
    var parts = location.hash.replace(/^#/, "").split("/").map(function (x) { try { return decodeURIComponent(x); } catch (e) { return x; } });
    var tab = tabs[parts[0]] ? parts[0] : "overview";
    Object.keys(tabs).forEach(function (k) { sections[k].className = k === tab ? "on" : ""; links[k].className = k === tab ? "on" : ""; });
    var r = parseInt(parts[1], 10);
    view.run = r >= 0 && r < D.runs.length ? r : 0;
    if (tab === "trees") {
      var shown = D.runs[view.run].trees.shown, s = parseInt(parts[2], 10);
      view.step = shown.indexOf(s) >= 0 ? s : (shown.length ? shown[0] : null);
      view.problem = parseInt(parts[3], 10) || 0;
      view.node = parseInt(parts[4], 10) || 0;
      drawTrees();
    } else if (tab === "transcripts") {
      view.filter = ["success", "failure"].indexOf(parts[2]) >= 0 ? parts[2] : "all";
      drawTranscripts();
    }
    document.body.setAttribute("data-view", location.hash || "#overview");
  }

  drawOverview();
  window.addEventListener("hashchange", route);
  route();
  document.body.setAttribute("data-ready", "1");
})();
