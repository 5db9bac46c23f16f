"""The schedule list's select-many action (docs/ui.md "Bulk changes"): the list posts the
chosen schedules (or its filters) here; the first answer is the dry run's counts, the second
starts the bulk change (the API's validation and services, bulk_api.py beside this module),
whose page shows its progress until the receipt."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.occurrences.bulk_changes import bulk_dry_run, bulk_start
from apps.occurrences.models import BulkChange
from apps.occurrences.schedules.bulk_api import BulkRequestSerializer
from apps.tenants.errors import RefusedRequest
from apps.tenants.web import actor_of, admin_only, tenant_page, tick_of

FILTERS = ("state", "kind", "handler", "q")


def _body(request: HttpRequest) -> dict[str, Any]:
    post = request.POST
    body: dict[str, Any] = {"action": post.get("action", "")}
    if post.get("scope") == "filter":
        wanted: dict[str, Any] = {name: post[name] for name in FILTERS if post.get(name)}
        labels = [text for text in post.getlist("label") if text.strip()]
        if labels:
            wanted["label"] = labels
        body["filter"] = wanted
    else:
        body["ids"] = post.getlist("ids")
    return body


def _hidden(body: dict[str, Any], scope: str) -> list[tuple[str, str]]:
    """The request's fields again, for the confirm page's "Start" form."""
    fields = [("action", body["action"]), ("scope", scope)]
    for name, value in body.get("filter", {}).items():
        values = value if isinstance(value, list) else [value]
        fields += [(name, str(v)) for v in values]
    fields += [("ids", str(i)) for i in body.get("ids", [])]
    return fields


@tenant_page
@require_POST
def bulk_confirm(request: HttpRequest) -> HttpResponse:
    admin_only(request)
    tenant = tick_of(request).tenant
    body = _body(request)
    serializer = BulkRequestSerializer(data=body)
    if not serializer.is_valid():
        for field, problems in serializer.errors.items():
            messages.error(request, f"{field}: {' '.join(str(p) for p in problems)}")
        return redirect("schedule-list")
    try:
        selection = serializer.selection(tenant)
    except Http404:
        messages.error(request, "A selected schedule is no longer there.")
        return redirect("schedule-list")
    verb = serializer.validated_data["action"]
    if request.POST.get("start") != "1":
        return render(request, "tick/bulk_confirm.html", {
            "preview": bulk_dry_run(tenant=tenant, verb=verb, selection=selection),
            "verb": BulkChange.Verb(verb), "fields": _hidden(body, request.POST.get("scope", "")),
            "selection": selection, "nav": "schedules",
        })  # fmt: skip
    try:
        job = bulk_start(tenant=tenant, verb=verb, selection=selection, actor=actor_of(request))
    except RefusedRequest as err:
        messages.error(request, err.message)
        return redirect("schedule-list")
    return redirect("bulk-detail", bulk_id=job.id)


@tenant_page
def bulk_detail(request: HttpRequest, bulk_id: str) -> HttpResponse:
    job = BulkChange.objects.filter(tenant=tick_of(request).tenant, id=bulk_id).first()
    if job is None:
        raise Http404("No such bulk change.")
    done = job.changed + job.already + job.refused
    return render(request, "tick/bulk_detail.html", {
        "job": job, "done": done, "verb": BulkChange.Verb(job.verb),
        "percent": round(100 * done / job.matched) if job.matched else 100,
        "running": job.state == BulkChange.State.RUNNING, "nav": "schedules",
    })  # fmt: skip
