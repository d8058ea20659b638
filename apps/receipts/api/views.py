from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from apps.invocations.api.views import PRUNED, pruned
from apps.invocations.models import InvocationRecord
from apps.receipts.models import DecisionReceipt
from apps.receipts.verification import header_of
from toolhub.web.api import CallerView


class ReceiptSerializer(serializers.Serializer[dict[str, object]]):
    invocationId = serializers.UUIDField()
    kid = serializers.CharField(help_text="The key that signed it: one of /.well-known/jwks.json")
    receipt = serializers.CharField(help_text="Compact JWS (Ed25519) over the receipt's body")
    decisions = serializers.ListField(
        child=serializers.CharField(),
        help_text="A held call's decision receipts (compact JWS each), oldest first: who "
        "voted what on which arguments; empty for a call that was never held",
    )


class InvocationReceiptView(CallerView):
    @extend_schema(
        operation_id="invocations_receipt",
        summary="An ended call's signed receipt",
        responses={
            200: ReceiptSerializer,
            404: OpenApiResponse(description="No such invocation in your tenant"),
            409: OpenApiResponse(description="The call has not ended: no receipt yet"),
            410: PRUNED,
        },
    )
    def get(self, request: Request, invocation_id: str) -> Response:
        caller = self.caller(request)
        record = (
            InvocationRecord.objects.filter(tenant=caller.tenant, pk=invocation_id)
            .only("pk", "receipt", "status")
            .first()
        )
        if record is None:
            gone = pruned(invocation_id, caller)
            if gone is not None:
                return gone
            raise NotFound("No such invocation in your tenant.")
        if not record.receipt:
            return Response(
                {"detail": f"The call is {record.status}: its receipt is signed when it ends."},
                status=status.HTTP_409_CONFLICT,
            )
        kid = header_of(record.receipt).get("kid")
        decisions = DecisionReceipt.objects.filter(approval__invocation=record).order_by("pk")
        return Response(
            {
                "invocationId": str(record.pk),
                "kid": kid,
                "receipt": record.receipt,
                "decisions": list(decisions.values_list("receipt", flat=True)),
            }
        )
