"""The HTML report opened in headless Chromium: the charts really render.

Needs Debian's `chromium` package (apt-get install chromium); skipped without it.
"""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest

from provision.validate import judge, report_html
from provision.validate.records import Measurement
from tests.helpers.validate_records import h100

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def fleet():
    nodes = []
    for i, (disk, bf16) in enumerate([(900, 800), (910, 805), (100, 790), (905, 500)]):
        name = f"node{i}"
        nodes.append(
            judge.NodeInput(
                name,
                [
                    Measurement(name, "disk_seq_read_mibs", float(disk)),
                    Measurement(name, "ram_triad_gbs", 20.0 + i),
                    Measurement(name, "gpu_bf16_tflops", float(bf16), "gpu0"),
                ],
                [h100(0)],
            )
        )
    return judge.judge(nodes)


def colour_pixels(png: np.ndarray, hex_colour: str, tol: float = 0.06) -> int:
    rgb = np.array([int(hex_colour[k : k + 2], 16) / 255 for k in (1, 3, 5)])
    return int((np.abs(png[:, :, :3] - rgb) < tol).all(axis=2).sum())


class SvgCount(HTMLParser):
    def __init__(self):
        super().__init__()
        self.svgs = 0
        self.bars = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.svgs += tag == "svg"
        self.bars += tag == "rect" and "bar" in (a.get("class") or "")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_html_report_charts_render_in_headless_chromium(tmp_path):
    import matplotlib.image

    html = tmp_path / "report.html"
    report_html.write(html, fleet(), "chromium render test")
    parsed = SvgCount()
    parsed.feed(html.read_text())
    # disk, RAM, bf16, and the five GPU health metrics from the inventory; a bar per node
    assert parsed.svgs == 8
    assert parsed.bars == 8 * 4

    png = tmp_path / "shot.png"
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
            f"--user-data-dir={tmp_path / 'profile'}",
            "--hide-scrollbars",
            "--window-size=1600,1400",
            f"--screenshot={png}",
            html.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    image = matplotlib.image.imread(str(png))
    assert image.shape[0] >= 1000
    assert image.shape[1] >= 1500
    assert image[:, :, :3].std() > 0.05  # not a blank page
    # Bars in the verdict colours, the fleet band and the expectation ticks were drawn.
    assert colour_pixels(image, report_html.COLORS["pass"]) > 500
    assert colour_pixels(image, report_html.COLORS["fail"]) > 200
    assert colour_pixels(image, report_html.EXPECT_COLOR, tol=0.1) > 20
