"""Headless Chromium (Debian's `chromium` package), for the HTML report's tests and benchmarks."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def screenshot(page: Path | str, png: Path, profile: Path, timeout_s: float = 120, script_ms: int = 0) -> None:
    """Open `page` (a file, or a URL) and save its first 1600x1400 screen to `png`;
    `profile` is a fresh directory (Chromium's user data, so runs do not share a cache).
    ``script_ms``: virtual time the page's scripts get first (a page drawn by JavaScript
    after its data arrives)."""
    if CHROMIUM is None:
        raise FileNotFoundError("chromium is not installed (apt-get install chromium)")
    subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--hide-scrollbars",
            "--window-size=1600,1400",
            f"--screenshot={png}",
            *([f"--virtual-time-budget={script_ms}"] if script_ms else []),
            page.as_uri() if isinstance(page, Path) else page,
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=True,
    )
