// The run page's Streams panel (#36): loads nothing while closed; open, the list every data-poll-ms while the run
// is live, and a stream opened from it every second instead of the list (within the page's polling budget).
(function () {
  "use strict";
  var timer = null;
  function panel() { return document.getElementById("run-streams"); }
  function stop() { if (timer !== null) { clearTimeout(timer); timer = null; } }
  function get(url, target) {
    return fetch(url, { headers: { "HX-Request": "true" }, credentials: "same-origin" }).then(function (r) {
      return r.ok ? r.text() : Promise.reject(new Error("HTTP " + r.status));
    }).then(function (html) { target.innerHTML = html; return target.firstElementChild; });
  }
  function tick() {
    timer = null;
    var p = panel();
    if (!p || !p.open) { return; }
    var run = p.getAttribute("data-run");
    var one = document.querySelector("#stream-open [data-stream]");
    var next = one
      ? get("/runs/" + run + "/streams/" + one.getAttribute("data-stream"), document.getElementById("stream-open"))
      : get("/runs/" + run + "/streams", document.getElementById("streams-list"));
    next.then(function (el) {
      if (el && el.getAttribute("data-live") === "yes" && p.open && timer === null) {
        timer = setTimeout(tick, parseInt(el.getAttribute("data-poll-ms"), 10) || 5000);
      }
    }).catch(function () { if (p.open && timer === null) { timer = setTimeout(tick, 10000); } });
  }
  document.addEventListener("toggle", function (evt) {
    if (evt.target !== panel()) { return; }
    stop();
    if (evt.target.open) { tick(); }
  }, true);
  document.addEventListener("click", function (evt) {
    var w = evt.target.closest && evt.target.closest("[data-watch-stream]");
    var c = evt.target.closest && evt.target.closest("[data-close-stream]");
    var p = panel();
    if (!p || (!w && !c)) { return; }
    stop();
    if (w) {
      document.getElementById("stream-open").innerHTML =
        '<section data-stream="' + parseInt(w.getAttribute("data-watch-stream"), 10) + '"></section>';
    } else {
      document.getElementById("stream-open").innerHTML = "";
    }
    tick();
  });
}());
