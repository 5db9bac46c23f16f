"""States, lanes, policies and roles are named through their enums in production code, also
inside SQL (as parameters): a bare copy of an enum value keeps "working" after the member is
renamed and silently matches nothing. This scan fails on such a copy."""

from __future__ import annotations

import ast
import enum
import re
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings

from apps.occurrences.models import Attempt, Lane, Occurrence, ShardLease
from apps.schedules.models import Schedule

ENUMS: tuple[type[enum.Enum], ...] = (
    Occurrence.State,
    Attempt.Outcome,
    Lane,
    ShardLease.Role,
    Schedule.State,
    Schedule.Kind,
    Schedule.Precision,
    Schedule.MisfirePolicy,
    Schedule.OverlapPolicy,
    Schedule.DstGap,
    Schedule.DstFold,
)
VALUES = frozenset(str(member.value) for choices in ENUMS for member in choices)
# Literals that equal an enum value by coincidence, each with the reason it is not one.
NOT_ENUM_VALUES = {
    # manage.py command names, also the keys of the benchmark's JSON report.
    ("apps/bench/burst.py", "relay"),
    # The process kind a stall stops (the relay command's processes).
    ("apps/bench/sustained.py", "relay"),
    # The audit command's printed verdict (OK / FAILED), not an attempt outcome.
    ("apps/occurrences/management/commands/reconcile.py", "FAILED"),
    # The benchmarks' phase names (the process that does the work), not a lease role.
    ("apps/bench/floor.py", "relay"),
    ("apps/bench/pg_profile.py", "relay"),
    ("apps/bench/outage.py", "relay"),
    ("apps/bench/execution_path.py", "relay"),
    # bench_outage's tenant labels (slugs of its four tenants); the policy beside each is
    # the enum member.
    ("apps/bench/outage.py", "skip"),
    ("apps/bench/outage.py", "catchup"),
    # English ordinals for "the first Monday", not a DST fold choice.
    ("apps/schedules/rule_words.py", "first"),
}
ENUM_BASES = {"TextChoices", "IntegerChoices", "StrEnum", "Enum", "Choices"}


def _production_files() -> Iterator[Path]:
    for path in sorted(Path(settings.BASE_DIR).glob("[at]*/**/*.py")):
        relative = path.relative_to(settings.BASE_DIR).as_posix()
        if not relative.startswith(("apps/", "tickweb/")):
            continue
        if "/tests/" in relative or "/migrations/" in relative or path.name == "models.py":
            continue
        yield path


def _skipped_nodes(tree: ast.Module) -> set[int]:
    """Docstrings and enum class bodies: a value defined or described, not compared."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant):
                skipped.add(id(body[0].value))
        if isinstance(node, ast.ClassDef):
            bases = {getattr(b, "attr", getattr(b, "id", "")) for b in node.bases}
            if bases & ENUM_BASES:
                skipped.update(id(n) for n in ast.walk(node))
    return skipped


def _bare_values(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    skipped = _skipped_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skipped or not isinstance(node, ast.Constant):
            continue
        if not isinstance(node.value, str):
            continue
        if node.value in VALUES:
            yield node.lineno, node.value
        # Inside SQL text: a quoted value ('SCHEDULED') compared or written by the statement.
        for quoted in re.findall(r"'([A-Za-z_]+)'", node.value):
            if quoted in VALUES and len(node.value) > len(quoted) + 2:
                yield node.lineno, quoted


def test_production_code_names_enum_values_through_the_enums() -> None:
    found = []
    for path in _production_files():
        relative = path.relative_to(settings.BASE_DIR).as_posix()
        for line, value in _bare_values(path):
            if (relative, value) not in NOT_ENUM_VALUES:
                found.append(f"{relative}:{line}: {value!r}")
    assert found == [], "bare enum values (use the enum member):\n" + "\n".join(found)


def test_the_scan_finds_a_bare_state_in_sql_and_in_a_comparison(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "SQL = \"UPDATE t SET state = 'SCHEDULED' WHERE id = %s\"\n"
        'def f(policy: str) -> bool:\n    return policy == "ALLOW"\n'
    )
    assert sorted(value for _, value in _bare_values(sample)) == ["ALLOW", "SCHEDULED"]
