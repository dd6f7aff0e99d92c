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
    root.querySelectorAll(".tab[data-tab]").forEach((t) => {
      t.classList.toggle("current", t.dataset.tab === name);
      t.setAttribute("aria-selected", t.dataset.tab === name ? "true" : "false");
    });
    root.querySelectorAll(".tab-pane[data-pane]").forEach((p) => { p.hidden = p.dataset.pane !== name; });
    // A tab chosen while the next record is on its way is the arriving record's: the swap would otherwise bring it
    // up on Text, throwing the choice (and the outgoing record's token request) away (#28: "the first t after a
    // swap sometimes loads nothing").
    if (arriving > 0) { carryTab = name; return; }
    if (name === "tokens") loadTokens(root.querySelector("#tokens-pane"));
  }

  // The token view, fetched once per record on its first show. Not through htmx: the fragment holds no hx- attribute,
  // and htmx's scan of a 32k-token record's 40k new elements for them took longer than drawing them (#28 item 8).
  function loadTokens(pane) {
    if (!pane || pane.dataset.loaded) return;
    pane.dataset.loaded = "1";
    fetch(pane.dataset.src, { credentials: "same-origin", headers: { "HX-Request": "true" } })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      })
      .then(function (html) {
        if (!pane.isConnected) return;  // the record was swapped for another meanwhile
        pane.dispatchEvent(new CustomEvent("sw:tokens-arrived", { bubbles: true }));
        pane.innerHTML = html;  // the server's template, every value escaped (as an htmx swap would insert it)
        pane.dispatchEvent(new CustomEvent("sw:tokens-shown", { bubbles: true }));
      })
      .catch(function (e) {
        delete pane.dataset.loaded;
        pane.textContent = "The token view did not load (" + e.message + "): press t to try again.";
      });
  }
  let arriving = 0;  // records on their way (show() calls not yet swapped in)
  let carryTab = null;  // the tab asked for meanwhile

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
      // a long text comes in blocks (laid out as they scroll into view): each block is redrawn on its own
      const blocks = pre.querySelectorAll(":scope > .chunk");
      (blocks.length ? Array.from(blocks) : [pre]).forEach((el) => {
        if (!el._plain) el._plain = Array.from(el.childNodes).map((n) => n.cloneNode(true));
        el.replaceChildren(...(on ? withWhitespace(el._plain) : el._plain.map((n) => n.cloneNode(true))));
      });
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
    const root = reviewRoot();
    const advanceUrl = root && root.dataset.advanceUrl;
    if (key !== "u" && !button.disabled && advanceOn() && advanceUrl) {
      // auto-advance: the verdict is posted and the next (prefetched) record shown at once; a verdict the
      // dashboard refuses is said in the toast, never dropped silently
      const values = JSON.parse(button.getAttribute("hx-vals") || "{}");
      const note = document.getElementById("flag-note");
      if (note && note.value) values.note = note.value;
      const bar = document.getElementById("flag-bar");
      const idEl = document.getElementById("rec-id");
      const id = idEl ? idEl.textContent : "?";
      const url = button.getAttribute("hx-post");
      keyAt = performance.now();
      chain = chain.then(function () {
        const body = new URLSearchParams(values);
        // keepalive: the verdict still reaches the dashboard if the page is closed meanwhile (the browser allows it
        // for bodies up to 64 KiB; a longer note goes as a plain request)
        return fetch(url, { method: "POST", credentials: "same-origin", headers: { "HX-Request": "true" },
                            body: body, keepalive: body.toString().length < 60000 })
          .then(function (r) {
            if (!r.ok) { lastFlag = null; toast("the verdict on #" + id + " was NOT saved (HTTP " + r.status + "): go back with p"); }
            return r.ok;
          });
      }).catch(function () { lastFlag = null; toast("the verdict on #" + id + " was NOT saved: the dashboard did not answer"); return false; });
      flagged(id, values.verdict, values.reason ? button.textContent.replace(/^\d+\s*/, "") : "",
              url.replace(/\/flag$/, "/undo"), bar ? bar.dataset.verdict : "");
      const posted = chain;
      // the progress is read again once the verdict is stored and the next record is in place
      Promise.all([posted, show(advanceUrl, true)]).then(function (done) { if (done[0]) refreshProgress(); });
      return true;
    }
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

  // Leaving the page waits for the verdicts still being sent: a navigation cancels the requests in flight, so Back
  // or j/k pressed right after a verdict key lost that verdict (the next record shows before its verdict is stored).
  // At most LEAVE_WAIT_MS: a dashboard that does not answer must not keep the reader on the page.
  const LEAVE_WAIT_MS = 10000;
  function afterVerdicts(fn) {
    Promise.race([chain, new Promise(function (done) { setTimeout(done, LEAVE_WAIT_MS); })]).then(fn);
  }
  function go(url) { if (url) afterVerdicts(function () { window.location.assign(url); }); }

  // ---- the next record swapped in place (#28 item 2): prefetched, so a verdict key shows the next record at once
  const prefetched = new Map();  // url -> Promise of {url, html} (null: fetch failed, so navigate instead)
  const shown = [];  // the records of this session before the current one, for p / ArrowLeft
  let keyAt = 0;  // performance.now() of the key that asked for the next record (for the sw:record-shown event)
  function getPage(url) {
    return fetch(url, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text().then(function (html) { return { url: r.url, html: html }; }) : null; })
      .catch(function () { return null; });
  }
  function prefetch(url) {
    if (url && !prefetched.has(url)) prefetched.set(url, getPage(url));
  }
  function reviewRoot() { return document.getElementById("review"); }

  // Swap #review for the page at url (an in-place navigation: history, title and focus follow).
  function show(url, remember) {
    if (!url) return Promise.resolve();
    const from = window.location.href;
    let p = prefetched.get(url);
    prefetched.delete(url);
    if (!p) p = getPage(url);
    arriving += 1;
    return p.then(function (got) {
      arriving -= 1;
      const tab = arriving === 0 ? carryTab : null;
      if (arriving === 0) carryTab = null;
      const doc = got && new DOMParser().parseFromString(got.html, "text/html");
      const fresh = doc && doc.getElementById("review");
      const old = reviewRoot();
      if (!fresh || !old || typeof htmx === "undefined") { go(url); return; }
      const focusedId = document.activeElement && document.activeElement.id;
      // htmx swaps it in: the new record's hx- attributes (verdict buttons, the Tokens pane) work like the first's
      htmx.swap(old, fresh.outerHTML, { swapStyle: "outerHTML", swapDelay: 0, settleDelay: 0 });
      const node = reviewRoot();
      if (remember) shown.push(from);
      window.history.pushState({ swReview: true }, "", got.url);
      document.title = doc.title;
      init(node);
      if (tab) showTab(node, tab);
      const again = focusedId && document.getElementById(focusedId);
      if (again && node.contains(again)) again.focus();  // focus stays on the control it was on
      node.dispatchEvent(new CustomEvent("sw:record-shown", { bubbles: true,
        detail: { ms: keyAt ? performance.now() - keyAt : null, url: got.url } }));
      keyAt = 0;
    });
  }

  // The prefetched page was rendered before the last verdict: its progress count is one behind, so it is read again.
  let progressSeq = 0;
  function refreshProgress() {
    const seq = ++progressSeq;
    getPage(window.location.href).then(function (got) {
      if (!got || seq !== progressSeq) return;  // a later refresh is on its way: only the newest counts
      const doc = new DOMParser().parseFromString(got.html, "text/html");
      const fresh = doc.querySelector('[data-testid="session-progress"]');
      const here = document.querySelector('[data-testid="session-progress"]');
      if (fresh && here) here.replaceWith(document.importNode(fresh, true));
    });
  }

  let toastTimer = 0;
  function toast(text) {
    let el = document.getElementById("review-toast");
    if (!el) {
      el = document.createElement("div");
      el.id = "review-toast";
      el.className = "review-toast";
      el.setAttribute("role", "status");
      document.body.appendChild(el);
    }
    el.textContent = text;
    el.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(function () { el.hidden = true; }, 8000);
  }

  // The last verdict given before auto-advance took the record away: z takes it back from the next record.
  let lastFlag = null;  // {id, verdict, undoUrl}
  function undoLast() {
    if (!lastFlag) return false;
    const f = lastFlag;
    lastFlag = null;
    fetch(f.undoUrl, { method: "POST", credentials: "same-origin", headers: { "HX-Request": "true" } })
      .then(function (r) {
        toast(r.ok ? "undone: #" + f.id + " is " + (f.before || "not reviewed") + " again" : "undo of #" + f.id + " failed (HTTP " + r.status + ")");
        if (r.ok) refreshProgress();
      })
      .catch(function () { toast("undo of #" + f.id + " failed: the dashboard did not answer"); });
    return true;
  }

  function flagged(id, verdict, reason, undoUrl, before) {
    lastFlag = { id: id, verdict: verdict, undoUrl: undoUrl, before: before };
    const label = reason ? " · " + reason : "";
    toast("flagged #" + id + " " + verdict + label + " · undo (z)");
  }

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

  // What each shown record needs (the first page's, and every record swapped in after it).
  function init(root) {
    root.querySelectorAll(".tab[data-tab]").forEach((t) => t.addEventListener("click", () => showTab(root, t.dataset.tab)));
    if (wsOn()) applyWhitespace(true);
    const toggle = document.getElementById("advance-toggle");
    if (toggle) {
      toggle.checked = advanceOn();
      toggle.addEventListener("change", function () {
        try { window.localStorage.setItem(ADVANCE_KEY, toggle.checked ? "1" : "0"); } catch (e) { /* this page only */ }
      });
    }
    const keys = document.getElementById("keys-toggle");
    if (keys) keys.addEventListener("click", toggleKeys);
    const next = document.getElementById("next-record");
    if (next) next.addEventListener("click", function (ev) { ev.preventDefault(); keyAt = performance.now(); show(next.href, true); });
    if (advanceOn() && root.dataset.advanceUrl) {
      prefetch(root.dataset.advanceUrl);
      // said on the page when the next record is here (the browser test waits for it as a reader reads)
      prefetched.get(root.dataset.advanceUrl).then(function (got) { if (got) root.dataset.prefetched = "1"; });
    }
  }

  function toggleKeys() {
    const help = document.getElementById("keys-help");
    const button = document.getElementById("keys-toggle");
    if (!help) return;
    help.hidden = !help.hidden;
    if (button) button.setAttribute("aria-expanded", help.hidden ? "false" : "true");
  }

  function previous() {
    const url = shown.pop();
    if (!url) { toast("this is the first record of this session"); return; }
    keyAt = performance.now();
    show(url, false);
  }

  // A token's jump link kept in the URL (#tok-N, #37): opening the record page with it shows the Tokens tab and
  // scrolls to that token once the view arrived.
  function jumpToHashToken(root) {
    const m = /^#(tok-\d+)$/.exec(window.location.hash);
    if (!m) return;
    const pane = root.querySelector("#tokens-pane");
    if (!pane) return;
    pane.addEventListener("sw:tokens-shown", function () {
      const el = document.getElementById(m[1]);
      if (el) el.scrollIntoView({ block: "center" });
    }, { once: true });
    showTab(root, "tokens");
  }

  document.addEventListener("DOMContentLoaded", function () {
    const first = reviewRoot();
    if (!first) return;
    init(first);
    jumpToHashToken(first);
    window.addEventListener("hashchange", function () {
      const root = reviewRoot();
      const m = /^#(tok-\d+)$/.exec(window.location.hash);
      if (!root || !m) return;
      const el = document.getElementById(m[1]);
      if (el) el.scrollIntoView({ block: "center" }); else jumpToHashToken(root);
    });
    window.addEventListener("popstate", function (ev) {
      if (ev.state && ev.state.swReview) afterVerdicts(function () { window.location.reload(); });
    });
    document.addEventListener("htmx:afterRequest", function (evt) {
      const path = evt.detail.pathInfo ? evt.detail.pathInfo.requestPath : "";
      if (!evt.detail.successful || !/\/flag$/.test(path || "")) return;
      if (stayOnce) { stayOnce = false; return; }
      const root = reviewRoot();
      if (!advanceOn() || !root || !root.dataset.advanceUrl) return;
      const elt = evt.detail.elt;
      const values = JSON.parse((elt && elt.getAttribute && elt.getAttribute("hx-vals")) || "{}");
      const idEl = document.getElementById("rec-id");
      if (values.verdict && idEl) flagged(idEl.textContent, values.verdict, "", path.replace(/\/flag$/, "/undo"), "");
      keyAt = performance.now();
      show(root.dataset.advanceUrl, true);
    });
    document.addEventListener("keydown", function (ev) {
      if (ev.target && ev.target.id === "flag-note") noteKey(ev);
    });

    document.addEventListener("keydown", function (ev) {
      if (ev.ctrlKey || ev.metaKey || ev.altKey || ev.isComposing || typing(ev.target)) return;
      const root = reviewRoot();
      if (!root) return;
      const key = ev.key;
      let handled = true;
      if (key === "n" || key === " ") { keyAt = performance.now(); show(root.dataset.sampleUrl, true); }
      else if (key === "j") go(root.dataset.nextUrl);
      else if (key === "k") go(root.dataset.prevUrl);
      else if (key === "p" || key === "ArrowLeft") previous();
      else if (key === "z") handled = undoLast();
      else if (key === "?") toggleKeys();
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

// The records table's selection (#28 item 4): row checkboxes, a sticky "N selected" bar with bulk flag and re-run.
// The ticked ids live here, so a table redrawn by htmx (every 5 s while following, after a flag) keeps them ticked.
(function () {
  const picked = new Set();
  function sync() {
    const bar = document.getElementById("selection-bar");
    if (!bar) return;
    document.querySelectorAll("#records-table input.row-select").forEach((cb) => { cb.checked = picked.has(cb.value); });
    const all = document.getElementById("select-page");
    const rows = document.querySelectorAll("#records-table input.row-select");
    if (all) all.checked = rows.length > 0 && Array.from(rows).every((cb) => cb.checked);
    bar.hidden = picked.size === 0;
    document.getElementById("selected-count").textContent = picked.size.toLocaleString("en-US") + " selected";
    bar.querySelectorAll("input.selected-ids").forEach((i) => { i.value = Array.from(picked).join(","); });
  }
  document.addEventListener("DOMContentLoaded", function () {
    if (!document.getElementById("selection-bar")) return;
    document.addEventListener("change", function (ev) {
      const t = ev.target;
      if (t.classList && t.classList.contains("row-select")) {
        if (t.checked) picked.add(t.value); else picked.delete(t.value);
        sync();
      } else if (t.id === "select-page") {
        document.querySelectorAll("#records-table input.row-select").forEach((cb) => {
          if (t.checked) picked.add(cb.value); else picked.delete(cb.value);
        });
        sync();
      }
    });
    document.getElementById("clear-selection").addEventListener("click", function () { picked.clear(); sync(); });
    document.body.addEventListener("htmx:afterSwap", sync);
    document.addEventListener("click", function (ev) {
      const a = ev.target.closest && ev.target.closest("[data-open-details]");
      const d = a && document.querySelector(a.dataset.openDetails);
      if (d) d.open = true;
    });
  });
})();
