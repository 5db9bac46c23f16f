"""A component's tunables as one frozen value, read from the Django settings it names.

The materializer, the relay and its staging, and the audit each take their tunables as one
frozen dataclass: the commands read it from the settings, a test or a benchmark builds it
with its own values. Each field that comes from a setting names it where it is declared
(`window_s: int = setting("TICK_PLANNING_WINDOW_S")`), and one `from_settings` reads them.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Self, dataclass_transform

from django.conf import settings

_SETTING = "setting"


def setting(name: str, *, default: Any = MISSING) -> Any:
    """A field that `from_settings` reads from the Django setting `name`; built by hand, the
    field is required unless it has a `default`."""
    return field(default=default, metadata={_SETTING: name})


@dataclass_transform(frozen_default=True, field_specifiers=(field, setting))
class SettingsConfig:
    """Base of such a value: each subclass is a frozen dataclass."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclass(frozen=True)(cls)

    @classmethod
    def from_settings(cls, **given: Any) -> Self:
        """The fields that name a setting read from it now, unless `given`; the other
        fields `given` or their defaults."""
        read = {
            f.name: getattr(settings, f.metadata[_SETTING])
            for f in fields(cls)  # type: ignore[arg-type]
            if _SETTING in f.metadata and f.name not in given
        }
        return cls(**read, **given)
