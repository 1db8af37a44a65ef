// The step being streamed, as markdown, rendered here in the browser (beside chat.js, which appends the raw
// text to the turn's .stream). The stored step's HTML, rendered once on the server (chat/web/rendering.py),
// replaces all of it.
//
// The parser is markdown-it configured as the server's (raw HTML off, tables and strikethrough on, an image
// shown as a plain link to its address); DOMPurify then keeps only the tags, attributes and URL schemes the
// server's sanitizer keeps (MathML aside: TeX shows as text until the stored step replaces it), and every
// link gets rel="noopener noreferrer nofollow".
//
// The cost stays bounded however long the step gets: a top-level block is finished once a later block has
// started on a whole line, and then it is rendered once and never again; each render parses only the text
// from the first unfinished block on and renders only that tail (past TAIL_CHARS, its last characters as
// plain text). At most PARSE_CHARS of whole lines are parsed at a time (a tab that joins late catches up over
// a few renders); a single block longer than that is never finished here, and shows as plain text until the
// stored step replaces it. Renders are coalesced to one per animation frame, and after a render that took t ms the next
// waits at least WAIT_FACTOR × t. A tab that is hidden renders nothing until it is shown again.
(function () {
  "use strict";

  var TAIL_CHARS = 8000;
  var PARSE_CHARS = 64000;
  var WAIT_FACTOR = 4;
  var LINK_REL = "noopener noreferrer nofollow";
  // chat/web/rendering.py: ALLOWED_TAGS (without MathML), ALLOWED_ATTRIBUTES, URL_SCHEMES.
  var TAGS = ["a", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "li", "ol",
    "p", "pre", "s", "span", "strong", "table", "tbody", "td", "th", "thead", "tr", "ul"];
  var ATTRIBUTES = { a: ["href", "title"], ol: ["start"] };
  // http:, https: and mailto: addresses, and relative ones (no scheme at all), as the server's sanitizer keeps.
  var URLS = /^(?:(?:https?|mailto):|[^a-z]|[a-z+.\-]+(?:[^a-z+.\-:]|$))/i;

  var stats = { renders: 0, ms: 0, longest: 0 };

  if (typeof window.markdownit !== "function" || typeof window.DOMPurify !== "function" ||
      !window.DOMPurify.isSupported) {
    // Without the renderer the raw text stays in view, as it streams.
    window.cachetLive = { update: function () {}, clear: function () {}, scan: function () {}, flush: function () {},
      stats: stats };
    return;
  }

  var md = window.markdownit({ html: false, linkify: false, typographer: false, breaks: false });
  md.enable(["table", "strikethrough"]);
  // A table's alignment is a style attribute, which the page's policy refuses (even in the sanitizer's parsing
  // document, where it would be reported as a violation): it goes before anything is rendered.
  md.core.ruler.push("cachet_no_style", function (state) {
    state.tokens.forEach(function (token) {
      if (token.attrs) token.attrs = token.attrs.filter(function (attr) { return attr[0] !== "style"; });
    });
  });
  md.renderer.rules.image = function (tokens, idx, options, env, self) {
    var token = tokens[idx];
    var alt = self.renderInlineAsText(token.children || [], options, env) || "image";
    var src = token.attrGet("src") || "";
    return '<a href="' + md.utils.escapeHtml(src) + '">[image: ' + md.utils.escapeHtml(alt) + "]</a>";
  };

  // A sanitizer of its own (its hooks touch no other), its settings read once (not at every call: that costs
  // about as much as the rest of a small render).
  var purify = window.DOMPurify(window);
  purify.setConfig({
    ALLOWED_TAGS: TAGS,
    ALLOWED_ATTR: ["href", "title", "start"],
    ALLOWED_URI_REGEXP: URLS,
    ALLOW_DATA_ATTR: false,
    ALLOW_ARIA_ATTR: false,
    RETURN_DOM_FRAGMENT: true
  });
  purify.addHook("uponSanitizeAttribute", function (node, data) {
    var allowed = ATTRIBUTES[node.nodeName.toLowerCase()];
    if (!allowed || allowed.indexOf(data.attrName) < 0) data.keepAttr = false;
  });
  purify.addHook("afterSanitizeAttributes", function (node) {
    if (node.nodeName === "A") node.setAttribute("rel", LINK_REL);
  });

  function markdown(text) {
    return purify.sanitize(md.render(text));
  }

  // Where each top-level block of ``text`` starts, as line numbers.
  function blockLines(text) {
    var tokens = [];
    md.block.parse(text, md, {}, tokens);
    var lines = [];
    for (var i = 0; i < tokens.length; i++) {
      var token = tokens[i];
      if (token.level === 0 && token.nesting >= 0 && token.map) lines.push(token.map[0]);
    }
    return lines;
  }

  function lineOffset(text, line) {
    var at = 0;
    for (var n = 0; n < line; n++) at = text.indexOf("\n", at) + 1;
    return at;
  }

  // The text as chat.js keeps it (or as the page came with it), without half a character at its end.
  function streamText(stream) {
    var text = stream.cachetText !== undefined ? stream.cachetText : stream.textContent;
    var last = text.charCodeAt(text.length - 1);
    return last >= 0xd800 && last <= 0xdbff ? text.slice(0, -1) : text;
  }

  function chunk(className) {
    var element = document.createElement("div");
    element.className = className;
    return element;
  }

  // Render the finished blocks of the first unfinished stretch (up to PARSE_CHARS of whole lines) once, into a
  // chunk of their own; true when text beyond that stretch remains to look at.
  function advance(state, target, text) {
    var wholeLines = text.lastIndexOf("\n") + 1;
    var end = wholeLines;
    if (end - state.doneAt > PARSE_CHARS) end = text.lastIndexOf("\n", state.doneAt + PARSE_CHARS - 1) + 1;
    if (end <= state.doneAt || end === state.triedEnd) return false;
    state.triedEnd = end;
    var stretch = text.slice(state.doneAt, end);
    var lines = blockLines(stretch);
    if (lines.length < 2) return false;
    var finishedAt = state.doneAt + lineOffset(stretch, lines[lines.length - 1]);
    var done = chunk("md-chunk");
    done.appendChild(markdown(text.slice(state.doneAt, finishedAt)));
    target.insertBefore(done, state.tail);
    state.doneAt = finishedAt;
    return end < wholeLines;
  }

  function showTail(state, text) {
    var tail = text.slice(state.doneAt);
    if (tail.length <= TAIL_CHARS) {
      state.tail.replaceChildren(markdown(tail));
      return;
    }
    var cut = tail.length - TAIL_CHARS;
    var code = tail.charCodeAt(cut);
    if (code >= 0xdc00 && code <= 0xdfff) cut += 1;
    var raw = document.createElement("pre");
    raw.className = "md-tail-raw";
    raw.textContent = "…" + tail.slice(cut);
    state.tail.replaceChildren(raw);
  }

  function render(area) {
    var target = area.querySelector(".stream-md");
    var stream = area.querySelector(".stream");
    if (!area.isConnected || !target || !stream) return;
    var text = streamText(stream);
    var state = target.cachetLive;
    if (!text || (state && text.length < state.length)) {
      clearTarget(target);
      if (!text) return;
      state = null;
    }
    if (state && text.length === state.length && !state.more) return;
    if (!state) {
      state = { doneAt: 0, triedEnd: 0, length: 0, more: false, tail: chunk("md-chunk md-tail") };
      target.replaceChildren(state.tail);
      target.cachetLive = state;
    }
    state.more = advance(state, target, text);
    showTail(state, text);
    state.length = text.length;
    if (state.more) update(area);
  }

  function clearTarget(target) {
    target.replaceChildren();
    target.cachetLive = null;
  }

  var pending = [];
  var frame = 0;
  var timer = 0;
  var readyAt = 0;
  var flushing = false;

  function schedule() {
    if (flushing || frame || timer || !pending.length) return;
    var wait = readyAt - performance.now();
    if (wait > 0) timer = setTimeout(function () { timer = 0; schedule(); }, wait);
    else frame = requestAnimationFrame(function () { frame = 0; flush(); });
  }

  // Render every area that changed since the last render, now.
  function flush() {
    if (frame) { cancelAnimationFrame(frame); frame = 0; }
    if (timer) { clearTimeout(timer); timer = 0; }
    var areas = pending;
    if (!areas.length) return;
    pending = [];
    flushing = true;
    var started = performance.now();
    try {
      areas.forEach(render);
    } finally {
      var cost = performance.now() - started;
      flushing = false;
      stats.renders += 1;
      stats.ms += cost;
      stats.longest = Math.max(stats.longest, cost);
      readyAt = started + cost * (1 + WAIT_FACTOR);
      schedule();
    }
  }

  // The live area ``area`` (.live) has new text: render it at the next frame.
  function update(area) {
    if (!area) return;
    if (pending.indexOf(area) < 0) pending.push(area);
    schedule();
  }

  // A new step or a reset: nothing rendered stays.
  function clear(area) {
    var target = area ? area.querySelector(".stream-md") : null;
    if (target) clearTarget(target);
  }

  // The live areas in ``root`` (an element the page just got) that came with text.
  function scan(root) {
    var areas = root.matches && root.matches(".live") ? [root] : [];
    areas.push.apply(areas, root.querySelectorAll ? root.querySelectorAll(".live") : []);
    areas.forEach(function (area) {
      var stream = area.querySelector(".stream");
      if (stream && stream.textContent) update(area);
    });
  }

  window.cachetLive = { update: update, clear: clear, scan: scan, flush: flush, stats: stats };
  scan(document);
})();
