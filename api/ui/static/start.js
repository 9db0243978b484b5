// The start form of the runs list and the workflows page (rendered only
// for a session with scope start): pick a deployed workflow, write the
// run's input as JSON, and POST /v1/runs, as pal run start NAME does;
// the browser then opens the new run. On the workflows page, opening a
// workflow picks it here.
"use strict";

(function () {
  const form = document.getElementById("start-form");
  if (!form) return;
  const details = document.getElementById("start");
  const sel = document.getElementById("start-workflow");
  const input = document.getElementById("start-input");
  const submit = document.getElementById("start-submit");
  // The form's own error line: the page's is its list's, cleared by
  // each poll.
  const errorEl = document.getElementById("start-error");
  function showError(e) {
    errorEl.hidden = !e;
    errorEl.textContent = e ? String(e.message || e) : "";
  }

  // pick chooses the workflow name (listed or not: it may be deployed
  // after the list was read).
  function pick(name) {
    if (!name) return;
    if (![...sel.options].some(o => o.value === name)) {
      const o = pal.el("option", "", name);
      o.value = name;
      sel.appendChild(o);
    }
    sel.value = name;
  }

  async function load() {
    try {
      const list = await pal.api("GET", "/v1/workflows");
      const keep = sel.value;
      sel.replaceChildren(...list.workflows.map(w => {
        const o = pal.el("option", "", w.name + " (latest: " + w.version + ")");
        o.value = w.name;
        return o;
      }));
      pick(keep || new URLSearchParams(location.search).get("workflow") || "");
      submit.disabled = sel.options.length === 0;
    } catch (e) {
      showError(e);
    }
  }

  form.addEventListener("submit", async ev => {
    ev.preventDefault();
    submit.disabled = true;
    showError(null);
    try {
      let body;
      try { body = JSON.parse(input.value.trim() || "null"); } catch (e) { throw new Error("the input is not JSON: " + e.message); }
      const res = await pal.api("POST", "/v1/runs", { workflow: sel.value, input: body });
      location.href = "/runs/" + encodeURIComponent(res.run_id);
      return;
    } catch (e) {
      showError(e);
    }
    submit.disabled = false;
  });

  // The workflows page: a workflow opened is the one to start.
  input.addEventListener("input", () => showError(null));
  document.addEventListener("pal:workflow", ev => pick(ev.detail));
  details.addEventListener("toggle", () => { if (details.open) load(); });
  load().then(() => pick(decodeURIComponent(location.hash.slice(1)).split("@")[0]));
})();
