"""The status page (``GET /``): one self-contained HTML document, inline CSS and JS, no assets.

The script polls ``status.json`` (relative, so the page also works behind a path prefix) every
two seconds and renders with ``textContent`` only (model names come from clients). The wire APIs
come from the server (``apis`` in ``status.json``, the registry's order): the per-API tables have a
column per API plus ``all``, and a selector narrows the chart and the recent requests to one API.
The chart is drawn on a ``<canvas>`` by the script itself: input tokens before vs after fitting
for each recent fitted request, on a log axis. ``CONTENT_SECURITY_POLICY`` allows nothing but the
inline code and same-origin polling. The script is in :mod:`app.observability.page_script`.

:func:`status_html` is the page; ``signed_in`` (opened with the login's session, see
``app.api.login``) adds a "Sign out" link to ``logout`` in the header (relative, like the polling).
"""

from __future__ import annotations

from .page_script import STATUS_SCRIPT

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

STATUS_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>ctxproxy status</title>
<style>
:root { --fg:#1d2330; --muted:#5b6475; --line:#dde2ea; --bg:#f6f8fb; --card:#fff;
        --before:#f0a35e; --after:#2f6fdb; --bad:#c2410c; --ok:#15803d; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color:var(--fg); background:var(--bg); }
header { display:flex; flex-wrap:wrap; gap:8px 24px; align-items:baseline; padding:14px 24px;
         background:#1d2330; color:#fff; }
header h1 { margin:0; font-size:20px; }
header .meta { color:#c9d1e0; font-size:13px; }
header .sign-out { margin-left:auto; align-self:center; color:#fff; font-size:13px; text-decoration:none;
                   border:1px solid #6b7589; border-radius:6px; padding:3px 10px; }
header .sign-out:hover, header .sign-out:focus { background:#2f3a4f; }
main { padding:16px 24px 32px; max-width:1400px; }
section { background:var(--card); border:1px solid var(--line); border-radius:8px;
          padding:14px 16px; margin-bottom:16px; }
h2 { font-size:15px; margin:0 0 10px; }
.cards { display:grid; grid-template-columns:repeat(auto-fill, minmax(150px, 1fr)); gap:10px; }
.card { border:1px solid var(--line); border-radius:6px; padding:8px 10px; }
.card .v { font-size:20px; font-weight:600; font-variant-numeric:tabular-nums; }
.card .k { color:var(--muted); font-size:12px; }
.kv { color:var(--muted); font-size:12px; margin-top:8px; }
table { border-collapse:collapse; width:100%; font-size:13px; }
th, td { text-align:left; padding:4px 5px; border-bottom:1px solid var(--line); white-space:nowrap; }
th { color:var(--muted); font-weight:600; position:sticky; top:0; background:var(--card);
     white-space:normal; vertical-align:bottom; }
td.clip { max-width:130px; overflow:hidden; text-overflow:ellipsis; }
td.actions { white-space:normal; overflow-wrap:anywhere; min-width:120px; max-width:220px; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; }
.scroll { max-height:420px; overflow:auto; }
.bad { color:var(--bad); font-weight:600; }
.good { color:var(--ok); }
.legend { display:flex; gap:16px; font-size:12px; color:var(--muted); margin-bottom:6px; }
.sw { display:inline-block; width:12px; height:12px; border-radius:2px; vertical-align:-2px;
      margin-right:4px; }
canvas { width:100%; height:260px; display:block; }
#apis td, #summaries td, #recall td { text-align:right; font-variant-numeric:tabular-nums; }
#apis td:first-child, #summaries td:first-child, #recall td:first-child {
  text-align:left; color:var(--muted); }
#apis td.text { text-align:left; white-space:normal; overflow-wrap:anywhere; max-width:260px; }
select { font:inherit; }
#error { display:none; background:#fff4ed; border-color:#f3c19b; color:var(--bad); }
.muted { color:var(--muted); }
</style>
</head>
<body>
<header>
  <h1>ctxproxy</h1>
  <span class="meta" id="version">version …</span>
  <span class="meta" id="upstream">upstream …</span>
  <span class="meta" id="uptime"></span>
<!--sign-out-->
</header>
<main>
<section id="error"></section>
<section>
  <h2>Since start</h2>
  <div class="cards" id="cards"></div>
  <div class="kv" id="breakdown"></div>
</section>
<section>
  <h2>By API</h2>
  <div class="scroll"><table id="apis"><thead></thead><tbody></tbody></table></div>
</section>
<section>
  <h2>Summaries by API</h2>
  <div class="scroll"><table id="summaries"><thead></thead><tbody></tbody></table></div>
  <div class="kv">What stands in for dropped turns: an LLM summary, or the plain note (no summary
  wanted, or it failed). Summary cache lookups of caches that count their own are in the cards above.</div>
</section>
<section>
  <h2>Recall by API</h2>
  <div class="scroll"><table id="recall"><thead></thead><tbody></tbody></table></div>
  <div class="kv">What a cut removed, fetched back by the model with ctx_recall and answered by the
  proxy (the client never sees the tool). Misses: an unknown or expired id, or no room.</div>
</section>
<section>
  <h2>Input tokens per fitted request: before vs after fitting
    <label class="muted" style="font-weight:normal; margin-left:12px">API
      <select id="api-filter"><option value="">all</option></select></label></h2>
  <div class="legend">
    <span><span class="sw" style="background:var(--before)"></span>before (as sent by the client)</span>
    <span><span class="sw" style="background:var(--after)"></span>after (as forwarded)</span>
  </div>
  <canvas id="chart" width="1200" height="260" aria-label="tokens before vs after per request"></canvas>
  <div class="kv" id="chart-note"></div>
</section>
<section>
  <h2>Recent requests <span class="muted" id="recent-count"></span></h2>
  <div class="scroll">
  <table id="recent">
    <thead><tr>
      <th>time</th><th>request id</th><th>route</th><th>model</th><th class="num">status</th>
      <th>outcome</th><th class="num">tokens before</th><th class="num">tokens after</th>
      <th>actions</th><th class="num">retries</th><th class="num">latency ms</th>
      <th class="num">upstream ms</th><th class="num">overhead ms</th>
    </tr></thead>
    <tbody></tbody>
  </table>
  </div>
</section>
<section>
  <h2>Upstream</h2>
  <div id="upstream-detail"></div>
</section>
<section>
  <details>
    <summary><strong>Effective model table</strong> <span class="muted" id="model-count"></span></summary>
    <div class="scroll">
    <table id="models">
      <thead><tr><th>model (name or prefix)</th><th class="num">window</th>
      <th class="num">max output</th><th>encoding</th><th>source</th></tr></thead>
      <tbody></tbody>
    </table>
    </div>
  </details>
  <div id="learned-box" style="display:none">
    <h2 style="margin-top:14px">Discovered or learned at run time</h2>
    <div class="scroll">
    <table id="learned">
      <thead><tr><th>model</th><th class="num">window</th><th>window from</th>
      <th class="num">max output</th><th>encoding</th><th class="num">correction</th></tr></thead>
      <tbody></tbody>
    </table>
    </div>
  </div>
</section>
</main>
<script>
""" + STATUS_SCRIPT + """</script>
</body>
</html>
"""

SIGN_OUT_LINK = '  <a class="sign-out" id="sign-out" href="logout">Sign out</a>'
STATUS_HTML_SIGNED_IN = STATUS_HTML.replace("<!--sign-out-->", SIGN_OUT_LINK, 1)


def status_html(*, signed_in: bool = False) -> str:
    """The status page; ``signed_in``: with the "Sign out" link (a session opened it)."""
    return STATUS_HTML_SIGNED_IN if signed_in else STATUS_HTML
