"""The report's embedded stylesheet and its one inline script, kept apart from the page structure.

Everything is inline so the file opens offline and can be mailed: system fonts only (no web
fonts), no external CSS. The print rules keep each figure on one page and unfold the logs; the
script does the unfolding for browsers whose CSS cannot open a closed ``<details>``.
"""

STYLESHEET = """
:root { --ok: #1a7f37; --bad: #cf222e; --ink: #1f2328; --muted: #57606a; --line: #d0d7de; --soft: #f6f8fa; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--ink); background: #fff; line-height: 1.45;
       font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main, header .inner, nav, footer { max-width: 1180px; margin: 0 auto; padding: 0 24px; }
header { color: #fff; padding: 20px 0 16px; }
header.ok { background: var(--ok); }
header.failed { background: var(--bad); }
header h1 { margin: 4px 0 10px; font-size: 26px; font-weight: 600; }
header .verdict { display: inline-block; font-weight: 700; letter-spacing: .06em; font-size: 13px;
                  padding: 2px 10px; border-radius: 3px; background: rgba(255,255,255,.22); }
header .meta { margin: 10px 0 0; font-size: 13px; opacity: .92; }
header code { color: #fff; background: rgba(0,0,0,.18); }
.chip { display: inline-block; margin: 0 6px 4px 0; padding: 2px 10px; border-radius: 12px; font-size: 14px;
        background: rgba(255,255,255,.15); border: 1px solid rgba(255,255,255,.45); }
.chip.active { background: #fff; color: var(--ink); font-weight: 600; }
nav { padding-top: 12px; padding-bottom: 12px; font-size: 14px; border-bottom: 1px solid var(--line); }
nav a { color: #0969da; text-decoration: none; margin-right: 16px; }
section { margin: 28px 0; }
h2 { font-size: 20px; margin: 0 0 10px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 16px; margin: 18px 0 6px; }
p.lead { margin: 4px 0 12px; color: var(--muted); }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace; font-size: 12.5px; }
code { background: var(--soft); padding: 1px 4px; border-radius: 3px; }
pre { background: var(--soft); border: 1px solid var(--line); border-radius: 4px; padding: 10px 12px;
      margin: 6px 0; overflow-x: auto; white-space: pre; line-height: 1.35; }
pre.error { background: #ffebe9; border-color: #ffcecb; color: #82071e; white-space: pre-wrap; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 14px; }
th, td { border: 1px solid var(--line); padding: 4px 10px; text-align: left; vertical-align: top; }
thead th, table.facts th { background: var(--soft); font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums;
         font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 13px; }
tr.bad td { background: #ffebe9; }
.pass { color: var(--ok); font-weight: 600; }
.fail { color: var(--bad); font-weight: 600; }
.note { color: var(--muted); font-size: 14px; }
figure { margin: 14px 0 22px; padding: 10px; border: 1px solid var(--line); border-radius: 6px; }
figure img { display: block; max-width: 100%; height: auto; margin: 0 auto; }
figcaption { margin-top: 8px; font-size: 14px; color: var(--muted); }
figcaption b { color: var(--ink); }
details { border: 1px solid var(--line); border-radius: 4px; margin: 6px 0; }
details > summary { cursor: pointer; padding: 6px 10px; background: var(--soft); font-size: 14px; }
details.failed > summary { background: #ffebe9; font-weight: 600; }
details > div { padding: 4px 10px 8px; }
details pre { max-height: 480px; overflow: auto; }
footer { color: var(--muted); font-size: 12px; padding-top: 10px; padding-bottom: 30px;
         border-top: 1px solid var(--line); }
@media print {
  @page { margin: 12mm; }
  body { font-size: 11pt; }
  header { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
  nav { display: none; }
  main, header .inner, footer { max-width: none; padding: 0 4mm; }
  section { margin: 14px 0; }
  h2, h3 { break-after: avoid; page-break-after: avoid; }
  figure, table, pre.error { break-inside: avoid; page-break-inside: avoid; }
  figure img { max-height: 240mm; }
  details pre { max-height: none; overflow: visible; white-space: pre-wrap; }
  details::details-content { content-visibility: visible; display: block; }
}
"""

PRINT_SCRIPT = """
(function () {
  var opened = [];
  window.addEventListener("beforeprint", function () {
    document.querySelectorAll("details:not([open])").forEach(function (d) { d.open = true; opened.push(d); });
  });
  window.addEventListener("afterprint", function () {
    opened.forEach(function (d) { d.open = false; });
    opened = [];
  });
})();
"""
