// Copy buttons (issue 11): a code block's button copies its code; a reply's button fetches the reply's
// markdown from its data-source URL and copies that. One listener on the document serves every button,
// whether the page came with it, htmx loaded it while scrolling up, or the websocket put it in place.
(function () {
  "use strict";

  var SHOWN_MS = 1500;

  function fallbackCopy(text) {
    var buffer = document.createElement("textarea");
    buffer.className = "copy-buffer";
    buffer.setAttribute("readonly", "");
    buffer.value = text;
    document.body.appendChild(buffer);
    buffer.select();
    var done = false;
    try { done = document.execCommand("copy"); } catch (error) { done = false; }
    buffer.remove();
    return done ? Promise.resolve() : Promise.reject(new Error("copy refused"));
  }

  function writeText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text).catch(function () { return fallbackCopy(text); });
    }
    return fallbackCopy(text);
  }

  function textOf(button) {
    if (button.classList.contains("copy-code")) {
      var pre = button.parentElement ? button.parentElement.querySelector("pre") : null;
      return Promise.resolve(pre ? pre.textContent : "");
    }
    var url = button.dataset.source;
    if (!url) return Promise.reject(new Error("nothing to copy"));
    return fetch(url, { credentials: "same-origin", headers: { Accept: "text/plain" } }).then(function (response) {
      if (!response.ok) throw new Error("HTTP " + response.status);
      return response.text();
    });
  }

  function show(button, label) {
    var original = button.dataset.label || button.textContent;
    button.dataset.label = original;
    button.textContent = label;
    button.dataset.copied = "";
    clearTimeout(button.cachetCopyTimer);
    button.cachetCopyTimer = setTimeout(function () {
      button.textContent = original;
      delete button.dataset.copied;
    }, SHOWN_MS);
  }

  document.addEventListener("click", function (event) {
    var button = event.target && event.target.closest ? event.target.closest("button.copy") : null;
    if (!button) return;
    event.preventDefault();
    textOf(button)
      .then(writeText)
      .then(function () { show(button, "Copied"); })
      .catch(function () { show(button, "Copy failed"); });
  });
})();
