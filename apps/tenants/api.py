"""Webhook signing secrets under /api/v1/ (docs/webhooks.md): list, rotate, revoke.

An API key acts for its whole tenant (only tenant admins create keys: docs/decisions.md
"Webhook signing"), so every key may rotate and revoke. Raw secrets appear once, in the
rotate answer, which no cache may keep (`Cache-Control: no-store`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.openapi import COMMON, error_table
from apps.core.pagination import unknown_query_params
from apps.tenants.authentication import principal_of
from apps.tenants.models import SigningSecret
from apps.tenants.signing import (
    signing_secret_revoke,
    signing_secret_rotate,
    signing_secrets_of,
)

# The longest a previous secret may keep signing after a rotation.
MAX_OVERLAP_S = 7 * 86_400


class SigningSecretSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField(read_only=True)
    prefix = serializers.CharField(
        read_only=True, help_text="The secret's first characters, to tell secrets apart."
    )
    status = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField(read_only=True)
    expires_at = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="Set on the previous secret by a rotation; null for the current one.",
    )
    revoked_at = serializers.DateTimeField(read_only=True, allow_null=True)

    @extend_schema_field(serializers.ChoiceField(choices=SigningSecret.Status.choices))
    def get_status(self, obj: SigningSecret) -> str:
        return str(obj.status_at(self.context.get("now") or timezone.now()))


class SigningSecretListSerializer(serializers.Serializer[Any]):
    results = SigningSecretSerializer(many=True)


class RotateRequestSerializer(serializers.Serializer[Any]):
    previous_expires_in_s = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_OVERLAP_S,
        help_text=(
            "How long the current secret keeps signing beside the new one, in seconds "
            f"(0 to {MAX_OVERLAP_S}). Default TICK_SIGNING_ROTATION_OVERLAP_S (24 h)."
        ),
    )

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


class RotateResponseSerializer(SigningSecretSerializer):
    secret = serializers.CharField(
        read_only=True,
        help_text="The new secret (`whsec_…`), shown in this answer only: store it now.",
    )


_errors = error_table(
    {
        "400-unknown": "An unknown parameter.",
        404: "No such signing secret in this tenant.",
        "409-rotating": "A rotation is in progress (two active secrets): revoke one first.",
        "409-only": "The only active secret: rotate first.",
    }
)


class SigningSecretList(APIView):
    @extend_schema(responses={200: SigningSecretListSerializer, **_errors(*COMMON, "400-unknown")})
    def get(self, request: Request) -> Response:
        """The tenant's webhook signing secrets, newest first (the latest 100): prefixes and
        dates only, never a secret."""
        unknown = unknown_query_params(request, ())
        if unknown:
            raise ValidationError(unknown)
        rows = signing_secrets_of(tenant=principal_of(request).tenant)
        data = SigningSecretSerializer(rows, many=True, context={"now": timezone.now()}).data
        return Response({"results": data})


class SigningSecretRotate(APIView):
    @extend_schema(
        request=RotateRequestSerializer,
        responses={
            201: RotateResponseSerializer,
            **_errors(*COMMON, 400, "409-rotating", 415),
        },
    )
    def post(self, request: Request) -> Response:
        """Create a new signing secret; the current one keeps signing beside it until it
        expires (`previous_expires_in_s`, default 24 h) or is revoked. The new raw secret is in
        this answer only (`Cache-Control: no-store`)."""
        # No body means the defaults; a JSON body must be an object (`null` is refused).
        sent = request.data
        body = RotateRequestSerializer(data={} if isinstance(sent, Mapping) and not sent else sent)
        body.is_valid(raise_exception=True)
        principal = principal_of(request)
        row, raw = signing_secret_rotate(
            tenant=principal.tenant,
            actor=principal.actor,
            previous_expires_in_s=body.validated_data.get("previous_expires_in_s"),
        )
        data = dict(SigningSecretSerializer(row).data)
        data["secret"] = raw
        return Response(data, status=status.HTTP_201_CREATED, headers={"Cache-Control": "no-store"})


class SigningSecretDetail(APIView):
    @extend_schema(
        responses={
            200: SigningSecretSerializer,
            **_errors(*COMMON, 404, "409-only"),
        }
    )
    def delete(self, request: Request, secret_id: Any) -> Response:
        """Revoke a secret: webhooks stop carrying its signature at once. Revoking the newer
        of two active secrets cancels the rotation (the previous one is current again);
        revoking the only active one is refused (409). Idempotent."""
        principal = principal_of(request)
        row = signing_secret_revoke(
            tenant=principal.tenant, secret_id=secret_id, actor=principal.actor
        )
        return Response(SigningSecretSerializer(row).data)
