// export behaviour (no inline scripts: the CSP forbids them)
"use strict";
(function () {
  // Show the options that apply to the chosen format only (the server validates regardless).
  function sync(form) {
    var checked = form.querySelector("input[data-export-format]:checked");
    var fmt = checked ? checked.value : "";
    form.querySelectorAll("[data-export-only]").forEach(function (el) {
      var applies = el.getAttribute("data-export-only").split(" ").indexOf(fmt) >= 0;
      el.hidden = !applies;
      el.querySelectorAll("input").forEach(function (input) {
        if (!applies) { input.checked = false; }
        input.disabled = !applies;
      });
    });
  }
  function init() {
    document.querySelectorAll("form[data-export-form]").forEach(function (form) {
      form.addEventListener("change", function () { sync(form); });
      form.addEventListener("submit", function () {
        var button = form.querySelector("button[type=submit]");
        if (button) { button.disabled = true; button.textContent = "Starting…"; }
      });
      sync(form);
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
