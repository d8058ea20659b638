"""Issue 46: core__send_email as a newcomer writes it. The README's example is held (202);
`"to": "bob@example.com"` is refused with the field and the shape to send; the examples in
/api/docs/ and the WebSocket docs are valid arguments."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from django.core.management import call_command
from pydantic import ValidationError
from rest_framework.test import APIClient

from apps.tools.builtin.email import SendEmailParams
from toolhub.apidocs import openapi_examples
from toolhub.apidocs.websocket_docs import asyncapi

ROOT = Path(__file__).resolve().parent.parent
LIST_HINT = 'to: expected a list of addresses, e.g. ["bob@example.com"]'


def readme_email_body() -> dict:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.findall(r"-d '(\{\"toolId\": \"core__send_email\".*?\})' ", readme)
    assert len(found) == 1, found
    return json.loads(found[0])


@pytest.fixture
def demo(db: None, tmp_path: Path) -> APIClient:
    key_file = tmp_path / "key"
    call_command("seed_demo", "--key-file", str(key_file), stdout=io.StringIO())
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key_file.read_text().strip()}")
    return client


def test_the_readme_email_example_is_held_for_approval(demo):
    response = demo.post("/api/v1/invocations/", readme_email_body(), format="json")
    body = response.json()
    assert response.status_code == 202, body
    assert body["status"] == "pending_approval" and body["approvalId"]
    assert body["args"]["to"] == ["bob@example.com"]


def test_a_single_address_string_is_refused_naming_the_field_and_the_list(demo):
    args = {**readme_email_body()["args"], "to": "bob@example.com"}
    response = demo.post(
        "/api/v1/invocations/", {"toolId": "core__send_email", "args": args}, format="json"
    )
    body = response.json()
    assert response.status_code == 200 and body["ok"] is False, body
    assert body["errorCode"] == "validation"
    assert body["safeMessage"] == "Invalid arguments: " + LIST_HINT


def test_a_list_of_bad_addresses_still_gets_the_address_error():
    with pytest.raises(ValidationError) as caught:
        SendEmailParams.model_validate_json(
            json.dumps({"to": ["not-an-address"], "subject": "Hi", "body": "Hello"}), strict=True
        )
    assert caught.value.errors()[0]["loc"] == ("to", 0)


@pytest.mark.parametrize(
    "args",
    [
        openapi_examples.HELD["args"],
        openapi_examples.DECISION[0].value["args"] | {"subject": "s", "body": "b"},
    ],
)
def test_the_openapi_email_examples_are_valid_arguments(args):
    SendEmailParams.model_validate_json(json.dumps(args), strict=True)


def test_the_openapi_refusal_example_says_what_the_runner_says():
    from apps.invocations.runner import explain_validation

    failed = openapi_examples.FAILED
    with pytest.raises(ValidationError) as caught:
        SendEmailParams.model_validate_json(json.dumps(failed["args"]), strict=True)
    assert explain_validation(caught.value) == failed["safeMessage"]


def test_the_websocket_docs_email_example_has_valid_arguments():
    examples = [
        example["payload"]
        for message in asyncapi()["components"]["messages"].values()
        for example in message.get("examples", [])
        if example["payload"].get("toolId") == "core__send_email" and "args" in example["payload"]
    ]
    assert examples
    for payload in examples:
        SendEmailParams.model_validate_json(json.dumps(payload["args"]), strict=True)
