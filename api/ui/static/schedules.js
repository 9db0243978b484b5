// The schedules: GET /v1/schedules, polled while the page is open. A
// session with scope deploy may pause, resume and delete a schedule, one
// with start trigger it (POST /v1/schedules/{name}/…). Every value is
// written as text.
"use strict";

(function () {
  const tbody = document.getElementById("schedules");
  let timer = null;
  let shown = ""; // the listing drawn: an unchanged one is not drawn again

  function when(s) {
    if (s.every) return "every " + s.every;
    return s.cron + (s.tz ? " (" + s.tz + ")" : " (UTC)");
  }

  function button(label, cls, action) {
    const b = pal.el("button", cls, label);
    b.type = "button";
    b.addEventListener("click", async () => {
      b.disabled = true;
      try {
        await action();
        pal.showError(null);
      } catch (e) {
        pal.showError(e);
      }
      b.disabled = false;
      load();
    });
    return b;
  }

  function act(name, verb) {
    return pal.api("POST", "/v1/schedules/" + encodeURIComponent(name) + "/" + verb);
  }

  function row(s) {
    const tr = pal.el("tr", "schedule");
    tr.dataset.name = s.name;
    tr.dataset.state = s.paused ? "paused" : "active";
    const runs = pal.el("a", "", s.name);
    runs.href = "/?schedule=" + encodeURIComponent(s.name);
    runs.title = "the runs of " + s.name;
    const td = pal.el("td");
    td.appendChild(runs);
    tr.appendChild(td);
    tr.appendChild(pal.el("td", "", when(s)));
    tr.appendChild(pal.el("td", "", s.workflow));
    tr.appendChild(pal.el("td", "state", s.paused ? "paused" : "active"));
    tr.appendChild(pal.el("td", "next", s.next ? pal.time(s.next) : "—"));
    const last = pal.el("td", "last");
    if (s.last_run) {
      const a = pal.el("a", "", s.last_run);
      a.href = "/runs/" + encodeURIComponent(s.last_run);
      last.appendChild(a);
    }
    tr.appendChild(last);
    tr.appendChild(pal.el("td", "sub", s.overlap + " · " + s.catchup));
    const actions = pal.el("td", "actions");
    if (pal.may("start")) {
      actions.appendChild(button("Run now", "trigger", () => act(s.name, "trigger")));
    }
    if (pal.may("deploy")) {
      actions.appendChild(s.paused ? button("Resume", "resume", () => act(s.name, "resume"))
        : button("Pause", "pause", () => act(s.name, "pause")));
      actions.appendChild(button("Delete", "danger delete", async () => {
        if (!confirm("Delete schedule " + s.name + "? Its runs stay.")) return;
        await pal.api("DELETE", "/v1/schedules/" + encodeURIComponent(s.name));
      }));
    }
    tr.appendChild(actions);
    return tr;
  }

  async function load() {
    clearTimeout(timer);
    try {
      const list = await pal.api("GET", "/v1/schedules");
      const key = JSON.stringify(list) + pal.scopes().join("+");
      if (key === shown) {
        timer = setTimeout(load, 2000);
        return;
      }
      shown = key;
      const frag = document.createDocumentFragment();
      for (const s of list.schedules) frag.appendChild(row(s));
      if (!list.schedules.length) {
        const tr = pal.el("tr");
        const td = pal.el("td", "sub", "No schedule yet: pal schedule create NAME --every 1h --workflow WORKFLOW, or POST /v1/schedules.");
        td.colSpan = 8;
        tr.appendChild(td);
        frag.appendChild(tr);
      }
      tbody.replaceChildren(frag);
      document.body.dataset.loaded = "1";
    } catch (e) {
      pal.showError(e);
    }
    timer = setTimeout(load, 2000);
  }

  load();
})();
