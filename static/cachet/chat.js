// The chat page's own behaviour; the rest is htmx and its ws extension.
//
// The websocket sends JSON messages (chat/web/messages.py): "ops" put elements in place by their id, remove
// them or append text to a form field's value (long words given back to the box), "live" carries the text of
// the step being streamed with its offset (live.js renders it as markdown), "rev" is the session revision the
// page now shows. A tab says hello when its socket opens (what revision it shows, its oldest turn, its last
// chart bar) and gets back only what it lacks.
//
// Enter sends (or, before the session is ready, queues) and Shift+Enter makes a new line; the box empties once a message is sent and takes the focus
// back when undo returns its words; Edit turns a message into a box in place; the transcript follows new
// text while you are at its end; the connection state shows in the header. A message larger than the server
// takes (the page's data-max-bytes) is not sent: it stays in its box and the notice says why, as the server would.
(function () {
  "use strict";

  var BAR_LIMIT = 120;
  var liveAskedAt = 0;

  function chat() { return document.getElementById("chat"); }
  function box() { return document.getElementById("composer-text"); }
  function sendButton() { return document.getElementById("send-button"); }

  function elementOf(html) {
    var template = document.createElement("template");
    template.innerHTML = html;
    return template.content.firstElementChild;
  }

  function insertOrdered(parent, element) {
    var order = parseFloat(element.dataset.order || "0");
    var children = parent.children;
    for (var i = 0; i < children.length; i++) {
      var other = children[i];
      if (other.dataset && other.dataset.order !== undefined && parseFloat(other.dataset.order) > order) {
        parent.insertBefore(element, other);
        return;
      }
    }
    parent.appendChild(element);
  }

  // The chart's plot scrolls sideways: it opens at its newest bars, and a new bar keeps them in view where the
  // person had not scrolled back to older ones.
  function chartPlot() {
    var bars = document.getElementById("chart-bars");
    return bars ? bars.parentElement : null;
  }
  function plotAtEnd() {
    var plot = chartPlot();
    return !plot || plot.scrollLeft + plot.clientWidth >= plot.scrollWidth - 24;
  }
  function plotToEnd() {
    var plot = chartPlot();
    if (plot) plot.scrollLeft = plot.scrollWidth;
  }

  function put(op) {
    var element = elementOf(op.html);
    if (!element) return;
    var chartAtEnd = plotAtEnd();
    var existing = document.getElementById(op.id);
    if (existing) {
      existing.replaceWith(element);
    } else if (op.into) {
      var parent = document.getElementById(op.into);
      if (!parent) return;
      if (op.at === "start") parent.insertBefore(element, parent.firstChild);
      else if (op.at === "order") insertOrdered(parent, element);
      else parent.appendChild(element);
      if (op.into === "chart-bars") {
        while (parent.children.length > BAR_LIMIT) parent.removeChild(parent.firstElementChild);
      }
    } else {
      return;
    }
    htmx.process(element);
    if (chartAtEnd && (op.into === "chart-bars" || element.querySelector("#chart-bars"))) plotToEnd();
    if (liveView()) liveView().scan(element);
    if (element.id === "composer-text" && element.dataset.focus) {
      element.focus();
      element.setSelectionRange(element.value.length, element.value.length);
    }
  }

  function remove(op) {
    var existing = document.getElementById(op.id);
    if (existing) existing.remove();
  }

  function append(op) {
    var field = document.getElementById(op.id);
    if (!field || field.value === undefined) return;
    field.value += op.text;
    if (document.activeElement === field) field.setSelectionRange(field.value.length, field.value.length);
  }

  function askLive() {
    var now = Date.now();
    if (now - liveAskedAt < 2000) return;
    liveAskedAt = now;
    send({ type: "live" });
  }

  // Append what ``text`` (at offset ``at``) adds to the element's text; true when it added something. The text
  // so far is kept as a string too (cachetText), so live.js renders it without reading the DOM.
  function appendAt(element, text, at) {
    if (!element || text === undefined) return false;
    if (element.cachetText === undefined) element.cachetText = element.textContent;
    var have = element.cachetText.length;
    if (at > have) { askLive(); return false; }
    if (at + text.length <= have) return false;
    var fresh = text.slice(have - at);
    element.appendChild(document.createTextNode(fresh));
    element.cachetText += fresh;
    return true;
  }

  function clear(element) {
    if (!element) return;
    element.textContent = "";
    element.cachetText = "";
  }

  function liveView() { return window.cachetLive; }

  function applyLive(live) {
    var area = document.getElementById("live-" + live.turn);
    if (!area) return;
    var stream = area.querySelector(".stream");
    var reasoning = area.querySelector(".live-reasoning-text");
    var calls = area.querySelector(".calling");
    var step = parseInt(area.dataset.step || "0", 10);
    if (live.step < step) return;
    if (live.step > step || live.reset) {
      area.dataset.step = String(live.step);
      clear(stream); clear(reasoning);
      if (calls) calls.textContent = "";
      if (liveView()) liveView().clear(area);
    }
    (live.calls || []).forEach(function (name) {
      if (!calls) return;
      var item = document.createElement("li");
      item.textContent = "calling " + name + "…";
      calls.appendChild(item);
    });
    if (appendAt(stream, live.text, live.text_at || 0) && liveView()) liveView().update(area);
    appendAt(reasoning, live.reasoning, live.reasoning_at || 0);
  }

  function apply(message) {
    (message.ops || []).forEach(function (op) {
      if (op.op === "put") put(op); else if (op.op === "remove") remove(op); else if (op.op === "append") append(op);
    });
    if (message.live) applyLive(message.live);
    if (message.hello) sayHello();
    var page = chat();
    if (page && message.rev !== undefined && message.rev > parseInt(page.dataset.rev || "0", 10)) {
      page.dataset.rev = String(message.rev);
    }
    sendQueued();
  }

  // What the websocket's messages go through, for the browser tests (tests/browser/test_browser_live_render.py).
  window.cachetChat = { apply: apply };

  htmx.defineExtension("cachet", {
    transformResponse: function (text, xhr) {
      if (xhr) return text;
      var message;
      try { message = JSON.parse(text); } catch (error) { return text; }
      apply(message);
      return "";
    }
  });

  var socket = null;
  function send(data) {
    if (socket) socket.send(JSON.stringify(data), chat());
  }

  // What the page shows, said when the socket opens and again when the server asks (its channel layer was away,
  // so events meant for the page may be lost): the server answers with what changed since.
  function sayHello() {
    var page = chat();
    send({ type: "hello", rev: parseInt(page.dataset.rev || "0", 10), first: firstTurn(), bar: lastBar() });
  }

  function lastBar() {
    var bars = document.querySelectorAll("#chart-bars .chart-bar");
    if (!bars.length) return 0;
    return parseInt(bars[bars.length - 1].id.replace("bar-", ""), 10) || 0;
  }

  function firstTurn() {
    var turn = document.querySelector("#transcript article.turn");
    return turn ? parseInt(turn.dataset.turn, 10) : 0;
  }

  // Enter before the page is ready (the socket not open yet, or the server not yet said the session is idle)
  // is kept and sent once it is; while a reply runs the words wait in the box and the note under it says why.
  var queued = false;
  function controlsState() {
    var controls = document.getElementById("controls");
    return controls ? controls.dataset.state : "";
  }
  function ready() {
    var button = sendButton();
    return !!socket && !!button && !button.disabled && controlsState() === "idle";
  }
  function waitNote(text) {
    var note = document.getElementById("composer-wait");
    if (!note) return;
    note.textContent = text;
    note.hidden = !text;
  }
  function submitOrQueue() {
    var text = box();
    queued = false;
    if (!text || text.value.trim() === "") { waitNote(""); return; }
    if (ready()) {
      waitNote("");
      document.getElementById("composer").requestSubmit();
    } else if (socket && controlsState() === "running") {
      waitNote("A reply is running: your message waits here. Stop it (Esc) or let it finish, then press Enter.");
    } else {
      queued = true;
      waitNote(socket ? "Getting the session ready… your message is sent as soon as it is."
        : "Connecting… your message is sent as soon as the page is connected.");
    }
  }
  function sendQueued() {
    if (queued) setTimeout(submitOrQueue, 0);
    else if (ready()) waitNote("");
  }

  document.addEventListener("keydown", function (event) {
    var target = event.target;
    if (!target || target.id !== "composer-text") return;
    if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
    event.preventDefault();
    submitOrQueue();
  });

  document.addEventListener("htmx:wsConfigSend", function (event) {
    // Send only what the server reads: the extension adds the request headers to every message.
    event.detail.headers = null;
  });

  function showNotice(text) {
    var notice = document.getElementById("notice");
    if (!notice) return;
    var words = document.createElement("span");
    words.className = "notice-text";
    words.textContent = text;
    notice.className = "notice error";
    notice.replaceChildren(words);
  }

  document.addEventListener("htmx:wsBeforeSend", function (event) {
    var page = chat();
    var limit = page ? parseInt(page.dataset.maxBytes || "0", 10) : 0;
    var message = event.detail.message;
    if (!limit || typeof message !== "string" || message.length * 3 <= limit) return;
    var size = new TextEncoder().encode(message).length;
    if (size <= limit) return;
    event.preventDefault();
    waitNote("");
    showNotice("That message is " + size + " bytes; the most Cachet takes is " + limit + " bytes.");
  });

  var lastSent = "";
  document.addEventListener("htmx:wsAfterSend", function (event) {
    if (event.target && event.target.id === "composer") {
      var text = box();
      if (text) { lastSent = text.value; text.value = ""; }
    }
  });

  // Edit in place: the person message becomes a box with Save and Cancel; Save sends {"type": "edit"}. The
  // form stays until the server takes the turn back (its article goes), so a refused edit loses nothing.
  function restoreFiles() {
    var box = document.getElementById("restore-files");
    return box && box.checked ? "1" : "";
  }

  function closeEdit(article) {
    var form = article.querySelector("form.edit-form");
    if (form) form.remove();
    var words = article.querySelector(".msg.user .words");
    if (words) words.hidden = false;
  }

  function startEdit(article) {
    if (article.querySelector("form.edit-form")) return;
    var words = article.querySelector(".msg.user .words");
    var source = article.querySelector("template.edit-words");
    if (!words) return;
    var form = document.createElement("form");
    form.className = "edit-form";
    var text = document.createElement("textarea");
    text.className = "edit-text";
    text.setAttribute("aria-label", "Your message");
    text.value = source ? source.content.textContent : words.textContent;
    text.rows = Math.min(12, Math.max(3, text.value.split("\n").length + 1));
    var buttons = document.createElement("div");
    buttons.className = "edit-buttons";
    var save = document.createElement("button");
    save.type = "submit";
    save.className = "primary edit-save";
    save.textContent = "Save";
    var cancel = document.createElement("button");
    cancel.type = "button";
    cancel.className = "edit-cancel";
    cancel.textContent = "Cancel";
    buttons.append(save, cancel);
    form.append(text, buttons);
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      if (text.value.trim() === "") return;
      send({ type: "edit", turn: parseInt(article.dataset.turn, 10), text: text.value, restore: restoreFiles() });
    });
    cancel.addEventListener("click", function () { closeEdit(article); });
    text.addEventListener("keydown", function (event) {
      if (event.key === "Escape") { event.preventDefault(); closeEdit(article); }
      else if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        form.requestSubmit();
      }
    });
    words.hidden = true;
    words.after(form);
    text.focus();
    text.setSelectionRange(text.value.length, text.value.length);
  }

  document.addEventListener("click", function (event) {
    var button = event.target && event.target.closest ? event.target.closest("button.edit") : null;
    var article = button ? button.closest("article.turn") : null;
    if (article) startEdit(article);
  });

  // Regenerate on a reply asks for it again: the last one as it was asked (its message unchanged, so the prompt
  // cache holds), an earlier one as a new branch from its turn with the same words (the old branch is kept).
  document.addEventListener("click", function (event) {
    var button = event.target && event.target.closest ? event.target.closest("button.regenerate-turn") : null;
    var article = button ? button.closest("article.turn") : null;
    if (!article) return;
    var turns = document.querySelectorAll("#transcript article.turn");
    if (turns[turns.length - 1] === article) {
      send({ type: "regenerate", restore: restoreFiles() });
      return;
    }
    var source = article.querySelector("template.edit-words");
    if (!source) return;
    send({ type: "edit", turn: parseInt(article.dataset.turn, 10), text: source.content.textContent, restore: restoreFiles() });
  });

  var transcriptEnd = true;
  function nearEnd() {
    return window.innerHeight + window.scrollY >= document.body.scrollHeight - 80;
  }
  window.addEventListener("scroll", function () { transcriptEnd = nearEnd(); }, { passive: true });

  document.addEventListener("htmx:wsAfterMessage", function () {
    if (transcriptEnd) window.scrollTo(0, document.body.scrollHeight);
  });

  function status(state, text) {
    var badge = document.getElementById("ws-status");
    if (!badge) return;
    badge.dataset.state = state;
    badge.textContent = text;
  }
  document.addEventListener("htmx:wsOpen", function (event) {
    socket = event.detail.socketWrapper;
    status("open", "live");
    sayHello();
  });
  document.addEventListener("htmx:wsClose", function (event) {
    socket = null;
    var code = event.detail && event.detail.event ? event.detail.event.code : 0;
    if (code === 4404) status("gone", "this session is not yours or no longer exists");
    else if (code === 4401) status("gone", "logged out: reload the page");
    else status("closed", "reconnecting…");
    if (code === 1009) {
      // A message past what the server reads at all: it closed the socket saying so. The words go back in the
      // box, and the page connects again (the extension itself only does after a dropped connection).
      var text = box();
      if (text && text.value === "") text.value = lastSent;
      showNotice("That message is larger than Cachet reads (" + (event.detail.event.reason || "message too big") +
        "); it was not sent.");
      var wrapper = event.detail.socketWrapper;
      setTimeout(function () { wrapper.reconnect(); }, 500);
    }
    if (queued) waitNote("Reconnecting… your message is sent as soon as the page is connected again.");
  });

  // Rewind here takes back this turn and every later one, and with "restore files" puts back what they changed:
  // asked first, naming both.
  document.addEventListener("click", function (event) {
    var button = event.target && event.target.closest ? event.target.closest("button.rewind") : null;
    if (!button) return;
    var article = button.closest("article.turn");
    var turns = [];
    var changed = [];
    for (var turn = article; turn; turn = turn.nextElementSibling) {
      if (!turn.matches("article.turn")) continue;
      turns.push(turn.querySelector(".turn-no").textContent.replace("turn ", ""));
      turn.querySelectorAll("li.tool[data-changed]").forEach(function (row) {
        JSON.parse(row.dataset.changed).forEach(function (path) { if (changed.indexOf(path) < 0) changed.push(path); });
      });
    }
    var restore = document.getElementById("restore-files");
    var taken = turns.length === 1 ? "turn " + turns[0] : turns.length + " turns (" + turns[0] + " to " +
      turns[turns.length - 1] + ")";
    var named = changed.slice(0, 8).join(", ") + (changed.length > 8 ? " and " + (changed.length - 8) + " more" : "");
    var files = !changed.length ? " They changed no file." : restore && restore.checked ?
      " The files they changed are put back as they were, where nobody changed them since: " + named + "." :
      " The files they changed stay as they are (tick “restore files” under More to put them back): " + named + ".";
    if (!window.confirm("Rewind here? This takes back " + taken + "." + files)) {
      event.preventDefault();
      event.stopImmediatePropagation();
    }
  }, true);

  // A chart drawn folded, or behind the phone's tab, has no width at load: it goes to its newest bars as it opens.
  document.addEventListener("toggle", function (event) {
    if (event.target && event.target.id === "chart-fold" && event.target.open) plotToEnd();
  }, true);
  document.addEventListener("click", function (event) {
    var tab = event.target && event.target.closest ? event.target.closest(".phone-tabs [role=tab]") : null;
    if (tab) setTimeout(plotToEnd, 0);  // after look.js has shown the tab
  });

  window.addEventListener("load", function () {
    window.scrollTo(0, document.body.scrollHeight);
    plotToEnd();
    var text = box();
    if (text) text.focus();
  });
})();
