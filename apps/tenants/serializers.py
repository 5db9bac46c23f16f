"""Shapes of the account API (/api/v1/members, /api/v1/invitations). Never the link token."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.tenants.members import address_canonical
from apps.tenants.models import Invitation, Membership


class RoleField(serializers.ChoiceField):
    """`admin` or `viewer`, in any letter case; always written in lower case."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=Membership.Role.choices, **kwargs)

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("invalid_choice", input=data)
        return super().to_internal_value(data.lower())


class MemberSerializer(serializers.ModelSerializer[Membership]):
    username = serializers.CharField(source="user.get_username", read_only=True)
    email = serializers.SerializerMethodField()

    class Meta:
        model = Membership
        fields = ["id", "username", "email", "role", "created_at"]
        read_only_fields = fields

    @extend_schema_field(serializers.EmailField(allow_null=True))
    def get_email(self, membership: Membership) -> str | None:
        """The account's address; null for an account without one (e.g. the demo login)."""
        return membership.user.email or None


class MemberUpdateSerializer(serializers.Serializer[Any]):
    role = RoleField()


class InvitationSerializer(serializers.ModelSerializer[Invitation]):
    state = serializers.SerializerMethodField()

    class Meta:
        model = Invitation
        fields = [
            "id", "email", "role", "state", "invited_by", "created_at", "sent_at",
            "expires_at", "accepted_at", "revoked_at",
        ]  # fmt: skip
        read_only_fields = fields

    def get_state(self, invitation: Invitation) -> Invitation.State:
        return invitation.state_at(timezone.now())


class StrictEmailField(serializers.EmailField):
    """A JSON string only (DRF's CharField would turn 123 into "123" before the check),
    judged as Tick compares addresses (`address_canonical`)."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(address_canonical(data)))


class InvitationCreateSerializer(serializers.Serializer[Any]):
    # It becomes the username of a new account (at most 150 characters).
    email = StrictEmailField(max_length=150)
    role = RoleField(default=Membership.Role.VIEWER)
