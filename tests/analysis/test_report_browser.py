"""The HTML report in a real browser: headless Chromium must paint it, offline."""

from __future__ import annotations

import struct

import pytest
from storebuilder import load_report

from toolproxy.analysis.report import htmlpage
from toolproxy.analysis.report.details import page_details
from toolproxy.analysis.report.screenshot import find_browser, screenshot
from toolproxy.analysis.store.connection import connect

pytestmark = pytest.mark.skipif(find_browser() is None, reason="Chromium not installed (apt-get install -y chromium)")


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_report_renders_in_headless_chromium(mixed_store, tmp_path):
    report = load_report(mixed_store)
    con = connect(mixed_store, read_only=True)
    try:
        page = htmlpage.render(report, page_details(con, report))
    finally:
        con.close()
    assert "Fidelity by turn index" in page and "Paired comparisons" in page
    html = tmp_path / "report.html"
    html.write_text(page, encoding="utf-8")
    blank = tmp_path / "blank.html"
    blank.write_text("<!doctype html><html><body></body></html>", encoding="utf-8")

    shot = screenshot(html, tmp_path / "report.png", 1200, 900)
    empty = screenshot(blank, tmp_path / "blank.png", 1200, 900)

    data = shot.read_bytes()
    assert _png_size(data) == (1200, 900)
    # a painted page (table, text, coloured bars) compresses far worse than an empty one
    assert len(data) > 10 * empty.stat().st_size, (len(data), empty.stat().st_size)
