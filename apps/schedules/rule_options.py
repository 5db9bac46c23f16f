"""The options of a schedule's time rule: what a DST gap and a DST fold do.

A module of its own, importing nothing from Django or from the rules: the time rules
(``apps.schedules.timerules``), the schedule model and the audit's independent cron matcher
all name the options through these enums (docs/timerules.md, "DST contract").
"""

from __future__ import annotations

from enum import EnumMeta, StrEnum
from typing import cast


class _ChoicesType(EnumMeta):
    """Django's ``choices`` / ``values`` / ``labels`` on the class, without Django."""

    def _members(cls) -> list[Choices]:
        return cast("list[Choices]", list(cls.__members__.values()))

    @property
    def choices(cls) -> list[tuple[str, str]]:
        return [(member.value, member.label) for member in cls._members()]

    @property
    def values(cls) -> list[str]:
        return [member.value for member in cls._members()]

    @property
    def labels(cls) -> list[str]:
        return [member.label for member in cls._members()]


class Choices(StrEnum, metaclass=_ChoicesType):
    """A string enum a model field can take as its choices (``Schedule.DstGap`` is ``DstGap``)."""

    @property
    def label(self) -> str:
        return self.value.capitalize()


class DstGap(Choices):
    """What a local time that does not exist (spring-forward gap) does."""

    SKIP = "skip"  # not run that day
    SHIFT = "shift"  # all matching times of one gap run once, at the end of the gap


class DstFold(Choices):
    """What a local time that happens twice (fall-back overlap) does."""

    FIRST = "first"  # runs once, at its first instant
    BOTH = "both"  # runs at both instants
