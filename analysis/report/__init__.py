"""Renderers: one module per output format, all fed the same `analysis.measure.summary.Report`."""

from __future__ import annotations

from toolproxy.analysis.measure.summary import Report
from toolproxy.analysis.report import csvrows, htmlpage, jsondoc, markdown, terminal

RENDERERS = {
    "table": terminal.render,
    "markdown": markdown.render,
    "json": jsondoc.render,
    "csv": csvrows.render,
    "html": htmlpage.render,
}
OUTPUT_FORMATS = tuple(RENDERERS)


def render(report: Report, fmt: str) -> str:
    return RENDERERS[fmt](report)
