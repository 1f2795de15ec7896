"""The HTML report opened in headless Chromium: the charts really render.

Needs Debian's `chromium` package (apt-get install chromium); skipped without it.
"""

from __future__ import annotations

from html.parser import HTMLParser

import numpy as np
import pytest

from provision.validate import judge, report_html
from provision.validate.records import Measurement
from tests.helpers import chromium
from tests.helpers.validate_records import h100, h100_fleet

CHROMIUM = chromium.CHROMIUM


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


def screenshot(page, tmp_path):
    """Headless Chromium's first 1600x1400 screen of the page, as an RGBA array."""
    import matplotlib.image

    png = tmp_path / "shot.png"
    chromium.screenshot(page, png, tmp_path / "profile")
    return matplotlib.image.imread(str(png))


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_html_report_charts_render_in_headless_chromium(tmp_path):
    html = tmp_path / "report.html"
    report_html.write(html, fleet(), "chromium render test")
    parsed = SvgCount()
    parsed.feed(html.read_text())
    # disk, RAM, bf16, and the five GPU health metrics from the inventory; a bar per node
    assert parsed.svgs == 8
    assert parsed.bars == 8 * 4

    image = screenshot(html, tmp_path)
    assert image.shape[0] >= 1000
    assert image.shape[1] >= 1500
    assert image[:, :, :3].std() > 0.05  # not a blank page
    # Bars in the verdict colours, the fleet band and the expectation ticks were drawn.
    assert colour_pixels(image, report_html.COLORS["pass"]) > 500
    assert colour_pixels(image, report_html.COLORS["fail"]) > 200
    assert colour_pixels(image, report_html.EXPECT_COLOR, tol=0.1) > 20


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_a_200_node_report_opens_on_its_summary_with_the_one_failing_gpu_drawn(tmp_path):
    # 1,600 GPUs: the first screen holds the summary, the node needing attention and the
    # charts, with the one slow GPU's histogram bin drawn in the fail colour.
    html = tmp_path / "report.html"
    report_html.write(html, h100_fleet(200), "200 nodes")
    image = screenshot(html, tmp_path)
    assert image[:, :, :3].std() > 0.05
    assert colour_pixels(image, report_html.COLORS["fail"]) >= 10  # a 3 px tall bin at least
    assert colour_pixels(image, report_html.COLORS["pass"]) > 500
    assert colour_pixels(image, "#ffcdd2", tol=0.03) > 100  # the attention table's FAIL cell
