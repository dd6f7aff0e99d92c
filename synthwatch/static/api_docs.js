// The API page: Swagger UI (from npm, served from static/vendor) on the app's own /openapi.json.
"use strict";
(function () {
  var el = document.getElementById("swagger-ui");
  if (!el || typeof window.SwaggerUIBundle !== "function") { return; }
  window.SwaggerUIBundle({
    url: el.dataset.specUrl,
    domNode: el,
    deepLinking: true,
    validatorUrl: null,  // no calls to validator.swagger.io: nothing leaves this machine
    tryItOutEnabled: false,
  });
})();
