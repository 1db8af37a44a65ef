// How the pages look and what a person notices, beside chat.js:
// - Dark mode is applied the moment it is chosen (htmx saves it; the server renders it on <html> from then on,
//   so a page never flashes the other theme);
// - Esc stops a running reply, as Stop does (or closes the sidebar drawer); Ctrl+Shift+O (⌘⇧O) opens New chat, Shift+Esc puts the cursor in
//   the message box, and "/" (outside a text field) in the session search;
// - a reply that finishes while the tab is hidden marks the tab's title until the tab is seen again, and shows a
//   browser notification where the person ticked Notify me and the browser allowed it;
// - on a phone: More opens the less-used controls, the Chat and Cache tabs, and a tapped chart bar shows its
//   figures under the chart; with a mouse, a card beside the bar on hover (a click keeps it), and on keyboard
//   focus; the chart folds to its summary line.
(function () {
  "use strict";

  var READY_MARK = "● Reply ready — ";
  var NOTIFY_KEY = "cachet-notify";

  document.addEventListener("change", function (event) {
    var target = event.target;
    if (target && target.id === "theme-select") document.documentElement.dataset.theme = target.value;
    // a preset chosen puts its instructions in the box, to send as they are or to change first
    if (target && target.matches && target.matches("select[data-fills]")) {
      var box = document.getElementById(target.dataset.fills);
      var chosen = target.selectedOptions[0];
      if (box && chosen && chosen.value) box.value = chosen.dataset.text || "";
    }
  });

  function controlsState() {
    var controls = document.getElementById("controls");
    return controls ? controls.dataset.state : "";
  }

  // --- Esc stops -----------------------------------------------------------------------------------------
  document.addEventListener("keydown", function (event) {
    if (event.key !== "Escape" || event.shiftKey || event.defaultPrevented || event.isComposing) return;
    if (document.querySelector("dialog[open]")) return;  // Esc closes the dialog, and does nothing else
    if (drawerOpen()) { event.preventDefault(); openDrawer(false); return; }
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
    } else if (event.key === "?" && !typing(event.target) && !event.ctrlKey && !event.metaKey && !event.altKey) {
      event.preventDefault();
      showShortcuts();
    } else if (event.key === "/" && !typing(event.target) && !event.ctrlKey && !event.metaKey && !event.altKey) {
      var search = document.getElementById("search-q") || document.getElementById("sidebar-q");
      if (search) {
        event.preventDefault();
        if (search.id === "sidebar-q" && phone()) openDrawer(true);
        search.focus();
      }
    }
  });

  // --- ? shows the keys there are ---------------------------------------------------------------------------
  var SHORTCUTS = [
    ["Enter", "send the message"],
    ["Shift+Enter", "a new line in the message"],
    ["Esc", "stop the reply; close a menu, the drawer or this sheet"],
    ["Shift+Esc", "to the message box"],
    ["/", "search the sessions"],
    ["Ctrl+Shift+O (⌘+Shift+O)", "new chat"],
    ["Enter / Esc in an edit", "send the changed message / keep it as it was"],
    ["Tab, then Enter on a bar", "the chart's figures for that request"],
    ["?", "these keys"]
  ];
  function showShortcuts() {
    var sheet = document.getElementById("shortcuts");
    if (!sheet) {
      sheet = document.createElement("dialog");
      sheet.id = "shortcuts";
      sheet.className = "shortcuts";
      sheet.setAttribute("aria-labelledby", "shortcuts-title");
      var title = document.createElement("h2");
      title.id = "shortcuts-title";
      title.textContent = "Keys";
      sheet.appendChild(title);
      var list = document.createElement("dl");
      SHORTCUTS.forEach(function (pair) {
        var keys = document.createElement("dt");
        var kbd = document.createElement("kbd");
        kbd.textContent = pair[0];
        keys.appendChild(kbd);
        var what = document.createElement("dd");
        what.textContent = pair[1];
        list.appendChild(keys);
        list.appendChild(what);
      });
      sheet.appendChild(list);
      var close = document.createElement("button");
      close.type = "button";
      close.textContent = "Close";
      close.addEventListener("click", function () { sheet.close(); });
      sheet.appendChild(close);
      document.body.appendChild(sheet);
    }
    if (!sheet.open) sheet.showModal();
  }

  // --- the sidebar: folds away on a wide screen (remembered in a cookie the server reads), a drawer on a phone ---
  var PHONE = window.matchMedia("(max-width: 860px)");
  function phone() { return PHONE.matches; }
  function drawerOpen() { return document.documentElement.classList.contains("sidebar-open"); }
  function toggleButton() { return document.getElementById("sidebar-toggle"); }
  function openDrawer(open) {
    var sidebar = document.getElementById("sidebar");
    if (!sidebar) return;
    document.documentElement.classList.toggle("sidebar-open", open);
    var backdrop = document.getElementById("sidebar-backdrop");
    if (backdrop) backdrop.hidden = !open;
    var button = toggleButton();
    if (button) button.setAttribute("aria-expanded", open ? "true" : "false");
    if (open) {
      var first = document.getElementById("sidebar-new");
      if (first) first.focus();
    } else if (button && sidebar.contains(document.activeElement)) {
      button.focus();
    }
  }
  function fold(folded) {
    document.documentElement.classList.toggle("sidebar-folded", folded);
    document.cookie = "cachet_sidebar=" + (folded ? "folded" : "open") + "; path=/; max-age=31536000; SameSite=Lax";
    var button = toggleButton();
    if (button) button.setAttribute("aria-expanded", folded ? "false" : "true");
  }
  function showState() {
    var button = toggleButton();
    if (!button) return;
    var shown = phone() ? drawerOpen() : !document.documentElement.classList.contains("sidebar-folded");
    button.setAttribute("aria-expanded", shown ? "true" : "false");
  }
  PHONE.addEventListener("change", function () { openDrawer(false); showState(); });
  document.addEventListener("DOMContentLoaded", showState);
  document.addEventListener("click", function (event) {
    var target = event.target instanceof Element ? event.target : null;
    if (!target) return;
    if (target.closest("#sidebar-toggle")) {
      if (phone()) openDrawer(!drawerOpen());
      else fold(!document.documentElement.classList.contains("sidebar-folded"));
    } else if (target.closest("#sidebar-close") || target.id === "sidebar-backdrop") {
      openDrawer(false);
    } else if (drawerOpen() && target.closest("#sidebar a[href]")) {
      openDrawer(false);
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

  // --- the figures of a chart bar: a card beside it on hover or keyboard focus, kept by a click or a tap ------
  var pinned = null;
  var HOVER = window.matchMedia("(hover: hover) and (pointer: fine)");
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

  // The card: its first line a heading, then each "name: value" as a row of two columns.
  function fillFigures(box, text) {
    box.textContent = "";
    text.split("\n").forEach(function (line, index) {
      if (index === 0) {
        var head = document.createElement("span");
        head.className = "figures-head";
        head.textContent = line;
        box.appendChild(head);
        return;
      }
      var row = document.createElement("span");
      row.className = "figures-row" + (/^cache miss: (harness|template|server)/.test(line) ? " figures-miss" : "");
      var at = line.indexOf(": ");
      var name = document.createElement("span");
      name.className = "figures-name";
      name.textContent = at < 0 ? line : line.slice(0, at);
      var value = document.createElement("span");
      value.className = "figures-value";
      value.textContent = at < 0 ? "" : line.slice(at + 2);
      var separator = document.createElement("span");  // read, and copied, as "name: value"; not drawn
      separator.className = "figures-sep";
      separator.textContent = at < 0 ? "" : ": ";
      row.appendChild(name);
      row.appendChild(separator);
      row.appendChild(value);
      box.appendChild(row);
    });
  }

  // Under the chart, not over its bars: lined up with the bar, inside the window.
  function placeCard(box, bar) {
    var side = document.getElementById("side");
    if (!side || !HOVER.matches) { box.classList.remove("floating"); return; }
    box.classList.add("floating");
    var area = side.getBoundingClientRect();
    var spot = bar.getBoundingClientRect();
    var plot = document.getElementById("cache-chart");
    var width = box.offsetWidth;
    var left = Math.min(spot.left - area.left, window.innerWidth - 10 - area.left - width);
    left = Math.max(left, 10 - area.left);
    box.style.setProperty("left", left + "px");
    var below = plot ? plot.getBoundingClientRect().bottom - area.top + 6 : spot.bottom - area.top + 6;
    box.style.setProperty("top", below + "px");
  }

  function showFigures(bar, keep) {
    var box = figuresBox();
    if (!box) return;
    document.querySelectorAll(".chart-bar.chosen").forEach(function (other) { other.classList.remove("chosen"); });
    bar.classList.add("chosen");
    fillFigures(box, bar.dataset.figures || "");
    placeCard(box, bar);
    if (keep) pinned = bar;
  }

  function hideFigures() {
    var box = document.getElementById("bar-figures");
    pinned = null;
    document.querySelectorAll(".chart-bar.chosen").forEach(function (other) { other.classList.remove("chosen"); });
    if (box) { box.textContent = ""; box.classList.remove("floating"); }
  }

  document.addEventListener("mouseover", function (event) {
    var bar = event.target && event.target.closest ? event.target.closest(".chart-bar") : null;
    if (bar && HOVER.matches && bar !== pinned) showFigures(bar, false);
  });
  document.addEventListener("mouseout", function (event) {
    var bar = event.target && event.target.closest ? event.target.closest(".chart-bar") : null;
    if (!bar || !HOVER.matches || pinned || bar.contains(event.relatedTarget)) return;
    hideFigures();
  });
  document.addEventListener("focusin", function (event) {
    var bar = event.target && event.target.closest ? event.target.closest(".chart-bar") : null;
    if (bar) showFigures(bar, false);
  });
  document.addEventListener("focusout", function (event) {
    var bar = event.target && event.target.closest ? event.target.closest(".chart-bar") : null;
    if (bar && !pinned) hideFigures();
  });
  document.addEventListener("keydown", function (event) {
    var bar = event.target && event.target.closest ? event.target.closest(".chart-bar") : null;
    if (bar && (event.key === "Enter" || event.key === " ")) { event.preventDefault(); showFigures(bar, true); }
    else if (event.key === "Escape" && document.querySelector(".chart-bar.chosen")) hideFigures();
  });

  // --- a header menu opens where it can be read: a panel that would pass the window's right edge is aligned to
  // its summary's right (or to the window where that is not enough), and a menu opened from below (Retry with
  // another model…, the header scrolled away) is brought into view ------------------------------------------
  var MARGIN = 8;
  function placePanel(menu) {
    var panel = menu.querySelector(":scope > .export-choices, :scope > .model-choices");
    if (!panel || getComputedStyle(panel).position === "fixed") return;  // the phone's panels span the screen
    panel.style.left = "";
    panel.style.right = "";
    var box = panel.getBoundingClientRect();
    if (box.right > window.innerWidth - MARGIN) {
      panel.style.left = "auto";
      panel.style.right = "0";
      box = panel.getBoundingClientRect();
      if (box.left < MARGIN) panel.style.right = (box.left - MARGIN) + "px";
    }
    box = menu.getBoundingClientRect();
    if (box.top < 0) menu.scrollIntoView({ block: "start" });
  }
  document.addEventListener("toggle", function (event) {
    var menu = event.target;
    if (menu && menu.open && menu.matches && menu.matches(".chat-head details")) placePanel(menu);
  }, true);
  // The model menu fills in once its server has answered: placed again then.
  document.addEventListener("htmx:afterSwap", function (event) {
    var menu = event.target && event.target.closest ? event.target.closest(".chat-head details[open]") : null;
    if (menu) placePanel(menu);
  });

  // --- the chart folds to its summary line; the server draws it as it was left (a cookie) ------------------
  // --- and opens or closes from its headline in the page's header --------------------------------------------
  document.addEventListener("toggle", function (event) {
    var fold = event.target;
    if (!fold || fold.id !== "chart-fold") return;
    document.cookie = "cachet_chart=" + (fold.open ? "open" : "folded") + "; path=/; max-age=31536000; SameSite=Lax";
    var toggle = document.getElementById("chart-toggle");
    if (toggle) toggle.setAttribute("aria-expanded", fold.open ? "true" : "false");
  }, true);
  document.addEventListener("click", function (event) {
    var toggle = event.target && event.target.closest ? event.target.closest("#chart-toggle") : null;
    var fold = document.getElementById("chart-fold");
    if (!toggle || !fold) return;
    fold.open = !fold.open;
    if (fold.open) {
      var side = document.getElementById("side");
      if (side && side.getBoundingClientRect().top > window.innerHeight) side.scrollIntoView({block: "start"});
    }
  });

  document.addEventListener("click", function (event) {
    var target = event.target;
    if (!target || !target.closest) return;
    var bar = target.closest(".chart-bar");
    if (bar) { showFigures(bar, true); return; }
    if (pinned && !target.closest("#bar-figures")) hideFigures();
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
