"""Serializer fields every API shares: strict JSON types, and choices in any letter case."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class StrictCharField(serializers.CharField):
    """A string, never a number coerced into one (DRF's CharField accepts 123 as "123")."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer, never a numeric string, a float or a boolean."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class AnyCaseChoiceField(serializers.ChoiceField):
    """A choice written in any letter case ("paused", "PAUSED"): query filters name enum
    members, and their case carries no meaning (docs/api.md)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str):
            for text, value in self.choice_strings_to_values.items():
                if text.casefold() == data.casefold():
                    return value
        return super().to_internal_value(data)
