(function () {
"use strict";
var errors = document.getElementById("lt-errors");
function report(message) {
  errors.hidden = false;
  errors.textContent += message + "\n";
}
window.addEventListener("error", function (e) { report("error: " + e.message); });
try {
  main();
  document.body.setAttribute("data-ready", "1");
  var marker = document.createElement("div");
  marker.id = "lt-ready";
  marker.hidden = true;
  document.body.appendChild(marker);
} catch (e) {
  report("error: " + (e && e.stack ? e.stack : e));
  if (window.console) { console.error(e); }
}

function main() {
  var PAGE = 50, TEXTS = 100, TIMELINE = 200;
  var data = JSON.parse(document.getElementById("lt-data").textContent);
  var spans = data.spans, byId = {}, rows = {}, lists = {}, selected = null;
  spans.forEach(function (s) { byId[s.id] = s; });
  // Times count from the first span (a trace block may start well before its first call).
  var t0 = null, t1 = null;
  spans.forEach(function (s) {
    if (t0 == null || s.start < t0) { t0 = s.start; }
    var e = s.end == null ? s.start : s.end;
    if (t1 == null || e > t1) { t1 = e; }
  });

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text != null) { e.textContent = String(text); }
    return e;
  }
  function ms(seconds) {
    if (seconds == null) { return "open"; }
    return seconds < 1 ? (seconds * 1000).toFixed(1) + " ms" : seconds.toFixed(2) + " s";
  }
  function shape(sm) {
    if (!sm) { return "?"; }
    if (sm.shape) { return "[" + sm.shape.join(", ") + "]"; }
    return sm.type || "?";
  }
  function shapes(list) { return (list || []).map(shape).join(", "); }
  function clip(t, n) { t = String(t); return t.length > n ? t.slice(0, n - 1) + "\u2026" : t; }
  function contentText(c) {
    if (typeof c === "string") { return c; }
    if (Array.isArray(c)) {
      return c.map(function (p) { return p && typeof p === "object" ? contentText(p.text) : contentText(p); })
        .filter(function (x) { return x != null; }).join("");
    }
    return null;
  }
  function chars(v) { return v && typeof v === "object" && typeof v.chars === "number" ? v.chars : null; }
  function prompt(req) {
    if (!req || !Array.isArray(req.messages) || !req.messages.length) { return null; }
    for (var i = req.messages.length - 1; i >= 0; i--) {
      var m = req.messages[i];
      if (m && (m.role === "user" || m.role === "tool")) { return m.content; }
    }
    return req.messages[req.messages.length - 1].content;
  }
  function label(s) {
    var path = s.path || "", last = path.split(".").pop();
    var base = path ? (last === s.name ? path : path + " " + s.name) : s.name;
    if (s.kind === "request") {
      var entries = (s.attrs && s.attrs.entries) || [];
      var t = contentText(prompt(s.request));
      return "request " + entries.slice(0, 4).join(",") + (t != null ? "  " + JSON.stringify(clip(t, 40)) : "");
    }
    if (s.kind === "op") { return s.name; }
    if (s.kind === "tool") { return s.name + (path ? "  " + path : ""); }
    if ((s.kind === "llm" || s.kind === "embed") && s.attrs && s.attrs.model) { return base + "  " + s.attrs.model; }
    return base;
  }
  function meta(s) {
    var parts = [];
    if (s.kind !== "request" && (s.inputs.length || s.outputs.length)) {
      parts.push((shapes(s.inputs) || "-") + " \u2192 " + (shapes(s.outputs) || "-"));
    }
    if (s.usage && (s.usage.prompt_tokens || s.usage.completion_tokens)) {
      parts.push((s.usage.prompt_tokens || 0) + "+" + (s.usage.completion_tokens || 0) + " tok");
    }
    parts.push(ms(s.duration));
    if (s.kind === "request" && s.attempts > 1) { parts.push(s.attempts + " attempts"); }
    return parts.join("  ");
  }

  // ---------------------------------------------------------------- tree (children on demand)
  function node(s, depth) {
    var li = el("li", "k-" + s.kind);
    var row = el("div", "lt-row");
    row.setAttribute("role", "treeitem");
    row.tabIndex = 0;
    row.dataset.span = s.id;
    var toggle = el("span", "lt-toggle", s.children.length ? "\u25b8" : "");
    row.appendChild(toggle);
    row.appendChild(el("span", "lt-kind", s.kind));
    row.appendChild(el("span", "lt-label", label(s)));
    row.appendChild(el("span", "lt-meta", meta(s)));
    if (s.cached === true) { row.appendChild(el("span", "lt-cached", "cached")); }
    if (s.error) { row.appendChild(el("span", "lt-err", "\u2717 " + s.error.type)); }
    li.appendChild(row);
    rows[s.id] = row;
    toggle.addEventListener("click", function (e) { e.stopPropagation(); setOpen(s, !isOpen(s)); });
    row.addEventListener("click", function () { select(s.id); });
    row.addEventListener("keydown", function (e) {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); select(s.id); }
      else if (e.key === "ArrowRight") { setOpen(s, true); }
      else if (e.key === "ArrowLeft") { setOpen(s, false); }
    });
    if (s.children.length && depth < 3 && s.children.length <= 20) { setOpen(s, true, li); }
    return li;
  }
  function isOpen(s) { var l = lists[s.id]; return !!(l && !l.ul.hidden); }
  function setOpen(s, open, li) {
    if (!s.children.length) { return; }
    var l = lists[s.id];
    if (!l) {
      if (!open) { return; }
      li = li || rows[s.id].parentNode;
      var ul = el("ul", "lt-children");
      ul.setAttribute("role", "group");
      li.appendChild(ul);
      l = lists[s.id] = {ul: ul, shown: 0, more: null, ids: s.children, depth: depthOf(s) + 1};
      more(l);
    }
    l.ul.hidden = !open;
    var row = rows[s.id];
    if (row) { row.firstChild.textContent = open ? "\u25be" : "\u25b8"; }
  }
  function depthOf(s) { var d = 0; while (s.parent_id != null && byId[s.parent_id]) { s = byId[s.parent_id]; d++; } return d; }
  function more(l) {
    if (l.more) { l.more.remove(); l.more = null; }
    var end = Math.min(l.ids.length, l.shown + PAGE);
    for (var i = l.shown; i < end; i++) {
      var c = byId[l.ids[i]];
      if (c) { l.ul.appendChild(node(c, l.depth)); }
    }
    l.shown = end;
    if (end < l.ids.length) {
      var li = el("li");
      var b = el("button", "lt-more", "show " + Math.min(PAGE, l.ids.length - end) + " more of " + (l.ids.length - end) + " remaining");
      b.addEventListener("click", function () { more(l); });
      li.appendChild(b);
      l.ul.appendChild(li);
      l.more = li;
    }
  }
  function reveal(id) {
    var chain = [], s = byId[id];
    while (s && s.parent_id != null) { chain.unshift(s.parent_id); s = byId[s.parent_id]; }
    chain.forEach(function (pid) {
      var p = byId[pid];
      setOpen(p, true);
      var l = lists[pid];
      var want = chain.indexOf(pid) + 1 < chain.length ? chain[chain.indexOf(pid) + 1] : id;
      var pos = l.ids.indexOf(want);
      while (l.shown <= pos) { more(l); }
    });
  }

  // ---------------------------------------------------------------------------- details pane
  function kv(table, key, value) {
    if (value == null || value === "") { return; }
    var tr = el("tr");
    tr.appendChild(el("th", null, key));
    var td = el("td");
    if (typeof value === "object") {
      var flat = JSON.stringify(value);
      td.appendChild(el("pre", null, flat.length <= 80 ? flat : JSON.stringify(value, null, 2)));
    }
    else { td.textContent = String(value); }
    tr.appendChild(td);
    table.appendChild(tr);
  }
  function textBlock(value) {
    var t = contentText(value);
    if (t != null) { return el("pre", "lt-text", t); }
    var n = chars(value);
    if (n != null) { return el("pre", "lt-text muted", "(" + n + " chars, content not recorded)"); }
    return el("pre", "lt-text", JSON.stringify(value, null, 2));
  }
  function tensors(box, title, list) {
    if (!list || !list.length) { return; }
    list.forEach(function (sm, k) {
      box.appendChild(el("h3", null, title + (list.length > 1 ? " " + k : "") + "  " + shape(sm)));
      var items = sm.texts || sm.chars;
      if (!items) { return; }
      var ol = el("ol");
      ol.start = 0;
      box.appendChild(ol);
      var shown = 0;
      function page() {
        var end = Math.min(items.length, shown + TEXTS);
        for (var i = shown; i < end; i++) {
          var li = el("li");
          li.appendChild(sm.texts ? el("pre", "lt-text", sm.texts[i])
            : el("pre", "lt-text muted", "(" + sm.chars[i] + " chars, content not recorded)"));
          ol.appendChild(li);
        }
        shown = end;
        if (shown < items.length) {
          var b = el("button", "lt-more", "show more (" + (items.length - shown) + " remaining)");
          b.addEventListener("click", function () { b.remove(); page(); });
          box.insertBefore(b, ol.nextSibling);
        }
      }
      page();
      if (sm.omitted) { box.appendChild(el("p", "muted", "\u2026 " + sm.omitted + " more entries not recorded")); }
    });
  }
  function metadataTable(box, md) {
    var keys = Object.keys(md || {});
    if (!keys.length) { return; }
    box.appendChild(el("h3", null, "Metadata"));
    var table = el("table"), head = el("tr");
    head.appendChild(el("th", null, "#"));
    keys.forEach(function (k) { head.appendChild(el("th", null, k)); });
    table.appendChild(head);
    var n = 0;
    keys.forEach(function (k) { if (Array.isArray(md[k])) { n = Math.max(n, md[k].length); } });
    for (var i = 0; i < Math.min(n, TEXTS); i++) {
      var tr = el("tr");
      tr.appendChild(el("td", null, i));
      keys.forEach(function (k) {
        var v = Array.isArray(md[k]) ? md[k][i] : md[k];
        tr.appendChild(el("td", null, v != null && typeof v === "object" ? JSON.stringify(v) : v));
      });
      table.appendChild(tr);
    }
    box.appendChild(table);
    if (n > TEXTS) { box.appendChild(el("p", "muted", "\u2026 " + (n - TEXTS) + " more rows")); }
  }
  function requestBlock(box, req) {
    if (!req) { return; }
    box.appendChild(el("h3", null, "Request"));
    var params = el("table");
    Object.keys(req).forEach(function (k) { if (k !== "messages") { kv(params, k, req[k]); } });
    if (params.childNodes.length) { box.appendChild(params); }
    (req.messages || []).forEach(function (m) {
      box.appendChild(el("div", "lt-msg-role", m.role != null && typeof m.role === "object" ? "(role)" : m.role));
      box.appendChild(m.content != null ? textBlock(m.content) : el("pre", "lt-text muted", "(no content)"));
      if (m.tool_calls) { box.appendChild(el("pre", "lt-text", JSON.stringify(m.tool_calls, null, 2))); }
    });
  }
  function responseBlock(box, resp) {
    if (!resp) { return; }
    box.appendChild(el("h3", null, "Response"));
    var t = el("table");
    kv(t, "model", resp.model);
    box.appendChild(t);
    (resp.choices || []).forEach(function (c, i) {
      var fr = c.finish_reason;
      box.appendChild(el("div", "lt-msg-role", "choice " + i + (typeof fr === "string" ? "  (" + fr + ")" : "")));
      if (c.text != null) { box.appendChild(textBlock(c.text)); }
      if (c.tool_calls) { box.appendChild(el("pre", "lt-text", JSON.stringify(c.tool_calls, null, 2))); }
    });
  }
  function select(id) {
    var s = byId[id];
    if (!s) { return; }
    if (selected != null && rows[selected]) { rows[selected].classList.remove("sel"); }
    if (selected != null && bars[selected]) { bars[selected].classList.remove("sel"); }
    selected = id;
    reveal(id);
    if (rows[id]) { rows[id].classList.add("sel"); rows[id].scrollIntoView({block: "nearest"}); }
    if (bars[id]) { bars[id].classList.add("sel"); }
    var box = document.getElementById("lt-details");
    box.replaceChildren();
    var h = el("h2");
    h.appendChild(el("span", "lt-kind", s.kind));
    h.appendChild(document.createTextNode(" " + (s.path || s.name) + (s.path && s.kind !== "request" ? "  (" + s.name + ")" : "")));
    box.appendChild(h);
    if (s.error) {
      var e = el("div", "lt-errbox");
      e.appendChild(el("strong", null, "\u2717 " + s.error.type + ": "));
      e.appendChild(el("pre", null, s.error.message));
      box.appendChild(e);
    }
    var t = el("table");
    kv(t, "span", s.id + (s.parent_id != null ? "  (parent " + s.parent_id + ")" : ""));
    kv(t, "kind", s.kind);
    kv(t, "name", s.name);
    kv(t, "path", s.path);
    kv(t, "start", "+" + ms(s.start - t0));
    kv(t, "duration", ms(s.duration));
    if (s.inputs.length || s.outputs.length) { kv(t, "shapes", (shapes(s.inputs) || "-") + " \u2192 " + (shapes(s.outputs) || "-")); }
    if (s.usage) { kv(t, "tokens", (s.usage.prompt_tokens || 0) + " prompt + " + (s.usage.completion_tokens || 0) + " completion"); }
    if (s.cost != null) { kv(t, "cost", "$" + s.cost); }
    if (s.cached != null) { kv(t, "cached", String(s.cached)); }
    if (s.attempts != null) { kv(t, "attempts", String(s.attempts)); }
    Object.keys(s.attrs || {}).forEach(function (k) { kv(t, k, s.attrs[k]); });
    if (s.children.length) { kv(t, "children", String(s.children.length)); }
    box.appendChild(t);
    tensors(box, "Input", s.inputs);
    tensors(box, "Output", s.outputs);
    requestBlock(box, s.request);
    responseBlock(box, s.response);
    metadataTable(box, s.metadata);
    try { history.replaceState(null, "", "#span-" + id); } catch (err) { /* file:// in some browsers */ }
  }

  // ------------------------------------------------------------------------------- timeline
  var bars = {};
  function timeline() {
    var box = document.getElementById("lt-timeline");
    var reqs = spans.filter(function (s) { return s.kind === "request" || s.kind === "tool"; });
    if (!reqs.length) { box.appendChild(el("p", "muted", "No requests in this trace.")); return; }
    reqs.sort(function (a, b) { return a.start - b.start; });
    var span = Math.max(t1 - t0, 1e-6);
    var axis = el("div", "lt-axis");
    for (var k = 0; k <= 4; k++) { axis.appendChild(el("span", null, ms(span * k / 4))); }
    box.appendChild(axis);
    var shown = 0, moreBtn = null;
    function page() {
      if (moreBtn) { moreBtn.remove(); moreBtn = null; }
      var end = Math.min(reqs.length, shown + TIMELINE);
      for (var i = shown; i < end; i++) {
        (function (s) {
          var row = el("div", "lt-tl-row");
          row.appendChild(el("span", "lt-tl-label", (s.path || s.name) + " " + (s.kind === "request" ? "#" + ((s.attrs && s.attrs.entries) || []).slice(0, 4).join(",") : s.name)));
          var track = el("div", "lt-tl-track");
          var bar = el("div", "lt-bar" + (s.cached === true ? " cached" : "") + (s.error ? " error" : ""));
          var end2 = s.end == null ? t1 : s.end;
          bar.style.left = (100 * (s.start - t0) / span) + "%";
          bar.style.width = (100 * Math.max(end2 - s.start, 0) / span) + "%";
          bar.title = label(s) + "  " + ms(s.duration) + (s.cached === true ? "  cached" : "") + (s.error ? "  \u2717 " + s.error.type : "");
          track.appendChild(bar);
          row.appendChild(track);
          row.addEventListener("click", function () { select(s.id); });
          bars[s.id] = row;
          box.appendChild(row);
        })(reqs[i]);
      }
      shown = end;
      if (shown < reqs.length) {
        moreBtn = el("button", "lt-more", "show " + Math.min(TIMELINE, reqs.length - shown) + " more of " + (reqs.length - shown) + " remaining");
        moreBtn.addEventListener("click", page);
        box.appendChild(moreBtn);
      }
    }
    page();
  }

  // ------------------------------------------------------------------------------- summary
  document.getElementById("lt-title").textContent = "langtorch trace: " + data.name;
  var nreq = 0, cached = 0, failed = 0, p = 0, c = 0, cost = 0;
  spans.forEach(function (s) {
    if (s.kind === "request") {
      nreq++;
      if (s.cached === true) { cached++; }
      if (s.error) { failed++; }
      if (s.usage) { p += s.usage.prompt_tokens || 0; c += s.usage.completion_tokens || 0; }
    }
    if ((s.kind === "llm" || s.kind === "embed") && s.cost) { cost += s.cost; }
  });
  var parts = [spans.length + " spans", nreq + " requests" + (cached ? " (" + cached + " cached)" : "")];
  if (failed) { parts.push(failed + " failed"); }
  parts.push("tokens " + p + "+" + c);
  if (cost) { parts.push("$" + cost.toPrecision(4)); }
  if (t0 != null) { parts.push(ms(t1 - t0)); }
  if (data.redact_content) { parts.push("content redacted"); }
  var summary = parts.join(" \u00b7 ");
  document.getElementById("lt-summary").textContent = summary;

  var tree = document.getElementById("lt-tree");
  var top = el("ul", "lt-children");
  top.setAttribute("role", "tree");
  tree.appendChild(top);
  var rootList = lists[0] = {ul: top, shown: 0, more: null, ids: data.roots, depth: 0};
  more(rootList);
  if (!data.roots.length) { tree.appendChild(el("p", "muted", "No spans recorded.")); }
  timeline();
  var m = /^#span-(\d+)$/.exec(location.hash || "");
  var first = m && byId[+m[1]] ? +m[1] : (data.roots.length ? data.roots[0] : null);
  if (first != null) {
    // reveal() walks parents; a root hidden beyond the first page of roots is paged in here.
    var r = byId[first];
    while (r && r.parent_id != null) { r = byId[r.parent_id]; }
    if (r) { var pos = data.roots.indexOf(r.id); while (rootList.shown <= pos) { more(rootList); } }
    select(first);
  }
}
})();
