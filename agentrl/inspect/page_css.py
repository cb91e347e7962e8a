"""The inline stylesheet of the HTML view (kept in Python so it ships inside the package).

Token kinds share one palette with the legend (``.k-<kind>``); ``.tok`` is only ever a
token of the current trajectory, so tests can count ``span.tok`` and ``span.tok.m1``.
``.seg`` blocks use ``content-visibility: auto`` so an 8,000-token trajectory only lays
out what is on screen.
"""

CSS = """
:root{--prompt:#dfe8fb;--template:#ececec;--tool:#ffe6b3;--model:#d4f3d2;--summary:#cdeff2;--unknown:#f7d3f4;
--prompt-b:#7d9fe0;--template-b:#a8a8a8;--tool-b:#e0a020;--model-b:#2f9e44;--summary-b:#1c9aa8;--unknown-b:#c040b0;
--good:#2f9e44;--bad:#d9480f;--ink:#1d1f23;--muted:#6b7280}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--ink);background:#f7f7f8}
header{padding:14px 22px 6px;background:#fff;border-bottom:1px solid #e3e3e6}
header h1{font-size:18px;margin:0 0 2px}
.sub{color:var(--muted);font-size:12.5px}
section{padding:10px 22px}
h2{font-size:14px;margin:6px 0 8px;text-transform:uppercase;letter-spacing:.04em;color:#444}
table{border-collapse:collapse;font-size:12.5px}
th,td{padding:3px 9px;border-bottom:1px solid #e6e6e9;text-align:right;white-space:nowrap}
th{background:#f0f0f3;font-weight:600}
td:first-child,th:first-child,td.l{text-align:left}
table.summary tr.eval td{color:#6a5a9a;background:#f7f5fc}
.charts{display:flex;flex-wrap:wrap;gap:10px}
.chart{background:#fff;border:1px solid #e3e3e6;border-radius:6px}
.chart .ct{font:600 12px system-ui,sans-serif;fill:#333}
.chart .ax{stroke:#bbb;stroke-width:1}
.chart .yl{font:10px system-ui,sans-serif;fill:#777;text-anchor:end}
.chart .xl{font:10px system-ui,sans-serif;fill:#777}
.chart .xr{text-anchor:end}
.problems{background:#fff4e5;border:1px solid #f0c36d;border-radius:6px;padding:6px 10px;font-size:12.5px}
.problems li{font-family:ui-monospace,Menlo,Consolas,monospace}
.k-prompt{background:var(--prompt)}.k-template{background:var(--template)}.k-tool{background:var(--tool)}
.k-model{background:var(--model)}.k-summary{background:var(--summary)}.k-unknown{background:var(--unknown)}
#legend{display:flex;flex-wrap:wrap;gap:12px;align-items:center;font-size:12.5px}
.sw{display:inline-block;padding:0 6px;border-radius:3px;font:12px ui-monospace,Menlo,Consolas,monospace}
.sw.m1{border-bottom:2px solid var(--model-b);font-weight:600}
.sw.m0{color:#666}
.modehelp{color:var(--muted)}
.group{margin-bottom:12px}
.group h3{font-size:13px;margin:4px 0 6px;font-weight:600}
.attempts{display:grid;grid-template-columns:repeat(auto-fit,minmax(230px,1fr));gap:8px}
.card{background:#fff;border:1px solid #dcdce0;border-radius:7px;padding:7px 9px;cursor:pointer;min-width:0}
.card:hover{border-color:#999}
.card.active{border-color:#2f6fdf;box-shadow:0 0 0 2px #2f6fdf33}
.card .top{display:flex;justify-content:space-between;gap:6px;font-size:12.5px;font-weight:600}
.card .meta{font-size:11.5px;color:var(--muted);margin:2px 0 4px}
.badge{display:inline-block;padding:0 6px;border-radius:9px;color:#fff;font-size:11.5px}
.badge.good{background:var(--good)}.badge.bad{background:var(--bad)}.badge.none{background:#999}
.kbar{display:flex;height:7px;border-radius:3px;overflow:hidden;margin:3px 0 5px}
.kbar div{min-width:1px}
.convo{font:11.5px/1.35 ui-monospace,Menlo,Consolas,monospace;white-space:pre-wrap;word-break:break-word;
max-height:150px;overflow:auto;background:#fafafa;border-radius:4px;padding:4px 6px;margin:0}
.toolbar{display:flex;flex-wrap:wrap;gap:10px;align-items:center;margin-bottom:6px}
.toolbar button{font-size:12.5px;padding:2px 9px}
#trajhead{background:#fff;border:1px solid #e3e3e6;border-radius:6px;padding:6px 10px;margin-bottom:8px;font-size:13px}
#trajhead .where{color:var(--muted);font-size:12px}
.notes{color:#b02a00;font-size:12.5px}
.viewer-main{display:grid;grid-template-columns:minmax(0,1fr) 310px;gap:12px}
#tokens{background:#fff;border:1px solid #e3e3e6;border-radius:6px;padding:6px 8px;
font:13px/1.75 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;min-width:0}
.seg{content-visibility:auto;contain-intrinsic-size:auto 48px;border-left:4px solid;padding:1px 0 1px 8px;margin:3px 0}
.seg.k-prompt{border-color:var(--prompt-b)}.seg.k-template{border-color:var(--template-b)}
.seg.k-tool{border-color:var(--tool-b)}.seg.k-model{border-color:var(--model-b)}.seg.k-summary{border-color:var(--summary-b)}.seg.k-unknown{border-color:var(--unknown-b)}
.seg{background:none}
.lab{font:10.5px system-ui,sans-serif;color:#888;float:right;margin-left:8px;user-select:none}
.fold{color:#2f6fdf;cursor:pointer}
.seg.folded .body{max-height:7em;overflow:hidden;-webkit-mask-image:linear-gradient(#000 55%,transparent);
mask-image:linear-gradient(#000 55%,transparent)}
.body{white-space:pre-wrap;word-break:break-word}
.tok{border-radius:2px;cursor:pointer}
.tok:nth-child(even){background-image:linear-gradient(rgba(0,0,0,.07),rgba(0,0,0,.07))}
.tok.m0{color:#5b5f66}
.tok.m1{color:#000;border-bottom:2px solid var(--model-b)}
.tok:hover{outline:1px solid #333}
.tok.sel{outline:2px solid #d6336c}
#tokens.ids .tok{margin-right:4px}
#tokens[data-mode="lp"] .tok,#tokens[data-mode="ratio"] .tok{background-color:transparent}
#details{position:sticky;top:8px;align-self:start;background:#fff;border:1px solid #e3e3e6;border-radius:6px;
padding:8px 10px;font-size:12.5px}
#details dl{display:grid;grid-template-columns:auto 1fr;gap:2px 10px;margin:4px 0 0}
#details dt{color:var(--muted)}
#details dd{margin:0;font-family:ui-monospace,Menlo,Consolas,monospace;word-break:break-all}
#details .hint{color:var(--muted)}
.tools td{vertical-align:top}
.tools th{text-align:left}
.tools pre{margin:0;max-height:160px;overflow:auto;white-space:pre-wrap;word-break:break-word;text-align:left;
font:11.5px ui-monospace,Menlo,Consolas,monospace}
.err{color:var(--bad);font-weight:600}
.msg{border-left:3px solid #ccc;padding:2px 8px;margin:4px 0;font-size:12.5px}
.msg b{display:block;font-size:11.5px;color:var(--muted)}
.msg pre{margin:0;white-space:pre-wrap;word-break:break-word;font:12px ui-monospace,Menlo,Consolas,monospace}
details>summary{cursor:pointer;font-weight:600;font-size:13px;margin:6px 0}
pre.config{background:#fff;border:1px solid #e3e3e6;padding:8px;font-size:12px;max-height:300px;overflow:auto}
"""
