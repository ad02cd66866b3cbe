"""Reports opened in a real browser: headless Chromium (Debian's ``chromium``) lays a page out at a window width,
a script added to a copy of the page measures what the user would see, and ``--dump-dom`` brings the numbers
back; ``--screenshot`` keeps a picture of the same page.

What the script reports (in CSS pixels, at the window's width):
- ``cut_charts``: an SVG chart that reaches past the window's edge (or is squashed to nothing);
- ``clipped_text``: a chart label that reaches past its SVG's box (the SVG cuts it: "p99" read "p9");
- ``overflowing``: an element that reaches past the window's edge with no scrolling box around it (the page
  would scroll sideways, or the text is out of sight).
"""
from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
WIDTHS = {"phone": 390, "desktop": 1280}

_PROBE = r"""<script>(function(){
const vw = document.documentElement.clientWidth, out = {viewport: vw, cut_charts: [], clipped_text: [], overflowing: []};
const scrolls = el => { for (let p = el.parentElement; p; p = p.parentElement) {
  const ox = getComputedStyle(p).overflowX; if (ox === 'auto' || ox === 'scroll') return true; } return false; };
for (const svg of document.querySelectorAll('svg')) {
  const r = svg.getBoundingClientRect(), name = svg.getAttribute('aria-label') || 'svg';
  if (r.width < 50 || ((r.right > vw + 0.5 || r.left < -0.5) && !scrolls(svg)))
    out.cut_charts.push({chart: name, left: r.left, right: r.right, width: r.width});
  for (const t of svg.querySelectorAll('text')) {
    const b = t.getBoundingClientRect();
    if (b.left < r.left - 0.5 || b.right > r.right + 0.5 || b.top < r.top - 0.5 || b.bottom > r.bottom + 0.5)
      out.clipped_text.push({chart: name, text: t.textContent, left: b.left, right: b.right, svg_left: r.left,
                             svg_right: r.right});
  }
}
for (const el of document.body.querySelectorAll('*')) {
  if (el.closest('svg') && el.tagName.toLowerCase() !== 'svg') continue;
  const r = el.getBoundingClientRect();
  if (r.width > 0 && r.right > vw + 0.5 && !scrolls(el))
    out.overflowing.push({tag: el.tagName.toLowerCase(), text: (el.textContent || '').trim().slice(0, 60),
                          right: r.right});
}
document.body.setAttribute('data-layout', JSON.stringify(out));
if (parent !== window) parent.postMessage(JSON.stringify(out), '*');
})();</script>"""
# Chromium's headless window is at least 500 px wide: the page is laid out in a frame of the width asked for, and
# the probe in it posts its findings to the frame's parent, which --dump-dom prints.
_FRAME = """<!doctype html><html><head><meta charset="utf-8"></head><body style="margin:0">
<iframe src="{src}" style="border:0;display:block;width:{width}px;height:{height}px"></iframe>
<script>window.addEventListener('message', e => document.body.setAttribute('data-layout', e.data));</script>
</body></html>"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _run(args: list[str], url: str, width: int, height: int, timeout: float = 120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="edgetrain-chromium-") as profile:
        return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                               *args, url], capture_output=True, text=True, timeout=timeout)


def _framed(page: Path, width: int, height: int, probe: bool) -> Path:
    inner = page
    if probe:
        inner = page.with_name(page.stem + ".probe.html")
        inner.write_text(page.read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>", 1), encoding="utf-8")
    frame = page.with_name(f"{page.stem}.{width}{'.probe' if probe else ''}.frame.html")
    frame.write_text(_FRAME.format(src=inner.name, width=width, height=height), encoding="utf-8")
    return frame


def layout(page: Path, width: int, height: int = 900) -> dict:
    """The probe's findings for ``page`` laid out ``width`` CSS pixels wide."""
    frame = _framed(page, width, height, probe=True)
    proc = _run(["--dump-dom", "--virtual-time-budget=5000"], frame.as_uri(), max(width, 500), height)
    m = re.search(r'<body[^>]*\sdata-layout="([^"]*)"', proc.stdout)
    if m is None:
        raise AssertionError(f"chromium gave no layout (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(html.unescape(m.group(1)))


def screenshot(page: Path, png: Path, width: int, height: int = 2400) -> Path:
    """``page`` at ``width`` CSS pixels, as a PNG of that width (the frame cut out of the wider window)."""
    from PIL import Image

    frame = _framed(page, width, height, probe=False)
    proc = _run([f"--screenshot={png}", "--virtual-time-budget=5000"], frame.as_uri(), max(width, 500), height)
    if not png.is_file() or png.stat().st_size == 0:
        raise AssertionError(f"chromium wrote no screenshot (exit {proc.returncode}): {proc.stderr[-2000:]}")
    with Image.open(png) as im:
        if im.width > width:
            im.crop((0, 0, width, im.height)).save(png)
    return png


def assert_reads_whole(page: Path, width: int, png: Path) -> None:
    """The report at ``width``: laid out at that width (not Chromium's 500 px window minimum), no chart label
    cut off by its SVG, no chart or element past the screen's edge, and its screenshot a page, not a blank
    frame."""
    from PIL import Image

    found = layout(page, width)
    assert found["viewport"] == width
    assert found["clipped_text"] == [], f"chart labels cut off by their SVG at {width} px"
    assert found["cut_charts"] == [], f"charts reaching past the screen at {width} px"
    assert found["overflowing"] == [], f"elements past the screen's edge at {width} px"
    with Image.open(screenshot(page, png, width)) as im:
        assert im.width == width and im.height > 500
        assert len(set(im.convert("L").resize((40, 120)).getdata())) > 5
