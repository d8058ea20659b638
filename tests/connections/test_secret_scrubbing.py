"""A target that echoes the request never hands the connection's secret back.

The local server answers /echo with the request's headers (as httpbin's /headers does),
/echo/base64 with them base64-encoded, and /reflect with a redirect that quotes the
credential. Whatever comes back, the secret is in no API response, record, run event
or log line; the scrubber's forms are checked one by one below.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from django.core.exceptions import ValidationError

from apps.connections.broker import MAX_RESPONSE_BYTES
from apps.connections.models import Connection
from apps.connections.scrubbing import REDACTED, Scrubber, secret_forms
from apps.invocations.models import RunEvent
from tests.conftest import Agent, allow
from tests.connections import HTTP, LocalServer, local_server, make_connection, usable
from tests.support.responses import failure, ok_result, record_of

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "SECRET-echoed-bearer-5c1d9a"
API_KEY = "SECRET-echoed-apikey-0e7b44"
USER, PASSWORD = "robot", "SECRET-echoed-basic-a93f10"
BASIC = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
SECRETS = {
    "bearer": {"token": TOKEN},
    "api_key": {"header_name": "X-Api-Key", "value": API_KEY},
    "basic": {"username": USER, "password": PASSWORD},
}
# What must appear nowhere: each secret, and the forms a header carries it in.
NEVER = {
    "bearer": [TOKEN, base64.b64encode(TOKEN.encode()).decode()],
    "api_key": [API_KEY],
    "basic": [PASSWORD, BASIC, f"{USER}:{PASSWORD}"],
}


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with local_server() as running:
        yield running


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


def connect(agent: Agent, kind: str) -> str:
    allow(agent.tenant, HTTP, name="http")
    connection = make_connection(
        agent.tenant, name=f"echo-{kind}", kind=kind, hosts=("127.0.0.1",), private=True,
        **SECRETS[kind],
    )  # fmt: skip
    return str(usable(connection, agent.principal).pk)


def everything_said(response: Any, logs: pytest.LogCaptureFixture) -> str:
    """The API answer, the record, the run's events and every log line."""
    record = record_of(response)
    events = RunEvent.objects.filter(tenant=record.tenant, run_id=record.run_id)
    return "\n".join(
        [
            response.content.decode(),
            json.dumps([record.args, record.result, record.safe_message]),
            json.dumps([event.message for event in events]),
            logs.text,
            *(repr(entry.args) for entry in logs.records),
        ]
    )


def assert_nowhere(kind: str, text: str) -> None:
    for secret in NEVER[kind]:
        assert secret.lower() not in text.lower(), f"{secret} leaked"


@pytest.mark.parametrize("kind", ["bearer", "api_key", "basic"])
def test_a_target_echoing_the_request_headers_gets_no_secret_back_to_anyone(
    agent, server, logs, kind
):
    connection_id = connect(agent, kind)
    response = agent.invoke(
        HTTP, args={"url": f"{server.base}/echo"}, connectionId=connection_id, runId="run-echo"
    )
    echoed = json.loads(ok_result(response)["body"])["headers"]
    (seen,) = server.seen
    assert any(secret in value for value in seen.headers.values() for secret in NEVER[kind])
    credential = "X-Api-Key" if kind == "api_key" else "Authorization"
    assert (
        echoed[credential]
        == {
            "bearer": f"Bearer {REDACTED}",
            "api_key": REDACTED,
            "basic": f"Basic {REDACTED}",
        }[kind]
    )
    assert echoed["User-Agent"] == "toolhub/1"  # the rest of the echo is untouched
    assert_nowhere(kind, everything_said(response, logs))


@pytest.mark.parametrize("kind", ["bearer", "basic"])
def test_headers_echoed_inside_base64_text_are_scrubbed_too(agent, server, logs, kind):
    connection_id = connect(agent, kind)
    response = agent.invoke(
        HTTP, args={"url": f"{server.base}/echo/base64"}, connectionId=connection_id
    )
    encoded = json.loads(ok_result(response)["body"])["encoded"]
    assert REDACTED in encoded
    said = everything_said(response, logs)
    assert_nowhere(kind, said)
    # The secret cannot be decoded from what is left either.
    for piece in encoded.split(REDACTED):
        decoded = base64.b64decode(piece + "=" * (-len(piece) % 4), validate=False)
        assert TOKEN.encode() not in decoded and PASSWORD.encode() not in decoded


def test_a_redirect_quoting_the_token_in_its_url_leaves_no_trace_in_the_final_url(
    agent, server, logs
):
    connection_id = connect(agent, "bearer")
    target = quote("/ok/landed?seen={credential}", safe="")
    response = agent.invoke(
        HTTP, args={"url": f"{server.base}/reflect?to={target}"}, connectionId=connection_id
    )
    result = ok_result(response)
    assert server.seen[-1].path == f"/ok/landed?seen={TOKEN}"
    assert result["url"] == f"{server.base}/ok/landed?seen={REDACTED}"
    assert_nowhere("bearer", everything_said(response, logs))


def test_an_error_message_quoting_the_token_is_scrubbed(agent, server, logs):
    # The redirect goes to a host named after the token; the refusal names that host,
    # lower-cased by the URL parser.
    connection_id = connect(agent, "bearer")
    target = quote("http://{credential}.evil.example.com/", safe="")
    response = agent.invoke(
        HTTP, args={"url": f"{server.base}/reflect?to={target}"}, connectionId=connection_id
    )
    code, message = failure(response)
    assert code == "execution"
    assert message == f"The connection does not allow requests to '{REDACTED}.evil.example.com'."
    assert_nowhere("bearer", everything_said(response, logs))


@pytest.mark.parametrize("kept", [4, 10, len(TOKEN) - 1])
def test_a_body_cut_inside_the_token_does_not_keep_its_start(agent, server, logs, kept):
    # The target pads its echo so that the 16 KB cut falls `kept` characters into the token.
    connection_id = connect(agent, "bearer")
    pad = MAX_RESPONSE_BYTES - len("Bearer ") - kept
    response = agent.invoke(
        HTTP, args={"url": f"{server.base}/echo/padded?pad={pad}"}, connectionId=connection_id
    )
    result = ok_result(response)
    assert result["truncated"] is True
    assert result["body"] == "x" * pad + f"Bearer {REDACTED}"
    assert TOKEN[:4] not in everything_said(response, logs)


def test_a_call_without_a_connection_is_not_scrubbed(agent, test_tools):
    allow(agent.tenant, "test__echo", name="echo")
    response = agent.invoke("test__echo", args={"text": TOKEN})
    assert ok_result(response) == {"text": TOKEN}


# ---------------------------------------------------------------- the scrubber's forms


def scrub(value: Any, *secrets: str, pairs: tuple[tuple[str, str], ...] = ()) -> Any:
    return Scrubber(secret_forms(secrets, pairs)).scrub(value)


@pytest.mark.parametrize(
    "form",
    [
        'pa ss/wörd+"q"&<x>',  # raw
        quote('pa ss/wörd+"q"&<x>', safe=""),  # URL-encoded
        quote('pa ss/wörd+"q"&<x>', safe="").lower(),  # URL-encoded, lower-case hex
        "pa+ss%2Fw%C3%B6rd%2B%22q%22%26%3Cx%3E",  # form-encoded
        json.dumps('pa ss/wörd+"q"&<x>')[1:-1],  # JSON-escaped
        json.dumps('pa ss/wörd+"q"&<x>', ensure_ascii=False)[1:-1],
        "pa ss/wörd+&quot;q&quot;&amp;&lt;x&gt;",  # HTML-escaped
        base64.b64encode('pa ss/wörd+"q"&<x>'.encode()).decode(),
        base64.urlsafe_b64encode('pa ss/wörd+"q"&<x>'.encode()).decode().rstrip("="),
        'PA SS/WÖRD+"Q"&<X>',  # case-folded
    ],
)
def test_every_usual_form_of_a_secret_is_scrubbed(form):
    secret = 'pa ss/wörd+"q"&<x>'
    assert scrub(f"before {form} after", secret) == f"before {REDACTED} after"


@pytest.mark.parametrize("prefix", ["", "a", "ab", "abc", "Authorization: Bearer "])
@pytest.mark.parametrize("suffix", ["", "z", "yz", "\r\nAccept: */*"])
def test_a_secret_inside_longer_base64_text_is_found_at_every_alignment(prefix, suffix):
    encoded = base64.b64encode(f"{prefix}{TOKEN}{suffix}".encode()).decode()
    scrubbed = scrub(encoded, TOKEN)
    assert REDACTED in scrubbed
    assert encoded not in scrubbed


def test_basic_credentials_are_scrubbed_as_the_pair_and_its_base64_but_not_the_user_name():
    header = f"Basic {BASIC}"
    scrubbed = scrub(
        {"auth": header, "pair": f"{USER}:{PASSWORD}", "user": USER},
        PASSWORD,
        pairs=((USER, PASSWORD),),
    )
    assert scrubbed == {"auth": f"Basic {REDACTED}", "pair": REDACTED, "user": USER}


def test_keys_and_nested_values_are_scrubbed():
    scrubbed = scrub({TOKEN: [{"deep": (f"x{TOKEN}x",)}], "n": 3, "none": None}, TOKEN)
    assert scrubbed == {REDACTED: [{"deep": [f"x{REDACTED}x"]}], "n": 3, "none": None}


def test_values_shorter_than_the_minimum_are_not_scrubbed():
    assert scrub("the cat sat", "cat") == "the cat sat"


def test_joined_scrubbers_scrub_both_secrets_in_any_case():
    other = "Other-Secret-Value-42"
    joined = Scrubber(secret_forms([TOKEN])) | Scrubber(secret_forms([other]))
    assert joined.text(f"{TOKEN.upper()} and {other}") == f"{REDACTED} and {REDACTED}"


def test_a_scrubber_never_shows_its_secrets():
    assert TOKEN not in repr(Scrubber(secret_forms([TOKEN])))


@pytest.mark.parametrize(
    ("kind", "secret"),
    [
        ("bearer", {"token": "short"}),
        ("api_key", {"header_name": "X-Key", "value": "1234567"}),
        ("basic", {"username": "u", "password": "hunter2"}),
    ],
)
def test_a_connection_refuses_secrets_too_short_to_scrub(agent, kind, secret):
    connection = Connection(tenant=agent.tenant, name="short", kind=kind)
    with pytest.raises(ValidationError, match="at least 8 characters"):
        connection.set_secret(**secret)
