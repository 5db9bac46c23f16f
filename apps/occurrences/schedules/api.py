"""Schedule endpoints under /api/v1/: thin views over selectors and services.

Every view that takes a schedule id goes through `access_schedule` first, for every method
(including ones the route does not allow), so another tenant's id is always a 404.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, NoReturn

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import MethodNotAllowed
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.openapi import BODY, COMMON, IDEMPOTENCY_KEY, done_or_accepted, error_table
from apps.core.pagination import KeysetPagination, unknown_query_params
from apps.occurrences.manual_runs import schedule_backfill, schedule_run_now
from apps.occurrences.schedule_changes import (
    LifecycleResult,
    schedule_cancel,
    schedule_pause,
    schedule_resume,
    schedule_update,
)
from apps.occurrences.schedules.serializers import (
    BackfillRequestSerializer,
    BackfillResponseSerializer,
    LifecycleResponseSerializer,
    PreviewEntrySerializer,
    PreviewQuerySerializer,
    RunNowRequestSerializer,
    RunNowResponseSerializer,
    ScheduleCreateSerializer,
    ScheduleListQuerySerializer,
    SchedulePreviewDraftSerializer,
    ScheduleSerializer,
    update_serializer,
)
from apps.schedules.selectors import access_schedule, schedules_filtered
from apps.schedules.services import schedule_create, schedule_preview, schedule_preview_saved
from apps.tenants.authentication import principal_of
from apps.tenants.idempotency import idempotent_post

_errors = error_table(
    {
        404: "No such schedule in this tenant.",
        405: "Method not allowed (schedules are never deleted: use cancel).",
        409: "Conflict with the schedule's state, a quota, or an Idempotency-Key.",
    }
)


class ScheduleCursor(KeysetPagination):
    # Each list filter has an index with this ordering (selectors.schedules_filtered).
    field = "created_at"


class TenantView(APIView):
    """Base of the schedule views: the tenant door also guards refused methods."""

    def _guard(self, request: Request, kwargs: dict[str, Any]) -> None:
        if "schedule_id" in kwargs:
            access_schedule(tenant=principal_of(request).tenant, schedule_id=kwargs["schedule_id"])

    def http_method_not_allowed(  # type: ignore[override]
        self, request: Request, *args: Any, **kwargs: Any
    ) -> NoReturn:
        self._guard(request, kwargs)
        if request.method == "DELETE":
            raise MethodNotAllowed(
                "DELETE",
                detail="Schedules are never deleted (their history is kept for audit); "
                "POST /api/v1/schedules/{id}/cancel stops one for good.",
            )
        raise MethodNotAllowed(request.method or "")

    def options(self, request: Request, *args: Any, **kwargs: Any) -> Response:  # type: ignore[override]
        self._guard(request, kwargs)
        return super().options(request, *args, **kwargs)


def _check_query(
    request: Request, query: serializers.Serializer[Any], extra: tuple[str, ...] = ()
) -> None:
    """Validate the query parameters: the serializer's own and every unknown one reported in
    one 400."""
    unknown = unknown_query_params(request, (*query.fields, *extra))
    if not query.is_valid() or unknown:
        raise serializers.ValidationError({**query.errors, **unknown})


def _lifecycle_response(result: LifecycleResult) -> Response:
    return Response(LifecycleResponseSerializer(result).data)


def _lifecycle_change(
    request: Request, schedule_id: Any, change: Callable[..., LifecycleResult]
) -> Response:
    """Pause, resume or cancel the tenant's schedule; the answer is the change's receipt."""
    principal = principal_of(request)
    schedule = access_schedule(tenant=principal.tenant, schedule_id=schedule_id)
    return _lifecycle_response(change(schedule=schedule, actor=principal.actor))


class ScheduleListCreate(TenantView):
    pagination_class = ScheduleCursor

    @extend_schema(
        parameters=[ScheduleListQuerySerializer],
        responses={200: ScheduleSerializer(many=True), **_errors(400, *COMMON)},
    )
    def get(self, request: Request) -> Response:
        """List the tenant's schedules, newest first, filtered by state and kind (any letter
        case), handler and a case-insensitive name search (`q`, at least 3 characters); cursor
        pages. An unknown query parameter is a 400."""
        query = ScheduleListQuerySerializer(data=request.query_params)
        _check_query(request, query, ScheduleCursor.query_params())
        queryset = schedules_filtered(tenant=principal_of(request).tenant, **query.validated_data)
        paginator = ScheduleCursor()
        page = paginator.paginate_queryset(queryset, request, view=self)
        return paginator.get_paginated_response(ScheduleSerializer(page, many=True).data)

    @extend_schema(
        request=ScheduleCreateSerializer,
        parameters=[IDEMPOTENCY_KEY],
        responses={201: ScheduleSerializer, **_errors(*BODY, 409, *COMMON)},
    )
    def post(self, request: Request) -> Response:
        """Create a schedule. Quotas: active schedules (409 `quota_exceeded`) and the
        minimum interval between a rule's fires (400 `rule_too_frequent`)."""
        principal = principal_of(request)

        def create() -> tuple[int, Any]:
            serializer = ScheduleCreateSerializer(
                data=request.data, context={"tenant": principal.tenant}
            )
            serializer.is_valid(raise_exception=True)
            schedule = schedule_create(
                tenant=principal.tenant, spec=serializer.to_spec(), actor=principal.actor
            )
            return status.HTTP_201_CREATED, dict(ScheduleSerializer(schedule).data)

        return idempotent_post(request, create)


class ScheduleDetail(TenantView):
    @extend_schema(responses={200: ScheduleSerializer, **_errors(404, *COMMON)})
    def get(self, request: Request, schedule_id: Any) -> Response:
        schedule = access_schedule(tenant=principal_of(request).tenant, schedule_id=schedule_id)
        return Response(ScheduleSerializer(schedule).data)

    @extend_schema(
        request=ScheduleCreateSerializer(partial=True),
        responses={200: LifecycleResponseSerializer, **_errors(*BODY, 404, 409, *COMMON)},
    )
    def patch(self, request: Request, schedule_id: Any) -> Response:
        """Change the definition: the given fields replace the saved ones and the whole is
        validated as on create. A change that alters future runs makes version + 1; pending
        unpublished occurrences of older versions become SUPERSEDED (listed in the receipt),
        and the new version never re-fires an instant an older one already published. A
        name-only change keeps the version. 409 if the schedule is canceled or changed
        concurrently (read it again and retry)."""
        principal = principal_of(request)
        schedule = access_schedule(tenant=principal.tenant, schedule_id=schedule_id)
        serializer = update_serializer(schedule, request.data)
        serializer.is_valid(raise_exception=True)
        return _lifecycle_response(
            schedule_update(schedule=schedule, spec=serializer.to_spec(), actor=principal.actor)
        )


class SchedulePause(TenantView):
    @extend_schema(request=None, responses={200: LifecycleResponseSerializer,
                                            **_errors(404, 409, *COMMON)})  # fmt: skip
    def post(self, request: Request, schedule_id: Any) -> Response:
        """Stop materializing; pending unpublished occurrences become CANCELED (receipt).
        Idempotent; 409 for a canceled or completed schedule."""
        return _lifecycle_change(request, schedule_id, schedule_pause)


class ScheduleResume(TenantView):
    @extend_schema(request=None, responses={200: LifecycleResponseSerializer,
                                            **_errors(404, 409, *COMMON)})  # fmt: skip
    def post(self, request: Request, schedule_id: Any) -> Response:
        """Materialize again from the first instant never materialized; instants that passed
        while paused follow the schedule's misfire policy (those the pause canceled stay
        canceled). Occurrences the pause canceled whose instant is still ahead are scheduled
        again, same ids (receipt `restored`). Idempotent."""
        return _lifecycle_change(request, schedule_id, schedule_resume)


class ScheduleCancel(TenantView):
    @extend_schema(request=None, responses={200: LifecycleResponseSerializer,
                                            **_errors(404, *COMMON)})  # fmt: skip
    def post(self, request: Request, schedule_id: Any) -> Response:
        """Cancel for good (never deleted): pending unpublished occurrences become CANCELED
        (receipt); enqueued ones are canceled by the worker's claim. Idempotent."""
        return _lifecycle_change(request, schedule_id, schedule_cancel)


def _request_id(request: Request, body: dict[str, Any]) -> str:
    """The run's name: the body's `request_id` or the `Idempotency-Key` header (the same
    value if both), else a fresh one (every such call runs)."""
    header = request.headers.get("Idempotency-Key")
    given = body.get("request_id")
    if header is not None and not (1 <= len(header) <= 255 and header.isascii()
                                   and header.isprintable()):  # fmt: skip
        raise serializers.ValidationError(
            {"Idempotency-Key": ["Use 1 to 255 printable ASCII characters."]}
        )
    if header is not None and given is not None and header != given:
        raise serializers.ValidationError(
            {"request_id": ["Differs from the Idempotency-Key header; send one of them."]}
        )
    return given or header or str(uuid.uuid4())


RUN_REQUEST_KEY = OpenApiParameter(
    "Idempotency-Key",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    required=False,
    description=(
        "The run's request id (1 to 255 printable ASCII characters), as the body's "
        "`request_id`: the same value runs once, for at least 24 h."
    ),
)


class ScheduleRunNow(TenantView):
    @extend_schema(
        request=RunNowRequestSerializer,
        parameters=[RUN_REQUEST_KEY],
        responses={202: RunNowResponseSerializer, **_errors(*BODY, 404, 409, *COMMON)},
    )
    def post(self, request: Request, schedule_id: Any) -> Response:
        """Run the schedule once now, beside its timetable: one occurrence due now on the
        strict lane, under the tenant's quotas and the schedule's overlap policy (under
        skip_if_running, while a run is in progress, it is recorded SKIPPED_OVERLAP with
        its `reason`). Its id derives from the request id (`request_id` or the
        `Idempotency-Key` header): a retry answers that occurrence's receipt (`replayed`,
        header `Idempotent-Replayed: true`) and runs nothing more. Allowed while paused; 409 for a
        canceled schedule."""
        principal = principal_of(request)
        schedule = access_schedule(tenant=principal.tenant, schedule_id=schedule_id)
        body = RunNowRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        receipt = schedule_run_now(
            schedule=schedule,
            actor=principal.actor,
            request_id=_request_id(request, body.validated_data),
        )
        schedule.refresh_from_db()
        data = RunNowResponseSerializer({"schedule": schedule, "receipt": receipt}).data
        headers = {"Idempotent-Replayed": "true"} if receipt.replayed else None
        return Response(data, status=status.HTTP_202_ACCEPTED, headers=headers)


class ScheduleBackfill(TenantView):
    @extend_schema(
        request=BackfillRequestSerializer,
        responses={
            **done_or_accepted(BackfillResponseSerializer, BackfillResponseSerializer),
            **_errors(*BODY, 404, 409, *COMMON),
        },
    )
    def post(self, request: Request, schedule_id: Any) -> Response:
        """Run the rule's instants in [from, to) again, through the catch-up lane at the
        tenant's catch-up rate: `only` missed (no run, or MISSED / skipped / canceled),
        failed (DEAD) or all. Each instant is backfilled at most once (deterministic id): a
        second backfill of the same range queues nothing (`already_done`). At most
        TICK_BACKFILL_MAX_INSTANTS (1000) instants per request (400
        `backfill_too_large`); `to` not in the future; `from` within the retention.
        `dry_run: true` answers the same receipt (200) without writing: the preview. 409
        for a canceled schedule."""
        principal = principal_of(request)
        schedule = access_schedule(tenant=principal.tenant, schedule_id=schedule_id)
        body = BackfillRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        args = body.validated_data
        receipt = schedule_backfill(
            schedule=schedule, actor=principal.actor, start=args["from"], end=args["to"],
            only=args["only"], dry_run=args["dry_run"],
        )  # fmt: skip
        data = BackfillResponseSerializer({"schedule": schedule, "receipt": receipt}).data
        code = status.HTTP_200_OK if receipt.dry_run else status.HTTP_202_ACCEPTED
        return Response(data, status=code)


class SchedulePreview(TenantView):
    @extend_schema(
        parameters=[PreviewQuerySerializer],
        responses={200: PreviewEntrySerializer(many=True), **_errors(400, 404, *COMMON)},
    )
    def get(self, request: Request, schedule_id: Any) -> Response:
        """The saved schedule's next fires, UTC and local, with a note for each DST effect."""
        schedule = access_schedule(tenant=principal_of(request).tenant, schedule_id=schedule_id)
        query = PreviewQuerySerializer(data=request.query_params)
        _check_query(request, query)
        entries = schedule_preview_saved(
            schedule=schedule, count=query.validated_data["count"], now=timezone.now()
        )
        return Response([entry.as_dict() for entry in entries])


class ScheduleDraftPreview(TenantView):
    @extend_schema(
        request=SchedulePreviewDraftSerializer,
        responses={200: PreviewEntrySerializer(many=True), **_errors(*BODY, *COMMON)},
    )
    def post(self, request: Request) -> Response:
        """Preview an unsaved definition; validated exactly as on create, nothing is stored."""
        principal = principal_of(request)
        draft = SchedulePreviewDraftSerializer(
            data=request.data, context={"tenant": principal.tenant}
        )
        draft.is_valid(raise_exception=True)
        entries = schedule_preview(
            timing=draft.to_spec(), after=timezone.now(), count=draft.validated_data["count"]
        )
        return Response([entry.as_dict() for entry in entries])
