"""Examples for the OpenAPI document, copied from real answers of the demo tenant.

tests/console/test_api_conformance.py validates each one against its operation's schema
(no undocumented field allowed) and compares their keys with real answers.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample

INVOCATION_ID = "0f9d5a1e-3c1b-4e7f-9a55-2b1d8c6e7a10"
APPROVAL_ID = "6a2e4c8b-1d3f-4b5a-8e7c-9f0a1b2c3d4e"
RUN_ID = "run-support-42"

SUCCEEDED = {
    "invocationId": INVOCATION_ID,
    "toolCallId": "call_7Qm2",
    "runId": RUN_ID,
    "toolId": "core__get_current_time",
    "status": "succeeded",
    "ok": True,
    "result": {"iso": "2026-11-23T14:30:05+00:00", "timezone": "UTC", "unix": 1795444205.0},
    "args": {"timezone": "UTC"},
    "principal": "agent:support-bot",
    "policyRule": "policy:1:demo",
    "createdAt": "2026-11-23T14:30:05.112Z",
    "startedAt": "2026-11-23T14:30:05.114Z",
    "endedAt": "2026-11-23T14:30:05.121Z",
    "durationMs": 7,
}
FAILED = {
    "invocationId": "3b7c9e2a-5d4f-4a1b-8c6d-7e8f9a0b1c2d",
    "toolCallId": "call_8Rn3",
    "runId": RUN_ID,
    "toolId": "core__send_email",
    "status": "failed",
    "ok": False,
    "errorCode": "validation",
    "safeMessage": "Invalid arguments: to.0: value is not a valid email address: "
    "An email address must have an @-sign.",
    "args": {"to": ["not-an-address"], "subject": "Hi", "body": "Hello"},
    "principal": "agent:support-bot",
    "createdAt": "2026-11-23T14:31:00.000Z",
    "startedAt": "2026-11-23T14:31:00.001Z",
    "endedAt": "2026-11-23T14:31:00.004Z",
    "durationMs": 3,
}
RATE_LIMITED = {
    **{key: value for key, value in FAILED.items() if key != "args"},
    "toolId": "core__get_current_time",
    "errorCode": "rate_limited",
    "safeMessage": "Rate limit reached: 60 calls per minute. Retry in 1.2 s.",
    "retryAfterMs": 1200,
    "args": {"timezone": "UTC"},
}
HELD = {
    "invocationId": "9c8b7a6f-5e4d-4c3b-a2a1-0f9e8d7c6b5a",
    "toolCallId": "call_9So4",
    "runId": RUN_ID,
    "toolId": "core__send_email",
    "status": "pending_approval",
    "args": {"to": ["customer@example.com"], "subject": "Your refund", "body": "Done."},
    "principal": "agent:support-bot",
    "policyRule": "policy:1:demo",
    "createdAt": "2026-11-23T14:32:00.000Z",
    "startedAt": None,
    "endedAt": None,
    "durationMs": None,
    "approvalId": APPROVAL_ID,
}
BAD_REQUEST = {
    "detail": "The request is invalid.",
    "errors": [{"field": "toolId", "message": "Field required"}],
}

INVOKE = [
    OpenApiExample(
        "Call a tool",
        value={
            "toolId": "core__get_current_time",
            "args": {"timezone": "UTC"},
            "toolCallId": "call_7Qm2",
            "runId": RUN_ID,
        },
        request_only=True,
    ),
    OpenApiExample("Succeeded", value=SUCCEEDED, response_only=True, status_codes=["200"]),
    OpenApiExample("Refused by validation", value=FAILED, response_only=True, status_codes=["200"]),
    OpenApiExample("Rate limited", value=RATE_LIMITED, response_only=True, status_codes=["200"]),
    OpenApiExample("Held for approval", value=HELD, response_only=True, status_codes=["202"]),
    OpenApiExample("toolId missing", value=BAD_REQUEST, response_only=True, status_codes=["400"]),
]

INVOCATION_PAGE = [
    OpenApiExample(
        "A page",
        value=SUCCEEDED,  # one item: drf-spectacular wraps it in a page
        response_only=True,
        status_codes=["200"],
    )
]

CATALOG = [
    OpenApiExample(
        "toolhub format",
        value={
            "tools": [
                {
                    "id": "core__get_current_time",
                    "name": "core__get_current_time",
                    "description": "The current time in a time zone.",
                    "inputSchema": {
                        "type": "object",
                        "properties": {"timezone": {"type": "string"}},
                    },
                    "effect": "read_only",
                    "consequenceLevel": "low",
                    "requiresConfirmation": False,
                    "requiresApproval": False,
                    "requiresConnection": False,
                    "timeoutMs": 5000,
                    "tags": ["time"],
                    "dependsOn": [],
                    "version": "1",
                    "schemaHash": "9b1f0c…",
                }
            ]
        },
        response_only=True,
        status_codes=["200"],
    ),
    OpenApiExample(
        "Nothing allowed",
        value={
            "tools": [],
            "notice": "No tool is available to agent:x in tenant demo: no enabled policy "
            "allows an enabled tool that this principal may execute (execute_tool permission).",
        },
        response_only=True,
        status_codes=["200"],
    ),
]

DECISION = [
    OpenApiExample(
        "Approve with an edit",
        value={
            "decision": "approve",
            "reason": "Fixed the address.",
            "args": {"to": ["a@b.example"]},
        },
        request_only=True,
    ),
    OpenApiExample(
        "Reject", value={"decision": "reject", "reason": "Not to customers."}, request_only=True
    ),
    OpenApiExample(
        "Already decided",
        value={"detail": "This request is already rejected."},
        response_only=True,
        status_codes=["409"],
    ),
]

STREAM_TICKET = [
    OpenApiExample("For one run", value={"runId": RUN_ID}, request_only=True),
    OpenApiExample(
        "Issued",
        value={"ticket": "k3Jx…single-use…", "expiresAt": "2026-11-23T14:33:00Z"},
        response_only=True,
        status_codes=["201"],
    ),
]

RUN_START = [
    OpenApiExample(
        "Two tools",
        value={"runId": RUN_ID, "tools": ["core__get_current_time", "core__planning_read_plan"]},
        request_only=True,
    ),
    OpenApiExample(
        "Started",
        value={
            "runId": RUN_ID,
            "tools": ["core__get_current_time", "core__planning_read_plan"],
            "startedBy": "agent:support-bot",
        },
        response_only=True,
        status_codes=["201"],
    ),
    OpenApiExample(
        "Another allowlist",
        value={
            "detail": "The run run-support-42 was started with another allowlist (it does not "
            "list core__send_email); a run's allowlist is fixed once set: start a new run."
        },
        response_only=True,
        status_codes=["409"],
    ),
]
