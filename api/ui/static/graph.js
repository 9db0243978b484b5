// The graph tab of a run's page: the run's workflow (the waterfall's
// graph, runs.GraphOf on the server: the nodes and edges of the snapshot
// run_created journaled, loop bodies and subagent workflows included) drawn
// as an SVG, each node coloured by its outcome in this run with the
// waterfall's status names. The layout is plain JavaScript: layers by the
// longest path from the roots (the trigger), then a few barycenter sweeps
// that order each layer by its neighbours' places to reduce crossings.
// It costs O(sweeps × (nodes × log nodes + edges)), and the server bounds
// the graph (runs.MaxGraphNodes, MaxGraphEdges). Every id is written as
// text (textContent).
"use strict";

// pal.graph returns the tab's controller: draw(graph, selected) draws it
// (laying it out again only when the workflow changed), and a click on a
// node calls onSelect with the step its detail shows ("" for none).
pal.graph = function (box, metaEl, onSelect) {
  const NS = "http://www.w3.org/2000/svg";
  const W = 172, H = 44, GX = 56, GY = 18, PAD = 16, SWEEPS = 4;
  let key = "", placed = null;

  function svg(tag, cls, attrs) {
    const e = document.createElementNS(NS, tag);
    if (cls) e.setAttribute("class", cls);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    return e;
  }
  const cut = (s, n) => s.length > n ? s.slice(0, n - 1) + "…" : s;

  // layout places each node: its layer (x) and its place in it (y).
  function layout(g) {
    const n = g.nodes.length;
    const idx = new Map(g.nodes.map((x, i) => [x.id, i]));
    const out = Array.from({ length: n }, () => []), inn = Array.from({ length: n }, () => []);
    const indeg = new Array(n).fill(0);
    for (const e of g.edges) {
      const a = idx.get(e.from), b = idx.get(e.to);
      if (a === undefined || b === undefined || a === b) continue;
      out[a].push(b); inn[b].push(a); indeg[b]++;
    }
    // Longest path from the roots, in topological order (Kahn). A
    // workflow has no cycle; a node on one would keep the layer it had.
    const layer = new Array(n).fill(0);
    const queue = [];
    for (let i = 0; i < n; i++) if (indeg[i] === 0) queue.push(i);
    for (let h = 0; h < queue.length; h++) {
      const u = queue[h];
      for (const v of out[u]) {
        layer[v] = Math.max(layer[v], layer[u] + 1);
        if (--indeg[v] === 0) queue.push(v);
      }
    }
    let depth = 0;
    for (let i = 0; i < n; i++) depth = Math.max(depth, layer[i] + 1);
    const layers = Array.from({ length: depth }, () => []);
    for (let i = 0; i < n; i++) layers[layer[i]].push(i);
    const pos = new Array(n).fill(0);
    for (const L of layers) L.forEach((v, i) => { pos[v] = i; });
    // Barycenter sweeps, down then up: a node goes where its
    // neighbours on the other side are, on average.
    const bary = new Array(n).fill(0);
    for (let s = 0; s < SWEEPS; s++) {
      const down = s % 2 === 0;
      for (let k = 0; k < depth; k++) {
        const L = layers[down ? k : depth - 1 - k];
        for (const v of L) {
          const nb = down ? inn[v] : out[v];
          let sum = 0;
          for (const u of nb) sum += pos[u];
          bary[v] = nb.length ? sum / nb.length : pos[v];
        }
        L.sort((a, b) => bary[a] - bary[b] || pos[a] - pos[b]);
        L.forEach((v, i) => { pos[v] = i; });
      }
    }
    let most = 0;
    for (const L of layers) most = Math.max(most, L.length);
    const xy = new Array(n);
    for (let i = 0; i < n; i++) {
      const off = (most - layers[layer[i]].length) * (H + GY) / 2;
      xy[i] = { x: PAD + layer[i] * (W + GX), y: PAD + off + pos[i] * (H + GY) };
    }
    return { idx, xy, width: 2 * PAD + Math.max(1, depth) * (W + GX) - GX, height: 2 * PAD + Math.max(1, most) * (H + GY) - GY };
  }

  function defs() {
    const d = svg("defs");
    const m = svg("marker", "", { id: "g-arrow", viewBox: "0 0 10 10", refX: "10", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" });
    m.appendChild(svg("path", "arrow", { d: "M 0 0 L 10 5 L 0 10 z" }));
    const p = svg("pattern", "", { id: "g-interrupted", width: "6", height: "6", patternUnits: "userSpaceOnUse", patternTransform: "rotate(135)" });
    p.appendChild(svg("rect", "stripe-a", { width: "3", height: "6" }));
    p.appendChild(svg("rect", "stripe-b", { x: "3", width: "3", height: "6" }));
    d.append(m, p);
    return d;
  }

  function nodeClass(x, selected) {
    return "gnode status-" + x.status + (x.step_id ? " has-step" : "") + (x.step_id && x.step_id === selected ? " selected" : "");
  }

  function nodeTitle(x) {
    const what = { not_reached: "not reached", child: "runs in the child run" }[x.status] || x.status;
    return x.id + " (" + x.type + "): " + what + (x.steps > 1 ? ", " + x.steps + " steps" : "") + (x.step_id ? " — click for step " + x.step_id : "");
  }

  function drawAll(g, selected) {
    const s = svg("svg", "graph-svg", { width: placed.width, height: placed.height, viewBox: "0 0 " + placed.width + " " + placed.height });
    s.appendChild(defs());
    const edges = svg("g", "edges");
    for (const e of g.edges) {
      const a = placed.idx.get(e.from), b = placed.idx.get(e.to);
      if (a === undefined || b === undefined) continue;
      const p = placed.xy[a], q = placed.xy[b];
      const x1 = p.x + W, y1 = p.y + H / 2, x2 = q.x, y2 = q.y + H / 2;
      const dx = Math.max(GX / 2, (x2 - x1) / 2);
      const path = svg("path", e.contains ? "contains" : "edge" + (e.condition ? " conditional" : ""),
        { d: `M ${x1} ${y1} C ${x1 + dx} ${y1}, ${x2 - dx} ${y2}, ${x2} ${y2}`, "marker-end": "url(#g-arrow)" });
      path.dataset.from = e.from;
      path.dataset.to = e.to;
      const t = svg("title");
      t.textContent = e.contains ? e.from + " runs the workflow it holds" : e.from + " → " + e.to + (e.condition ? " if " + e.condition : "");
      path.appendChild(t);
      edges.appendChild(path);
    }
    s.appendChild(edges);
    const nodes = svg("g", "nodes");
    g.nodes.forEach((x, i) => {
      const p = placed.xy[i];
      const n = svg("g", nodeClass(x, selected), { transform: `translate(${p.x},${p.y})` });
      n.dataset.node = x.id;
      n.dataset.status = x.status;
      n.dataset.step = x.step_id || "";
      const t = svg("title");
      t.textContent = nodeTitle(x);
      n.appendChild(t);
      n.appendChild(svg("rect", "box", { width: W, height: H, rx: "5" }));
      const id = svg("text", "gid", { x: "8", y: "18" });
      id.textContent = cut(x.id, 22);
      const ty = svg("text", "gtype", { x: "8", y: "35" });
      ty.textContent = x.type + (x.steps > 1 ? " · " + x.steps + " steps" : "");
      n.append(id, ty);
      nodes.appendChild(n);
    });
    s.appendChild(nodes);
    box.replaceChildren(s);
  }

  function draw(g, selected) {
    if (!g) {
      box.replaceChildren(pal.el("p", "meta", "A plain LLM run has no workflow to draw."));
      metaEl.textContent = "";
      return;
    }
    const k = g.nodes.map(x => x.id).join("\n") + "\n\n" + g.edges.map(e => e.from + "\n" + e.to).join("\n");
    if (k !== key || !box.querySelector("svg")) {
      key = k;
      const t0 = performance.now();
      placed = layout(g);
      const t1 = performance.now();
      drawAll(g, selected);
      // How long the layout and the drawing took, for the curious.
      box.dataset.layoutMs = (t1 - t0).toFixed(1);
      box.dataset.drawMs = (performance.now() - t1).toFixed(1);
    } else {
      // The same workflow: only the outcomes change.
      const els = box.querySelectorAll(".gnode");
      g.nodes.forEach((x, i) => {
        const n = els[i];
        n.setAttribute("class", nodeClass(x, selected));
        n.dataset.status = x.status;
        n.dataset.step = x.step_id || "";
        n.querySelector("title").textContent = nodeTitle(x);
        n.querySelector(".gtype").textContent = x.type + (x.steps > 1 ? " · " + x.steps + " steps" : "");
      });
    }
    const edges = g.edges.filter(e => !e.contains).length;
    metaEl.textContent = g.nodes.length + " node" + (g.nodes.length === 1 ? "" : "s") + " · " + edges + " edge" + (edges === 1 ? "" : "s") +
      (g.truncated ? " · the workflow is larger: only its first nodes are drawn" : "");
  }

  box.addEventListener("click", ev => {
    const n = ev.target.closest("[data-node]");
    if (n) onSelect(n.dataset.step || "");
  });
  return { draw };
};
