// Attach: files the person gives the model, from the Attach button, dropped on the page, or pasted in the message
// box. On a session's page each file is sent at once (one request a file) and the list above the box shows what
// the next message will say arrived; a name already in the workspace asks: Replace, or keep both (OK, Cancel). On New chat the
// files go with the first message (the form's own file field), so nothing is stored before it is sent.
(function () {
  "use strict";

  function csrf() {
    try { return JSON.parse(document.body.getAttribute("hx-headers") || "{}")["X-CSRFToken"] || ""; }
    catch (error) { return ""; }
  }
  function dock() { return document.querySelector("[data-attach-url]"); }
  function newChatInput() { return document.getElementById("new-chat-files"); }
  function say(text) {
    var box = document.getElementById("attachments");
    if (!box) return;
    var line = document.createElement("p");
    line.className = "attach-said error";
    line.setAttribute("role", "alert");
    line.textContent = text;
    box.appendChild(line);
  }
  function pastedName(file) {
    if (file.name && !/^image\.\w+$/.test(file.name)) return file.name;
    var now = new Date();
    function two(n) { return (n < 10 ? "0" : "") + n; }
    var stamp = now.getFullYear() + two(now.getMonth() + 1) + two(now.getDate()) + "-" +
      two(now.getHours()) + two(now.getMinutes()) + two(now.getSeconds());
    var extension = (file.type.split("/")[1] || "bin").replace(/[^a-z0-9]/gi, "");
    return "pasted-" + stamp + "." + extension;
  }

  // A file of that name is in the workspace: replace it, keep both, or attach nothing (Esc too).
  function askClash(taken) {
    return new Promise(function (resolve) {
      var dialog = document.createElement("dialog");
      dialog.className = "clash-dialog";
      dialog.setAttribute("aria-label", "A file of that name is in the workspace");
      var text = document.createElement("p");
      text.textContent = taken.path + " is already in the workspace.";
      dialog.appendChild(text);
      var row = document.createElement("div");
      row.className = "clash-actions";
      [["replace", "Replace it"], ["keep_both", "Keep both (the new one as " + taken.free + ")"],
        ["", "Don't attach"]].forEach(function (pair) {
        var button = document.createElement("button");
        button.type = "button";
        button.textContent = pair[1];
        if (pair[0] === "replace") button.className = "primary";
        button.addEventListener("click", function () { dialog.close(pair[0]); });
        row.appendChild(button);
      });
      dialog.appendChild(row);
      dialog.addEventListener("close", function () {
        var choice = dialog.returnValue;
        dialog.remove();
        resolve(choice);
      });
      document.body.appendChild(dialog);
      dialog.showModal();
    });
  }

  function send(file, name, choice) {
    var place = dock();
    var limit = parseInt(place.dataset.attachMax, 10) || 0;
    if (limit && file.size > limit) {
      say(name + " is too large: a file attached is at most " + Math.floor(limit / 1048576) + " MB.");
      return Promise.resolve();
    }
    var form = new FormData();
    form.append("files", file, name);
    if (choice) form.append(choice, "1");
    return fetch(place.dataset.attachUrl, {
      method: "POST",
      body: form,
      credentials: "same-origin",
      headers: { "X-CSRFToken": csrf(), "X-Requested-With": "fetch" }
    }).then(function (response) {
      if ((response.headers.get("content-type") || "").indexOf("application/json") === 0) {
        return response.json().then(function (taken) {
          return askClash(taken).then(function (choice) {
            if (!choice) { say(name + " was not attached."); return; }
            return send(file, name, choice);
          });
        });
      }
      return response.text().then(function (text) {
        if (!response.ok) { say(text.trim() || ("Could not attach " + name + ".")); return; }
        var box = document.getElementById("attachments");
        if (box) {
          box.outerHTML = text;
          var fresh = document.getElementById("attachments");
          if (fresh && window.htmx) window.htmx.process(fresh);
        }
      });
    }, function () { say("Could not attach " + name + ": Cachet did not answer."); });
  }

  function attach(files, pasted) {
    var list = Array.prototype.slice.call(files || []);
    if (!list.length) return;
    var input = newChatInput();
    if (input) {  // New chat: they go with the first message
      var all = new DataTransfer();
      Array.prototype.forEach.call(input.files, function (file) { all.items.add(file); });
      list.forEach(function (file) {
        all.items.add(pasted ? new File([file], pastedName(file), { type: file.type }) : file);
      });
      input.files = all.files;
      input.dispatchEvent(new Event("change", { bubbles: true }));
      return;
    }
    if (!dock()) return;
    list.reduce(function (done, file) {
      return done.then(function () { return send(file, pasted ? pastedName(file) : file.name); });
    }, Promise.resolve());
  }

  document.addEventListener("change", function (event) {
    var target = event.target;
    if (target && target.id === "attach-input") {
      attach(target.files, false);
      target.value = "";
    } else if (target && target.id === "new-chat-files") {
      var names = document.getElementById("new-chat-attached");
      if (names) {
        names.textContent = Array.prototype.map.call(target.files, function (file) { return file.name; }).join(", ");
      }
    }
  });

  document.addEventListener("paste", function (event) {
    var target = event.target;
    if (!target || target.id !== "composer-text" || !event.clipboardData) return;
    var files = event.clipboardData.files;
    if (files && files.length) {
      event.preventDefault();
      attach(files, true);
    }
  });

  function dropZone(target) {
    return target && target.closest ? target.closest(".conversation, .first-message") : null;
  }
  function carriesFiles(event) {
    return event.dataTransfer && Array.prototype.indexOf.call(event.dataTransfer.types || [], "Files") >= 0;
  }
  document.addEventListener("dragover", function (event) {
    var zone = dropZone(event.target);
    if (!zone || !carriesFiles(event)) return;
    event.preventDefault();
    zone.classList.add("dropping");
  });
  document.addEventListener("dragleave", function (event) {
    var zone = dropZone(event.target);
    if (zone && !zone.contains(event.relatedTarget)) zone.classList.remove("dropping");
  });
  document.addEventListener("drop", function (event) {
    var zone = dropZone(event.target);
    if (!zone || !carriesFiles(event)) return;
    event.preventDefault();
    zone.classList.remove("dropping");
    attach(event.dataTransfer.files, false);
  });
})();
