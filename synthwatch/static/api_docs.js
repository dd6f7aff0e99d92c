// The API page: Swagger UI (from npm, served from static/vendor) on the app's own /openapi.json.
"use strict";
(function () {
  var el = document.getElementById("swagger-ui");
  if (!el || typeof window.SwaggerUIBundle !== "function") { return; }
  window.SwaggerUIBundle({
    url: el.dataset.specUrl,
    domNode: el,
    deepLinking: false,  // a deep link nests an <a> inside the operation's summary button (axe: nested-interactive)
    validatorUrl: null,  // no calls to validator.swagger.io: nothing leaves this machine
    tryItOutEnabled: false,
  });
})();
