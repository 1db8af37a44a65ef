// The chat page's own behaviour; everything else is htmx and its ws extension.
// Enter sends and Shift+Enter makes a new line; the box empties once a message is sent and takes
// the focus back when undo returns its words; the transcript follows new text while you are at its
// end; the connection state shows in the header.
(function () {
  "use strict";

  function box() { return document.getElementById("composer-text"); }
  function sendButton() { return document.getElementById("send-button"); }

  document.addEventListener("keydown", function (event) {
    var target = event.target;
    if (!target || target.id !== "composer-text") return;
    if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
    event.preventDefault();
    var button = sendButton();
    if (target.value.trim() === "" || (button && button.disabled)) return;
    document.getElementById("composer").requestSubmit();
  });

  document.addEventListener("htmx:wsConfigSend", function (event) {
    // Send only what the server reads: the extension adds the request headers to every message.
    event.detail.headers = null;
  });

  document.addEventListener("htmx:wsAfterSend", function (event) {
    if (event.target && event.target.id === "composer") {
      var text = box();
      if (text) text.value = "";
    }
  });

  var transcriptEnd = true;
  function nearEnd() {
    return window.innerHeight + window.scrollY >= document.body.scrollHeight - 80;
  }
  window.addEventListener("scroll", function () { transcriptEnd = nearEnd(); }, { passive: true });

  document.addEventListener("htmx:wsAfterMessage", function () {
    if (transcriptEnd) window.scrollTo(0, document.body.scrollHeight);
  });

  htmx.onLoad(function (element) {
    if (element.id === "composer-text" && element.dataset.focus) {
      element.focus();
      element.setSelectionRange(element.value.length, element.value.length);
    }
  });

  function status(state, text) {
    var badge = document.getElementById("ws-status");
    if (!badge) return;
    badge.dataset.state = state;
    badge.textContent = text;
  }
  document.addEventListener("htmx:wsOpen", function () { status("open", "live"); });
  document.addEventListener("htmx:wsClose", function (event) {
    var code = event.detail && event.detail.event ? event.detail.event.code : 0;
    if (code === 4404) status("gone", "this session is not yours or no longer exists");
    else if (code === 4401) status("gone", "logged out: reload the page");
    else status("closed", "reconnecting…");
  });

  window.addEventListener("load", function () {
    window.scrollTo(0, document.body.scrollHeight);
    var text = box();
    if (text) text.focus();
  });
})();
