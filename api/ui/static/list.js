// The runs list: GET /v1/runs, newest first, polled while the page is
// open so statuses and counts stay live.
"use strict";

(function () {
  const statusSel = document.getElementById("status");
  const wfInput = document.getElementById("workflow");
  const search = document.getElementById("search");
  const labelInput = document.getElementById("label");
  const sinceInput = document.getElementById("since");
  const untilInput = document.getElementById("until");
  const qInput = document.getElementById("q");
  // The server's filters the form sets, by query parameter.
  const serverFilters = { label: labelInput, since: sinceInput, until: untilInput, q: qInput };
  const tbody = document.getElementById("runs");
  const counts = document.getElementById("counts");
  const more = document.getElementById("more");
  const workflows = new Set();
  const limit = 200;
  let older = []; // runs of pages loaded with "Older runs"
  let next = "";
  let timer = null;

  const params = new URLSearchParams(location.search);
  statusSel.value = params.get("status") || "";
  wfInput.value = params.get("workflow") || "";
  search.value = params.get("search") || "";
  for (const [k, input] of Object.entries(serverFilters)) input.value = params.get(k) || "";
  // sort is created (the server's order, newest first), duration or cost,
  // "-" first for descending.
  let sort = params.get("sort") || "";

  // addFilters puts the form's server filters in q: each label a
  // parameter of its own, the times as RFC 3339 (the inputs are local).
  function addFilters(q) {
    for (const l of labelInput.value.split(",")) if (l.trim()) q.append("label", l.trim());
    for (const [k, input] of [["since", sinceInput], ["until", untilInput]]) {
      if (!input.value) continue;
      const t = new Date(input.value);
      q.set(k, isNaN(t) ? input.value : t.toISOString());
    }
    if (qInput.value.trim()) q.set("q", qInput.value.trim());
  }

  function query(before) {
    const q = new URLSearchParams({ limit: String(limit) });
    if (statusSel.value) q.set("status", statusSel.value);
    if (wfInput.value.trim()) q.set("workflow", wfInput.value.trim());
    addFilters(q);
    if (params.get("schedule")) q.set("schedule", params.get("schedule")); // from the schedules page
    if (before) q.set("before", before);
    return "/v1/runs?" + q.toString();
  }

  function durationMs(r) {
    const start = Date.parse(r.created_at);
    const end = r.ended_at ? Date.parse(r.ended_at) : Date.now();
    return end - start;
  }

  function duration(r) { return pal.ms(durationMs(r)); }

  const sortValue = {
    created: r => Date.parse(r.created_at),
    duration: durationMs,
    cost: r => (r.usage && r.usage.cost_usd) || 0,
  };

  // sorted is list in the chosen order (the server's when none).
  function sorted(list) {
    const key = sort.replace(/^-/, "");
    const value = sortValue[key];
    if (!value) return list;
    const dir = sort.startsWith("-") ? -1 : 1;
    return list.slice().sort((a, b) => dir * (value(a) - value(b)) || (a.run_id < b.run_id ? -1 : 1));
  }

  function markSort() {
    for (const b of document.querySelectorAll("button.sort")) {
      const on = sort.replace(/^-/, "") === b.dataset.sort;
      b.classList.toggle("on", on);
      b.dataset.dir = on ? (sort.startsWith("-") ? "desc" : "asc") : "";
      b.title = "sort by " + b.dataset.sort + (on ? (sort.startsWith("-") ? ", descending" : ", ascending") : "");
    }
  }

  function draw(list) {
    const needle = search.value.trim();
    const shown = sorted(needle ? list.filter(r => r.run_id.includes(needle)) : list);
    const byStatus = {};
    for (const r of list) byStatus[r.status] = (byStatus[r.status] || 0) + 1;
    const parts = Object.keys(byStatus).sort().map(s => s + " " + byStatus[s]);
    counts.textContent = list.length + " runs listed" + (parts.length ? ": " + parts.join(", ") : "") +
      (needle ? " · " + shown.length + " match " + JSON.stringify(needle) : "");
    const frag = document.createDocumentFragment();
    for (const r of shown) {
      const tr = pal.el("tr", "run");
      tr.dataset.runId = r.run_id;
      const a = pal.el("a", "", r.run_id);
      a.href = "/runs/" + encodeURIComponent(r.run_id);
      const td = pal.el("td");
      td.appendChild(a);
      if (r.parent_run_id) td.appendChild(pal.el("span", "sub", " child of " + r.parent_run_id));
      tr.appendChild(td);
      tr.appendChild(pal.el("td", "", r.workflow || "(plain LLM)"));
      // A queued run waits for a worker of its queue: name the queue.
      tr.appendChild(pal.el("td", "status " + r.status, r.status === "queued" ? "queued on " + (r.queue || "default") : r.status));
      tr.appendChild(pal.el("td", "", pal.time(r.created_at)));
      tr.appendChild(pal.el("td", "", duration(r)));
      tr.appendChild(pal.el("td", "num", r.resumes));
      tr.appendChild(pal.el("td", "num tokens", r.usage ? r.usage.total_tokens : 0));
      tr.appendChild(pal.el("td", "num cost", r.usage && r.usage.cost_usd ? r.usage.cost_usd.toFixed(6) : "0"));
      frag.appendChild(tr);
      if (r.workflow) workflows.add(r.workflow);
    }
    tbody.replaceChildren(frag);
    const dl = document.getElementById("workflows");
    dl.replaceChildren(...[...workflows].sort().map(w => { const o = pal.el("option"); o.value = w; return o; }));
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      const page = await pal.api("GET", query());
      if (!older.length) next = page.next || "";
      more.hidden = !next;
      draw(page.runs.concat(older.filter(o => !page.runs.some(r => r.run_id === o.run_id))));
      pal.showError(null);
    } catch (e) {
      pal.showError(e);
    }
    timer = setTimeout(refresh, document.hidden ? 10000 : 2000);
  }

  // pageURL keeps the filters and the order in the page's address.
  function pageURL() {
    const q = new URLSearchParams();
    if (statusSel.value) q.set("status", statusSel.value);
    if (wfInput.value.trim()) q.set("workflow", wfInput.value.trim());
    for (const [k, input] of Object.entries(serverFilters)) if (input.value.trim()) q.set(k, input.value.trim());
    if (search.value.trim()) q.set("search", search.value.trim());
    if (sort) q.set("sort", sort);
    history.replaceState(null, "", q.toString() ? "/?" + q.toString() : "/");
  }

  for (const b of document.querySelectorAll("button.sort")) {
    b.addEventListener("click", () => {
      // A click sorts by the column, descending first; again, ascending.
      sort = sort === "-" + b.dataset.sort ? b.dataset.sort : "-" + b.dataset.sort;
      markSort();
      pageURL();
      refresh();
    });
  }
  markSort();

  document.getElementById("filters").addEventListener("submit", async ev => {
    ev.preventDefault();
    pageURL();
    older = [];
    // A whole run id opens the run, listed or not.
    const id = search.value.trim();
    if (pal.runIDPattern.test(id)) {
      try {
        await pal.api("GET", "/v1/runs/" + encodeURIComponent(id));
        location.href = "/runs/" + encodeURIComponent(id);
        return;
      } catch (e) { /* not a run: filter the list */ }
    }
    refresh();
  });
  statusSel.addEventListener("change", () => { older = []; refresh(); });
  more.addEventListener("click", async () => {
    try {
      const page = await pal.api("GET", query(next));
      older = older.concat(page.runs);
      next = page.next || "";
      refresh();
    } catch (e) { pal.showError(e); }
  });
  refresh();
})();
