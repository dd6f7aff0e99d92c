// review behaviour: keyboard review of samples, tabs, whitespace toggle (no inline scripts: the CSP forbids them)
"use strict";
(function () {
  const WS_KEY = "synthwatch.ws";
  const WS_RE = /[ \t\r\n\u00a0\u2000-\u200a\u3000]+/g;
  const WS_SHOW = { " ": "·", "\t": "→\t", "\n": "↵\n", "\r": "␍", "\u00a0": "⍽", "\u3000": "□" };

  function typing(target) {
    if (!target || !target.closest) return false;
    // a checkbox or a button keeps the keys working; text fields take them
    return !!target.closest("input:not([type=checkbox]):not([type=radio]):not([type=button]):not([type=submit]),"
      + " textarea, select, [contenteditable=''], [contenteditable='true']");
  }

  function showTab(root, name) {
    root.querySelectorAll(".tab[data-tab]").forEach((t) => t.classList.toggle("current", t.dataset.tab === name));
    root.querySelectorAll(".tab-pane[data-pane]").forEach((p) => { p.hidden = p.dataset.pane !== name; });
    if (name === "tokens") {
      const pane = document.getElementById("tokens-pane");
      if (pane) pane.dispatchEvent(new Event("sw-show"));
    }
  }

  // Whitespace made visible in the page itself: text nodes are split with textContent only (never HTML),
  // the server's markers for invisible characters are kept as they are.
  function withWhitespace(nodes) {
    const out = [];
    nodes.forEach((node) => {
      if (node.nodeType !== Node.TEXT_NODE) { out.push(node.cloneNode(true)); return; }
      const s = node.nodeValue;
      let last = 0;
      s.replace(WS_RE, (m, off) => {
        // a single space between two words is the expected whitespace: left as is, so that the unusual
        // kinds (runs, tabs, line ends, no-break and other unicode spaces) stand out, and 200 KB stay fast
        if (m === " " && off > 0 && off + 1 < s.length) return m;
        if (off > last) out.push(document.createTextNode(s.slice(last, off)));
        const span = document.createElement("span");
        span.className = "ws";
        span.textContent = Array.from(m).map((c) => WS_SHOW[c] || "␣").join("");
        out.push(span);
        last = off + m.length;
        return m;
      });
      if (last < s.length) out.push(document.createTextNode(s.slice(last)));
    });
    return out;
  }

  function applyWhitespace(on) {
    document.querySelectorAll("#review pre.text").forEach((pre) => {
      if (!pre._plain) pre._plain = Array.from(pre.childNodes).map((n) => n.cloneNode(true));
      pre.replaceChildren(...(on ? withWhitespace(pre._plain) : pre._plain.map((n) => n.cloneNode(true))));
      pre.classList.toggle("ws-on", on);
    });
    const state = document.getElementById("ws-state");
    if (state) state.textContent = on ? "on" : "off";
  }

  function wsOn() {
    try { return window.localStorage.getItem(WS_KEY) === "1"; } catch (e) { return false; }
  }

  function toggleWhitespace() {
    const on = !wsOn();
    try { window.localStorage.setItem(WS_KEY, on ? "1" : "0"); } catch (e) { /* private mode: this page only */ }
    applyWhitespace(on);
  }

  // Flag keys send their requests one after another (never racing), each with the bar as it is after the
  // previous answer was swapped in: pressing b then 3 quickly gives "bad", then "bad · reason".
  let chain = Promise.resolve();
  function flagKey(key) {
    const selector = '#flag-bar button[data-key="' + key + '"]';
    const button = document.querySelector(selector);
    if (!button || typeof htmx === "undefined") return false;
    chain = chain.then(function () {
      const current = document.querySelector(selector);
      if (!current || current.disabled) return undefined;
      const values = JSON.parse(current.getAttribute("hx-vals") || "{}");
      const note = document.getElementById("flag-note");
      if (note && note.value) values.note = note.value;
      return htmx.ajax("POST", current.getAttribute("hx-post"), { target: "#flag-bar", swap: "outerHTML", values: values });
    }).catch(function () { /* htmx reports failed requests itself */ });
    return true;
  }

  function go(url) { if (url) window.location.assign(url); }

  // After a verdict the next record comes up by itself (one key per record); a checkbox turns that off.
  const ADVANCE_KEY = "synthwatch.advance";
  let stayOnce = false;  // a note saved with Enter stays on the record
  function advanceOn() {
    try { return window.localStorage.getItem(ADVANCE_KEY) !== "0"; } catch (e) { return true; }
  }

  // In the note field Enter saves the note (with the record's verdict, when it has one) and Escape leaves
  // the field: either way the next key is a command again, not a character of the note.
  function noteKey(ev) {
    const note = ev.target;
    if (ev.key === "Escape") { note.blur(); ev.preventDefault(); return; }
    if (ev.key !== "Enter" || ev.isComposing) return;
    ev.preventDefault();
    const bar = document.getElementById("flag-bar");
    const verdict = bar ? bar.dataset.verdict : "";
    if (verdict && note.value && typeof htmx !== "undefined") {
      stayOnce = true;
      const values = { verdict: verdict, note: note.value };
      if (bar.dataset.reason) values.reason = bar.dataset.reason;
      chain = chain.then(function () {
        return htmx.ajax("POST", bar.dataset.flagUrl, { target: "#flag-bar", swap: "outerHTML", values: values });
      }).catch(function () { /* htmx reports failed requests itself */ });
    } else if (bar) {
      bar.classList.add("note-pending");  // no verdict yet: the note goes with the next one
    }
    note.blur();
  }

  document.addEventListener("DOMContentLoaded", function () {
    const root = document.getElementById("review");
    if (!root) return;
    root.querySelectorAll(".tab[data-tab]").forEach((t) => t.addEventListener("click", () => showTab(root, t.dataset.tab)));
    if (wsOn()) applyWhitespace(true);
    const toggle = document.getElementById("advance-toggle");
    if (toggle) {
      toggle.checked = advanceOn();
      toggle.addEventListener("change", function () {
        try { window.localStorage.setItem(ADVANCE_KEY, toggle.checked ? "1" : "0"); } catch (e) { /* this page only */ }
      });
    }
    document.addEventListener("htmx:afterRequest", function (evt) {
      const path = evt.detail.pathInfo ? evt.detail.pathInfo.requestPath : "";
      if (!evt.detail.successful || !/\/flag$/.test(path || "")) return;
      if (stayOnce) { stayOnce = false; return; }
      if (advanceOn()) go(root.dataset.advanceUrl);
    });
    document.addEventListener("keydown", function (ev) {
      if (ev.target && ev.target.id === "flag-note") noteKey(ev);
    });

    document.addEventListener("keydown", function (ev) {
      if (ev.ctrlKey || ev.metaKey || ev.altKey || ev.isComposing || typing(ev.target)) return;
      const key = ev.key;
      let handled = true;
      if (key === "n" || key === " ") go(root.dataset.sampleUrl);
      else if (key === "j") go(root.dataset.nextUrl);
      else if (key === "k") go(root.dataset.prevUrl);
      else if (key === "w") toggleWhitespace();
      else if (key === "t") showTab(root, "tokens");
      else if (key === "r") showTab(root, "raw");
      else if (key === "x") showTab(root, "text");
      else if (key === "g" || key === "b" || key === "u" || /^[1-9]$/.test(key)) handled = flagKey(key);
      else handled = false;
      if (handled) ev.preventDefault();
    });
  });
})();
