"""A report laid out by a real headless Chromium (Debian's `chromium`; .ci/run installs it): widths and screenshots."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli import SUBPROCESS_TIMEOUT

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs a headless Chromium (apt-get install chromium)")

# Runs in the page after layout: the document's scroll width, the viewport, and every element whose content is
# wider than its box while the box hides the overflow (text or columns a reader cannot see).
PROBE = """<script>
const hidden = [...document.querySelectorAll('body *')].filter(e => {
  const style = getComputedStyle(e);
  return e.scrollWidth > e.clientWidth + 1 && ['hidden', 'auto', 'scroll', 'clip'].includes(style.overflowX);
}).map(e => e.tagName + '.' + e.className);
document.title = JSON.stringify({scroll: document.documentElement.scrollWidth, viewport: window.innerWidth, hidden});
</script></body>"""


def chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
                          capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)


def layout(html: Path, width: int) -> dict:
    """{scroll, viewport, hidden} of `html` laid out at `width` px."""
    return probe_page(html, width, PROBE)


def probe_page(html: Path, width: int, probe_script: str) -> dict:
    """`html` laid out at `width` px with `probe_script` (a `<script>…</script></body>` that sets document.title to
    JSON) before its `</body>`: that JSON."""
    probe = html.with_name(f"probe-{width}-{abs(hash(probe_script)) % 10**8}.html")
    probe.write_text(html.read_text().replace("</body>", probe_script))
    try:
        dom = chromium(f"--window-size={width},2000", "--dump-dom", probe.as_uri()).stdout
    finally:
        probe.unlink()
    found = re.search(r"<title>(.*?)</title>", dom, re.S)
    assert found, dom[-2000:]
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def screenshot(html: Path, png: Path, width: int = 1400, height: int = 4000) -> Path:
    chromium(f"--window-size={width},{height}", f"--screenshot={png}", html.as_uri())
    return png
