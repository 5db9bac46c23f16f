"""Account endpoints under /api/v1/: members and invitations of the key's tenant.

Doors, in order: the tenant door (`access_membership` / `access_invitation`: another tenant's
id is a 404, for every method), then the key's role (a viewer key changes nothing: 403),
then the service, which enforces the rest (last admin, open invitations) under its lock.
POSTs take an `Idempotency-Key` like schedule creation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.openapi import BODY, COMMON, IDEMPOTENCY_KEY, error_table
from apps.core.pagination import unknown_query_params
from apps.tenants import members
from apps.tenants.authentication import TenantPrincipal, principal_of
from apps.tenants.idempotency import idempotent_post
from apps.tenants.models import Invitation, Membership, Tenant
from apps.tenants.serializers import (
    InvitationCreateSerializer,
    InvitationSerializer,
    MemberSerializer,
    MemberUpdateSerializer,
)

# Team-sized lists are answered whole, up to this many rows (newest first for invitations).
LIST_LIMIT = 1000


_errors = error_table(
    {
        403: "A viewer API key reads members and invitations and changes nothing.",
        404: "No such member or invitation in this tenant.",
        409: "The last admin, an existing member or open invitation, a closed invitation, "
        "or an Idempotency-Key used with another body.",
        429: "Per-key rate limit, or the tenant's hourly invitation mails (new and re-sent) "
        "are spent; retry after `Retry-After` seconds.",
    }
)


def _admin(request: Request) -> TenantPrincipal:
    principal = principal_of(request)
    if principal.api_key.role != Membership.Role.ADMIN:
        raise PermissionDenied(
            "This API key has the viewer role: it reads members and invitations and changes "
            "nothing. Use an admin key."
        )
    return principal


def _no_query(request: Request) -> None:
    unknown = unknown_query_params(request, ())
    if unknown:
        raise serializers.ValidationError(unknown)


def _site_url(request: Request) -> str:
    return request.build_absolute_uri("/")


class MemberList(APIView):
    checks_key_role = True  # the tenant door's 404 comes before the role's 403 (`_admin`)

    @extend_schema(responses={200: MemberSerializer(many=True), **_errors(400, *COMMON)})
    def get(self, request: Request) -> Response:
        """The tenant's members (people with a web login), by username."""
        _no_query(request)
        rows = members.members_for(tenant=principal_of(request).tenant)[:LIST_LIMIT]
        return Response(MemberSerializer(rows, many=True).data)


# One member's or invitation's endpoints: the tenant door before anything else, for every
# method (404 over 405/403); `found` is the row it let through, and GET answers it in the
# class's `shown` serializer, documented as such. (A comment, not a docstring: the OpenAPI
# document would take a view's docstring as its operations' description.)
class _OneRow(APIView):
    checks_key_role = True  # the tenant door's 404 comes before the role's 403 (`_admin`)
    id_kwarg: ClassVar[str]
    shown: ClassVar[type[serializers.ModelSerializer[Any]]]
    found: Any

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "shown" in vars(cls):
            responses = {200: cls.shown, **_errors(404, *COMMON)}
            extend_schema_view(get=extend_schema(responses=responses))(cls)

    def door(self, tenant: Tenant, row_id: Any) -> Any:
        raise NotImplementedError

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        self.found = self.door(principal_of(request).tenant, kwargs[self.id_kwarg])

    def get(self, request: Request, **kwargs: Any) -> Response:
        return Response(self.shown(self.found).data)


class MemberDetail(_OneRow):
    id_kwarg = "member_id"
    shown = MemberSerializer

    def door(self, tenant: Tenant, row_id: Any) -> Membership:
        return members.access_membership(tenant=tenant, membership_id=row_id)

    @extend_schema(
        request=MemberUpdateSerializer,
        responses={200: MemberSerializer, **_errors(*BODY, 403, 404, 409, *COMMON)},
    )
    def patch(self, request: Request, member_id: int) -> Response:
        """Change a member's role. Demoting the last admin is a 409 `last_admin`."""
        principal = _admin(request)
        body = MemberUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        changed = members.membership_change_role(
            membership=self.found, role=Membership.Role(body.validated_data["role"]),
            actor=principal.actor,
        )  # fmt: skip
        return Response(MemberSerializer(changed).data)

    @extend_schema(responses={204: None, **_errors(403, 404, 409, *COMMON)})
    def delete(self, request: Request, member_id: int) -> Response:
        """Remove a member from the tenant (their account stays). The last admin: 409."""
        principal = _admin(request)
        members.membership_remove(membership=self.found, actor=principal.actor)
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationListCreate(APIView):
    checks_key_role = True  # the tenant door's 404 comes before the role's 403 (`_admin`)

    @extend_schema(responses={200: InvitationSerializer(many=True), **_errors(400, *COMMON)})
    def get(self, request: Request) -> Response:
        """The tenant's invitations, newest first, in every state (pending, expired,
        accepted, revoked)."""
        _no_query(request)
        rows = members.invitations_for(tenant=principal_of(request).tenant)[:LIST_LIMIT]
        return Response(InvitationSerializer(rows, many=True).data)

    @extend_schema(
        request=InvitationCreateSerializer,
        parameters=[IDEMPOTENCY_KEY],
        responses={201: InvitationSerializer, **_errors(*BODY, 403, 409, *COMMON)},
    )
    def post(self, request: Request) -> Response:
        """Invite an e-mail address with a role (default `viewer`); the link is mailed,
        never returned. An existing member or an open invitation for the address is a 409
        `membership_conflict` (re-send the open one instead)."""
        principal = _admin(request)
        body = InvitationCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)

        def create() -> tuple[int, Any]:
            invitation = members.invitation_create(
                tenant=principal.tenant, email=body.validated_data["email"],
                role=Membership.Role(body.validated_data["role"]), actor=principal.actor,
                site_url=_site_url(request),
            )  # fmt: skip
            return status.HTTP_201_CREATED, dict(InvitationSerializer(invitation).data)

        return idempotent_post(request, create)


class InvitationDetail(_OneRow):
    id_kwarg = "invitation_id"
    shown = InvitationSerializer

    def door(self, tenant: Tenant, row_id: Any) -> Invitation:
        return members.access_invitation(tenant=tenant, invitation_id=row_id)


# Re-send and revoke: no body, the invitation as it is afterwards.
_invitation_action_schema = extend_schema(
    request=None,
    parameters=[IDEMPOTENCY_KEY],
    responses={200: InvitationSerializer, **_errors(403, 404, 409, *COMMON)},
)


def _invitation_action(
    request: Request, invitation: Invitation, act: Callable[..., Any]
) -> Response:
    principal = _admin(request)

    def call() -> tuple[int, Any]:
        return status.HTTP_200_OK, dict(InvitationSerializer(act(invitation, principal)).data)

    return idempotent_post(request, call)


class _InvitationAction(InvitationDetail):
    # An action, not a resource: it answers POST only (a GET is 405), and the invitation is
    # read at its own URL.
    http_method_names = ["post", "options"]


class InvitationResend(_InvitationAction):
    @_invitation_action_schema
    def post(self, request: Request, invitation_id: Any) -> Response:
        """Mail a new link and restart the expiry; the earlier link stops working. An
        accepted or revoked invitation: 409 `invitation_closed`."""
        return _invitation_action(
            request, self.found,
            lambda inv, who: members.invitation_resend(
                invitation=inv, actor=who.actor, site_url=_site_url(request)
            ),
        )  # fmt: skip


class InvitationRevoke(_InvitationAction):
    @_invitation_action_schema
    def post(self, request: Request, invitation_id: Any) -> Response:
        """Revoke an open invitation: its link is refused from now on."""
        return _invitation_action(
            request, self.found,
            lambda inv, who: members.invitation_revoke(invitation=inv, actor=who.actor),
        )  # fmt: skip
