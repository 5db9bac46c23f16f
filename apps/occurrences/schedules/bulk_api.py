"""POST /api/v1/schedules/bulk and GET /api/v1/schedules/bulk/{id}: a bulk pause, resume,
cancel or run now with one receipt (apps/occurrences/bulk_changes.py, docs/api.md "Bulk
changes")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.openapi import COMMON, done_or_accepted, error_table
from apps.occurrences.bulk_changes import REFUSALS_KEPT, bulk_dry_run, bulk_start
from apps.occurrences.models import BulkChange
from apps.occurrences.schedules.serializers import ScheduleListQuerySerializer
from apps.schedules.selectors import schedules_for
from apps.tenants.authentication import principal_of
from apps.tenants.idempotency import IdempotentPost
from apps.tenants.models import Tenant

MAX_IDS = 1000


_errors = error_table({
    403: "A viewer key: it changes nothing.",
    404: "An id that is no schedule of this tenant, or no such bulk change.",
    409: "A quota (resume over a lowered active-schedule quota) or an Idempotency-Key "
    "reused with another body.",
})  # fmt: skip


class BulkRequestSerializer(serializers.Serializer[Any]):
    action = serializers.ChoiceField(choices=BulkChange.Verb.values)
    ids = serializers.ListField(
        child=serializers.UUIDField(), min_length=1, max_length=MAX_IDS, required=False,
        help_text=f"The schedules, by id (1 to {MAX_IDS}); or give `filter`.",
    )  # fmt: skip
    filter = serializers.DictField(
        required=False,
        help_text="The schedule list's filters: `state`, `kind`, `handler`, `q`, `label` "
        '(a list of "key=value", all required). `{}` selects every schedule of the tenant.',
    )
    dry_run = serializers.BooleanField(
        default=False, help_text="Only count what would change (200); nothing is written."
    )

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
            if not isinstance(data.get("dry_run", False), bool):
                raise serializers.ValidationError({"dry_run": ["Must be true or false."]})
        return super().to_internal_value(data)

    def validate_filter(self, value: dict[str, Any]) -> dict[str, Any]:
        if isinstance(value.get("label"), str):
            value = {**value, "label": [value["label"]]}
        query = ScheduleListQuerySerializer(data=value)
        unknown = sorted(set(value) - set(query.fields))
        if not query.is_valid() or unknown:
            raise serializers.ValidationError(
                {**query.errors, **{name: ["Unknown filter."] for name in unknown}}
            )
        stored: dict[str, Any] = {
            k: str(v) for k, v in query.validated_data.items() if k != "label"
        }
        if "label" in query.validated_data:
            stored["label"] = [list(pair) for pair in query.validated_data["label"]]
        return stored

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("ids" in attrs) == ("filter" in attrs):
            raise serializers.ValidationError(
                {"non_field_errors": ["Give either `ids` or `filter` (one of them)."]}
            )
        return attrs

    def selection(self, tenant: Tenant) -> dict[str, Any]:
        """The stored selection; every id must be the tenant's (404 otherwise)."""
        data = self.validated_data
        if "filter" in data:
            return {"filter": data["filter"]}
        ids = sorted({str(i) for i in data["ids"]})
        found = schedules_for(tenant=tenant).filter(id__in=ids).count()
        if found != len(ids):
            raise Http404("An id is no schedule of this tenant.")
        return {"ids": ids}


class DryRunSerializer(serializers.Serializer[Any]):
    action = serializers.CharField(source="verb")
    dry_run = serializers.SerializerMethodField()
    matched = serializers.IntegerField(help_text="Schedules the selection matches now.")
    change = serializers.IntegerField(help_text="Of them, in a state the action changes.")
    already = serializers.IntegerField(help_text="Of them, already so (paused, canceled…).")
    refuse = serializers.IntegerField(help_text="Of them, in a state the action refuses.")

    def get_dry_run(self, obj: Any) -> bool:
        return True


class RefusalSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    code = serializers.CharField()
    message = serializers.CharField()


class BulkChangeSerializer(serializers.ModelSerializer[BulkChange]):
    action = serializers.CharField(source="verb")
    done = serializers.SerializerMethodField()
    refusals = RefusalSerializer(
        many=True, help_text=f"Why each refused schedule was refused (the first {REFUSALS_KEPT})."
    )

    class Meta:
        model = BulkChange
        fields = ["id", "action", "state", "selection", "matched", "changed", "already",
                  "refused", "done", "refusals", "actor", "created_at", "finished_at"]  # fmt: skip
        read_only_fields = fields
        extra_kwargs = {
            "matched": {"help_text": "Schedules the selection matched when it started."},
            "changed": {"help_text": "Changed by the action (its event and receipt each)."},
            "already": {"help_text": "Already so: nothing written."},
            "refused": {"help_text": "Refused by the single verb's rules (see refusals)."},
        }

    def get_done(self, obj: BulkChange) -> int:
        """Schedules counted so far: changed + already + refused."""
        return obj.changed + obj.already + obj.refused


class ScheduleBulk(APIView):
    @extend_schema(
        request=BulkRequestSerializer,
        responses={
            **done_or_accepted(DryRunSerializer, BulkChangeSerializer),
            **_errors(400, 401, 403, 404, 409, 429),
        },
    )
    def post(self, request: Request) -> Response:
        """Pause, resume, cancel or run now every schedule of `ids` or `filter`. Each
        schedule's change is the single verb's (events, receipts, recall); the work runs in
        batches (`manage.py bulk`): the answer is 202 with the bulk change to follow at
        `GET schedules/bulk/{id}`. `dry_run: true` answers 200 with the counts only. With an
        `Idempotency-Key`, a retry answers the first bulk change (header
        `Idempotent-Replayed: true`) and starts nothing."""
        principal = principal_of(request)
        post = IdempotentPost(request)
        if (replayed := post.replay()) is not None:
            return replayed
        body = BulkRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        verb = body.validated_data["action"]
        selection = body.selection(principal.tenant)
        if body.validated_data["dry_run"]:
            preview = bulk_dry_run(tenant=principal.tenant, verb=verb, selection=selection)
            return Response(DryRunSerializer(preview).data)

        def start() -> tuple[int, Any]:
            job = bulk_start(
                tenant=principal.tenant, verb=verb, selection=selection, actor=principal.actor
            )
            return status.HTTP_202_ACCEPTED, dict(BulkChangeSerializer(job).data)

        return post.run(start)


class ScheduleBulkDetail(APIView):
    @extend_schema(responses={200: BulkChangeSerializer, **_errors(404, *COMMON)})
    def get(self, request: Request, bulk_id: Any) -> Response:
        """A bulk change's progress and, once `state` is DONE, its receipt."""
        job = BulkChange.objects.filter(tenant=principal_of(request).tenant, id=bulk_id).first()
        if job is None:
            raise Http404("No such bulk change.")
        return Response(BulkChangeSerializer(job).data)
