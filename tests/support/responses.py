"""Reading invocation responses in tests: the record behind one, its result, its failure."""

from __future__ import annotations

from typing import Any

from apps.invocations.models import InvocationRecord


def record_of(response: Any) -> InvocationRecord:
    return InvocationRecord.objects.get(pk=response.json()["invocationId"])


def ok_result(response: Any) -> Any:
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["ok"] is True, body
    return body["result"]


def failure(response: Any) -> tuple[str, str]:
    """A tool-level failure: 200, ok false, no result; its code and safe message."""
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["ok"] is False, body
    assert body["status"] == "failed"
    assert "result" not in body
    return body["errorCode"], body["safeMessage"]
