"""E-mail addresses Tick mails on a tenant's behalf (alert channels, invitations).

Besides the syntax (Django's `validate_email`), the domain must be a public-looking name:
no IP literal (`ops@[10.0.0.5]`), no dotless host (`ops@localhost`) and no special-use local
suffix (`.localhost`, `.local`, `.internal`, …). Such addresses would point the operator's
mail relay at internal hosts, around the webhook SSRF guard (docs/security.md). Mail sent
on a tenant's request is also counted per hour (`hourly_budget_wait_s`), so Tick cannot be
used to flood an inbox.
"""

from __future__ import annotations

import ipaddress
import math
from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.core.validators import validate_email

from apps.tenants.errors import MailRateLimited

# RFC 6761/6762/8375 and common private-network suffixes a relay would resolve internally.
LOCAL_SUFFIXES = ("localhost", "localdomain", "local", "internal", "home.arpa", "arpa", "lan")


def email_address_errors(address: str) -> list[str]:
    """Why Tick must not mail `address` ([] = it may)."""
    try:
        validate_email(address)
    except ValidationError:
        return ["Enter a valid e-mail address."]
    domain = address.rsplit("@", 1)[1].rstrip(".").lower()
    if domain.startswith("["):
        return ["Use a domain name, not an IP address literal."]
    try:
        ipaddress.ip_address(domain)
    except ValueError:
        pass
    else:
        return ["Use a domain name, not an IP address."]
    if "." not in domain:
        return ["Use a full domain name (with a dot), not a local host name."]
    if any(domain == s or domain.endswith(f".{s}") for s in LOCAL_SUFFIXES):
        return ["Use a public domain name, not a local or internal one."]
    return []


def hourly_budget_wait_s(sent_at: list[datetime], *, limit: int, now: datetime) -> int | None:
    """None while fewer than `limit` mails of a kind went out in the hour before `now` (their
    times in `sent_at`), else the seconds until the oldest of them leaves that hour."""
    window = [at for at in sent_at if at > now - timedelta(hours=1)]
    if len(window) < limit:
        return None
    return max(1, math.ceil((min(window) + timedelta(hours=1) - now).total_seconds()))


def refuse_over_hourly_budget(
    sent_at: list[datetime], *, limit: int, now: datetime, spent: str
) -> None:
    """`MailRateLimited` (429 with Retry-After) once `limit` mails of a kind went out in the
    hour before `now`; `spent` says what, e.g. "sent 10 invitation mails"."""
    if (wait_s := hourly_budget_wait_s(sent_at, limit=limit, now=now)) is not None:
        raise MailRateLimited(
            f"This tenant {spent} in the last hour; try again in {wait_s} s.",
            retry_after_s=wait_s,
        )
