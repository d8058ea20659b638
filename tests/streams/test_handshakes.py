"""Handshakes that must fail cleanly: unknown paths, malformed run ids, foreign Origins."""

from __future__ import annotations

import pytest

from tests.streams.conftest import logged_in, operator, refusal
from toolhub.web.ws_auth import allowed_origin

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.server,
    pytest.mark.one_leg("postgresql"),
]


def bearer(agent) -> dict[str, str]:
    return {"Authorization": f"Bearer {agent.key}"}


def test_it_closes_a_stream_on_an_unknown_path_with_4404_and_logs_no_traceback(server, acme):
    for path in ("/ws/v1/nope/", "/ws/v1/runs/run-1/extra/", "/", "/ws/v1/approvals/x/"):
        assert refusal(server, path, bearer(acme)) == 4404, path
    assert "Traceback" not in server.output()
    assert "No route found" not in server.output()


def test_it_closes_a_run_stream_with_a_malformed_run_id_with_4400_and_logs_no_traceback(
    server, acme
):
    for run_id in ("r" * 129, "a%20b", "%C3%BCber", "semi;colon", ""):
        assert refusal(server, f"/ws/v1/runs/{run_id}/", bearer(acme)) == 4400, run_id
    assert refusal(server, f"/ws/v1/runs/{'r' * 128}/", bearer(acme), wait=0.5) == "open"
    assert "Traceback" not in server.output()


def test_it_refuses_an_origin_of_another_scheme_port_or_host(server, acme):
    port = server.port
    for origin in (
        f"https://127.0.0.1:{port}",
        "http://127.0.0.1:9999",
        "http://127.0.0.1",
        f"http://evil.example:{port}",
        f"http://localhost:{port}",  # another origin than the page's (127.0.0.1)
        "null",
    ):
        headers = {**bearer(acme), "Origin": origin}
        assert refusal(server, "/ws/v1/runs/run-1/", headers) == "HTTP 403", origin
    headers = {**bearer(acme), "Origin": f"http://127.0.0.1:{port}"}
    assert refusal(server, "/ws/v1/runs/run-1/", headers, wait=0.5) == "open"


def test_a_staff_browser_on_the_right_origin_opens_the_approvals_stream(server, acme):
    browser = logged_in(server, operator("opal", acme.tenant))
    assert refusal(server, "/ws/v1/approvals/", browser.ws_headers, wait=0.5) == "open"
    foreign = {**browser.ws_headers, "Origin": "http://127.0.0.1:9999"}
    assert refusal(server, "/ws/v1/approvals/", foreign) == "HTTP 403"


def handshake(host: str, scheme: str = "ws") -> dict:
    return {"type": "websocket", "scheme": scheme, "headers": [(b"host", host.encode())]}


def test_the_origin_must_match_the_handshakes_scheme_host_and_port(settings):
    settings.ALLOWED_HOSTS = ["toolhub.example.com", "127.0.0.1"]
    settings.CSRF_TRUSTED_ORIGINS = []
    assert allowed_origin(handshake("127.0.0.1:8000"), "http://127.0.0.1:8000")
    assert allowed_origin(handshake("toolhub.example.com", "wss"), "https://toolhub.example.com")
    assert allowed_origin(handshake("toolhub.example.com"), "http://toolhub.example.com:80")
    assert not allowed_origin(handshake("127.0.0.1:8000"), "https://127.0.0.1:8000")
    assert not allowed_origin(handshake("127.0.0.1:8000"), "http://127.0.0.1:9999")
    assert not allowed_origin(handshake("127.0.0.1:8000"), "http://evil.example:8000")
    assert not allowed_origin(handshake("toolhub.example.com", "wss"), "http://toolhub.example.com")
    assert not allowed_origin(handshake("127.0.0.1:8000"), "http://127.0.0.1:8000/path")
    assert not allowed_origin(handshake("127.0.0.1:8000"), "null")


def test_a_host_outside_allowed_hosts_is_not_its_own_origin(settings):
    """DNS rebinding: evil.example resolved to the server sends Host and Origin alike."""
    settings.ALLOWED_HOSTS = ["toolhub.example.com"]
    settings.CSRF_TRUSTED_ORIGINS = []
    assert not allowed_origin(handshake("evil.example"), "http://evil.example")


def test_trusted_origins_are_accepted_with_their_scheme_and_port(settings):
    """TLS ending at a proxy: the handshake is plain ws, the page https."""
    settings.ALLOWED_HOSTS = ["toolhub.example.com"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://toolhub.example.com", "https://*.corp.example"]
    assert allowed_origin(handshake("toolhub.example.com"), "https://toolhub.example.com")
    assert allowed_origin(handshake("toolhub.example.com"), "https://ops.corp.example")
    assert not allowed_origin(handshake("toolhub.example.com"), "http://ops.corp.example")
    assert not allowed_origin(handshake("toolhub.example.com"), "https://corp.example.evil")
    assert not allowed_origin(handshake("toolhub.example.com"), "https://toolhub.example.com:8443")
