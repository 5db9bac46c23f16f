"""What docs/decisions.md "Layout of the occurrences app" and docs/architecture.md promise about
the code's shape, checked: every module of a package is named in its reading guide (the
package's `__init__.py` docstring), once, and no function body in production code is longer than
60 lines."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
PRODUCTION = ("apps", "tickweb")
# Not production code, or no code to guide a reader through.
OFF = {"tests", "migrations", "management", "templatetags", "formats", "__pycache__"}
# An app's own top level is guided by README.md "Layout" and docs/architecture.md; a package
# inside an app has its guide in its __init__.py.
APPS = {ROOT / "apps" / name for name in ("tenants", "schedules", "occurrences")}
MAX_BODY_LINES = 60
# Longer on purpose, each with why.
LONG_BODIES = {
    # One cron field's grammar (lists, ranges, steps, names) read top to bottom, in the order
    # docs/timerules.md gives it; split, the error messages lose their order.
    ("apps/schedules/timerules/cron.py", "_parse_field"),
}


def _packages() -> Iterator[Path]:
    for top in PRODUCTION:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            package = init.parent
            parts = set(package.relative_to(ROOT).parts)
            if parts & OFF or package in APPS or package == ROOT / top:
                continue
            yield package


def _modules(package: Path) -> list[str]:
    return sorted(p.name for p in package.glob("*.py") if p.name != "__init__.py")


def _named(module: str, guide: str) -> bool:
    # `name.py`, or the bare name as a word (``cron``): not a longer name that contains it.
    stem = re.escape(module.removesuffix(".py"))
    return re.search(rf"(?<![\w/]){stem}(\.py)?(?!\w)", guide) is not None


def test_every_module_is_in_its_package_guide() -> None:
    missing: dict[str, list[str]] = {}
    for package in _packages():
        modules = _modules(package)
        if not modules:
            continue
        guide = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        absent = [name for name in modules if not _named(name, guide)]
        if absent:
            missing[str(package.relative_to(ROOT))] = absent
    assert missing == {}, "name each module in its package's __init__ docstring"


def test_no_module_has_two_entries_in_its_guide() -> None:
    # An entry is a line that starts with the module's file name; two are a merge's trace.
    twice: dict[str, list[str]] = {}
    for package in _packages():
        guide = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        heads = re.findall(r"^(\w+\.py)\b", guide, re.MULTILINE)
        if repeated := sorted({name for name in heads if heads.count(name) > 1}):
            twice[str(package.relative_to(ROOT))] = repeated
    assert twice == {}, "name each module once in its package's __init__ docstring"


def test_the_guide_check_sees_a_package() -> None:
    # The check is not vacuous: it walks the occurrences sub-packages.
    names = {str(p.relative_to(ROOT)) for p in _packages()}
    assert "apps/occurrences/execution" in names and "apps/occurrences/pipeline" in names


def _functions(path: Path) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring is not body
    end = node.end_lineno or node.lineno
    return end - body[0].lineno + 1


def test_no_function_body_in_production_code_is_longer_than_60_lines() -> None:
    long: list[str] = []
    for top in PRODUCTION:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if set(rel.parts) & {"tests", "migrations", "bench"}:
                continue
            for node in _functions(path):
                lines = _body_lines(node)
                if lines > MAX_BODY_LINES and (str(rel), node.name) not in LONG_BODIES:
                    long.append(f"{rel}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []
