// New chat: Enter sends the first message (Shift+Enter makes a new line), once: the button stays disabled while
// the page that shows the session loads, so a double press never stores the message twice.
(function () {
  "use strict";

  function form() { return document.getElementById("new-chat-form"); }

  document.addEventListener("keydown", function (event) {
    var target = event.target;
    if (!target || target.id !== "composer-text" || !form()) return;
    if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
    event.preventDefault();
    if (target.value.trim() !== "") form().requestSubmit();
  });

  document.addEventListener("submit", function (event) {
    var sent = form();
    if (event.target !== sent) return;
    if (sent.dataset.sending) { event.preventDefault(); return; }
    sent.dataset.sending = "1";
    var button = document.getElementById("start-session");
    if (button) { button.disabled = true; button.textContent = "Sending…"; }
  });

  window.addEventListener("pageshow", function () {
    var sent = form();
    if (!sent) return;
    delete sent.dataset.sending;
    var button = document.getElementById("start-session");
    if (button) { button.disabled = false; button.textContent = "Send"; }
  });
})();
