"""A session's device in words, "Chrome on Linux", from its User-Agent header (the account
page's session list, docs/ui.md "Team and account").

A few ordered patterns, not a parsing library: the label only helps a person recognise their
own sessions (the full header stays in a tooltip), so a rare browser read as "Chrome" or an
unknown one shown as "Unknown browser" costs nothing, and no dependency has to be kept up
to date for it (docs/decisions.md "Session devices")."""

from __future__ import annotations

import re

# Order matters: Edge and Opera say "Chrome", Chrome says "Safari", every browser says
# "Mozilla". The first match names the browser.
_BROWSERS: tuple[tuple[str, str], ...] = (
    (r"\bEdg(?:e|A|iOS)?/", "Edge"),
    (r"\b(?:OPR|Opera)/", "Opera"),
    (r"\bSamsungBrowser/", "Samsung Internet"),
    (r"\b(?:Firefox|FxiOS)/", "Firefox"),
    (r"\bHeadlessChrome/", "Headless Chrome"),
    (r"\b(?:Chrome|Chromium|CriOS)/", "Chrome"),
    (r"\bVersion/[\d.]+.*\bSafari/", "Safari"),
    (r"^curl/", "curl"),
    (r"^python-requests/|^python-httpx/|^Python-urllib/", "Python"),
)
_SYSTEMS: tuple[tuple[str, str], ...] = (
    (r"\b(?:iPhone|iPad|iPod)\b", "iOS"),
    (r"\bAndroid\b", "Android"),
    (r"\bCrOS\b", "ChromeOS"),
    (r"\bWindows\b", "Windows"),
    (r"\bMac OS X\b|\bMacintosh\b", "macOS"),
    (r"\bLinux\b|\bX11\b", "Linux"),
)


def device_label(user_agent: str) -> str:
    """ "Chrome on Linux", "Safari on iOS", "Firefox", "Unknown browser"."""
    text = (user_agent or "").strip()
    if not text:
        return "Unknown browser"
    browser = next((name for pattern, name in _BROWSERS if re.search(pattern, text)), None)
    system = next((name for pattern, name in _SYSTEMS if re.search(pattern, text)), None)
    if browser and system:
        return f"{browser} on {system}"
    return browser or (f"Unknown browser on {system}" if system else "Unknown browser")
