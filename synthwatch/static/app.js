// synthwatch dashboard behaviour. No inline scripts anywhere (the CSP forbids them).
"use strict";

// The repair page: saving settings mid-repair keeps the records being chosen below (an alarm, a check, ...).
// The settings form carries them in keep.* fields (filled from the URL by the server); this copies what the
// person chose since, so the page comes back with the same selection and Preview works at once.
document.addEventListener("submit", function (e) {
  var form = e.target;
  if (!form.classList || !form.classList.contains("settings-form")) { return; }
  var repair = document.querySelector("form.repair-form");
  if (!repair) { return; }
  form.querySelectorAll("input[name^='keep.']").forEach(function (keep) {
    var name = keep.name.slice(5);
    var field = name === "kind" ? repair.querySelector("input[name=kind]:checked") : repair.querySelector("[name='" + name + "']");
    if (field) { keep.value = field.value; }
  });
}, true);
