"""Content-Security-Policy helpers (docs/security.md "CSP and headers").

The policy itself is `CONTENT_SECURITY_POLICY` in settings.py: only this origin, no inline
script, style, handler or eval, no framing; django-csp's middleware sets it on every response.
drf-spectacular's Swagger UI page carries one fixed inline `<style>` block, so that view alone
also allows the SHA-256 of that exact block, computed from the installed template (an upgrade
that changes the block changes the hash with it); anything else inline stays refused there.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from typing import Any

from django.template import loader

SWAGGER_INLINE_STYLE_TEMPLATES = ("drf_spectacular/swagger_ui.html",)

_STYLE_BLOCK = re.compile(r"<style>(.*?)</style>", re.DOTALL)


@cache
def inline_style_hashes(*template_names: str) -> tuple[str, ...]:
    """CSP source expressions ('sha256-…') for the literal `<style>` blocks of templates."""
    hashes = []
    for name in template_names:
        source = loader.get_template(name).template.source  # type: ignore[attr-defined]
        for block in _STYLE_BLOCK.findall(source):
            if "{{" in block or "{%" in block:
                continue  # a templated block has no fixed hash; it stays refused
            digest = base64.b64encode(hashlib.sha256(block.encode()).digest()).decode()
            hashes.append(f"'sha256-{digest}'")
    return tuple(hashes)


def style_hash_update(*template_names: str) -> dict[str, Any]:
    """A django-csp per-view `update` adding the templates' inline style hashes to style-src."""
    return {"style-src": list(inline_style_hashes(*template_names))}
