// Draws the figures from the JSON block, wires the evidence buttons (zoom the timeline's
// x-axis to a finding's intervals), the GPU picker and, on many nodes, the node picker. Sets
// window.__gpuprofRenderedMs when every figure is drawn, so a browser test or benchmark can
// tell when the page is ready.
(function () {
  "use strict";
  window.__gpuprofScriptStartMs = performance.now(); // plotly.js parsed, nothing drawn yet
  var data = JSON.parse(document.getElementById("gp-data").textContent);
  drawFlames(data.flames || {});
  var config = { responsive: true, displaylogo: false };
  var nodes = data.nodes, fullHeatmap = data.figures["gp-heatmap"];
  var nodePicker = document.getElementById("gp-node");
  if (nodePicker && nodes && !nodes.all && fullHeatmap) {
    // too many GPUs for one heatmap: the first draw already shows only the picked node
    data.figures["gp-heatmap"] = heatmapView(Number(nodePicker.value));
  }
  var ids = Object.keys(data.figures);
  window.__gpuprofDrawMs = {}; // per figure, for the benchmark
  // one figure after the other (JS is single-threaded anyway), so each draw time is its own
  var allDrawn = ids.reduce(function (previous, id) {
    return previous.then(function () {
      var fig = data.figures[id], before = performance.now();
      return Plotly.newPlot(id, fig.data, fig.layout, config).then(function () {
        window.__gpuprofDrawMs[id] = Math.round(performance.now() - before);
      });
    });
  }, Promise.resolve());
  var timeline = document.getElementById("gp-timeline");
  var heatmap = document.getElementById("gp-heatmap");
  var label = document.getElementById("gp-zoom-label");
  var syncing = false;

  function zoom(range) {
    syncing = true;
    var done = [Plotly.relayout(timeline, { "xaxis.range": range })];
    if (heatmap && heatmap.data) { done.push(Plotly.relayout(heatmap, { "xaxis.range": range })); }
    return Promise.all(done).then(function () { syncing = false; });
  }

  allDrawn.then(function () {
    window.__gpuprofRenderedMs = performance.now();
    document.body.setAttribute("data-rendered", "1");
    timeline.on("plotly_relayout", function (ev) {
      if (syncing || !heatmap || !heatmap.data) { return; }
      if (ev["xaxis.range[0]"] !== undefined) {
        Plotly.relayout(heatmap, { "xaxis.range": [ev["xaxis.range[0]"], ev["xaxis.range[1]"]] });
      } else if (ev["xaxis.autorange"]) {
        Plotly.relayout(heatmap, { "xaxis.range": [0, data.end] });
      }
    });
  });

  var position = {};
  Array.prototype.forEach.call(document.querySelectorAll("[data-evidence]"), function (button) {
    button.addEventListener("click", function () {
      var key = button.getAttribute("data-evidence");
      var intervals = data.evidence[key] || [];
      if (!intervals.length) { return; }
      var i = position[key] === undefined ? 0 : (position[key] + 1) % intervals.length;
      position[key] = i;
      var lo = intervals[i][0], hi = intervals[i][1];
      var pad = Math.max((hi - lo) * 0.5, data.end * 0.002);
      zoom([Math.max(0, lo - pad), hi + pad]);
      label.textContent = "evidence " + (i + 1) + " of " + intervals.length + ": " +
        lo.toFixed(2) + "–" + hi.toFixed(2) + " " + data.unit + " (click again for the next)";
      document.getElementById("gp-timeline-section").scrollIntoView({ behavior: "instant" });
    });
  });

  document.getElementById("gp-reset").addEventListener("click", function () {
    label.textContent = "";
    zoom([0, data.end]);
  });

  var picker = document.getElementById("gp-gpu");
  if (picker && data.selector) {
    picker.addEventListener("change", function () {
      var i = Number(picker.value), s = data.selector, tick = 0;
      var x = s.x_deltas[i].map(function (d) { tick += d; return tick / s.x_scale; });
      Plotly.restyle(timeline, { x: [x], y: [s.y[i]], name: "selected: " + s.labels[i] },
                     [s.trace_index]);
    });
  }

  // Flame graphs (icicles) of the Python stacks in each finding's intervals: one SVG per
  // <div class="flame" data-flame="i" data-which="busy|blocked">, outermost call on top,
  // widths proportional to time. Every name goes in as text (textContent), never as markup.
  function drawFlames(flames) {
    var boxes = document.querySelectorAll(".flame[data-flame]");
    Array.prototype.forEach.call(boxes, function (box) {
      var trees = flames[box.getAttribute("data-flame")] || {};
      var tree = trees[box.getAttribute("data-which")];
      if (tree) { drawFlame(box, tree); }
    });
  }

  function drawFlame(box, tree) {
    var NS = "http://www.w3.org/2000/svg", W = 1200, ROW = 17, CHAR = 6.8;
    var svg = document.createElementNS(NS, "svg");
    box.appendChild(svg);
    function depth(node) {
      return 1 + node.c.reduce(function (m, c) { return Math.max(m, depth(c)); }, 0);
    }
    function el(name, attrs) {
      var e = document.createElementNS(NS, name);
      Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
      return e;
    }
    function color(node) {
      if (node === tree) { return "#9e9e9e"; }
      var h = 0;
      for (var i = 0; i < node.n.length; i++) { h = (h * 31 + node.n.charCodeAt(i)) % 997; }
      return node.u ? "hsl(" + (20 + h % 25) + ",85%," + (58 + h % 12) + "%)"
                    : "hsl(" + (200 + h % 30) + ",45%," + (68 + h % 12) + "%)";
    }
    function render(root) {
      while (svg.firstChild) { svg.removeChild(svg.firstChild); }
      var rows = depth(root);
      svg.setAttribute("viewBox", "0 0 " + W + " " + rows * ROW);
      var scale = W / root.v, drawn = 0;
      (function place(node, x, d) {
        var w = node.v * scale;
        if (w < 0.6) { return; }
        var g = el("g", { "data-name": node.n });
        var title = document.createElementNS(NS, "title");
        title.textContent = node.n + (node.f ? " (" + node.f + ")" : "") + " \u2014 " +
          node.v.toFixed(2) + " s, " + (100 * node.v / tree.v).toFixed(1) + "%";
        g.appendChild(title);
        g.appendChild(el("rect", { x: x.toFixed(2), y: d * ROW, width: w.toFixed(2),
                                   height: ROW - 1, fill: color(node) }));
        var fits = Math.floor((w - 6) / CHAR);
        if (fits >= 3) {
          var label = node === tree && root === tree ? "all (" + node.v.toFixed(1) + " s)"
                                                       : node.n;
          if (label.length > fits) { label = label.slice(0, fits - 1) + "\u2026"; }
          var text = el("text", { x: (x + 3).toFixed(2), y: d * ROW + ROW - 5 });
          text.textContent = label;
          g.appendChild(text);
        }
        g.addEventListener("click", function () { render(node === root ? tree : node); });
        svg.appendChild(g);
        drawn += 1;
        var cx = x;
        node.c.forEach(function (c) { place(c, cx, d + 1); cx += c.v * scale; });
      })(root, 0, 0);
      box.setAttribute("data-drawn", String(drawn));
      box.setAttribute("data-root", root.n);
    }
    render(tree);
  }

  // The heatmap figure narrowed to node k's rows (k: index into nodes.names, or "all").
  function heatmapView(k) {
    if (k === "all") { return fullHeatmap; }
    var lo = nodes.bounds[k], hi = nodes.bounds[k + 1], px = nodes.height, full = fullHeatmap;
    var rows = full.data[0];
    var trace = Object.assign({}, rows, { z: rows.z.slice(lo, hi), y: rows.y.slice(lo, hi) });
    var yaxis = Object.assign({}, full.layout.yaxis, {
      showticklabels: true,
      tickmode: "auto",
      title: { text: (hi - lo) + " GPUs on " + nodes.names[k] }
    });
    delete yaxis.tickvals; // node-name ticks of the all-nodes view
    delete yaxis.ticktext;
    var height = Math.min(px.max, Math.max(px.min, px.base + px.row * (hi - lo)));
    var layout = Object.assign({}, full.layout, { yaxis: yaxis, shapes: [], height: height });
    return { data: [trace], layout: layout };
  }

  // Only node k's GPUs in the GPU picker; the selected GPU moves there if it was elsewhere
  // (the red line follows once the timeline is drawn).
  function narrowPicker(k, groups) {
    var current = picker.value;
    picker.textContent = "";
    groups.forEach(function (group) {
      if (k === "all" || Number(group.getAttribute("data-node")) === k) {
        picker.appendChild(group);
      }
    });
    var kept = Array.prototype.some.call(picker.options, function (o) {
      return o.value === current;
    });
    if (kept) { picker.value = current; return; }
    picker.value = picker.options[0].value;
    allDrawn.then(function () { picker.dispatchEvent(new Event("change")); });
  }

  if (nodePicker && nodes) {
    var groups = picker ? Array.prototype.slice.call(picker.querySelectorAll("optgroup")) : [];
    if (!nodes.all && groups.length) { narrowPicker(Number(nodePicker.value), groups); }
    nodePicker.addEventListener("change", function () {
      var k = nodePicker.value === "all" ? "all" : Number(nodePicker.value);
      if (groups.length) { narrowPicker(k, groups); }
      if (!heatmap || !fullHeatmap) { return; }
      allDrawn.then(function () {
        var view = heatmapView(k);
        // keep the x-range the timeline's zoom gave the heatmap
        var range = heatmap.layout.xaxis.range.slice();
        var layout = Object.assign({}, view.layout, {
          xaxis: Object.assign({}, view.layout.xaxis, { range: range })
        });
        return Plotly.react(heatmap, view.data, layout, config);
      }).then(function () {
        heatmap.setAttribute("data-node", String(k));
      });
    });
  }
})();
