// A run's waterfall. The server computes it from the fold of the journal
// (GET /v1/runs/{id}/waterfall); this page only draws it, and draws it
// again on each event of the run's SSE feed while the run is in flight.
// The feed also carries the text LLM steps stream (event: delta, ?deltas=1),
// shown growing in the step's row and detail panel until the step ends.
// The Journal tab beside it lists the journal's events (journal.js), the
// Graph tab draws the run's workflow (graph.js). The axis is compressed:
// long stretches in which the run only waited are drawn as breaks
// (axis.js). A step's detail shows an LLM step's conversation
// (conversation.js).
"use strict";

(function () {
  const runID = pal.meta("pal-run");
  const user = pal.meta("pal-user");
  const rowsEl = document.getElementById("rows");
  const overlay = document.getElementById("overlay");
  const axis = document.getElementById("axis");
  const detail = document.getElementById("detail");
  const approvals = document.getElementById("approvals");
  const cancelBtn = document.getElementById("cancel");
  const lanesBtn = document.getElementById("lanes-view");
  const axisBtn = document.getElementById("axis-mode");
  const zoomBtn = document.getElementById("zoom-reset");
  const terminal = new Set(["succeeded", "failed", "cancelled"]);
  const expanded = new Set();
  const collapsed = new Set(); // rows the user folded that would open by default
  const children = new Map(); // child run id → its waterfall, while folded out
  let wf = null;
  let selected = "";
  let es = null;
  let lanesView = false; // one row per lane instead of one per step
  let tab = "waterfall"; // or "journal", "graph"
  let axisMode = "compressed"; // or "linear"
  let scale = null; // the axis: time → % of the track (makeScale)
  let zoom = null; // {t0, t1}: the stretch of time a drag on the axis chose

  // streamed is each step's text as its deltas tell it, by step id: the
  // call it belongs to, the next index, and the text and thinking so far.
  // The rule is event.Streamed's (Go): a later call starts the text again,
  // an earlier or ended one is dropped, a delta is taken once, in order.
  const streamed = new Map();
  function takeDelta(d) {
    let s = streamed.get(d.step_id);
    if (!s) { s = { call: 0, next: 0, ended: 0, text: "", reasoning: "", attempt: 0 }; streamed.set(d.step_id, s); }
    if (d.call < s.ended || d.call < s.call) return false;
    if (d.call > s.call) {
      if (d.index !== 0) return false;
      Object.assign(s, { call: d.call, next: 0, text: "", reasoning: "" });
    } else if (d.index !== s.next) return false;
    s.next = d.index + 1;
    s.attempt = d.attempt;
    if (d.kind === "reasoning") s.reasoning += d.text; else s.text += d.text;
    return true;
  }
  // endStep: the journal ended the step's call at seq; its text is the
  // journal's now.
  function endStep(stepID, seq) {
    const s = streamed.get(stepID);
    if (!s) { streamed.set(stepID, { call: 0, next: 0, ended: seq, text: "", reasoning: "", attempt: 0 }); return; }
    if (seq <= s.ended) return;
    if (s.call < seq) Object.assign(s, { call: 0, next: 0, text: "", reasoning: "" });
    s.ended = seq;
  }
  const streamingText = key => { const s = streamed.get(key); return s && (s.text || s.reasoning) ? s : null; };
  // tail is the end of a long text, as a row has room for it.
  const tail = (t, n) => t.length > n ? "…" + t.slice(t.length - n) : t;

  // Rows with few children open by default; a 1,000-iteration loop stays
  // folded until asked.
  const openByDefault = r => r.children > 0 && r.children <= 10;
  const isOpen = (key, r) => expanded.has(key) || (openByDefault(r) && !collapsed.has(key));

  function pct(ms, span) { return span > 0 ? Math.max(0, Math.min(100, (ms / span) * 100)) : 0; }

  // niceStep picks a tick interval giving at most n ticks after 0.
  function niceStep(span, n) {
    const raw = span / n;
    const p = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 0.001))));
    for (const m of [1, 2, 5, 10]) if (raw <= m * p) return m * p;
    return 10 * p;
  }

  // busyOf adds the times in which some step of w (and of the child runs
  // folded out, shifted onto this run's axis) worked: each attempt but
  // its wait. A loop's or an agent's bar spans its nested steps, which
  // say when it worked; folded rows count too, so folding changes
  // nothing.
  function busyOf(w, shift, out, seen) {
    if (seen.has(w.run_id)) return;
    seen.add(w.run_id);
    for (const r of w.rows) {
      if (r.node_type !== "loop" && r.node_type !== "agent") {
        for (const s of r.segments) {
          const a = s.start_ms + shift, b = s.end_ms + shift;
          if (s.wait) out.push([a, s.wait.start_ms + shift], [s.wait.end_ms + shift, b]);
          else out.push([a, b]);
        }
      }
      const c = r.child_run_id && children.get(r.child_run_id);
      if (c) busyOf(c, Date.parse(c.created_at) - Date.parse(w.created_at) + shift, out, seen);
    }
  }

  // makeScale is the axis for a track px wide: x(ms) gives the % of the
  // track, pieces the linear stretches and the breaks between them.
  function makeScale(span, px) {
    if (zoom) {
      // Zoomed: linear over the chosen stretch; what lies outside is
      // clipped by the track (body[data-zoomed]).
      const { t0, t1 } = zoom;
      return { x: ms => Math.max(-1, Math.min(101, (ms - t0) / (t1 - t0) * 100)), pieces: [{ t0, t1, x0: 0, x1: 100 }], breaks: [] };
    }
    const lin = { x: ms => pct(ms, span), pieces: [{ t0: 0, t1: span, x0: 0, x1: 100 }], breaks: [] };
    if (axisMode !== "compressed" || !(span > 0) || !(px > 0)) return lin;
    const iv = [];
    busyOf(wf, 0, iv, new Set());
    return pal.compressedScale(iv, span, px) || lin;
  }

  // drawAxis writes the ticks of each linear stretch of the axis, true
  // to the real times on each side of a break, and each break's length.
  // A tick label every 90 px at least, so labels such as "0.00 ms" and
  // "2.00 s" never run together on a narrow window.
  function drawAxis(span) {
    const frag = document.createDocumentFragment();
    const px = axis.clientWidth;
    const taken = []; // [left, right] in px of the labels placed
    const free = (l, r) => taken.every(([a, b]) => r <= a || l >= b);
    for (const b of scale.breaks) {
      const el = pal.el("span", "axis-break", pal.ms(b.t1 - b.t0));
      el.style.left = b.x0 + "%";
      el.style.width = (b.x1 - b.x0) + "%";
      el.title = "the run only waited for " + pal.ms(b.t1 - b.t0) + ", from +" + pal.ms(b.t0) + " to +" + pal.ms(b.t1) + ": drawn " + pal.axisBreakPx + " px wide";
      el.dataset.ms = b.t1 - b.t0;
      frag.appendChild(el);
      taken.push([b.x0 / 100 * px, b.x1 / 100 * px]);
    }
    const ticks = [];
    for (const p of scale.pieces) {
      if (p.brk) continue;
      const w = (p.x1 - p.x0) / 100 * px, dur = p.t1 - p.t0;
      if (p.t0 > 0) ticks.push({ t: p.t0, start: true }); // just after a break
      const step = niceStep(dur || 1, Math.max(1, Math.min(8, Math.floor(w / 90))));
      for (let t = Math.ceil(p.t0 / step - 1e-9) * step; t <= p.t1 + 1e-9; t += step) {
        if (p.t0 > 0 && t - p.t0 < step / 2) continue;
        ticks.push({ t });
      }
    }
    ticks.sort((a, b) => (b.start ? 1 : 0) - (a.start ? 1 : 0)); // a break's ends first
    const placed = [];
    for (const k of ticks) {
      const x = scale.x(k.t) / 100 * px;
      k.left = k.t === 0 || k.start;
      const l = k.left ? x : x - 45, r = k.left ? x + 90 : x + 45;
      if (!free(l, r)) continue;
      taken.push([l, r]);
      placed.push(k);
    }
    for (const k of placed.sort((a, b) => a.t - b.t)) {
      const tick = pal.el("span", "tick" + (k.left ? " left" : ""), pal.ms(k.t));
      tick.style.left = scale.x(k.t) + "%";
      tick.dataset.ms = k.t;
      frag.appendChild(tick);
    }
    axis.replaceChildren(frag);
    document.body.dataset.axisWidth = px; // the width the ticks were laid out for
    document.body.dataset.axis = zoom ? "zoomed" : scale.breaks.length ? "compressed" : "linear";
    document.body.dataset.breaks = scale.breaks.length;
    document.body.dataset.zoomed = zoom ? "true" : "false";
  }

  // timeAt is the time at x% of the track: the scale inverted.
  function timeAt(x) {
    for (const p of scale.pieces) {
      if (x <= p.x1) return p.x1 > p.x0 ? p.t0 + Math.max(0, x - p.x0) / (p.x1 - p.x0) * (p.t1 - p.t0) : p.t0;
    }
    const last = scale.pieces[scale.pieces.length - 1];
    return last ? last.t1 : 0;
  }

  // A drag across the axis zooms into the stretch it covers (at least
  // 8 px; at most down to a hundredth of a millisecond); Reset zoom
  // goes back.
  axis.addEventListener("mousedown", ev => {
    if (ev.button !== 0 || !wf || tab !== "waterfall") return;
    ev.preventDefault();
    const box = axis.getBoundingClientRect();
    const at = e => Math.max(0, Math.min(box.width, e.clientX - box.left));
    const x0 = at(ev);
    const sel = pal.el("div", "zoom-sel");
    axis.appendChild(sel);
    const move = e => {
      const x1 = at(e);
      sel.style.left = Math.min(x0, x1) + "px";
      sel.style.width = Math.abs(x1 - x0) + "px";
    };
    const up = e => {
      window.removeEventListener("mousemove", move);
      window.removeEventListener("mouseup", up);
      sel.remove();
      const x1 = at(e);
      if (Math.abs(x1 - x0) < 8) return;
      const t0 = timeAt(Math.min(x0, x1) / box.width * 100), t1 = timeAt(Math.max(x0, x1) / box.width * 100);
      if (t1 - t0 < 0.01) return;
      zoom = { t0, t1 };
      draw();
    };
    move(ev);
    window.addEventListener("mousemove", move);
    window.addEventListener("mouseup", up);
  });

  // visibleRows flattens the tree as it is folded: a run's rows, and the
  // rows of child runs folded out under their step, shifted onto this
  // run's axis.
  function visibleRows(w, shift, depth0, prefix, out) {
    let hideBelow = Infinity;
    for (const r of w.rows) {
      if (r.depth > hideBelow) continue;
      hideBelow = Infinity;
      const key = prefix + r.step_id;
      const hasKids = r.children > 0 || !!r.child_run_id;
      const open = hasKids && (r.child_run_id ? expanded.has(key) : isOpen(key, r));
      out.push({ r, key, shift, depth: depth0 + r.depth, hasKids, open, run: w.run_id });
      if (hasKids && !open) { hideBelow = r.depth; continue; }
      const child = r.child_run_id && children.get(r.child_run_id);
      if (child) {
        const off = (Date.parse(child.created_at) - Date.parse(w.created_at)) + shift;
        visibleRows(child, off, depth0 + r.depth + 1, key + "/", out);
      }
    }
    return out;
  }

  function drawRow(v, span) {
    const r = v.r;
    const row = pal.el("div", "wf-row status-" + r.status + (v.key === selected ? " selected" : ""));
    row.dataset.step = r.step_id;
    row.dataset.key = v.key;
    row.dataset.run = v.run;
    const name = pal.el("div", "wf-name");
    name.style.paddingLeft = (6 + v.depth * 14) + "px";
    if (v.hasKids) {
      const t = pal.el("button", "toggle", v.open ? "▾" : "▸");
      t.title = v.open ? "fold" : (r.child_run_id ? "show the child run's steps" : "show " + r.children + " nested steps");
      t.dataset.toggle = v.key;
      name.appendChild(t);
    } else {
      name.appendChild(pal.el("span", "toggle-space"));
    }
    name.appendChild(pal.el("span", "step-id", r.step_id));
    // A tool call of an agent is labelled by its tool, not "agent".
    name.appendChild(pal.el("span", "node-type", r.tool || r.node_type || ""));
    if (r.model) name.appendChild(pal.el("span", "model", r.model));
    if (r.retries) name.appendChild(pal.el("span", "badge", r.retries + " retr" + (r.retries === 1 ? "y" : "ies")));
    if (r.child_run_id) {
      const a = pal.el("a", "child", "child run");
      a.href = "/runs/" + encodeURIComponent(r.child_run_id);
      name.appendChild(a);
    }
    if (r.copied_from) {
      const a = pal.el("a", "copied badge", "copied");
      a.href = "/runs/" + encodeURIComponent(r.copied_from.run_id);
      a.title = "copied from run " + r.copied_from.run_id + " (seq " + r.copied_from.seq + "), not run again";
      name.appendChild(a);
    }
    row.appendChild(name);
    const track = pal.el("div", "wf-track");
    for (const s of r.segments) {
      const start = s.start_ms + v.shift, end = s.end_ms + v.shift;
      const seg = pal.el("div", "seg " + s.outcome + (s.open ? " open" : ""));
      const x0 = scale.x(start), x1 = scale.x(end);
      seg.style.left = x0 + "%";
      seg.style.width = (x1 - x0) + "%";
      seg.dataset.attempt = s.attempt;
      seg.dataset.outcome = s.outcome;
      // Attempt 0 stands for a loop or an agent not journaled yet: its
      // nested steps' span.
      seg.title = (s.attempt ? "attempt " + s.attempt : "its nested steps") + (s.tries > 1 ? " (" + s.tries + " tries)" : "") + ": " + s.outcome +
        ", " + pal.ms(s.end_ms - s.start_ms) + (s.error ? " — " + s.error : "");
      if (s.wait) {
        // Placed on the axis, which may be compressed inside the bar.
        const wait = pal.el("div", "wait");
        const segW = Math.max(x1 - x0, 1e-9);
        const w0 = scale.x(s.wait.start_ms + v.shift), w1 = scale.x(s.wait.end_ms + v.shift);
        wait.style.left = ((w0 - x0) / segW) * 100 + "%";
        wait.style.width = ((w1 - w0) / segW) * 100 + "%";
        wait.dataset.reason = s.wait.reason || "";
        wait.title = "waited for " + (s.wait.reason || "input") + ": " + pal.ms(s.wait.end_ms - s.wait.start_ms) + (s.wait.open ? " so far" : "");
        seg.appendChild(wait);
      }
      track.appendChild(seg);
    }
    const st = v.run === runID && streamingText(r.step_id);
    if (st) track.appendChild(pal.el("span", "stream", tail(st.text || st.reasoning, 160)));
    row.appendChild(track);
    return row;
  }

  // laneRows draws the lane view: one row per lane, each holding the
  // steps of this run that ran in it, one after another, so steps that ran
  // at once overlap on rows of their own. The server lays them out
  // (row.lane); a click on a bar selects its step.
  function laneRows(span) {
    const rows = [], counts = [];
    for (let i = 0; i < wf.lanes; i++) {
      const row = pal.el("div", "wf-row lane");
      row.dataset.lane = i;
      const name = pal.el("div", "wf-name");
      name.appendChild(pal.el("span", "toggle-space"));
      name.appendChild(pal.el("span", "step-id", "lane " + (i + 1)));
      row.appendChild(name);
      row.appendChild(pal.el("div", "wf-track"));
      rows.push(row);
      counts.push(0);
    }
    for (const r of wf.rows) {
      if (r.lane < 0 || r.lane >= rows.length) continue;
      counts[r.lane]++;
      const track = rows[r.lane].lastChild;
      for (const s of r.segments) {
        const seg = pal.el("div", "seg " + s.outcome + (s.open ? " open" : "") + (r.step_id === selected ? " selected" : ""));
        seg.style.left = scale.x(s.start_ms) + "%";
        seg.style.width = (scale.x(s.end_ms) - scale.x(s.start_ms)) + "%";
        seg.dataset.key = r.step_id;
        seg.dataset.step = r.step_id;
        seg.dataset.attempt = s.attempt;
        seg.dataset.outcome = s.outcome;
        seg.title = r.step_id + " · attempt " + s.attempt + ": " + s.outcome + ", " + pal.ms(s.end_ms - s.start_ms) + (s.error ? " — " + s.error : "");
        seg.textContent = r.step_id; // cut to the bar's width
        track.appendChild(seg);
      }
    }
    rows.forEach((row, i) => row.firstChild.appendChild(pal.el("span", "node-type", counts[i] + " step" + (counts[i] === 1 ? "" : "s"))));
    return rows;
  }

  // showStream updates a streaming step's row and detail panel in place:
  // a delta redraws no more than its own text.
  function showStream(stepID) {
    const st = streamingText(stepID);
    if (!st) return;
    for (const row of rowsEl.querySelectorAll(".wf-row")) {
      if (row.dataset.step !== stepID || row.dataset.run !== runID) continue;
      const track = row.querySelector(".wf-track");
      let span = track.querySelector(".stream");
      if (!span) { span = pal.el("span", "stream"); track.appendChild(span); }
      span.textContent = tail(st.text || st.reasoning, 160);
    }
    if (selected === stepID && !detail.hidden) {
      const pre = detail.querySelector("pre.streaming");
      if (pre) pre.textContent = st.text; else drawDetail();
      const think = detail.querySelector("pre.thinking");
      if (think) think.textContent = st.reasoning;
    }
  }

  function drawMarkers() {
    const frag = document.createDocumentFragment();
    // Each break of a compressed axis, across the rows.
    for (const b of scale.breaks) {
      const band = pal.el("div", "wf-break");
      band.style.left = b.x0 + "%";
      band.style.width = (b.x1 - b.x0) + "%";
      band.title = "the run only waited for " + pal.ms(b.t1 - b.t0);
      frag.appendChild(band);
    }
    // Zoomed, only the markers of the stretch shown.
    const shown = ms => !zoom || (ms >= zoom.t0 && ms <= zoom.t1);
    for (const d of wf.drives) {
      if (!shown(d.at_ms)) continue;
      const m = pal.el("div", "marker drive" + (d.interrupted ? " interrupted" : "") + (scale.x(d.at_ms) > 70 ? " flip" : ""));
      m.style.left = scale.x(d.at_ms) + "%";
      m.dataset.worker = d.worker;
      const label = "drive " + d.count + " · " + d.worker + (d.interrupted ? " · previous drive interrupted" : "");
      m.title = label + " at " + pal.ms(d.at_ms);
      m.appendChild(pal.el("span", "label", label));
      frag.appendChild(m);
    }
    for (const k of wf.marks) {
      if (!shown(k.at_ms)) continue;
      const m = pal.el("div", "marker mark kind-" + k.kind + (scale.x(k.at_ms) > 70 ? " flip" : ""));
      m.style.left = scale.x(k.at_ms) + "%";
      m.dataset.kind = k.kind;
      m.title = k.kind + (k.step_id ? " (" + k.step_id + ")" : "") + " at " + pal.ms(k.at_ms) + (k.data ? ": " + JSON.stringify(k.data) : "");
      m.appendChild(pal.el("span", "label", k.kind.replace(/_/g, " ")));
      frag.appendChild(m);
    }
    overlay.replaceChildren(frag);
    staggerLabels();
  }

  // staggerLabels puts each marker's label on the first line where it
  // overlaps no label to its left, so markers close together (a drive
  // and the anomaly it found) keep readable labels.
  function staggerLabels() {
    const labels = [...overlay.querySelectorAll(".marker .label")];
    const boxes = labels.map(l => l.getBoundingClientRect());
    if (boxes.every(b => b.width === 0)) return; // not shown: laid out when it is
    const order = labels.map((_, i) => i).sort((a, b) => boxes[a].left - boxes[b].left);
    const ends = []; // each line's rightmost label edge so far
    for (const i of order) {
      let line = 0;
      while (line < ends.length && boxes[i].left < ends[line] + 4) line++;
      ends[line] = boxes[i].right;
      labels[i].style.top = (line * 15 - 1) + "px";
    }
    // Room above the first row for every line of labels.
    rowsEl.style.paddingTop = Math.max(28, ends.length * 15 + 2) + "px";
  }

  function draw() {
    const t0 = performance.now();
    const span = wf.span_ms;
    document.getElementById("run-status").textContent = wf.status;
    document.getElementById("run-status").className = "status " + wf.status;
    document.body.dataset.status = wf.status;
    document.body.dataset.lastSeq = wf.last_seq;
    const meta = [wf.workflow || "plain LLM run", "created " + pal.time(wf.created_at),
      (terminal.has(wf.status) ? "took " : "running for ") + pal.ms(span), wf.drives.length + " drive" + (wf.drives.length === 1 ? "" : "s")];
    if (wf.lanes > 1) meta.push("at most " + wf.lanes + " steps at once");
    if (wf.usage.total_tokens) meta.push(wf.usage.total_tokens + " tokens");
    if (wf.usage.cost_usd) meta.push(pal.cost(wf.usage.cost_usd));
    if (wf.error) meta.push("error: " + wf.error);
    document.getElementById("run-meta").textContent = meta.join(" · ");
    if (wf.parent_run_id) {
      const a = pal.el("a", "", " parent run");
      a.href = "/runs/" + encodeURIComponent(wf.parent_run_id);
      document.getElementById("run-meta").appendChild(a);
    }
    if (wf.forked_from) {
      const a = pal.el("a", "forked", " forked from " + wf.forked_from.run_id + " at " + wf.forked_from.step_id);
      a.href = "/runs/" + encodeURIComponent(wf.forked_from.run_id);
      document.getElementById("run-meta").appendChild(a);
    }
    // The detail panel first: the page makes room for it, and the axis
    // is laid out for the width left.
    if (selected) drawDetail();
    scale = makeScale(span, axis.clientWidth);
    drawAxis(span);
    axisBtn.hidden = !!zoom || (axisMode === "compressed" && scale.breaks.length === 0);
    zoomBtn.hidden = !zoom;
    axisBtn.textContent = axisMode === "compressed" ? "Linear axis" : "Compressed axis";
    const frag = document.createDocumentFragment();
    if (lanesView) for (const row of laneRows(span)) frag.appendChild(row);
    else for (const v of visibleRows(wf, 0, 0, "", [])) frag.appendChild(drawRow(v, span));
    rowsEl.replaceChildren(overlay, frag);
    document.body.dataset.view = lanesView ? "lanes" : "steps";
    lanesBtn.textContent = lanesView ? "Step view" : "Lane view";
    drawMarkers();
    if (tab === "graph") graphView.draw(wf.graph, selected);
    drawApprovals();
    cancelBtn.hidden = terminal.has(wf.status) || !pal.may("cancel");
    // The run's actions (actions.js) follow its status and steps.
    document.dispatchEvent(new CustomEvent("pal:waterfall", { detail: wf }));
    // How long drawing took, for the benchmark and the curious.
    document.body.dataset.drawMs = (performance.now() - t0).toFixed(1);
    document.body.dataset.drawnAt = performance.now().toFixed(1);
  }

  function mayDecide(r) {
    if (!pal.may("approve")) return false;
    const a = r.approval && r.approval.approvers;
    return !a || a.length === 0 || a.includes(user);
  }

  function approvalBox(r) {
    const box = pal.el("div", "approval");
    box.dataset.step = r.step_id;
    box.appendChild(pal.el("h3", "", "Step " + r.step_id + " waits for approval"));
    box.appendChild(pal.el("p", "prompt", (r.approval && r.approval.prompt) || "(no prompt)"));
    const who = r.approval && r.approval.approvers && r.approval.approvers.length ? r.approval.approvers.join(", ") : "anyone with scope approve";
    box.appendChild(pal.el("p", "approvers", "May decide: " + who));
    if (mayDecide(r)) {
      const comment = pal.el("input", "comment");
      comment.placeholder = "comment (optional)";
      comment.maxLength = 1000;
      const ok = pal.el("button", "approve", "Approve");
      const no = pal.el("button", "reject danger", "Reject");
      const decide = async decision => {
        ok.disabled = no.disabled = true;
        try {
          await pal.api("POST", "/v1/runs/" + encodeURIComponent(runID) + "/approve",
            { step_id: r.step_id, decision, comment: comment.value });
          pal.showError(null);
        } catch (e) { pal.showError(e); ok.disabled = no.disabled = false; }
        refresh();
      };
      ok.addEventListener("click", () => decide("approve"));
      no.addEventListener("click", () => decide("reject"));
      box.append(comment, ok, no);
    } else {
      box.appendChild(pal.el("p", "note", "You (" + user + ") may not decide this step."));
    }
    return box;
  }

  function drawApprovals() {
    const waiting = wf.rows.filter(r => r.status === "waiting" && r.wait_reason === "approval");
    approvals.hidden = waiting.length === 0;
    // Keep boxes being typed in; rebuild when the set changes.
    const ids = waiting.map(r => r.step_id).join("\n");
    if (approvals.dataset.ids === ids) return;
    approvals.dataset.ids = ids;
    approvals.replaceChildren(...waiting.map(approvalBox));
  }

  function kv(dl, k, v) {
    if (v === undefined || v === null || v === "") return;
    dl.appendChild(pal.el("dt", "", k));
    dl.appendChild(pal.el("dd", "", v));
  }

  function findSelected() {
    for (const v of visibleRows(wf, 0, 0, "", [])) if (v.key === selected) return v;
    // A step folded away, selected in the lane view.
    const r = wf.rows.find(r => r.step_id === selected);
    return r ? { r, key: r.step_id } : null;
  }

  function drawDetail() {
    if (tab === "journal") { detail.hidden = true; return; }
    const v = findSelected();
    if (!v) { detail.hidden = true; return; }
    const r = v.r;
    detail.hidden = false;
    const close = pal.el("button", "close", "×");
    close.addEventListener("click", () => { selected = ""; detail.hidden = true; draw(); });
    const h = pal.el("h2", "", r.step_id);
    const dl = pal.el("dl");
    kv(dl, "Node type", r.node_type);
    kv(dl, "Status", r.status + (r.wait_reason ? " (" + r.wait_reason + ")" : ""));
    kv(dl, "Idempotency key", r.idempotency_key);
    kv(dl, "Model", r.model);
    if (r.usage) {
      let tokens = r.usage.input_tokens + " in, " + r.usage.output_tokens + " out, " + r.usage.total_tokens + " total";
      if (r.usage.cache_read_tokens || r.usage.cache_write_tokens) {
        tokens += "; cache " + (r.usage.cache_read_tokens || 0) + " read, " + (r.usage.cache_write_tokens || 0) + " written";
      }
      if (r.usage.reasoning_tokens) tokens += "; " + r.usage.reasoning_tokens + " reasoning";
      kv(dl, "Tokens", tokens);
      kv(dl, "Cost", pal.cost(r.usage.cost_usd) || "$0");
    }
    kv(dl, "Delivery", r.delivery);
    if (r.receipt) kv(dl, "Receipt", r.receipt.status + (r.receipt.http_status ? " (HTTP " + r.receipt.http_status + ")" : "") +
      (r.receipt.connector ? " · " + r.receipt.connector : "") + (r.receipt.target ? " → " + r.receipt.target : ""));
    kv(dl, "Child run", r.child_run_id);
    kv(dl, "Error", r.error ? r.error + (r.class ? " [" + r.class + "]" : "") : "");
    const tbl = pal.el("table", "attempts");
    const head = pal.el("tr");
    for (const c of ["Attempt", "Model", "Start", "Duration", "Waited", "Outcome", "Error"]) head.appendChild(pal.el("th", "", c));
    tbl.appendChild(head);
    for (const s of r.segments) {
      if (!s.attempt) continue; // a loop's or agent's span, not an attempt
      const tr = pal.el("tr", "attempt");
      tr.appendChild(pal.el("td", "", s.attempt + (s.tries > 1 ? " ×" + s.tries : "")));
      tr.appendChild(pal.el("td", "", s.model || ""));
      tr.appendChild(pal.el("td", "", "+" + pal.ms(s.start_ms)));
      tr.appendChild(pal.el("td", "", pal.ms(s.end_ms - s.start_ms) + (s.open ? " so far" : "")));
      tr.appendChild(pal.el("td", "", s.wait ? pal.ms(s.wait.end_ms - s.wait.start_ms) : ""));
      tr.appendChild(pal.el("td", "outcome " + s.outcome, s.outcome));
      tr.appendChild(pal.el("td", "", s.error || ""));
      tbl.appendChild(tr);
    }
    const parts = [close, h, dl, pal.el("h3", "", "Attempts"), tbl];
    const st = v.run === runID && streamingText(r.step_id);
    if (st) {
      // The answer as the model writes it (the journal has it once the
      // step completes).
      parts.push(pal.el("h3", "", "Streaming (attempt " + st.attempt + ")"));
      if (st.reasoning) parts.push(pal.el("pre", "thinking", st.reasoning));
      parts.push(pal.el("pre", "streaming", st.text));
    }
    const conv = pal.conversationOf(r, v.run && v.run !== runID ? children.get(v.run) : wf);
    if (conv) parts.push(pal.el("h3", "", "Conversation"), pal.drawConversation(conv));
    if (r.input !== undefined) parts.push(pal.el("h3", "", "Input (rendered)"), pal.el("pre", "input", pal.json(r.input)));
    if (r.output !== undefined) parts.push(pal.el("h3", "", "Output"), pal.el("pre", "output", pal.json(r.output)));
    detail.replaceChildren(...parts);
  }

  let inflight = false, again = false, timer = null;
  async function refresh() {
    if (inflight) { again = true; return; }
    inflight = true;
    clearTimeout(timer);
    try {
      wf = await pal.api("GET", "/v1/runs/" + encodeURIComponent(runID) + "/waterfall");
      // A step that has ended has its answer in the journal: its deltas,
      // which the feed may still hold, are over.
      for (const r of wf.rows) if (r.status === "completed" || r.status === "failed") endStep(r.step_id, wf.last_seq);
      for (const id of [...children.keys()]) {
        children.set(id, await pal.api("GET", "/v1/runs/" + encodeURIComponent(id) + "/waterfall"));
      }
      draw();
      pal.showError(null);
    } catch (e) {
      pal.showError(e);
    }
    inflight = false;
    if (again) { again = false; setTimeout(refresh, 150); return; }
    if (wf && terminal.has(wf.status) && es) { es.close(); es = null; }
    if (wf && !terminal.has(wf.status)) {
      follow();
      // Open bars grow with time even when no event arrives.
      timer = setTimeout(refresh, 3000);
    }
  }

  // follow listens to the run's events (the session cookie authenticates
  // the EventSource) and redraws on each.
  const kinds = ["run_created", "run_resumed", "step_started", "step_completed", "step_failed", "step_retrying", "step_waiting",
    "side_effect_claimed", "side_effect_delivered", "child_run_created", "anomaly_detected", "confidence_evaluated",
    "confidence_gate_bypassed", "approval_received", "signal_received", "substep_started", "substep_completed",
    "budget_warning", "budget_exceeded", "budget_raised", "run_succeeded", "run_failed", "run_cancelled"];
  const ends = new Set(["step_completed", "step_failed", "step_retrying"]);
  function follow() {
    if (es) return;
    es = new EventSource("/v1/runs/" + encodeURIComponent(runID) + "/events?deltas=1&after=" + wf.last_seq);
    const on = ev => {
      try {
        const e = JSON.parse(ev.data);
        if (ends.has(e.kind) && e.step_id) endStep(e.step_id, e.seq);
      } catch (err) { /* not an envelope: redraw all the same */ }
      refresh();
      if (ev.type === "run_succeeded" || ev.type === "run_failed" || ev.type === "run_cancelled") { es.close(); es = null; }
    };
    for (const k of kinds) es.addEventListener(k, on);
    es.onmessage = on;
    es.addEventListener("delta", ev => {
      let d;
      try { d = JSON.parse(ev.data); } catch (err) { return; }
      if (takeDelta(d)) showStream(d.step_id);
    });
  }

  rowsEl.addEventListener("click", async ev => {
    const t = ev.target.closest("[data-toggle]");
    if (t) {
      ev.stopPropagation();
      const key = t.dataset.toggle;
      const v = visibleRows(wf, 0, 0, "", []).find(x => x.key === key);
      if (!v) return;
      if (v.open) { expanded.delete(key); collapsed.add(key); if (v.r.child_run_id) children.delete(v.r.child_run_id); }
      else {
        expanded.add(key); collapsed.delete(key);
        if (v.r.child_run_id) {
          try { children.set(v.r.child_run_id, await pal.api("GET", "/v1/runs/" + encodeURIComponent(v.r.child_run_id) + "/waterfall")); }
          catch (e) { pal.showError(e); }
        }
      }
      draw();
      return;
    }
    if (ev.target.closest("a")) return;
    const seg = ev.target.closest(".lane .seg");
    if (seg) {
      selected = seg.dataset.key;
      draw();
      showDetail();
      return;
    }
    const row = ev.target.closest(".wf-row");
    if (!row) return;
    selected = row.dataset.key;
    draw();
    showDetail();
  });

  // showDetail brings the detail panel into view where it is laid out
  // below the page (a narrow window) rather than beside it.
  function showDetail() {
    if (!detail.hidden && getComputedStyle(detail).position === "static") detail.scrollIntoView({ block: "nearest" });
  }

  // The tabs: the waterfall, or the journal's events (#journal in the
  // address opens the journal).
  const journal = pal.journal(runID, kinds);
  // The graph's nodes open their step's detail, as the waterfall's rows do.
  const graphView = pal.graph(document.getElementById("graph-box"), document.getElementById("graph-meta"), step => {
    selected = step;
    if (!step) detail.hidden = true;
    draw();
    showDetail();
  });
  function showTab(name) {
    tab = name;
    document.body.dataset.tab = name;
    document.getElementById("view-waterfall").hidden = name !== "waterfall";
    document.getElementById("journal").hidden = name !== "journal";
    document.getElementById("graph").hidden = name !== "graph";
    for (const b of document.querySelectorAll(".tabs .tab")) b.setAttribute("aria-selected", b.id === "tab-" + name ? "true" : "false");
    if (name === "journal") { detail.hidden = true; journal.show(); }
    else if (wf) draw();
    history.replaceState(null, "", name === "waterfall" ? location.pathname + location.search : "#" + name);
  }
  for (const name of ["waterfall", "journal", "graph"]) document.getElementById("tab-" + name).addEventListener("click", () => showTab(name));
  const tabOfAddress = () => location.hash === "#journal" ? "journal" : location.hash === "#graph" ? "graph" : "waterfall";
  window.addEventListener("hashchange", () => showTab(tabOfAddress()));
  showTab(tabOfAddress());

  // The axis's ticks and the markers' labels follow the window's width.
  let resizing = false;
  window.addEventListener("resize", () => {
    if (resizing || !wf || tab !== "waterfall") return;
    resizing = true;
    // The compressed axis's breaks are so many pixels wide: the
    // rows are drawn again for the new width.
    requestAnimationFrame(() => { resizing = false; draw(); });
  });

  zoomBtn.addEventListener("click", () => {
    zoom = null;
    draw();
  });
  axisBtn.addEventListener("click", () => {
    axisMode = axisMode === "compressed" ? "linear" : "compressed";
    draw();
  });

  lanesBtn.addEventListener("click", () => {
    lanesView = !lanesView;
    draw();
  });
  document.getElementById("expand-all").addEventListener("click", () => {
    for (const r of wf.rows) if (r.children > 0) { expanded.add(r.step_id); collapsed.delete(r.step_id); }
    draw();
  });
  document.getElementById("collapse-all").addEventListener("click", () => {
    expanded.clear();
    for (const r of wf.rows) if (r.children > 0) collapsed.add(r.step_id);
    children.clear();
    draw();
  });

  let confirming = false;
  cancelBtn.addEventListener("click", async () => {
    if (!confirming) { confirming = true; cancelBtn.textContent = "Click again to cancel the run"; return; }
    cancelBtn.disabled = true;
    try {
      await pal.api("POST", "/v1/runs/" + encodeURIComponent(runID) + "/cancel", { reason: "cancelled from the web UI" });
      pal.showError(null);
    } catch (e) { pal.showError(e); }
    cancelBtn.disabled = false;
    confirming = false;
    cancelBtn.textContent = "Cancel run";
    refresh();
  });

  refresh();
})();
