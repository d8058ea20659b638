"""No plaintext secret anywhere: API responses, run events, logs (every logger, DEBUG) and
every row of every table, after the security scenarios have run. And logs carry argument
shapes, never values."""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from django.apps import apps
from django.core import serializers

from apps.connections.models import Connection
from apps.invocations.models import InvocationRecord, RunEvent
from tests.conftest import Agent, allow
from tests.connections import (
    HTTP,
    LocalServer,
    local_server,
    make_connection,
    permit_use,
    usable,
)
from tests.support.responses import ok_result, record_of

pytestmark = pytest.mark.django_db(transaction=True)

SECRETS = {
    "api_key": {"header_name": "X-Api-Key", "value": "SECRET-apikey-2b9d41e0c7"},
    "bearer": {"token": "SECRET-bearer-7f3a8e21d4"},
    "basic": {"username": "robot", "password": "SECRET-basic-c55e90a1f3"},
    "oauth": {
        "access_token": "SECRET-oauth-access-91ab7c",
        "refresh_token": "SECRET-oauth-refresh-0d4e2f",
    },
}
FOREIGN_SECRET = "SECRET-foreign-bearer-e8c1a6"
BASIC_HEADER = base64.b64encode(b"robot:SECRET-basic-c55e90a1f3").decode()
PLAINTEXTS = [
    *(value for secret in SECRETS.values() for value in secret.values() if "SECRET" in value),
    FOREIGN_SECRET,
    BASIC_HEADER,
]


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with local_server() as running:
        yield running


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Every logger at DEBUG, captured."""
    caplog.set_level(logging.DEBUG)
    for name in list(logging.root.manager.loggerDict):
        caplog.set_level(logging.DEBUG, logger=name)
    return caplog


def log_text(caplog: pytest.LogCaptureFixture) -> str:
    formatter = logging.Formatter()
    lines = [caplog.text]
    for record in caplog.records:
        lines.append(record.getMessage())
        lines.append(repr(record.args))
        if record.exc_info:
            lines.append(formatter.formatException(record.exc_info))
        if record.stack_info:
            lines.append(record.stack_info)
    return "\n".join(lines)


def every_row() -> str:
    dumps = []
    for model in apps.get_models():
        dumps.append(serializers.serialize("json", model._default_manager.all()))
    return "\n".join(dumps)


class Transcript:
    """Every API answer of the scenario."""

    def __init__(self) -> None:
        self.bodies: list[str] = []

    def keep(self, response: Any) -> Any:
        self.bodies.append(response.content.decode())
        return response


def test_no_plaintext_secret_appears_in_responses_events_logs_or_any_table(
    agent: Agent,
    stranger: Agent,
    bare_agent: Agent,
    test_tools: list[str],
    server: LocalServer,
    debug_logs: pytest.LogCaptureFixture,
) -> None:
    said = Transcript()
    allow(agent.tenant, HTTP, "test__crash", "test__echo", name="scenario")
    allow(stranger.tenant, HTTP, name="scenario")
    ours = {
        kind: usable(
            make_connection(
                agent.tenant,
                name=f"local-{kind}",
                kind=kind,
                hosts=("127.0.0.1", "169.254.169.254"),
                private=True,
                **secret,
            ),
            agent.principal,
        )
        for kind, secret in SECRETS.items()
    }
    ungranted = make_connection(
        agent.tenant, name="ungranted", hosts=("127.0.0.1",), private=True, token=FOREIGN_SECRET
    )
    permit_use(ungranted)
    theirs = usable(
        make_connection(
            stranger.tenant, name="theirs", hosts=("127.0.0.1",), private=True, token=FOREIGN_SECRET
        ),
        stranger.principal,
    )

    def http(who: Agent, connection_id: str | None, url: str, **args: Any) -> Any:
        body: dict[str, Any] = {"args": {"url": url, **args}, "runId": "run-leaks"}
        if connection_id is not None:
            body["connectionId"] = connection_id
        return said.keep(who.invoke(HTTP, **body))

    # Successful requests with each kind of credential, through the local server.
    for connection in ours.values():
        result = ok_result(http(agent, str(connection.pk), f"{server.base}/ok"))
        assert result["status"] == 200
    # A redirect followed on the same server; refused ones to metadata and elsewhere.
    bearer = str(ours["bearer"].pk)
    ok_result(http(agent, bearer, f"{server.base}/redirect?to=/ok/again"))
    for target in ("http://169.254.169.254/latest/meta-data/", "http://evil.example.com/"):
        response = http(agent, bearer, f"{server.base}/redirect?to={quote(target, safe='')}")
        assert response.json()["errorCode"] == "execution"
    # A tool trying to set the credential header itself.
    response = http(agent, bearer, f"{server.base}/ok", headers={"Authorization": "Bearer x"})
    assert response.json()["errorCode"] == "execution"
    # Forged, malformed, ungranted and foreign connection ids; no connection at all.
    for connection_id in (str(uuid.uuid4()), "nope", str(ungranted.pk), str(theirs.pk), None):
        response = http(agent, connection_id, f"{server.base}/ok")
        assert response.json()["errorCode"] == "policy_denied"
    # The other tenant uses its own connection, and tries ours.
    ok_result(http(stranger, str(theirs.pk), f"{server.base}/ok"))
    assert http(stranger, bearer, f"{server.base}/ok").json()["errorCode"] == "policy_denied"
    # Denied calls and a crashing tool.
    said.keep(bare_agent.invoke(HTTP, args={"url": f"{server.base}/ok"}, connectionId=bearer))
    said.keep(agent.invoke("test__refuse", args={}))
    crash = said.keep(agent.invoke("test__crash", args={}))
    assert crash.json()["errorCode"] == "execution"
    # What a client reads back afterwards.
    for who in (agent, stranger, bare_agent):
        said.keep(who.tools())
        said.keep(who.client.get("/api/v1/invocations/", {"pageSize": 200}))
    for record in InvocationRecord.objects.filter(tenant=agent.tenant):
        said.keep(agent.client.get(f"/api/v1/invocations/{record.pk}/"))

    # The scenario really used the secrets: the server saw every credential that is sent.
    seen_headers = json.dumps([seen.headers for seen in server.seen])
    for plaintext in [*PLAINTEXTS]:
        if "refresh" not in plaintext and "basic-" not in plaintext:
            assert plaintext in seen_headers, plaintext
    assert f"Basic {BASIC_HEADER}" in seen_headers
    assert debug_logs.records, "nothing was logged: the log scan would prove nothing"

    places = {
        "API responses": "\n".join(said.bodies),
        "run events": json.dumps([e.message for e in RunEvent.objects.all()]),
        "logs": log_text(debug_logs),
        "database rows": every_row(),
    }
    assert len(said.bodies) > 20
    assert "test__crash" in places["logs"]
    assert str(ours["bearer"].pk) in places["database rows"]
    for where, text in places.items():
        for plaintext in PLAINTEXTS:
            assert plaintext not in text, f"{plaintext} leaked into {where}"
    # The ciphertexts are in the table, decryptable, and nowhere a client can read.
    for connection in Connection.objects.all():
        assert connection.secret_encrypted in places["database rows"]
        assert connection.secret_encrypted not in places["API responses"]
        assert connection.secret_encrypted not in places["run events"]


def test_logs_carry_argument_shapes_never_values(
    agent: Agent, test_tools: list[str], debug_logs: pytest.LogCaptureFixture
) -> None:
    allow(agent.tenant, "test__echo", name="echo")
    response = agent.invoke(
        "test__echo", args={"text": "VALUE-xyz", "secret_note": "VALUE-note-77"}
    )
    assert ok_result(response) == {"text": "VALUE-xyz"}
    record = record_of(response)
    assert record.args == {"text": "VALUE-xyz"}  # the allowlist keeps `text` in the record
    assert "VALUE-note-77" not in json.dumps([record.args, record.args_shape, record.result])

    logs = log_text(debug_logs)
    assert '"text":"string[9]"' in logs
    assert '"secret_note":"string[13]"' in logs
    assert "VALUE-xyz" not in logs
    assert "VALUE-note-77" not in logs


def test_a_refused_call_logs_the_shape_of_its_arguments_only(
    bare_agent: Agent, test_tools: list[str], debug_logs: pytest.LogCaptureFixture
) -> None:
    response = bare_agent.invoke("test__echo", args={"text": "VALUE-denied-3c"})
    assert response.json()["errorCode"] == "policy_denied"
    logs = log_text(debug_logs)
    assert "test__echo" in logs
    assert '"text":"string[15]"' in logs
    assert "VALUE-denied-3c" not in logs


def test_a_credential_the_http_library_rejects_never_reaches_logs_or_results(
    agent: Agent, server: LocalServer, debug_logs: pytest.LogCaptureFixture
) -> None:
    allow(agent.tenant, HTTP, name="http")
    broken = usable(
        make_connection(
            agent.tenant,
            name="pasted-badly",
            hosts=("127.0.0.1",),
            private=True,
            token="SECRET-pasted\nacross-two-lines-44f",
        ),
        agent.principal,
    )
    response = agent.invoke(HTTP, args={"url": f"{server.base}/ok"}, connectionId=str(broken.pk))
    body = response.json()
    assert body["errorCode"] == "execution"
    assert "malformed" in body["safeMessage"]
    assert server.seen == []
    everywhere = "\n".join([response.content.decode(), log_text(debug_logs), every_row()])
    assert "SECRET-pasted" not in everywhere
    assert "across-two-lines-44f" not in everywhere


def test_a_tool_header_with_a_line_break_is_refused_without_logging_its_value(
    agent: Agent, server: LocalServer, debug_logs: pytest.LogCaptureFixture
) -> None:
    allow(agent.tenant, HTTP, name="http")
    connection = usable(
        make_connection(agent.tenant, name="local", hosts=("127.0.0.1",), private=True),
        agent.principal,
    )
    response = agent.invoke(
        HTTP,
        args={"url": f"{server.base}/ok", "headers": {"X-Note": "VALUE-a\r\nX-Injected: 1"}},
        connectionId=str(connection.pk),
    )
    body = response.json()
    assert body["errorCode"] == "execution"
    assert "malformed" in body["safeMessage"]
    assert server.seen == []
    logs = log_text(debug_logs)
    assert "VALUE-a" not in logs
    assert "X-Injected" not in logs
