// An LLM step's conversation in the run page's detail panel (run.js):
// rebuilt from the waterfall's rows, as the journal has them, and drawn
// as text.
"use strict";

(function () {
  const turnRe = /\.turn\[(\d+)\]$/;
  const isCall = r => !!(r && r.input && Array.isArray(r.input.messages));

  // pal.conversationOf is the conversation of row r of waterfall w as its
  // journaled inputs and outputs tell it: an ai-step's system prompt and
  // messages, then the answer; an agent's (or one of its turns', up to
  // that turn) from its turns, each of which journals only the messages
  // after the first "prior" ones (the earlier turns' answers and tool
  // results among them), then the last turn's answer. null for a step
  // that is no LLM call.
  pal.conversationOf = function (r, w) {
    let calls;
    if (isCall(r) && r.parent && turnRe.test(r.step_id)) {
      calls = w.rows.filter(x => x.parent === r.parent && turnRe.test(x.step_id) && isCall(x));
      calls = calls.slice(0, calls.indexOf(r) + 1);
    } else if (isCall(r)) {
      calls = [r];
    } else if (r.node_type === "agent" && w) {
      calls = w.rows.filter(x => x.parent === r.step_id && turnRe.test(x.step_id) && isCall(x));
    }
    if (!calls || calls.length === 0) return null;
    let msgs = [];
    for (const c of calls) {
      const prior = c.input.prior || 0;
      if (prior <= msgs.length) msgs = msgs.slice(0, prior);
      msgs = msgs.concat(c.input.messages);
    }
    const last = calls[calls.length - 1];
    const out = last.output;
    if (out && typeof out === "object" && (out.text || (out.tool_calls && out.tool_calls.length))) {
      msgs.push({ role: "assistant", content: out.text, tool_calls: out.tool_calls, answer: true });
    }
    return { system: calls[0].input.system, msgs };
  };

  // pal.drawConversation draws c, one box per message with its role, tool
  // calls and images, every value as text.
  pal.drawConversation = function (c) {
    const box = pal.el("div", "conversation");
    const msg = (role, text) => {
      const m = pal.el("div", "msg role-" + role);
      m.dataset.role = role;
      m.appendChild(pal.el("span", "role", role));
      if (text) m.appendChild(pal.el("pre", "content", text));
      box.appendChild(m);
      return m;
    };
    if (c.system) msg("system", c.system);
    for (const x of c.msgs) {
      const role = typeof x.role === "string" ? x.role : "?";
      const m = msg(role, typeof x.content === "string" ? x.content : (x.content === undefined ? "" : pal.json(x.content)));
      if (x.tool_call_id) m.insertBefore(pal.el("span", "call-id", "result of " + x.tool_call_id), m.children[1] || null);
      for (const img of x.images || []) m.appendChild(pal.el("div", "image", "image: " + (img.url || "blob " + img.blob)));
      for (const tc of x.tool_calls || []) {
        const call = pal.el("div", "tool-call", "calls " + tc.name + (tc.id ? " (" + tc.id + ")" : ""));
        call.dataset.tool = tc.name;
        call.appendChild(pal.el("pre", "arguments", pal.json(tc.arguments)));
        m.appendChild(call);
      }
      if (x.answer) m.classList.add("answer");
    }
    return box;
  };
})();
