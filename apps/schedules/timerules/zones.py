"""The zones Tick accepts, read from the ``tzdata`` package only.

Part of ``apps.schedules.timerules`` (docs/timerules.md).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources
from typing import Final, Literal
from zoneinfo import ZoneInfo

from apps.schedules.timerules.base import TimeRuleError

#: Longest accepted zone name (the longest IANA name is 32 characters).
MAX_ZONE_LENGTH: Final = 64

_ZONE_NAME_RE: Final = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*")
_REFUSED_ZONES: Final = frozenset({"Factory", "posixrules", "localtime", "posix", "right"})


@functools.cache
def available_zones() -> frozenset[str]:
    """Zone names Tick accepts: the ``tzdata`` package's list, minus ``Factory``."""
    text = resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    names = {line.strip() for line in text.splitlines() if line.strip()}
    return frozenset(n for n in names if n not in _REFUSED_ZONES)


@functools.cache
def _zones_by_folded_name() -> dict[str, str]:
    return {name.casefold(): name for name in available_zones()}


def validate_zone(time_zone: object) -> str:
    """Return the zone name if Tick accepts it, else raise ``TimeRuleError("time_zone")``."""
    field = "time_zone"
    if not isinstance(time_zone, str):
        raise TimeRuleError(field, "The time zone must be a string such as 'Europe/Berlin'.")
    if not time_zone:
        raise TimeRuleError(field, "The time zone is empty; give an IANA name such as 'UTC'.")
    if len(time_zone) > MAX_ZONE_LENGTH:
        raise TimeRuleError(
            field,
            f"The time zone name is too long (over {MAX_ZONE_LENGTH} characters).",
        )
    if not time_zone.isascii() or not _ZONE_NAME_RE.fullmatch(time_zone):
        raise TimeRuleError(
            field,
            "The time zone must be an IANA name such as 'America/New_York' "
            "(letters, digits, '_', '+', '-' and '/'; no paths).",
        )
    if time_zone in _REFUSED_ZONES:
        raise TimeRuleError(field, f"'{time_zone}' is not a real time zone; use an IANA name.")
    if time_zone not in available_zones():
        hint = _zones_by_folded_name().get(time_zone.casefold())
        extra = f" Did you mean '{hint}'?" if hint else ""
        raise TimeRuleError(field, f"Unknown time zone '{time_zone}'.{extra}")
    return time_zone


@functools.lru_cache(maxsize=1024)
def _load_zone(name: str) -> ZoneInfo:
    parts = name.split("/")
    resource = resources.files("tzdata").joinpath("zoneinfo", *parts)
    with resource.open("rb") as fh:
        return ZoneInfo.from_file(fh, key=name)


def get_zone(time_zone: str) -> ZoneInfo:
    """The validated zone, read from the ``tzdata`` package (never from host zone files)."""
    return _load_zone(validate_zone(time_zone))


@dataclass(frozen=True)
class ZoneDescription:
    name: str
    kind: Literal["region", "fixed-offset", "link"]
    same_rules_as: tuple[str, ...]
    note: str | None


@functools.cache
def _zone_groups() -> dict[bytes, tuple[str, ...]]:
    groups: dict[bytes, list[str]] = {}
    root = resources.files("tzdata").joinpath("zoneinfo")
    for name in sorted(available_zones()):
        data = root.joinpath(*name.split("/")).read_bytes()
        groups.setdefault(data, []).append(name)
    return {k: tuple(v) for k, v in groups.items()}


# Well-known names kept by IANA only for backward compatibility ("backward" file).
_LEGACY_PREFIXES: Final = ("US/", "Canada/", "Mexico/", "Brazil/", "Chile/")
_LEGACY_NAMES: Final = {
    "Asia/Calcutta": "Asia/Kolkata",
    "Asia/Saigon": "Asia/Ho_Chi_Minh",
    "Asia/Katmandu": "Asia/Kathmandu",
    "Asia/Rangoon": "Asia/Yangon",
    "Asia/Ulan_Bator": "Asia/Ulaanbaatar",
    "Europe/Kiev": "Europe/Kyiv",
    "America/Buenos_Aires": "America/Argentina/Buenos_Aires",
    "America/Godthab": "America/Nuuk",
    "Pacific/Truk": "Pacific/Chuuk",
    "Atlantic/Faeroe": "Atlantic/Faroe",
    "GB": "Europe/London",
    "Japan": "Asia/Tokyo",
    "Singapore": "Asia/Singapore",
    "Israel": "Asia/Jerusalem",
    "Turkey": "Europe/Istanbul",
    "Egypt": "Africa/Cairo",
    "Eire": "Europe/Dublin",
    "Hongkong": "Asia/Hong_Kong",
    "Iran": "Asia/Tehran",
    "NZ": "Pacific/Auckland",
    "PRC": "Asia/Shanghai",
    "ROC": "Asia/Taipei",
    "ROK": "Asia/Seoul",
}
_ETC_GMT_RE: Final = re.compile(r"Etc/GMT([+-])(\d{1,2})")


def describe_zone(time_zone: str) -> ZoneDescription:
    """Explain a zone name: fixed offsets (with the inverted POSIX sign), legacy aliases."""
    name = validate_zone(time_zone)
    same = tuple(n for n in _zone_groups()[_zone_bytes(name)] if n != name)
    match = _ETC_GMT_RE.fullmatch(name)
    if match:
        sign = "-" if match.group(1) == "+" else "+"
        hours = int(match.group(2))
        note = (
            f"{name} is a fixed offset of UTC{sign}{hours:02d}:00 with no DST. POSIX-style "
            f"'Etc/GMT' names invert the sign: {name} is {hours} hours "
            f"{'behind' if sign == '-' else 'ahead of'} UTC."
        )
        return ZoneDescription(name, "fixed-offset", same, note)
    legacy = _LEGACY_NAMES.get(name)
    if legacy is None and name.startswith(_LEGACY_PREFIXES) and same:
        legacy = next((n for n in same if "/" in n and not n.startswith(_LEGACY_PREFIXES)), None)
    if legacy is not None:
        note = (
            f"{name} is a backward-compatible IANA alias of {legacy}; it behaves identically. "
            f"Tick keeps the name as given."
        )
        return ZoneDescription(name, "link", same, note)
    if name in ("UTC", "Etc/UTC", "Etc/UCT", "UCT", "Zulu", "Etc/Zulu", "Universal"):
        return ZoneDescription(name, "fixed-offset", same, None)
    return ZoneDescription(name, "region", same, None)


def _zone_bytes(name: str) -> bytes:
    return resources.files("tzdata").joinpath("zoneinfo", *name.split("/")).read_bytes()
