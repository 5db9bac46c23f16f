"""A component's tunables: the fields that name a setting are read from it, the rest keep
their defaults, and what the caller gives wins (apps/core/config.py)."""

from __future__ import annotations

import dataclasses

import pytest
from django.test import override_settings

from apps.core.config import SettingsConfig, setting


class _Tunables(SettingsConfig):
    size: int = setting("TEST_TUNABLE_SIZE")
    name: str = setting("TEST_TUNABLE_NAME", default="plain")
    pause_s: float = 1.5


@override_settings(TEST_TUNABLE_SIZE=7, TEST_TUNABLE_NAME="named")
def test_the_fields_that_name_a_setting_are_read_from_it() -> None:
    assert _Tunables.from_settings() == _Tunables(size=7, name="named", pause_s=1.5)


@override_settings(TEST_TUNABLE_SIZE=7, TEST_TUNABLE_NAME="named")
def test_what_the_caller_gives_wins_over_the_setting() -> None:
    assert _Tunables.from_settings(size=3, pause_s=0.5) == _Tunables(3, "named", 0.5)


def test_built_by_hand_a_setting_field_is_required_unless_it_has_a_default() -> None:
    assert _Tunables(size=2) == _Tunables(2, "plain", 1.5)
    with pytest.raises(TypeError):
        _Tunables()  # type: ignore[call-arg]


def test_the_value_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        _Tunables(size=2).size = 3  # type: ignore[misc]
