// Shared helpers of PAL's pages. Every value from a run is written with
// textContent, never as markup.
"use strict";

const pal = {
  meta(name) {
    const m = document.querySelector('meta[name="' + name + '"]');
    return m ? m.content : "";
  },
  // el makes an element with a class and text.
  el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  },
  // api calls the REST API with the session cookie; changing requests
  // carry the session's CSRF token.
  async api(method, path, body) {
    const opts = { method, headers: { "Accept": "application/json" }, credentials: "same-origin" };
    if (method !== "GET") {
      opts.headers["X-CSRF-Token"] = pal.meta("pal-csrf");
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body === undefined ? {} : body);
    }
    const res = await fetch(path, opts);
    if (res.status === 401) {
      location.href = "/login?next=" + encodeURIComponent(location.pathname);
      throw new Error("not logged in");
    }
    let data = null;
    try { data = await res.json(); } catch (e) { data = null; }
    if (!res.ok) {
      const msg = data && data.detail ? data.detail : res.status + " " + res.statusText;
      const err = new Error(msg);
      err.status = res.status;
      throw err;
    }
    return data;
  },
  scopes() { return pal.meta("pal-scopes").split("+"); },
  may(scope) { const s = pal.scopes(); return s.includes("admin") || s.includes(scope); },
  // ms formats a duration in milliseconds.
  ms(v) {
    if (v === null || v === undefined || isNaN(v)) return "";
    if (v < 1) return v.toFixed(2) + " ms";
    if (v < 1000) return Math.round(v) + " ms";
    if (v < 60000) return (v / 1000).toFixed(v < 10000 ? 2 : 1) + " s";
    if (v < 3600000) return Math.floor(v / 60000) + " m " + Math.round((v % 60000) / 1000) + " s";
    return Math.floor(v / 3600000) + " h " + Math.round((v % 3600000) / 60000) + " m";
  },
  time(s) {
    if (!s) return "";
    const d = new Date(s);
    return isNaN(d) ? s : d.toLocaleString();
  },
  cost(c) { return c ? "$" + c.toFixed(c < 0.01 ? 6 : 4) : ""; },
  // json shows a step's value: a string as its JSON literal, anything
  // else indented.
  json(v) {
    if (v === undefined || v === null) return "";
    return typeof v === "string" ? JSON.stringify(v) : JSON.stringify(v, null, 2);
  },
  tokens(u) { return u && u.total_tokens ? String(u.total_tokens) : ""; },
  showError(err) {
    const p = document.getElementById("error");
    if (!p) return;
    if (!err) { p.hidden = true; p.textContent = ""; return; }
    p.hidden = false;
    p.textContent = String(err.message || err);
  },
  runIDPattern: /^[A-Za-z0-9_-]{1,128}$/,
};
