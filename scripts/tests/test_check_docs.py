"""The docs check of `make lint` (scripts/check_docs.py) fails on what a merge that kept both
sides leaves behind, and on an API route that docs/api.md does not list."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parent.parent / "check_docs.py"


def _check_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_docs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PROSE = "Tick turns every scheduled instant into an occurrence and hands it on time."


def test_a_clean_file_passes() -> None:
    table = "| a | b |\n|---|---|\n"
    text = f"# Title\n\n{PROSE}\n\n{table}| 1 | 2 |\n\n{table}| 3 | 4 |\n"
    assert _check_docs().repeated_lines(text) == []


def test_a_prose_line_kept_twice_by_a_merge_fails() -> None:
    text = f"{PROSE}\n{PROSE[:46]} and then the other side's ending of it.\n"
    problems = _check_docs().repeated_lines(text)
    assert len(problems) == 1 and "a line starts twice" in problems[0]


def test_a_repeated_table_row_fails_but_a_repeated_header_does_not() -> None:
    row = "| log in / out | `/login/` | Django auth views |"
    text = f"| page | route | how |\n|---|---|---|\n{row}\n{row}\n"
    problems = _check_docs().repeated_lines(text)
    assert problems == [f"a table row stands twice: {row[:60]!r}"]


def test_code_blocks_may_repeat_lines() -> None:
    text = f"```sh\n{PROSE}\n{PROSE}\n```\n"
    assert _check_docs().repeated_lines(text) == []


def test_a_route_missing_from_the_route_tables_is_named() -> None:
    api_md = (
        "| route | answer |\n|---|---|\n"
        "| `POST schedules/{id}/pause` · `/resume` | receipt |\n"
        "| `GET occurrences?state=` | page |\n"
    )
    routes = {"schedules/{}/pause", "schedules/{}/resume", "occurrences", "occurrences/{}/cancel"}
    assert _check_docs().undocumented_routes(api_md, routes) == ["occurrences/{}/cancel"]


def test_the_repository_docs_pass_and_a_planted_duplicate_fails(tmp_path: Path) -> None:
    ok = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr

    planted = tmp_path / "planted.md"
    readme = (SCRIPT.parent.parent / "README.md").read_text(encoding="utf-8")
    paragraph = readme.split("\n\n")[1]
    planted.write_text(f"{readme}\n\n{paragraph}\n", encoding="utf-8")
    failed = subprocess.run(
        [sys.executable, str(SCRIPT), str(planted)], capture_output=True, text=True, check=False
    )
    assert failed.returncode == 1
    assert "stands twice" in failed.stdout or "starts twice" in failed.stdout
