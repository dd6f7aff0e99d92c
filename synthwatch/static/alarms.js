// alarms behaviour (no inline scripts: the CSP forbids them).
// The banner is pure htmx; this only keeps the tab title telling that a run has active alarms.
"use strict";
(function () {
  const base = document.title;
  function update() {
    const slot = document.getElementById("alarm-slot");
    const n = slot ? Number(slot.dataset.alarmCount || 0) : 0;
    document.title = n > 0 ? "(" + n + " alarm" + (n === 1 ? "" : "s") + ") " + base : base;
  }
  document.addEventListener("htmx:afterSettle", update);
  document.addEventListener("DOMContentLoaded", update);
})();
