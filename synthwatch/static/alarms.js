// alarms behaviour (no inline scripts: the CSP forbids them).
// The cards and strips are pure htmx; this keeps "N more" open across polls and the tab title telling the run's
// state: "⏸ · name" while paused, "⚠ · name" while an alarm is open (#28 item 9), or "(N alarms) title" elsewhere.
"use strict";
(function () {
  const base = document.title;
  let moreOpen = false;
  function update() {
    const slot = document.getElementById("alarm-slot") || document.querySelector("[data-alarm-count]");
    const stateEl = document.getElementById("run-state-key");
    const n = slot ? Number(slot.dataset.alarmCount || 0) : 0;
    const state = (slot && slot.dataset.runState) || (stateEl && stateEl.value) || "";
    const name = slot && slot.dataset.runName;
    const runPage = document.body.dataset.page === "run";
    if (runPage && name) {
      const paused = state.endsWith(":pause") || state.startsWith("paused:");
      const marks = (paused ? "⏸ " : "") + (n > 0 ? "⚠ " : "");
      document.title = marks ? marks + "· " + base : base;
    } else {
      document.title = n > 0 ? "(" + n + " alarm" + (n === 1 ? "" : "s") + ") " + base : base;
    }
    const more = document.querySelector("#alarm-slot details.alarm-more");
    if (more && moreOpen) more.open = true;
  }
  document.addEventListener("toggle", function (e) {
    if (e.target.matches && e.target.matches("details.alarm-more")) moreOpen = e.target.open;
  }, true);
  // A poll never redraws a card while its acknowledge dialog is open (#37): the number typed in it, and the click
  // on its button, would land on a replaced element. The next poll after it closes brings the cards up to date.
  document.addEventListener("htmx:beforeRequest", function (evt) {
    const elt = evt.detail && evt.detail.elt;
    if (!elt || elt.id !== "alarm-slot" || (evt.detail.requestConfig && evt.detail.requestConfig.verb !== "get")) return;
    if (elt.querySelector("details.ack-resume[open], details.alarm-ack-one[open]")) evt.preventDefault();
  });
  document.addEventListener("htmx:afterSettle", update);
  document.addEventListener("DOMContentLoaded", update);
})();
