"""The inline script of the HTML view: renders tokens, the group view, details on hover/click.

Data comes from ``<script type="application/json" id="agentrl-data">`` (see html.py). Only
the current trajectory's tokens are in the DOM, built once into a DocumentFragment; one
delegated listener on ``#tokens`` serves hover and click for every token (no per-token
listeners), so a 20-turn, 8,000-token trajectory stays responsive. All text from the data
(token text, tool output) goes through ``textContent``, never ``innerHTML``: tool output is
untrusted. An evaluation attempt (``t.eval``) is never trained: its labels say "sampled", not
"trained", and show no advantage. ``window.agentrlRenderMs`` records how long the last
trajectory took to render and ``window.agentrlReadyMs`` when the page was ready (ms since
navigation start).
"""

JS = r"""
(function () {
"use strict";
var DATA = JSON.parse(document.getElementById("agentrl-data").textContent);
var T = DATA.trajs;
var cur = -1, pinned = -1, selEl = null, mode = "kind";
function $(id) { return document.getElementById(id); }
function el(tag, cls, text) {
  var e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = text;
  return e;
}
function fmt(x, d) { return (x === null || x === undefined) ? "\u2014" : Number(x).toFixed(d === undefined ? 3 : d); }
function signed(x) { return (x === null || x === undefined) ? "\u2014" : (x >= 0 ? "+" : "") + x.toFixed(3); }
function badge(r) {
  var cls = r === null ? "none" : (r > 0 ? "good" : "bad");
  return el("span", "badge " + cls, "reward " + (r === null ? "\u2014" : String(+r.toFixed(3))));
}
function tokText(t, i) {
  if (!t.text) return String(t.ids[i]);
  var s = t.text[i];
  return s === "" ? "\u2205" : s.replace(/\n/g, "\u21b5\n");
}
function segOf(t, i) {
  for (var k = 0; k < t.segs.length; k++) { var s = t.segs[k]; if (i >= s[0] && i < s[1]) return s; }
  return [i, i + 1, "unknown"];
}

function foldable(t, a, b) {
  if (!t.text) return b - a > 300;
  var lines = 0;
  for (var i = a; i < b; i++) if (t.text[i].indexOf("\n") >= 0) lines++;
  return lines > 6;
}
function toggleFold(seg) {
  var f = seg.querySelector(".fold");
  if (!f) return;
  var folded = seg.classList.toggle("folded");
  f.textContent = folded ? " \u00b7 \u25b8 show all" : " \u00b7 \u25be fold";
}

function renderTokens(t) {
  var box = $("tokens");
  box.textContent = "";
  box.classList.toggle("ids", !t.text);
  var frag = document.createDocumentFragment();
  for (var k = 0; k < t.segs.length; k++) {
    var a = t.segs[k][0], b = t.segs[k][1], kind = t.segs[k][2], trained = 0;
    for (var i = a; i < b; i++) trained += t.mask[i] === 1 ? 1 : 0;
    var seg = el("div", "seg k-" + kind);
    var lab = el("div", "lab", kind + " " + a + "\u2013" + b + (!trained ? " \u00b7 masked" :
      t.eval ? " \u00b7 sampled " + trained + " (evaluation: not trained)" : " \u00b7 trained " + trained));
    seg.appendChild(lab);
    if (kind === "prompt" && foldable(t, a, b)) {  // the same long system prompt in every attempt
      seg.classList.add("folded");
      lab.appendChild(el("span", "fold", " \u00b7 \u25b8 show all"));
    }
    var body = el("div", "body");
    for (i = a; i < b; i++) {
      var s = document.createElement("span");
      s.className = "tok k-" + kind + (t.mask[i] === 1 ? " m1" : " m0");
      s.setAttribute("data-i", i);
      s.textContent = tokText(t, i);
      body.appendChild(s);
    }
    seg.appendChild(body);
    frag.appendChild(seg);
  }
  box.appendChild(frag);
}

function applyMode() {
  var t = T[cur], box = $("tokens");
  box.setAttribute("data-mode", mode);
  var toks = box.getElementsByClassName("tok");
  for (var n = 0; n < toks.length; n++) {
    var e = toks[n], j = +e.getAttribute("data-i"), bg = "";
    if (mode === "lp" && t.mask[j] === 1) {
      bg = "hsl(" + Math.round(120 * Math.exp(t.lp[j])) + ",75%,78%)";
    } else if (mode === "ratio" && t.mask[j] === 1 && t.old) {
      var a = Math.min(1, Math.abs(t.old[j] - t.lp[j]) / 0.2);
      bg = "rgba(220,40,40," + a.toFixed(2) + ")";
    }
    e.style.backgroundColor = bg;
  }
  $("modehelp").textContent = {
    kind: "background = span kind; underlined = trained (loss_mask 1)",
    lp: "trained tokens by sampler probability: green likely \u2192 red unlikely",
    ratio: T[cur].old ? "trained tokens by |log \u03c1|, \u03c1 = \u03c0_old/\u03bc: white 0 \u2192 red \u2265 0.2"
                      : "no ratio: " + (T[cur].old_note || "trainer log-probs not recorded")
  }[mode];
}

function showDetails(i) {
  var t = T[cur], m = t.mask[i], seg = segOf(t, i), lp = t.lp[i];
  var old = t.old ? t.old[i] : null;
  var rows = [
    ["pos", "token", "#" + i + " of " + t.ids.length + (i < t.prompt_len ? " (prompt)" : " (response)")],
    ["id", "id", String(t.ids[i])],
    ["text", "text", t.text ? JSON.stringify(t.text[i]) : "(no tokenizer: pass --tokenizer)"],
    ["kind", "kind", seg[2] + " [" + seg[0] + ", " + seg[1] + ")"],
    ["mask", "loss_mask", m !== 1 ? "0 \u00b7 masked out" : t.eval ? "1 \u00b7 sampled (evaluation: not trained)" : "1 \u00b7 trained"],
    ["lp", "sampler log-prob \u03bc", (m === 1 || lp !== 0) ? fmt(lp, 4) + "  (p = " + (100 * Math.exp(lp)).toFixed(1) + "%)" : "\u2014 (not sampled)"],
    ["old", "trainer log-prob \u03c0_old", !t.old ? (t.old_note || "not recorded") : (m === 1 ? fmt(old, 4) : "\u2014")],
    ["ratio", "ratio \u03c0_old/\u03bc", (t.old && m === 1) ? Math.exp(old - lp).toFixed(4) : "\u2014"],
    ["adv", "advantage", t.eval ? "\u2014 (evaluation: never trained)" : m === 1 ? signed(t.adv) : "\u2014 (masked: no gradient)"]
  ];
  var d = $("details");
  d.textContent = "";
  d.appendChild(el("div", "hint", pinned === i ? "pinned (click again to release)" : "hover \u00b7 click to pin"));
  var dl = el("dl");
  for (var k = 0; k < rows.length; k++) {
    dl.appendChild(el("dt", null, rows[k][1]));
    var dd = el("dd", null, rows[k][2]);
    dd.setAttribute("data-field", rows[k][0]);
    dl.appendChild(dd);
  }
  d.appendChild(dl);
}
function resetDetails() {
  var d = $("details");
  d.textContent = "";
  d.appendChild(el("div", "hint", "Hover a token to see its id, text, mask, log-probs, ratio and advantage; click to pin."));
}

function renderHead(t) {
  var h = $("trajhead");
  h.textContent = "";
  var top = el("div");
  top.appendChild(el("b", null, "trajectory " + (cur + 1) + "/" + T.length + " \u00b7 " +
    (t.label ? t.label + " \u00b7 " : "") + "group " + (t.group || "\u2014") + " \u00b7 sample " + t.sample + "  "));
  top.appendChild(badge(t.reward));
  top.appendChild(el("span", null, (t.eval ? "  evaluation (never trained)" : "  advantage " + signed(t.adv)) +
    " \u00b7 finish " + t.finish + " \u00b7 policy v" + t.policy + (t.seg || "")));
  h.appendChild(top);
  var n = t.ids.length, trained = 0;
  for (var i = 0; i < n; i++) trained += t.mask[i] === 1 ? 1 : 0;
  h.appendChild(el("div", null, n + " tokens = prompt " + t.prompt_len + " + response " + (n - t.prompt_len) +
    (t.eval ? "" : " (trained " + trained + ")") + " \u00b7 " + t.ratio));
  h.appendChild(el("div", "where", t.where));
  for (var k = 0; k < t.notes.length; k++) h.appendChild(el("div", "notes", "\u26a0 " + t.notes[k]));
}

function renderTools(t) {
  var box = $("tools");
  box.textContent = "";
  if (!t.tools.length) { box.appendChild(el("div", "sub", "no tool calls")); return; }
  var tab = el("table", "tools"), hr = el("tr");
  ["turn", "tool", "arguments", "result", "error", "latency"].forEach(function (c) { hr.appendChild(el("th", null, c)); });
  tab.appendChild(hr);
  t.tools.forEach(function (c) {
    var tr = el("tr");
    tr.appendChild(el("td", null, String(c.turn)));
    tr.appendChild(el("td", "l", c.name));
    var a = el("td", "l"); a.appendChild(el("pre", null, JSON.stringify(c.arguments))); tr.appendChild(a);
    var r = el("td", "l"); r.appendChild(el("pre", null, c.result)); tr.appendChild(r);
    tr.appendChild(el("td", "l err", c.error || ""));
    tr.appendChild(el("td", null, c.latency_s.toFixed(2) + "s"));
    tab.appendChild(tr);
  });
  box.appendChild(tab);
}

function messageText(m) {
  var s = m.content || "";
  (m.calls || []).forEach(function (c) { s += (s ? "\n" : "") + "\u2192 " + c; });
  return s;
}
function renderMessages(t) {
  var box = $("messages");
  box.textContent = "";
  box.appendChild(el("summary", null, "conversation (" + t.messages.length + " messages, from the message list)"));
  t.messages.forEach(function (m) {
    var d = el("div", "msg");
    d.appendChild(el("b", null, m.role));
    d.appendChild(el("pre", null, messageText(m)));
    box.appendChild(d);
  });
}

function renderGroups() {
  var root = $("groups");
  DATA.groups.forEach(function (g) {
    var sec = el("div", "group");
    var rewards = g.members.map(function (k) { return T[k].reward; }).filter(function (r) { return r !== null; });
    var mean = rewards.length ? rewards.reduce(function (a, b) { return a + b; }, 0) / rewards.length : null;
    sec.appendChild(el("h3", null, g.label + " \u00b7 " + g.members.length + " attempts \u00b7 mean reward " + fmt(mean)));
    var row = el("div", "attempts");
    g.members.forEach(function (k) {
      var t = T[k], c = el("div", "card"), top = el("div", "top"), trained = 0, errors = 0;
      c.setAttribute("data-t", k);
      top.appendChild(el("span", null, "#" + t.sample + (t.eval ? " \u00b7 eval" : " \u00b7 A " + signed(t.adv))));
      top.appendChild(badge(t.reward));
      c.appendChild(top);
      for (var i = 0; i < t.mask.length; i++) trained += t.mask[i] === 1 ? 1 : 0;
      t.tools.forEach(function (x) { if (x.error) errors++; });
      c.appendChild(el("div", "meta", t.finish + " \u00b7 " + t.ids.length + " tok" + (t.eval ? "" : " (" + trained + " trained)") + " \u00b7 " +
        t.tools.length + (t.tools.length === 1 ? " tool call" : " tool calls") + (errors ? ", " + errors + " failed" : "")));
      var bar = el("div", "kbar");
      t.segs.forEach(function (s) { var d = el("div", "k-" + s[2]); d.style.flexGrow = s[1] - s[0]; bar.appendChild(d); });
      c.appendChild(bar);
      var text = t.messages.slice(t.first_response).map(function (m) {
        var body = messageText(m);
        if (m.role === "tool" && body.length > 240) body = body.slice(0, 240) + "\u2026";
        return m.role + ": " + body;
      }).join("\n");
      c.appendChild(el("pre", "convo", text));
      row.appendChild(c);
    });
    sec.appendChild(row);
    root.appendChild(sec);
  });
}

function select(k, scroll) {
  if (k < 0 || k >= T.length) return;
  var t0 = performance.now();
  cur = k; pinned = -1; selEl = null;
  var t = T[k];
  renderHead(t);
  renderTokens(t);
  applyMode();
  renderTools(t);
  renderMessages(t);
  resetDetails();
  var cards = document.querySelectorAll(".card");
  for (var i = 0; i < cards.length; i++) cards[i].classList.toggle("active", +cards[i].getAttribute("data-t") === k);
  if (history.replaceState) history.replaceState(null, "", "#t=" + k);
  window.agentrlRenderMs = performance.now() - t0;
  if (scroll) $("viewer").scrollIntoView({block: "start"});
}

function init() {
  if (!T.length) { $("viewer").appendChild(el("p", "sub", "No trajectory matched the filters.")); return; }
  renderGroups();
  var box = $("tokens");
  box.addEventListener("mouseover", function (e) {
    var tok = e.target.closest(".tok");
    if (tok && pinned < 0) showDetails(+tok.getAttribute("data-i"));
  });
  box.addEventListener("click", function (e) {
    var lab = e.target.closest(".lab");
    if (lab) { toggleFold(lab.parentNode); return; }
    var tok = e.target.closest(".tok");
    if (!tok) return;
    var i = +tok.getAttribute("data-i");
    if (selEl) selEl.classList.remove("sel");
    if (pinned === i) { pinned = -1; selEl = null; } else { pinned = i; selEl = tok; tok.classList.add("sel"); }
    showDetails(i);
  });
  $("groups").addEventListener("click", function (e) {
    var c = e.target.closest(".card");
    if (c) select(+c.getAttribute("data-t"), true);
  });
  $("prev").addEventListener("click", function () { select(cur - 1, false); });
  $("next").addEventListener("click", function () { select(cur + 1, false); });
  $("mode").addEventListener("change", function (e) { mode = e.target.value; applyMode(); });
  var m = /#t=(\d+)/.exec(location.hash);
  select(m ? Math.min(+m[1], T.length - 1) : 0, false);
  window.agentrlReadyMs = performance.now();  // since navigation start
  document.body.setAttribute("data-ready", "1");
}
init();
})();
"""
