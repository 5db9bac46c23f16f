"""A tenant's team: invitations by e-mail, roles, removal (docs/decisions.md: invitations).

Every change takes the tenant row `FOR NO KEY UPDATE` first, so the changes of one tenant's
team run one at a time: "is this the last admin?" is answered and acted on under that lock,
and two admins demoting each other at once leave one admin, never none. (`NO KEY`: rows of
other tables that reference the tenant are still inserted meanwhile.) Every change writes a
TenantEvent in the same transaction. Mail is sent after commit, never for a rolled-back row.
"""

from __future__ import annotations

import hashlib
import secrets
import unicodedata
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.http import Http404
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from apps.tenants import rls
from apps.tenants.addresses import email_address_errors, refuse_over_hourly_budget
from apps.tenants.errors import (
    InvitationStateConflict,
    LastAdminRefused,
    MembershipConflict,
    RefusedRequest,
)
from apps.tenants.models import (
    USERNAME_MAX_LENGTH,
    Invitation,
    Membership,
    Tenant,
    TenantEvent,
)
from apps.tenants.services import log_tenant_event, member_keys_revoke


def _token_hash(token: str) -> str:
    # 256 random bits: a fast hash is enough, as for API keys (nothing to brute-force).
    return hashlib.sha256(token.encode()).hexdigest()


def _lock_tenant(tenant: Tenant) -> None:
    Tenant.objects.select_for_update(no_key=True).filter(pk=tenant.pk).values_list("pk").get()


def _ttl() -> timedelta:
    return timedelta(days=settings.TICK_INVITATION_TTL_DAYS)


def address_canonical(email: str) -> str:
    """`email` as Tick compares and stores it: NFKC (a full-width `ｅ` is an `e`) without
    invisible format characters (a zero-width space, a soft hyphen, a BOM) and surrounding
    whitespace, so a look-alike of a member's address is that address."""
    folded = unicodedata.normalize("NFKC", email)
    return "".join(char for char in folded if unicodedata.category(char) != "Cf").strip()


def users_with_address(email: str) -> QuerySet[Any]:
    """Accounts an invitation to `email` belongs to: username or e-mail, in any case, after
    `address_canonical`."""
    email = address_canonical(email)
    return get_user_model().objects.filter(Q(username__iexact=email) | Q(email__iexact=email))


# --- doors ----------------------------------------------------------------------------------


def invitations_for(*, tenant: Tenant) -> QuerySet[Invitation]:
    return Invitation.objects.filter(tenant=tenant).order_by("-created_at", "id")


def members_for(*, tenant: Tenant) -> QuerySet[Membership]:
    return (
        Membership.objects.filter(tenant=tenant).select_related("user").order_by("user__username")
    )


def access_invitation(*, tenant: Tenant, invitation_id: uuid.UUID | str) -> Invitation:
    """The tenant's invitation, or 404 — also for another tenant's id."""
    try:
        return invitations_for(tenant=tenant).get(id=invitation_id)
    except (Invitation.DoesNotExist, ValueError, TypeError, ValidationError):
        raise Http404("No such invitation.") from None


def access_membership(*, tenant: Tenant, membership_id: int | str) -> Membership:
    """The tenant's membership, or 404 — also for another tenant's id."""
    try:
        return members_for(tenant=tenant).get(id=membership_id)
    except (Membership.DoesNotExist, ValueError, TypeError, ValidationError):
        raise Http404("No such member.") from None


# --- invitations ----------------------------------------------------------------------------


INVITATION_MAIL_EVENTS = (TenantEvent.Kind.MEMBER_INVITED, TenantEvent.Kind.INVITATION_RESENT)


def _refuse_over_mail_budget(tenant: Tenant, now: datetime) -> None:
    """At most TICK_INVITATION_MAILS_PER_HOUR invitation mails (new and re-sent) per tenant:
    counted from the account log, under the tenant lock the caller holds."""
    limit = settings.TICK_INVITATION_MAILS_PER_HOUR
    sent_at = list(
        TenantEvent.objects.filter(
            tenant=tenant, kind__in=INVITATION_MAIL_EVENTS, at__gt=now - timedelta(hours=1)
        ).values_list("at", flat=True)
    )
    refuse_over_hourly_budget(sent_at, limit=limit, now=now, spent=f"sent {limit} invitation mails")


def _send_invitation(invitation: Invitation, token: str, site_url: str) -> None:
    link = site_url.rstrip("/") + reverse("invitation-accept", args=[token])
    context = {"invitation": invitation, "link": link, "tenant": invitation.tenant}
    send_mail(
        subject=f"You are invited to {invitation.tenant.name} on Tick",
        message=render_to_string("tick/email/invitation.txt", context),
        from_email=None,
        recipient_list=[invitation.email],
    )


@transaction.atomic
def invitation_create(
    *, tenant: Tenant, email: str, role: Membership.Role, actor: str, site_url: str
) -> Invitation:
    """Invite `email` to `tenant` as `role` and mail the link (after commit).

    Refused (409) when the address is already a member or already has an open invitation,
    expired ones included: re-sending renews that one. The address is stored as
    `address_canonical` makes it."""
    email = address_canonical(email)
    # The invited address becomes the username of a new account (Django's username column).
    if len(email) > USERNAME_MAX_LENGTH:
        raise RefusedRequest(
            f"Use an address of at most {USERNAME_MAX_LENGTH} characters: it becomes the username.",
            field="email",
        )
    if address_errors := email_address_errors(email):
        raise RefusedRequest(address_errors[0], field="email")
    _lock_tenant(tenant)
    if Membership.objects.filter(
        tenant=tenant, user__in=users_with_address(email).values("pk")
    ).exists():
        raise MembershipConflict(f"{email} is already a member of this tenant.", field="email")
    if Invitation.objects.filter(
        tenant=tenant, email__iexact=email, accepted_at__isnull=True, revoked_at__isnull=True
    ).exists():
        raise MembershipConflict(
            f"{email} already has an open invitation; re-send or revoke it.", field="email"
        )
    now = timezone.now()
    _refuse_over_mail_budget(tenant, now)
    token = secrets.token_urlsafe(32)
    invitation = Invitation.objects.create(
        tenant=tenant, email=email, role=role, token_hash=_token_hash(token), invited_by=actor,
        created_at=now, sent_at=now, expires_at=now + _ttl(),
    )  # fmt: skip
    log_tenant_event(
        tenant=tenant, kind=TenantEvent.Kind.MEMBER_INVITED, actor=actor, now=now,
        email=email, role=str(role), invitation=str(invitation.id),
    )  # fmt: skip
    transaction.on_commit(lambda: _send_invitation(invitation, token, site_url))
    return invitation


def _lock_open_invitation(invitation: Invitation) -> Invitation:
    locked = Invitation.objects.select_for_update().select_related("tenant").get(pk=invitation.pk)
    if locked.accepted_at is not None or locked.revoked_at is not None:
        state = Invitation.State.ACCEPTED if locked.accepted_at else Invitation.State.REVOKED
        raise InvitationStateConflict(f"This invitation was already {state.label.lower()}.")
    return locked


@transaction.atomic
def invitation_resend(*, invitation: Invitation, actor: str, site_url: str) -> Invitation:
    """Mail a new link and restart the expiry; the previous link stops working."""
    _lock_tenant(invitation.tenant)
    invitation = _lock_open_invitation(invitation)
    now = timezone.now()
    _refuse_over_mail_budget(invitation.tenant, now)
    token = secrets.token_urlsafe(32)
    invitation.token_hash, invitation.sent_at, invitation.expires_at = (
        _token_hash(token), now, now + _ttl(),
    )  # fmt: skip
    invitation.save(update_fields=["token_hash", "sent_at", "expires_at"])
    log_tenant_event(
        tenant=invitation.tenant, kind=TenantEvent.Kind.INVITATION_RESENT, actor=actor, now=now,
        email=invitation.email, invitation=str(invitation.id),
    )  # fmt: skip
    transaction.on_commit(lambda: _send_invitation(invitation, token, site_url))
    return invitation


@transaction.atomic
def invitation_revoke(*, invitation: Invitation, actor: str) -> Invitation:
    _lock_tenant(invitation.tenant)
    invitation = _lock_open_invitation(invitation)
    now = timezone.now()
    invitation.revoked_at = now
    invitation.save(update_fields=["revoked_at"])
    log_tenant_event(
        tenant=invitation.tenant, kind=TenantEvent.Kind.INVITATION_REVOKED, actor=actor, now=now,
        email=invitation.email, invitation=str(invitation.id),
    )  # fmt: skip
    return invitation


@dataclass(frozen=True)
class InvitationCheck:
    """What an invitation link leads to: an open invitation, or why it is refused."""

    invitation: Invitation | None
    refusal: str | None

    @property
    def usable(self) -> bool:
        return self.invitation is not None and self.refusal is None


def invitation_by_token(token: str, *, now: datetime | None = None) -> InvitationCheck:
    """Look an invitation link up. Unknown (forged, or replaced by a re-send), used, revoked
    and expired links are refused, each with a reason a person can act on."""
    token_hash = _token_hash(token)
    # Row-level security (apps/tenants/rls.py): the link's holder may read its one invitation.
    rls.lookup_present(rls.INVITATION_TOKEN_SETTING, token_hash)
    invitation = Invitation.objects.select_related("tenant").filter(token_hash=token_hash).first()
    if invitation is None:
        return InvitationCheck(None, "This invitation link is not valid. It may have been "
                                     "replaced by a newer one: use the latest mail.")  # fmt: skip
    refusals = {
        Invitation.State.ACCEPTED: "This invitation was already used.",
        Invitation.State.REVOKED: "This invitation was revoked by an admin of the tenant.",
        Invitation.State.EXPIRED: "This invitation has expired; ask an admin to re-send it.",
    }
    return InvitationCheck(invitation, refusals.get(invitation.state_at(now or timezone.now())))


def invitation_accept(
    *, token: str, user: AbstractBaseUser | None = None, password: str | None = None
) -> tuple[Membership, AbstractBaseUser]:
    """Accept an invitation link, once.

    `user` (signed in) joins the tenant if the invitation is addressed to that account;
    otherwise a new account is created with username = e-mail and `password` (validated by
    the caller). The invitation row is locked, so a link used twice at once joins once.
    Raises InvitationStateConflict when the link is refused, MembershipConflict when the
    account does not match the invitation."""
    check = invitation_by_token(token)
    if check.invitation is None or check.refusal:
        raise InvitationStateConflict(check.refusal or "This invitation link is not valid.")
    # An open invitation admits its holder to the tenant's rows (the membership, its event).
    rls.tenant_enter(check.invitation.tenant_id)
    with transaction.atomic():
        _lock_tenant(check.invitation.tenant)
        invitation = _lock_open_invitation(check.invitation)
        if invitation.state_at(timezone.now()) == Invitation.State.EXPIRED:
            raise InvitationStateConflict("This invitation has expired; ask for a new one.")
        email = invitation.email
        if user is None:
            if users_with_address(email).exists():
                raise MembershipConflict(
                    f"An account for {email} exists already: log in to accept.", field="email"
                )
            if not password:
                raise MembershipConflict("Choose a password.", field="password")
            try:
                with transaction.atomic():
                    user = get_user_model().objects.create_user(
                        username=email, email=email, password=password
                    )
            except IntegrityError:
                # The same address signed up through another tenant's invitation meanwhile.
                raise MembershipConflict(
                    f"An account for {email} exists already: log in to accept.", field="email"
                ) from None
        elif not users_with_address(email).filter(pk=user.pk).exists():
            raise MembershipConflict(
                f"This invitation is for {email}; you are signed in as "
                f"{user.get_username()}. Log out to accept it with that account.",
                field="email",
            )
        membership, created = Membership.objects.get_or_create(
            user=user, tenant=invitation.tenant, defaults={"role": invitation.role}
        )
        now = timezone.now()
        invitation.accepted_at, invitation.accepted_by = now, user  # type: ignore[assignment]
        invitation.save(update_fields=["accepted_at", "accepted_by"])
        log_tenant_event(
            tenant=invitation.tenant, kind=TenantEvent.Kind.INVITATION_ACCEPTED,
            actor=f"user:{user.get_username()}", now=now, email=email,
            role=membership.role, invitation=str(invitation.id), already_member=not created,
        )  # fmt: skip
    return membership, user


# --- roles and removal ----------------------------------------------------------------------


def _refuse_last_admin(membership: Membership, doing: str) -> None:
    """Called under the tenant lock: is `membership` the tenant's only admin?"""
    if membership.role != Membership.Role.ADMIN:
        return
    others = Membership.objects.filter(tenant_id=membership.tenant_id, role=Membership.Role.ADMIN)
    if not others.exclude(pk=membership.pk).exists():
        raise LastAdminRefused(
            f"{membership.user.get_username()} is the last admin of this tenant and cannot be "
            f"{doing}; make another member admin first.",
            field="role" if doing == "demoted" else None,
        )


def _locked_member(membership: Membership) -> Membership:
    """The membership as it is now, under the tenant lock; removed meanwhile → 404."""
    try:
        return Membership.objects.select_related("user", "tenant").get(pk=membership.pk)
    except Membership.DoesNotExist:
        raise Http404("No such member.") from None


@transaction.atomic
def membership_change_role(
    *, membership: Membership, role: Membership.Role, actor: str
) -> Membership:
    _lock_tenant(membership.tenant)
    locked = _locked_member(membership)
    if locked.role == role:
        return locked
    if role != Membership.Role.ADMIN:
        _refuse_last_admin(locked, "demoted")
    previous = locked.role
    locked.role = role
    locked.save(update_fields=["role"])
    log_tenant_event(
        tenant=membership.tenant, kind=TenantEvent.Kind.MEMBER_ROLE_CHANGED, actor=actor,
        member=locked.user.get_username(), role=str(role), previous_role=previous,
    )  # fmt: skip
    member_keys_demote(membership=locked, actor=actor)
    return locked


def membership_deleted(sender: type[Membership], instance: Membership, **kwargs: Any) -> None:
    """`pre_delete` of a membership: its member's keys in the tenant are revoked (a no-op
    when `membership_remove` or the admin already did, with their actor)."""
    member_keys_revoke(
        tenant_id=instance.tenant_id, user_id=instance.user_id, actor="system",
        reason="membership_deleted",
    )  # fmt: skip


def member_keys_demote(*, membership: Membership, actor: str) -> None:
    """A member's keys may do no more than the member: on a demotion to viewer their admin
    keys are revoked (viewer keys stay)."""
    if membership.role == Membership.Role.ADMIN:
        return
    member_keys_revoke(
        tenant_id=membership.tenant_id, user_id=membership.user_id, actor=actor,
        reason="member_demoted", roles=[Membership.Role.ADMIN],
    )  # fmt: skip


@transaction.atomic
def membership_remove(*, membership: Membership, actor: str) -> None:
    _lock_tenant(membership.tenant)
    locked = _locked_member(membership)
    _refuse_last_admin(locked, "removed")
    # Logged before the membership goes, so the log reads: keys revoked, then member removed.
    member_keys_revoke(
        tenant_id=locked.tenant_id, user_id=locked.user_id, actor=actor, reason="member_removed"
    )
    locked.delete()
    log_tenant_event(
        tenant=membership.tenant, kind=TenantEvent.Kind.MEMBER_REMOVED, actor=actor,
        member=locked.user.get_username(), role=locked.role,
    )  # fmt: skip
