"""Documentation served to tenants (docs/ui.md "Webhook signing"): docs/webhooks.md, the
receiver's guide the signing page points to, rendered from the repository's own file so the
page and the document never differ."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from markdown_it import MarkdownIt

WEBHOOKS_MD = Path(__file__).resolve().parents[2] / "docs" / "webhooks.md"


@cache
def _rendered(path: Path, mtime_ns: int) -> str:
    # CommonMark without raw HTML (the page's Content-Security-Policy and escaping stay
    # whole), plus GitHub's tables, which the guide uses.
    parser = MarkdownIt("commonmark", {"html": False}).enable("table")
    return str(parser.render(path.read_text(encoding="utf-8")))


def webhooks_guide_html() -> str:
    """docs/webhooks.md as HTML, rendered once per version of the file."""
    return _rendered(WEBHOOKS_MD, WEBHOOKS_MD.stat().st_mtime_ns)
