"""The report page: one HTML file with its style, script and data inline (no network, opens from disk).

The data sits in a ``<script type="application/json" id="report-data">`` block (``embedded_data`` reads it back,
as the tests do); ``assets/report.js`` draws the page from it with DOM calls only (model text is never parsed as
HTML). The file is ASCII: every other character is a JSON or HTML escape.
"""

from __future__ import annotations

import html
import json
import re
from importlib import resources
from typing import Any

DATA_ID = "report-data"
_DATA_BLOCK = re.compile(r'<script type="application/json" id="report-data">(.*?)</script>', re.S)


def render(data: dict[str, Any], title: str) -> str:
    """The whole HTML page for ``data`` (``report.data.report_data``)."""
    css, js = _asset("report.css"), _asset("report.js")
    payload = json.dumps(data, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    payload = payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")  # no "</script>"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\n"
            f"<title>{html.escape(title).encode('ascii', 'xmlcharrefreplace').decode()}</title>\n"
            f"<style>\n{css}</style>\n</head>\n<body>\n"
            "<noscript>This report draws itself with JavaScript; enable it to see the curves and trees.</noscript>\n"
            f'<script type="application/json" id="{DATA_ID}">{payload}</script>\n'
            f"<script>\n{js}</script>\n</body></html>\n")


def embedded_data(page: str) -> dict[str, Any]:
    """The data block of a report page, parsed (what the page's script reads)."""
    m = _DATA_BLOCK.search(page)
    if m is None:
        raise ValueError("no report data block in this page")
    return json.loads(m.group(1))


def _asset(name: str) -> str:
    text = resources.files(__package__).joinpath("assets", name).read_text(encoding="utf-8")
    if not text.isascii():
        raise ValueError(f"report asset {name} must be ASCII")
    return text
