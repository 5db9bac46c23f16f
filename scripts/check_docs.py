"""Docs that stay true to themselves and to the code, checked in `make lint`.

Fails on:
- a prose line (outside code blocks and tables, over 50 characters) whose first 45
  characters stand twice in one file — the trace of a merge that kept both sides;
- a table row or a paragraph repeated within one file;
- an API route of the URL conf (`/api/v1/…`) missing from the route tables of docs/api.md.

Usage: python scripts/check_docs.py [FILE …]   (default: README.md and docs/*.md)
"""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
API_PREFIX = "api/v1/"
PROSE_MIN = 50
PROSE_KEY = 45
_METHODS = re.compile(r"^(GET|POST|PUT|PATCH|DELETE)\s+")
_PARAM = re.compile(r"\{[^}]*\}")
_CONVERTER = re.compile(r"<(?:[^:>]+:)?[^>]+>")


def _outside_code(lines: Iterable[str]) -> Iterator[str]:
    in_code = False
    for line in lines:
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if not in_code:
            yield line


def repeated_lines(text: str) -> list[str]:
    """Prose lines sharing their first 45 characters, repeated table rows and paragraphs."""
    lines = list(_outside_code(text.splitlines()))
    problems: list[str] = []
    prose = Counter(
        line.strip()[:PROSE_KEY]
        for line in lines
        if len(line) > PROSE_MIN
        and not line.lstrip().startswith("|")
        and re.search(r"[a-z]{4}", line)
    )
    problems += [f"a line starts twice: {key!r}" for key, n in prose.items() if n > 1]
    rows = Counter(
        line.strip()
        for line, after in zip(lines, [*lines[1:], ""][: len(lines)], strict=True)
        if line.lstrip().startswith("|") and not re.fullmatch(r"\s*[|\s:-]+", after)
    )
    problems += [
        f"a table row stands twice: {row[:60]!r}"
        for row, n in rows.items()
        if n > 1 and not re.fullmatch(r"[|\s:-]+", row)
    ]
    paragraphs = Counter(
        block.strip() for block in "\n".join(lines).split("\n\n") if len(block.strip()) > PROSE_MIN
    )
    problems += [f"a paragraph stands twice: {p[:60]!r}" for p, n in paragraphs.items() if n > 1]
    return problems


def documented_routes(api_md: str) -> set[str]:
    """Routes named in the first cell of docs/api.md's tables, `{…}` for every parameter.

    A cell may abbreviate siblings: "`POST schedules/{id}/pause` · `/resume`" names
    schedules/{id}/pause and schedules/{id}/resume."""
    routes: set[str] = set()
    for line in api_md.splitlines():
        if not line.startswith("|"):
            continue
        first_cell = line.split("|")[1]
        previous = ""
        for span in re.findall(r"`([^`]+)`", first_cell):
            route = _METHODS.sub("", span.strip()).split("?")[0].split(" ")[0]
            if route in {"GET", "POST", "PUT", "PATCH", "DELETE"} or not route:
                continue
            if route.startswith("/") and previous:
                route = previous.rsplit("/", 1)[0] + route
            route = _PARAM.sub("{}", route.lstrip("/"))
            routes.add(route)
            previous = route
    return routes


def url_conf_routes() -> set[str]:
    """Every `/api/v1/` route of the URL conf, `{}` for every converter."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tickweb.settings")
    os.environ.setdefault("DJANGO_DEBUG", "1")
    django.setup()
    from django.urls import URLResolver, get_resolver

    def walk(patterns: Iterable[object], prefix: str) -> Iterator[str]:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
            else:
                yield prefix + str(pattern.pattern)  # type: ignore[attr-defined]

    return {
        _CONVERTER.sub("{}", route[len(API_PREFIX) :])
        for route in walk(get_resolver().url_patterns, "")
        if route.startswith(API_PREFIX)
    }


def undocumented_routes(api_md: str, routes: set[str]) -> list[str]:
    return sorted(routes - documented_routes(api_md))


def main(argv: list[str]) -> int:
    files = [Path(a) for a in argv] or [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    failures = [
        f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {problem}"
        for path in files
        for problem in repeated_lines(path.read_text(encoding="utf-8"))
    ]
    if not argv:
        api_md = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
        failures += [
            f"docs/api.md: the route /api/v1/{route} is in the URL conf but in no route table"
            for route in undocumented_routes(api_md, url_conf_routes())
        ]
    for failure in failures:
        print(failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
