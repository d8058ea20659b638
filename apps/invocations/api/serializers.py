from __future__ import annotations

from typing import Any

from drf_spectacular.utils import inline_serializer
from rest_framework import serializers

from apps.invocations.models import ErrorCode, InvocationRecord, Status


class InvocationSerializer(serializers.ModelSerializer[InvocationRecord]):
    """An invocation record on the wire (camelCase; empty optional fields left out)."""

    invocationId = serializers.UUIDField(source="id")
    toolCallId = serializers.CharField(source="tool_call_id")
    runId = serializers.CharField(source="run_id")
    toolId = serializers.CharField(source="tool_ref")
    status = serializers.ChoiceField(choices=Status.choices)
    ok = serializers.BooleanField(allow_null=True, required=False)
    result = serializers.JSONField(required=False, allow_null=True)
    errorCode = serializers.ChoiceField(
        source="error_code", choices=ErrorCode.choices, required=False
    )
    safeMessage = serializers.CharField(source="safe_message", required=False)
    retryAfterMs = serializers.IntegerField(
        source="retry_after_ms",
        required=False,
        allow_null=True,
        help_text="rate_limited: milliseconds from endedAt until a call would be admitted; "
        "unavailable, timeout: the tool's hint of when to try again",
    )
    args = serializers.JSONField(required=False, allow_null=True, help_text="Redacted arguments")
    principal = serializers.CharField()
    connectionId = serializers.CharField(source="connection_id", required=False)
    idempotencyKey = serializers.CharField(
        source="idempotency_key",
        required=False,
        help_text="The caller's key, or the key the tool's strategy derived (auto:..., params:...)",
    )
    idempotencyStrategy = serializers.CharField(
        source="idempotency_strategy",
        required=False,
        help_text="How idempotencyKey was made: custom (the caller's), auto or params (derived)",
    )
    retryOf = serializers.UUIDField(
        source="retry_of_id",
        required=False,
        help_text="The failed call this one retries (same idempotency key)",
    )
    attempt = serializers.IntegerField(
        required=False, min_value=2, help_text="This call's number among its key's attempts"
    )
    retries = serializers.ListField(
        child=inline_serializer(
            "RunnerRetry",
            {
                "attempt": serializers.IntegerField(min_value=1),
                "errorCode": serializers.CharField(help_text="unavailable or timeout"),
                "safeMessage": serializers.CharField(),
                "durationMs": serializers.IntegerField(min_value=0),
                "waitMs": serializers.IntegerField(min_value=0),
                "retryAfterMs": serializers.IntegerField(min_value=0, required=False),
            },
        ),
        required=False,
        help_text="The runner's own retries before the last attempt (unavailable, timeout)",
    )
    policyRule = serializers.CharField(source="policy_rule", required=False)
    cacheHit = serializers.BooleanField(
        source="cache_hit",
        required=False,
        help_text="Present (true) when the result came from the tool's result cache: "
        "the tool did not run.",
    )
    hooks = serializers.ListField(
        child=serializers.DictField(child=serializers.CharField()),
        required=False,
        help_text="What each hook did, in order: {hook, stage, did} (docs/hooks.md).",
    )
    createdAt = serializers.DateTimeField(source="created_at")
    startedAt = serializers.DateTimeField(source="started_at", required=False, allow_null=True)
    endedAt = serializers.DateTimeField(source="ended_at", required=False, allow_null=True)
    durationMs = serializers.IntegerField(source="duration_ms", required=False, allow_null=True)
    approvalId = serializers.SerializerMethodField()
    receipt = serializers.CharField(
        required=False,
        help_text="An ended call's signed receipt: a compact JWS (Ed25519) whose body names "
        "the call, the digests of its arguments and result, its decision and outcome; "
        "verify it against /.well-known/jwks.json (docs/receipts.md)",
    )

    OPTIONAL = (
        "ok",
        "result",
        "errorCode",
        "safeMessage",
        "retryAfterMs",
        "connectionId",
        "idempotencyKey",
        "idempotencyStrategy",
        "policyRule",
        "cacheHit",
        "hooks",
        "retryOf",
        "attempt",
        "retries",
        "approvalId",
        "receipt",
    )

    class Meta:
        model = InvocationRecord
        fields = [
            "invocationId", "toolCallId", "runId", "toolId", "status", "ok", "result", "errorCode",
            "safeMessage", "retryAfterMs", "args", "principal", "connectionId", "idempotencyKey",
            "idempotencyStrategy", "policyRule", "cacheHit", "hooks", "retryOf", "attempt",
            "retries", "createdAt", "startedAt", "endedAt", "durationMs", "approvalId", "receipt",
        ]  # fmt: skip

    def get_approvalId(self, record: InvocationRecord) -> str | None:
        approval = getattr(record, "approval", None)  # reverse one-to-one: absent -> None
        return str(approval.pk) if approval is not None else None

    def to_representation(self, instance: InvocationRecord) -> dict[str, Any]:
        # The fields above describe the shape for the API document; the record writes
        # it without DRF's per-field machinery (issue 13). tests/invocations/
        # test_representation.py holds both to the same output.
        return instance.as_api()
