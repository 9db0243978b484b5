// A run's actions, beside its waterfall: retry a failed run, resume one in
// flight (force: scope admin), fork from a step, raise the budget, send a
// signal to a waiting wait node, verify the signed receipt. Each is the
// REST route the CLI's command is (POST with the session's CSRF token,
// pal.api), so the server checks the session's scopes and the run's state
// again; the page only leaves out what the session may not do (the
// template renders no button without its scope, and a signal's send
// button is drawn only with scope approve). run.js hands over each
// waterfall it draws (the pal:waterfall event).
"use strict";

(function () {
  const runID = pal.meta("pal-run");
  const base = "/v1/runs/" + encodeURIComponent(runID);
  const terminal = new Set(["succeeded", "failed", "cancelled"]);
  const $ = id => document.getElementById(id);
  const result = $("action-result");
  const signals = $("signals");
  let wf = null;

  // say shows what an action did, or why it was refused (the API's
  // message), as text. The page's own error line is run.js's, cleared
  // by its next refresh; an action's answer stays until the next action.
  function say(text, refused) {
    result.hidden = !text;
    result.textContent = text || "";
    result.className = refused ? "error" : "result";
    result.dataset.outcome = !text ? "" : refused ? "refused" : "done";
  }

  // act runs one action with its button disabled.
  async function act(btn, fn) {
    if (btn) btn.disabled = true;
    say("");
    try {
      await fn();
    } catch (e) {
      say(String(e.message || e), true);
    }
    if (btn) btn.disabled = false;
  }

  // json reads a text field as JSON, naming the field when it is not.
  function json(text, what) {
    try { return JSON.parse(text); } catch (e) { throw new Error(what + " is not JSON: " + e.message); }
  }

  function draw(w) {
    wf = w;
    const ended = terminal.has(wf.status);
    if ($("retry")) $("retry").hidden = wf.status !== "failed";
    if ($("resume")) $("resume").hidden = ended;
    if ($("force-wrap")) $("force-wrap").hidden = ended;
    if ($("budget-open")) $("budget-open").hidden = ended;
    if (ended && $("budget")) $("budget").hidden = true;
    if ($("verify")) $("verify").hidden = !ended;
    const fork = $("fork-from");
    if (fork) {
      // The steps the run started, at the top level: a fork runs the one
      // chosen and everything after it again.
      const ids = wf.rows.filter(r => r.depth === 0 && r.segments.length > 0).map(r => r.step_id);
      $("fork-wrap").hidden = ids.length === 0;
      if (fork.dataset.ids !== ids.join("\n")) {
        const keep = fork.value;
        fork.dataset.ids = ids.join("\n");
        fork.replaceChildren(...ids.map(id => { const o = pal.el("option", "", id); o.value = id; return o; }));
        if (ids.includes(keep)) fork.value = keep;
      }
    }
    drawSignals();
  }

  // A wait node waiting shows the signal it waits for (its rendered
  // input, engine.WaitInput), and with scope approve a payload to send.
  function signalBox(r) {
    const name = (r.input && r.input.signal) || "";
    const box = pal.el("div", "approval signal");
    box.dataset.step = r.step_id;
    box.dataset.signal = name;
    box.appendChild(pal.el("h3", "", "Step " + r.step_id + " waits for signal " + name));
    if (!pal.may("approve")) return box;
    const payload = pal.el("textarea", "payload");
    payload.rows = 2;
    payload.spellcheck = false;
    payload.value = "{}";
    payload.title = "the signal's payload (JSON)";
    const send = pal.el("button", "send", "Send signal " + name);
    send.addEventListener("click", () => act(send, async () => {
      const body = json(payload.value.trim() || "null", "the payload");
      await pal.api("POST", base + "/signals/" + encodeURIComponent(name), body);
      say("Signal " + name + " sent.");
    }));
    box.append(payload, send);
    return box;
  }

  function drawSignals() {
    const waiting = wf.rows.filter(r => r.status === "waiting" && r.wait_reason === "signal");
    signals.hidden = waiting.length === 0;
    const ids = waiting.map(r => r.step_id).join("\n");
    if (signals.dataset.ids === ids) return; // keep a payload being typed
    signals.dataset.ids = ids;
    signals.replaceChildren(...waiting.map(signalBox));
  }

  // A new run (fork, retry): open its page.
  function open(res) { location.href = "/runs/" + encodeURIComponent(res.run_id); }

  if ($("retry")) $("retry").addEventListener("click", ev => act(ev.target, async () => {
    open(await pal.api("POST", base + "/retry", {}));
  }));
  if ($("fork")) $("fork").addEventListener("click", ev => act(ev.target, async () => {
    open(await pal.api("POST", base + "/fork", { from: $("fork-from").value }));
  }));
  if ($("resume")) $("resume").addEventListener("click", ev => act(ev.target, async () => {
    const force = !!($("force") && $("force").checked);
    const res = await pal.api("POST", base + "/resume", force ? { force: true } : {});
    say("Resumed" + (res.broke ? ", breaking the lease of " + res.broke : "") + (res.taken_by ? "; taken by " + res.taken_by : "") + ".");
  }));
  if ($("budget-open")) {
    $("budget-open").addEventListener("click", () => { $("budget").hidden = false; });
    $("budget-close").addEventListener("click", () => { $("budget").hidden = true; });
    $("budget").addEventListener("submit", ev => {
      ev.preventDefault();
      act($("budget-submit"), async () => {
        const body = {};
        for (const [id, key] of [["add-usd", "add_usd"], ["add-tokens", "add_tokens"], ["add-steps", "add_steps"], ["add-ms", "add_ms"]]) {
          const v = $(id).value.trim();
          if (v !== "") body[key] = Number(v);
        }
        if (!Object.keys(body).length) throw new Error("give an amount to add to at least one limit");
        await pal.api("POST", base + "/budget", body);
        say("Budget raised: " + Object.entries(body).map(([k, v]) => k.replace("add_", "+") + " " + v).join(", ") + ".");
        $("budget").hidden = true;
      });
    });
  }
  if ($("verify")) $("verify").addEventListener("click", ev => act(ev.target, async () => {
    // The server serves a receipt only when its signature verifies
    // against its keys and it is this run's (else an error saying why).
    let r;
    try {
      r = await pal.api("GET", base + "/receipt");
    } catch (e) {
      throw new Error("Receipt not verified: " + e.message);
    }
    say("Receipt verified: signed by key " + r.key_id + " (" + r.alg + ") at " + pal.time(r.signed_at) + "; " + r.status +
      ", seq " + r.first_seq + "–" + r.last_seq + ", " + r.events + " events, chain head " + r.journal_digest + ".");
  }));

  document.addEventListener("pal:waterfall", ev => draw(ev.detail));
})();
