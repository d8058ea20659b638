from __future__ import annotations

from typing import Any

from rest_framework import serializers

from apps.approvals.models import ApprovalRequest, ApprovalStatus


class ApprovalSerializer(serializers.ModelSerializer[ApprovalRequest]):
    approvalId = serializers.UUIDField(source="id")
    invocationId = serializers.UUIDField(source="invocation_id")
    toolId = serializers.CharField(source="tool_id")
    toolCallId = serializers.CharField(source="tool_call_id")
    runId = serializers.CharField(source="run_id")
    status = serializers.ChoiceField(choices=ApprovalStatus.choices)
    effect = serializers.CharField(source="tool.effect")
    consequenceLevel = serializers.CharField(source="tool.consequence_level")
    originalArgs = serializers.JSONField(source="original_args")
    argsDiff = serializers.JSONField(source="args_diff")
    holdReason = serializers.CharField(source="hold_reason")
    policyRule = serializers.CharField(source="policy_rule")
    approvalsRequired = serializers.IntegerField(source="approvals_required")
    approvalsGiven = serializers.SerializerMethodField()
    fourEyes = serializers.BooleanField(source="four_eyes")
    expiresAt = serializers.DateTimeField(source="expires_at")
    decidedBy = serializers.SerializerMethodField()
    decidedAt = serializers.DateTimeField(source="decided_at", allow_null=True)
    reason = serializers.CharField(source="decision_reason")
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        model = ApprovalRequest
        fields = [
            "approvalId", "invocationId", "toolId", "toolCallId", "runId", "status", "principal",
            "args", "originalArgs", "argsDiff", "effect", "consequenceLevel", "holdReason",
            "policyRule", "approvalsRequired", "approvalsGiven", "fourEyes", "expiresAt",
            "decidedBy", "decidedAt", "reason", "createdAt",
        ]  # fmt: skip

    def get_approvalsGiven(self, approval: ApprovalRequest) -> int:
        return approval.approvals_given

    def get_decidedBy(self, approval: ApprovalRequest) -> str | None:
        return approval.decided_by.get_username() if approval.decided_by else None


class DecisionSerializer(serializers.Serializer[dict[str, Any]]):
    """Documents the decision body; the view validates it with pydantic."""

    decision = serializers.ChoiceField(choices=["approve", "reject"])
    reason = serializers.CharField(required=False, max_length=1000)
    args = serializers.DictField(required=False, help_text="Approve these edited arguments")
