"""Render an HTML report in headless Chromium and save a PNG, to check it in a real browser.

    python -m toolproxy.analysis.report.screenshot report.html report.png [--width 1200 --height 900]

Chromium runs with networking features off and a throwaway profile, so the screenshot also
proves the page needs nothing from the network.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def run_chromium(target: str, *args: str, timeout: float = 90.0) -> subprocess.CompletedProcess:
    """Headless Chromium on `target` (a file:// or http:// address) with a throwaway profile."""
    browser = find_browser()
    if browser is None:
        raise RuntimeError(
            f"no Chromium found (looked for {', '.join(BROWSERS)}); on Debian: apt-get install -y chromium"
        )
    with tempfile.TemporaryDirectory(prefix="toolproxy-chromium-") as profile:
        cmd = [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            *args,
            target,
        ]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def screenshot(
    html: Path | str, png: Path, width: int = 1200, height: int = 900, timeout: float = 90.0, wait_ms: int | None = None
) -> Path:
    """Write `png` of a file or an http:// address; raises RuntimeError with Chromium's own words
    when it could not. wait_ms: let the page's scripts run that long (virtual time) first."""
    target = html if isinstance(html, str) else html.resolve().as_uri()
    extra = [f"--virtual-time-budget={wait_ms}"] if wait_ms else []
    proc = run_chromium(
        target, f"--screenshot={png.resolve()}", f"--window-size={width},{height}", *extra, timeout=timeout
    )
    if proc.returncode != 0 or not png.exists() or png.stat().st_size == 0:
        raise RuntimeError(f"chromium exited {proc.returncode} without a screenshot: {proc.stderr.strip()[-500:]}")
    return png


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--width", type=int, default=1200)
    parser.add_argument("--height", type=int, default=900)
    args = parser.parse_args(argv)
    if not args.html.is_file():
        print(f"error: {args.html} is not a file", file=sys.stderr)
        return 2
    try:
        screenshot(args.html, args.png, args.width, args.height)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
