// The deployed workflows: GET /v1/workflows, each at its latest version;
// a workflow's versions and a version's definition from GET
// /v1/workflows/{name}. Every value is written as text.
"use strict";

(function () {
  const tbody = document.getElementById("workflows");
  const detail = document.getElementById("detail");

  async function show(name, version) {
    try {
      const q = version ? "?version=" + encodeURIComponent(String(version)) : "";
      const wf = await pal.api("GET", "/v1/workflows/" + encodeURIComponent(name) + q);
      document.getElementById("detail-name").textContent = wf.name + " · " + wf.versions.length + " versions";
      const frag = document.createDocumentFragment();
      for (const v of wf.versions) {
        const tr = pal.el("tr", v.version === wf.version ? "version shown" : "version");
        tr.dataset.version = String(v.version);
        const a = pal.el("a", "", wf.name + "@" + v.version);
        a.href = "#" + encodeURIComponent(wf.name) + "@" + v.version;
        a.addEventListener("click", (e) => { e.preventDefault(); show(wf.name, v.version); });
        const td = pal.el("td", "num");
        td.appendChild(a);
        tr.appendChild(td);
        tr.appendChild(pal.el("td", "", pal.time(v.deployed_at)));
        const runs = pal.el("a", "", "runs of " + wf.name);
        runs.href = "/?workflow=" + encodeURIComponent(wf.name);
        const rt = pal.el("td");
        rt.appendChild(runs);
        tr.appendChild(rt);
        frag.appendChild(tr);
      }
      document.getElementById("versions").replaceChildren(frag);
      document.getElementById("definition-title").textContent =
        wf.name + "@" + wf.version + " · sha256 " + wf.sha256 + (wf.by ? " · deployed by " + wf.by : "");
      document.getElementById("definition").textContent = JSON.stringify(wf.workflow, null, 2);
      detail.hidden = false;
      // The start form (start.js), when there is one, starts this one.
      document.dispatchEvent(new CustomEvent("pal:workflow", { detail: wf.name }));
      pal.showError(null);
    } catch (e) {
      pal.showError(e);
    }
  }

  async function load() {
    try {
      const list = await pal.api("GET", "/v1/workflows");
      const frag = document.createDocumentFragment();
      for (const w of list.workflows) {
        const tr = pal.el("tr", "workflow");
        tr.dataset.name = w.name;
        const a = pal.el("a", "", w.name);
        a.href = "#" + encodeURIComponent(w.name);
        a.addEventListener("click", (e) => { e.preventDefault(); show(w.name, 0); });
        const td = pal.el("td");
        td.appendChild(a);
        tr.appendChild(td);
        tr.appendChild(pal.el("td", "num latest", w.version));
        tr.appendChild(pal.el("td", "sub", w.sha256.slice(0, 12)));
        tr.appendChild(pal.el("td", "", w.by || ""));
        tr.appendChild(pal.el("td", "", pal.time(w.deployed_at)));
        frag.appendChild(tr);
      }
      if (!list.workflows.length) {
        const tr = pal.el("tr");
        const td = pal.el("td", "sub", "No workflow is deployed yet: pal workflow deploy FILE, or PUT /v1/workflows/{name}.");
        td.colSpan = 5;
        tr.appendChild(td);
        frag.appendChild(tr);
      }
      tbody.replaceChildren(frag);
      pal.showError(null);
      const hash = decodeURIComponent(location.hash.slice(1));
      if (hash) {
        const [name, version] = hash.split("@");
        show(name, Number(version) || 0);
      }
    } catch (e) {
      pal.showError(e);
    }
  }

  load();
})();
