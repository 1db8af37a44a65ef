// How the pages look and what a person notices, beside chat.js:
// - Dark mode is applied the moment it is chosen (htmx saves it; the server renders it on <html> from then on,
//   so a page never flashes the other theme);
// - Esc stops a running reply, as Stop does; Ctrl+Shift+O (⌘⇧O) starts a new session, Shift+Esc puts the cursor in
//   the message box, and "/" (outside a text field) in the session search;
// - a reply that finishes while the tab is hidden marks the tab's title until the tab is seen again, and shows a
//   browser notification where the person ticked Notify me and the browser allowed it;
// - on a phone: More opens the less-used controls, the Chat and Cache tabs, and a tapped chart bar shows its
//   figures (on any screen: a click does too).
(function () {
  "use strict";

  var READY_MARK = "● Reply ready — ";
  var NOTIFY_KEY = "cachet-notify";

  document.addEventListener("change", function (event) {
    var target = event.target;
    if (target && target.id === "theme-select") document.documentElement.dataset.theme = target.value;
  });

  function controlsState() {
    var controls = document.getElementById("controls");
    return controls ? controls.dataset.state : "";
  }

  // --- Esc stops -----------------------------------------------------------------------------------------
  document.addEventListener("keydown", function (event) {
    if (event.key !== "Escape" || event.shiftKey || event.defaultPrevented || event.isComposing) return;
    var more = document.getElementById("toolbar");
    if (more && more.classList.contains("more-open")) { openMore(false); return; }
    var stop = document.getElementById("stop-button");
    if (stop && !stop.disabled && controlsState() === "running") {
      event.preventDefault();
      stop.click();
    }
  });

  // --- shortcuts ----------------------------------------------------------------------------------------------
  function typing(target) {
    return target && (target.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(target.tagName));
  }

  document.addEventListener("keydown", function (event) {
    if (event.defaultPrevented || event.isComposing) return;
    var key = event.key.toLowerCase();
    if (key === "o" && event.shiftKey && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      window.location.assign("/sessions/new");
    } else if (event.key === "Escape" && event.shiftKey) {
      var box = document.getElementById("composer-text");
      if (box) { event.preventDefault(); box.focus(); }
    } else if (event.key === "/" && !typing(event.target) && !event.ctrlKey && !event.metaKey && !event.altKey) {
      var search = document.getElementById("search-q");
      if (search) { event.preventDefault(); search.focus(); }
    }
  });

  // --- a reply finished while the tab was hidden -----------------------------------------------------------
  var wasRunning = false;
  var plainTitle = null;

  function notifyWanted() {
    return "Notification" in window && Notification.permission === "granted"
      && window.localStorage.getItem(NOTIFY_KEY) === "1";
  }

  function replyFinished() {
    if (plainTitle === null) plainTitle = document.title;
    document.title = READY_MARK + plainTitle;
    if (notifyWanted()) {
      var title = document.getElementById("session-title");
      try {
        new Notification("Reply ready", { body: title ? title.textContent : plainTitle, tag: "cachet-reply" });
      } catch (error) {
        // a browser that offers Notification but refuses it outside a service worker: the title says enough
      }
    }
  }

  document.addEventListener("htmx:wsAfterMessage", function () {
    var state = controlsState();
    if (state === "running") wasRunning = true;
    else if (state === "idle" && wasRunning) {
      wasRunning = false;
      if (document.hidden) replyFinished();
    }
  });

  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && plainTitle !== null) {
      document.title = plainTitle;
      plainTitle = null;
    }
  });

  function setUpNotify() {
    var control = document.getElementById("notify-control");
    var box = document.getElementById("notify-me");
    if (!control || !box || !("Notification" in window)) return;
    control.hidden = false;
    box.checked = notifyWanted();
    box.addEventListener("change", function () {
      if (!box.checked) { window.localStorage.removeItem(NOTIFY_KEY); return; }
      Promise.resolve(Notification.requestPermission()).then(function (permission) {
        if (permission === "granted") window.localStorage.setItem(NOTIFY_KEY, "1");
        else {
          box.checked = false;
          control.title = "The browser does not allow notifications from this page: allow them in its site settings.";
        }
      });
    });
  }

  // --- More, the tabs, a proxy button ----------------------------------------------------------------------
  function openMore(open) {
    var toolbar = document.getElementById("toolbar");
    var button = document.getElementById("more-button");
    if (!toolbar || !button) return;
    toolbar.classList.toggle("more-open", open);
    button.setAttribute("aria-expanded", open ? "true" : "false");
  }

  function showTab(name) {
    var page = document.getElementById("chat");
    if (!page) return;
    page.dataset.tab = name;
    document.querySelectorAll(".phone-tabs [role=tab]").forEach(function (tab) {
      tab.setAttribute("aria-selected", tab.dataset.tab === name ? "true" : "false");
    });
  }

  // --- the figures of a chart bar, on a tap or a click ------------------------------------------------------
  function figuresBox() {
    var box = document.getElementById("bar-figures");
    if (box) return box;
    var chart = document.getElementById("chart");
    if (!chart) return null;
    box = document.createElement("pre");
    box.id = "bar-figures";
    box.className = "bar-figures";
    box.setAttribute("role", "status");
    chart.after(box);
    return box;
  }

  function showFigures(bar) {
    var box = figuresBox();
    if (!box) return;
    document.querySelectorAll(".chart-bar.chosen").forEach(function (other) { other.classList.remove("chosen"); });
    bar.classList.add("chosen");
    box.textContent = bar.getAttribute("title") || "";
  }

  document.addEventListener("click", function (event) {
    var target = event.target;
    if (!target || !target.closest) return;
    var bar = target.closest(".chart-bar");
    if (bar) { showFigures(bar); return; }
    var tab = target.closest(".phone-tabs [role=tab]");
    if (tab) { showTab(tab.dataset.tab); return; }
    if (target.closest("#more-button")) {
      var toolbar = document.getElementById("toolbar");
      openMore(!(toolbar && toolbar.classList.contains("more-open")));
      return;
    }
    var proxy = target.closest("[data-click]");
    if (proxy) {
      var real = document.getElementById(proxy.dataset.click);
      if (real && !real.disabled) real.click();
      openMore(false);
      return;
    }
    if (!target.closest("#options")) openMore(false);
  });

  document.addEventListener("DOMContentLoaded", setUpNotify);
})();
