"""core__http_request against a real HTTP server on 127.0.0.1, and the SSRF guard.

No request ever leaves 127.0.0.1: every refusal below happens before a socket is opened
(the host allowlist, or the address check after a resolver swapped in by the test).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from apps.connections import broker, netguard
from apps.connections.models import Connection
from apps.invocations.models import RunEvent
from tests.conftest import Agent, allow
from tests.connections import (
    HTTP,
    LocalServer,
    local_server,
    make_connection,
    usable,
)
from tests.support.responses import failure, ok_result, record_of

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "SECRET-bearer-7f3a9c1e-http"


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with local_server() as running:
        yield running


@pytest.fixture
def caller(agent: Agent) -> Agent:
    allow(agent.tenant, HTTP, name="http")  # no approval_effects: the call runs
    return agent


def connect(agent: Agent, hosts: tuple[str, ...] = ("127.0.0.1",), private: bool = True) -> str:
    connection = make_connection(
        agent.tenant, name="local", hosts=hosts, private=private, token=TOKEN
    )
    return str(usable(connection, agent.principal).pk)


def fetch(
    agent: Agent, connection_id: str, url: str, key: str | None = None, **args: object
) -> object:
    extra = {"idempotencyKey": key} if key is not None else {}
    return agent.invoke(
        HTTP, args={"url": url, **args}, connectionId=connection_id, runId="run-http", **extra
    )


def refused(response: object, *fragments: str) -> str:
    code, message = failure(response)
    assert code == "execution", message
    for fragment in fragments:
        assert fragment in message, message
    return message


def everything_said(response: object) -> str:
    record = record_of(response)
    events = RunEvent.objects.filter(tenant=record.tenant, run_id=record.run_id)
    return json.dumps(
        [
            response.content.decode(),  # type: ignore[attr-defined]
            record.args,
            record.args_shape,
            record.result,
            record.safe_message,
            [event.message for event in events],
        ]
    )


# ---------------------------------------------------------------- the happy path


def test_the_request_carries_the_connections_bearer_token_which_nothing_returns(caller, server):
    connection_id = connect(caller)
    response = fetch(caller, connection_id, f"{server.base}/ok")
    result = ok_result(response)
    assert result["status"] == 200
    assert json.loads(result["body"]) == {"hello": "world", "path": "/ok"}
    assert result["content_type"] == "application/json"
    assert result["truncated"] is False
    assert result["url"] == f"{server.base}/ok"

    (seen,) = server.seen
    assert seen.headers["authorization"] == f"Bearer {TOKEN}"
    assert seen.headers["user-agent"] == "toolhub/1"
    said = everything_said(response)
    assert TOKEN not in said
    assert "Bearer" not in said
    assert record_of(response).connection_id == connection_id


def test_a_post_sends_the_body_and_the_tools_own_headers(caller, server):
    connection_id = connect(caller)
    response = fetch(
        caller,
        connection_id,
        f"{server.base}/ok/post",
        method="POST",
        body='{"a": 1}',
        headers={"Content-Type": "application/json", "X-Trace": "t-1"},
    )
    assert ok_result(response)["status"] == 200
    (seen,) = server.seen
    assert seen.method == "POST"
    assert seen.body == b'{"a": 1}'
    assert seen.headers["x-trace"] == "t-1"
    assert seen.headers["authorization"] == f"Bearer {TOKEN}"


# ---------------------------------------------------------------- the Idempotency-Key header


def test_a_post_sends_the_callers_idempotency_key_and_a_retry_sends_nothing(caller, server):
    connection_id = connect(caller)
    url = f"{server.base}/ok/orders"
    first = fetch(caller, connection_id, url, method="POST", body="{}", key="order-7")
    assert ok_result(first)["status"] == 200
    (seen,) = server.seen
    assert seen.headers["idempotency-key"] == "order-7"
    record = record_of(first)
    assert (record.idempotency_key, record.idempotency_strategy) == ("order-7", "custom")

    again = fetch(caller, connection_id, url, method="POST", body="{}", key="order-7")
    assert record_of(again).pk == record.pk  # replayed: the upstream saw one request
    assert len(server.seen) == 1


def test_a_read_repeated_in_a_run_runs_again_and_a_keyless_post_sends_no_key(caller, server):
    """http_request keeps the caller's key (`custom`), not its effect's derived default: a
    GET repeated in a run is a new read (a status polled twice), not a duplicate."""
    connection_id = connect(caller)
    for _ in range(2):
        assert ok_result(fetch(caller, connection_id, f"{server.base}/ok"))["status"] == 200
    assert [seen.method for seen in server.seen] == ["GET", "GET"]
    response = fetch(caller, connection_id, f"{server.base}/ok/send", method="POST", body="x")
    record = record_of(response)
    assert record.idempotency_key is None  # no key: none derived
    assert "idempotency-key" not in server.seen[-1].headers


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_get_and_head_send_no_idempotency_key(caller, server, method):
    connection_id = connect(caller)
    response = fetch(caller, connection_id, f"{server.base}/ok", method=method, key="k1")
    assert ok_result(response)["status"] == 200
    (seen,) = server.seen
    assert seen.method == method
    assert "idempotency-key" not in seen.headers
    assert record_of(response).idempotency_key == "k1"


def test_an_idempotency_key_header_in_the_arguments_is_kept(caller, server):
    connection_id = connect(caller)
    response = fetch(
        caller,
        connection_id,
        f"{server.base}/ok/put",
        method="PUT",
        body="x",
        headers={"idempotency-key": "the-tools-own"},
        key="the-callers",
    )
    assert ok_result(response)["status"] == 200
    (seen,) = server.seen
    assert seen.headers["idempotency-key"] == "the-tools-own"


@pytest.mark.parametrize("name", ["Authorization", "authorization", "Cookie", "Host"])
def test_a_tool_supplied_reserved_header_is_refused(caller, server, name):
    connection_id = connect(caller)
    response = fetch(caller, connection_id, f"{server.base}/ok", headers={name: "Bearer mine"})
    refused(response, name, "set by the connection")
    assert server.seen == []


def test_an_api_key_connections_header_cannot_be_overridden_by_the_tool(caller, server):
    connection = make_connection(
        caller.tenant,
        name="keyed",
        kind="api_key",
        hosts=("127.0.0.1",),
        private=True,
        header_name="X-Api-Key",
        value="SECRET-apikey-local",
    )
    connection_id = str(usable(connection, caller.principal).pk)
    refused(
        fetch(caller, connection_id, f"{server.base}/ok", headers={"x-api-key": "mine"}),
        "set by the connection",
    )
    assert ok_result(fetch(caller, connection_id, f"{server.base}/ok"))["status"] == 200
    (seen,) = server.seen
    assert seen.headers["x-api-key"] == "SECRET-apikey-local"


# ---------------------------------------------------------------- refusals


def test_loopback_is_refused_when_the_connection_does_not_allow_private_networks(caller, server):
    connection_id = connect(caller, private=False)
    refused(
        fetch(caller, connection_id, f"{server.base}/ok"),
        "'127.0.0.1'",
        "a private or loopback address",
    )
    assert server.seen == []


def test_the_metadata_address_is_refused_even_when_private_networks_are_allowed(caller):
    connection_id = connect(caller, hosts=("169.254.169.254",), private=True)
    refused(
        fetch(caller, connection_id, "http://169.254.169.254/latest/meta-data/"),
        "a cloud metadata address",
    )


def test_ipv6_loopback_is_refused_without_private_networks(caller):
    connection_id = connect(caller, hosts=("[::1]",), private=False)
    refused(fetch(caller, connection_id, "http://[::1]/"), "a private or loopback address")


def test_a_host_name_resolving_to_a_private_address_is_refused(caller, monkeypatch):
    asked: list[tuple[str, int]] = []

    def resolver(host: str, port: int) -> list[str]:
        asked.append((host, port))
        return ["10.0.0.5"]

    monkeypatch.setattr(broker, "resolver", resolver)
    connection_id = connect(caller, hosts=("internal.example.com",), private=False)
    refused(
        fetch(caller, connection_id, "http://internal.example.com/admin"),
        "'internal.example.com'",
        "a private or loopback address",
    )
    assert asked == [("internal.example.com", 80)]


def test_a_host_name_with_one_private_address_among_public_ones_is_refused(caller, monkeypatch):
    monkeypatch.setattr(broker, "resolver", lambda host, port: ["8.8.8.8", "192.168.1.10"])
    connection_id = connect(caller, hosts=("mixed.example.com",), private=False)
    refused(fetch(caller, connection_id, "http://mixed.example.com/"), "private or loopback")


def test_a_host_not_in_allowed_hosts_is_refused(caller, server, monkeypatch):
    monkeypatch.setattr(broker, "resolver", lambda host, port: ["127.0.0.1"])
    connection_id = connect(caller, hosts=("127.0.0.1",))
    port = server.server_address[1]
    refused(
        fetch(caller, connection_id, f"http://localhost:{port}/ok"),
        "does not allow requests to 'localhost'",
    )
    assert server.seen == []


def test_a_redirect_to_the_metadata_address_is_refused(caller, server):
    # 169.254.169.254 is even on the allowlist: the address check still refuses it.
    connection_id = connect(caller, hosts=("127.0.0.1", "169.254.169.254"), private=True)
    target = quote("http://169.254.169.254/latest/meta-data/", safe="")
    refused(
        fetch(caller, connection_id, f"{server.base}/redirect?to={target}"),
        "a cloud metadata address",
    )
    assert [seen.path for seen in server.seen] == [f"/redirect?to={target}"]


def test_a_redirect_to_a_host_outside_allowed_hosts_is_refused(caller, server):
    connection_id = connect(caller)
    target = quote("http://evil.example.com/collect", safe="")
    refused(
        fetch(caller, connection_id, f"{server.base}/redirect?to={target}"),
        "does not allow requests to 'evil.example.com'",
    )
    assert len(server.seen) == 1


def test_a_redirect_to_an_allowed_path_on_the_same_server_is_followed(caller, server):
    connection_id = connect(caller)
    response = fetch(caller, connection_id, f"{server.base}/redirect?to=/ok/landed")
    result = ok_result(response)
    assert result["status"] == 200
    assert result["url"] == f"{server.base}/ok/landed"
    assert json.loads(result["body"])["path"] == "/ok/landed"
    assert [seen.path for seen in server.seen] == ["/redirect?to=/ok/landed", "/ok/landed"]
    assert all(seen.headers["authorization"] == f"Bearer {TOKEN}" for seen in server.seen)
    assert TOKEN not in everything_said(response)


def test_a_redirect_loop_stops_after_the_redirect_limit(caller, server):
    connection_id = connect(caller)
    refused(fetch(caller, connection_id, f"{server.base}/loop"), "Too many redirects")
    assert len(server.seen) == netguard.MAX_REDIRECTS + 1


def test_a_url_with_credentials_is_refused(caller, server):
    connection_id = connect(caller)
    port = server.server_address[1]
    refused(fetch(caller, connection_id, f"http://user:pw@127.0.0.1:{port}/ok"), "credentials")
    assert server.seen == []


def test_a_url_that_is_not_http_is_a_validation_error(caller):
    connection_id = connect(caller)
    code, message = failure(fetch(caller, connection_id, "file:///etc/passwd"))
    assert code == "validation"
    assert "url" in message


def test_an_unresolvable_host_is_refused_cleanly(caller, monkeypatch):
    def nowhere(host: str, port: int) -> list[str]:
        raise netguard.Blocked(f"The host {host!r} could not be resolved.")

    monkeypatch.setattr(broker, "resolver", nowhere)
    connection_id = connect(caller, hosts=("nowhere.example.com",), private=False)
    refused(fetch(caller, connection_id, "http://nowhere.example.com/"), "could not be resolved")


def test_a_closed_port_is_an_execution_error_without_details(caller):
    with local_server() as closed:
        port = closed.server_address[1]
    connection_id = connect(caller)
    message = refused(fetch(caller, connection_id, f"http://127.0.0.1:{port}/ok"), "failed")
    assert "Traceback" not in message


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("/short", "closed the connection after 10 of the 100 bytes it announced"),
        ("/chunked-cut", "closed the connection after 5 bytes, in the middle of its answer"),
        ("/not-http", "answer is not valid HTTP"),
    ],
)
def test_an_answer_cut_short_or_not_http_is_an_execution_error_not_a_result(caller, path, said):
    # http.client hands back the bytes that came before the close as if they were the body.
    with local_server(keep_alive=True) as server:
        connection_id = connect(caller)
        response = fetch(caller, connection_id, f"{server.base}{path}")
        refused(response, said)
        assert record_of(response).result is None
        # The socket is not kept: the next call opens a new one and gets its answer.
        assert ok_result(fetch(caller, connection_id, f"{server.base}/ok"))["status"] == 200
        broken, after = server.seen
        assert broken.peer != after.peer


def test_a_short_body_behind_a_redirect_is_still_refused(caller, server):
    connection_id = connect(caller)
    response = fetch(caller, connection_id, f"{server.base}/redirect?to=/short")
    refused(response, "after 10 of the 100 bytes")


# ---------------------------------------------------------------- netguard, unit by unit


def ip(text: str) -> netguard.IPAddress:
    return ipaddress.ip_address(text)


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("10.1.2.3", "a private or loopback address"),
        ("172.16.0.1", "a private or loopback address"),
        ("172.31.255.254", "a private or loopback address"),
        ("192.168.0.1", "a private or loopback address"),
        ("127.0.0.1", "a private or loopback address"),
        ("127.8.9.10", "a private or loopback address"),
        ("::1", "a private or loopback address"),
        ("fc00::1", "a private or loopback address"),
        ("fe80::1", "a link-local address"),
        ("169.254.1.1", "a link-local address"),
        ("169.254.169.254", "a cloud metadata address"),
        ("fd00:ec2::254", "a cloud metadata address"),
        ("::ffff:127.0.0.1", "a private or loopback address"),
        ("::ffff:169.254.169.254", "a cloud metadata address"),
        ("100.64.0.1", "a private or loopback address"),
        ("0.0.0.0", "a reserved address"),  # noqa: S104 - an address under test, not a bind
        ("224.0.0.1", "a reserved address"),
    ],
)
def test_address_problem_refuses_non_public_addresses(address, problem):
    assert netguard.address_problem(ip(address), allow_private=False) == problem


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "172.32.0.1"])
def test_address_problem_allows_public_addresses(address):
    assert netguard.address_problem(ip(address), allow_private=False) is None


@pytest.mark.parametrize(
    "address", ["10.0.0.5", "172.16.0.1", "192.168.1.1", "127.0.0.1", "::1", "100.64.0.1"]
)
def test_allow_private_admits_private_and_loopback_addresses(address):
    assert netguard.address_problem(ip(address), allow_private=True) is None


@pytest.mark.parametrize(
    "address", ["169.254.169.254", "fe80::1", "169.254.10.10", "::ffff:169.254.169.254"]
)
def test_allow_private_never_admits_link_local_or_metadata_addresses(address):
    assert netguard.address_problem(ip(address), allow_private=True) is not None


@pytest.mark.parametrize(
    ("host", "patterns", "allowed"),
    [
        ("api.example.com", ["api.example.com"], True),
        ("API.Example.com.", ["api.example.com"], True),
        ("api.example.com", ["example.com"], False),
        ("evil-api.example.com", ["api.example.com"], False),
        ("api.example.com.evil.net", ["api.example.com"], False),
        ("a.example.org", ["*.example.org"], True),
        ("a.b.example.org", ["*.example.org"], True),
        ("example.org", ["*.example.org"], False),
        ("badexample.org", ["*.example.org"], False),
        ("example.org.evil.net", ["*.example.org"], False),
        ("::1", ["[::1]"], True),
        ("127.0.0.1", [], False),
    ],
)
def test_host_allowed_matches_exact_names_and_wildcard_subdomains(host, patterns, allowed):
    assert netguard.host_allowed(host, patterns) is allowed


def test_safe_address_checks_every_resolved_address_and_uses_the_first():
    policy = netguard.NetworkPolicy(
        allowed_hosts=["svc.example.com"], resolver=lambda h, p: ["8.8.8.8", "1.1.1.1"]
    )
    assert policy.safe_address("svc.example.com", 443) == "8.8.8.8"
    poisoned = netguard.NetworkPolicy(
        allowed_hosts=["svc.example.com"], resolver=lambda h, p: ["8.8.8.8", "10.0.0.5"]
    )
    with pytest.raises(netguard.Blocked):
        poisoned.safe_address("svc.example.com", 443)


def test_a_connection_refuses_host_patterns_with_schemes_paths_or_ports(agent):
    for bad in (["https://a.example.com"], ["a.example.com/x"], ["a.example.com:8080"], [""]):
        with pytest.raises(Exception, match="host"):
            make_connection(agent.tenant, name=f"bad-{len(bad[0])}", hosts=tuple(bad))
    assert not Connection.objects.filter(name__startswith="bad-").exists()
