// dashboard behaviour (no inline scripts: the CSP forbids them)
"use strict";
(function () {
  // A control that fails validation answers 400 with a readable fragment: show it instead of dropping it.
  document.addEventListener("htmx:beforeSwap", function (evt) {
    var target = evt.detail.target;
    var status = evt.detail.xhr ? evt.detail.xhr.status : 0;
    if (status >= 400 && status < 500 && target && target.closest && target.closest("[data-swap-errors]")) {
      evt.detail.shouldSwap = true;
      evt.detail.isError = false;
    }
  });
  // A poll that fails (dashboard restarting, network blip) leaves the last values and marks them stale.
  document.addEventListener("htmx:sendError", function (evt) {
    var el = evt.detail.elt;
    if (el && el.classList) { el.classList.add("is-stale"); }
  });
  document.addEventListener("htmx:afterSwap", function (evt) {
    var el = evt.detail.elt;
    if (el && el.classList) { el.classList.remove("is-stale"); }
  });
  // "Re-run every match…": the records table's filter as it is now (it applies as it changes, without a reload).
  document.addEventListener("submit", function (evt) {
    var form = evt.target, from = form && form.getAttribute && form.getAttribute("data-filter-from");
    var filters = from && document.querySelector(from);
    if (!filters) { return; }
    var params = new URLSearchParams();
    new FormData(filters).forEach(function (v, k) { if (v !== "" && k !== "sort" && k !== "order") { params.append(k, v); } });
    form.querySelector("input[name=filter]").value = params.toString();
  });
  // The runs list's filter: a changed select applies at once (the form works without this too).
  document.addEventListener("change", function (evt) {
    var el = evt.target;
    if (el && el.classList && el.classList.contains("auto-submit") && el.form) { el.form.requestSubmit(); }
  });
})();
