// The journal tab of a run's page: every event of the run's journal in seq
// order, as the run's event feed sends it (GET /v1/runs/{id}/events from
// the start: each event's envelope, §6.1 of docs/architecture.md). A row
// shows the envelope's seq, kind, step id and attempt, writer (worker_id),
// time and prev (the hash chain's link to the message before it); each
// run_resumed, which opens a drive, is marked; each payload is a folded
// JSON tree that a click opens. The feed is opened the first time the tab
// is shown and followed until the run's terminal event. Every value is
// written as text (textContent): payloads are whatever a model, a tool or
// a caller wrote.
"use strict";

// pal.journal returns the tab's controller: show() draws it, reading the
// feed the first time. kinds are the event kinds the feed names (run.js
// keeps the one list).
pal.journal = function (runID, kinds) {
  const rowsEl = document.getElementById("journal-rows");
  const metaEl = document.getElementById("journal-meta");
  const terminal = new Set(["run_succeeded", "run_failed", "run_cancelled"]);
  let es = null;
  let last = 0; // the last seq listed
  let t0 = NaN; // run_created's time, for the offsets
  let drives = 0;
  let ended = false; // the terminal event is listed
  let closed = ""; // why the feed stopped before the end, if it did

  function meta() {
    const n = rowsEl.querySelectorAll(".jr-event").length;
    const parts = [n + " event" + (n === 1 ? "" : "s"), drives + " drive" + (drives === 1 ? "" : "s")];
    if (ended) parts.push("the run has ended");
    else if (closed) parts.push(closed);
    else parts.push("following the run…");
    metaEl.textContent = parts.join(" · ");
    rowsEl.dataset.lastSeq = last;
    rowsEl.dataset.ended = ended ? "true" : "false";
  }

  // preview is a payload on one line, cut to n characters.
  function preview(v, n) {
    let s;
    try { s = JSON.stringify(v); } catch (e) { s = String(v); }
    if (s === undefined) s = "";
    return s.length > n ? s.slice(0, n) + "…" : s;
  }

  // scalar is a JSON value that is not an object or an array, as text.
  function scalar(v) {
    const t = v === null ? "null" : typeof v;
    return pal.el("span", "json-" + t, t === "string" ? JSON.stringify(v) : String(v));
  }

  const isTree = v => v !== null && typeof v === "object";

  // tree is a JSON value: an object or array folds (folded unless open),
  // its members drawn the first time it opens.
  function tree(v, open) {
    if (!isTree(v)) return scalar(v);
    const arr = Array.isArray(v);
    const keys = arr ? v.map((_, i) => i) : Object.keys(v);
    const node = pal.el("span", "json-node");
    const btn = pal.el("button", "json-toggle", open ? "▾" : "▸");
    btn.type = "button";
    btn.setAttribute("aria-expanded", open ? "true" : "false");
    const sum = arr ? "[" + keys.length + " item" + (keys.length === 1 ? "" : "s") + "]"
      : "{" + keys.length + " key" + (keys.length === 1 ? "" : "s") + "}";
    node.append(btn, pal.el("span", "json-summary", sum));
    if (keys.length === 0) { btn.disabled = true; return node; }
    node.appendChild(pal.el("span", "json-preview", " " + preview(v, 80)));
    node._value = v;
    if (open) unfold(node);
    return node;
  }

  // unfold draws a node's members (once) and shows them.
  function unfold(node) {
    let kids = node.querySelector(":scope > .json-members");
    if (!kids) {
      const v = node._value;
      kids = pal.el("ul", "json-members");
      for (const k of Array.isArray(v) ? v.keys() : Object.keys(v)) {
        const li = pal.el("li", "json-member");
        li.appendChild(pal.el("span", "json-key", Array.isArray(v) ? String(k) : JSON.stringify(k)));
        li.appendChild(pal.el("span", "json-colon", ": "));
        li.appendChild(tree(v[k], false));
        kids.appendChild(li);
      }
      node.appendChild(kids);
    }
    kids.hidden = false;
    node.classList.add("open");
    const btn = node.querySelector(":scope > .json-toggle");
    btn.textContent = "▾";
    btn.setAttribute("aria-expanded", "true");
  }

  function fold(node) {
    const kids = node.querySelector(":scope > .json-members");
    if (kids) kids.hidden = true;
    node.classList.remove("open");
    const btn = node.querySelector(":scope > .json-toggle");
    btn.textContent = "▸";
    btn.setAttribute("aria-expanded", "false");
  }

  // clock is an event's time of day, to the millisecond.
  function clock(ts) {
    const d = new Date(ts);
    if (isNaN(d)) return ts || "";
    return d.toLocaleTimeString([], { hour12: false, hour: "2-digit", minute: "2-digit", second: "2-digit", fractionalSecondDigits: 3 });
  }

  function cell(cls, text, title) {
    const c = pal.el("span", cls, text);
    if (title) c.title = title;
    return c;
  }

  // row is one event's entry.
  function row(e) {
    const li = pal.el("li", "jr-event kind-" + e.kind);
    li.dataset.seq = e.seq;
    li.dataset.kind = e.kind;
    const line = pal.el("div", "jr-line");
    const at = Date.parse(e.ts);
    const first = isNaN(t0);
    if (first) t0 = at;
    line.append(
      cell("jr-seq", e.seq),
      cell("jr-kind", e.kind),
      cell("jr-step", e.step_id ? e.step_id + (e.attempt ? " #" + e.attempt : "") : "", e.step_id ? "step " + e.step_id + (e.attempt ? ", attempt " + e.attempt : "") : ""),
      cell("jr-writer", e.worker_id || "", e.worker_id ? "worker_id: " + e.worker_id : ""),
      cell("jr-ts", clock(e.ts) + (first || isNaN(at - t0) ? "" : " +" + pal.ms(at - t0)), e.ts),
      cell("jr-prev", e.prev ? e.prev.slice(0, 10) + "…" : "—", e.prev ? "prev: " + e.prev : "the journal's first message: no prev"));
    li.appendChild(line);
    if (e.kind === "run_resumed") {
      // A drive begins: its worker's run_resumed is the fencing token
      // every driven event after it is held to.
      drives++;
      const d = isTree(e.data) ? e.data : {};
      const n = d.resume_count || drives;
      li.classList.add("drive");
      if (d.crashed) li.classList.add("interrupted");
      const badge = pal.el("span", "drive-badge", "drive " + n + " · " + (d.worker || e.worker_id || "") + (d.crashed ? " · previous drive interrupted" : ""));
      badge.title = "a drive began here: " + (d.worker || e.worker_id || "a worker") + " took the run's lease" +
        (d.crashed ? " after the previous drive ended without finishing or parking the run" : "");
      line.children[1].appendChild(badge);
    }
    const data = pal.el("div", "jr-data");
    if (e.data === undefined || e.data === null) {
      data.appendChild(pal.el("span", "jr-none", "no data"));
    } else {
      const btn = pal.el("button", "jr-toggle", "▸ data");
      btn.type = "button";
      btn.setAttribute("aria-expanded", "false");
      const payload = pal.el("div", "jr-payload");
      payload.hidden = true;
      payload._value = e.data;
      data.append(btn, pal.el("span", "jr-preview", preview(e.data, 160)), payload);
    }
    li.appendChild(data);
    return li;
  }

  function add(e) {
    if (!e || typeof e.seq !== "number" || e.seq <= last) return; // sent once, in seq order; never twice
    last = e.seq;
    rowsEl.appendChild(row(e));
    if (terminal.has(e.kind)) {
      ended = true;
      if (es) { es.close(); es = null; }
    }
  }

  function follow() {
    if (es || ended) return;
    closed = "";
    es = new EventSource("/v1/runs/" + encodeURIComponent(runID) + "/events?after=" + last);
    const on = ev => {
      let e;
      try { e = JSON.parse(ev.data); } catch (err) { return; }
      add(e);
      meta();
    };
    for (const k of kinds) es.addEventListener(k, on);
    es.onmessage = on;
    es.onerror = () => {
      // The browser reconnects from the last seq by itself; a feed it
      // closed (a reconnect after the sound events of a corrupt journal
      // is 204, a removed journal 410) stays closed.
      if (es && es.readyState === EventSource.CLOSED) {
        es = null;
        closed = last ? "the feed has nothing more" : "the journal could not be read";
        meta();
      }
    };
  }

  rowsEl.addEventListener("click", ev => {
    const jt = ev.target.closest(".json-toggle");
    if (jt) {
      const node = jt.parentElement;
      if (node.classList.contains("open")) fold(node); else unfold(node);
      return;
    }
    const t = ev.target.closest(".jr-toggle");
    if (!t) return;
    const payload = t.parentElement.querySelector(".jr-payload");
    const open = payload.hidden;
    if (open && !payload.firstChild) payload.appendChild(tree(payload._value, true));
    payload.hidden = !open;
    t.textContent = (open ? "▾" : "▸") + " data";
    t.setAttribute("aria-expanded", open ? "true" : "false");
    t.parentElement.classList.toggle("open", open);
  });

  return {
    show() { follow(); meta(); },
  };
};
