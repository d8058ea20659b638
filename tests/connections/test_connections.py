"""Connections and grants: secrets encrypted at rest and rotatable, connection ids only in
the invocation context, and the runner's grant ∩ request check (which never tells a forged
id from another tenant's)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from io import StringIO

import pytest
from cryptography.fernet import Fernet
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db import connection as db
from django.test import Client
from django.test.utils import override_settings
from django.utils import timezone
from pydantic import Field

from apps.connections import broker, crypto
from apps.connections.models import Connection, Grant
from apps.tools.contracts import Redaction, ToolContract, ToolOutput, ToolParams
from apps.tools.registry import ToolRegistrationError, ToolRegistry
from tests.conftest import Agent, allow, make_agent
from tests.connections import (
    HTTP,
    grant,
    make_connection,
    permit_use,
    usable,
)
from tests.support.responses import failure, record_of

pytestmark = pytest.mark.django_db(transaction=True)

FORGED_OR_FOREIGN = "That connection is not granted to this caller."
OUTSIDE = "http://elsewhere.example.net/"  # not an allowed host: refused before any traffic


@pytest.fixture
def caller(agent: Agent) -> Agent:
    """`acme`'s agent:test, allowed core__http_request (no approval) by policy."""
    allow(agent.tenant, HTTP, name="http")
    return agent


def call_http(agent: Agent, connection_id: str | None, **body: object) -> object:
    if connection_id is not None:
        body["connectionId"] = connection_id
    return agent.invoke(HTTP, args=body.pop("args", {"url": OUTSIDE}), **body)


def assert_past_the_connection_check(response: object) -> None:
    """The call got through grant ∩ request and was stopped later, by the host allowlist."""
    code, message = failure(response)
    assert code == "execution", message
    assert "does not allow requests to 'elsewhere.example.net'" in message


# ---------------------------------------------------------------- encryption at rest


def raw_rows() -> str:
    table = db.ops.quote_name(Connection._meta.db_table)
    with db.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {table}")  # noqa: S608 - a fixed table name
        return repr(cursor.fetchall())


def test_a_secret_is_encrypted_at_rest_and_read_secret_round_trips(agent):
    connection = make_connection(agent.tenant, token="SECRET-bearer-at-rest-91c2")
    stored = raw_rows()
    assert "SECRET-bearer-at-rest-91c2" not in stored
    assert connection.secret_encrypted in stored
    fresh = Connection.objects.get(pk=connection.pk)
    assert fresh.read_secret() == {"token": "SECRET-bearer-at-rest-91c2"}
    assert fresh.has_secret


@pytest.mark.parametrize(
    ("kind", "secret"),
    [
        ("api_key", {"header_name": "X-Api-Key", "value": "SECRET-key-1"}),
        ("bearer", {"token": "SECRET-bearer-1"}),
        ("basic", {"username": "robot", "password": "SECRET-pass-1"}),
        ("oauth", {"access_token": "SECRET-access-1", "refresh_token": "SECRET-refresh-1"}),
    ],
)
def test_every_kind_of_secret_is_stored_encrypted(agent, kind, secret):
    connection = make_connection(agent.tenant, kind=kind, **secret)
    stored = raw_rows()
    for value in secret.values():
        if value.startswith("SECRET"):
            assert value not in stored
    assert Connection.objects.get(pk=connection.pk).read_secret() == secret


def test_a_secret_missing_a_required_field_is_refused(agent):
    connection = Connection(tenant=agent.tenant, name="half", kind="basic")
    with pytest.raises(ValidationError, match="password"):
        connection.set_secret(username="robot")
    assert not connection.has_secret


# ---------------------------------------------------------------- key rotation


@pytest.fixture
def use_keys() -> Iterator[Callable[..., None]]:
    """Switch TOOLHUB_ENCRYPTION_KEYS (and the cached MultiFernet) for the rest of a test."""
    active: list[override_settings] = []

    def use(*keys: bytes) -> None:
        if active:
            active.pop().disable()
        override = override_settings(TOOLHUB_ENCRYPTION_KEYS=[k.decode() for k in keys])
        override.enable()
        active.append(override)
        crypto._fernet.cache_clear()

    yield use
    if active:
        active.pop().disable()
    crypto._fernet.cache_clear()


def test_old_keys_still_decrypt_and_rotation_re_encrypts_with_the_new_first_key(agent, use_keys):
    old, new = Fernet.generate_key(), Fernet.generate_key()
    use_keys(old)
    connection = make_connection(agent.tenant, token="SECRET-rotate-me")
    before = connection.secret_encrypted
    Fernet(old).decrypt(before.encode())

    use_keys(new, old)  # the new key first, the old one kept to decrypt
    assert Connection.objects.get(pk=connection.pk).read_secret() == {"token": "SECRET-rotate-me"}

    out = StringIO()
    call_command("rotate_connection_keys", stdout=out)
    assert "Re-encrypted 1 secret(s)" in out.getvalue()

    after = Connection.objects.get(pk=connection.pk).secret_encrypted
    assert after != before
    assert json.loads(Fernet(new).decrypt(after.encode())) == {"token": "SECRET-rotate-me"}
    use_keys(new)  # the old key can now be dropped
    assert Connection.objects.get(pk=connection.pk).read_secret() == {"token": "SECRET-rotate-me"}


def test_without_the_old_key_a_secret_is_unreadable(agent, use_keys):
    use_keys(Fernet.generate_key())
    connection = make_connection(agent.tenant, token="SECRET-lost")
    use_keys(Fernet.generate_key())
    with pytest.raises(crypto.SecretUnreadable):
        Connection.objects.get(pk=connection.pk).read_secret()


def test_an_unreadable_secret_makes_rotation_fail_without_changing_anything(agent, use_keys):
    current, lost, newest = (Fernet.generate_key() for _ in range(3))
    use_keys(current)
    readable = make_connection(agent.tenant, name="a-readable", token="SECRET-readable")
    use_keys(lost)
    unreadable = make_connection(agent.tenant, name="b-unreadable", token="SECRET-unreadable")
    before = dict(Connection.objects.values_list("pk", "secret_encrypted"))

    use_keys(newest, current)  # `lost` is gone
    with pytest.raises(CommandError, match=str(unreadable.pk)):
        call_command("rotate_connection_keys", stdout=StringIO())

    assert dict(Connection.objects.values_list("pk", "secret_encrypted")) == before
    assert Connection.objects.get(pk=readable.pk).read_secret() == {"token": "SECRET-readable"}


# ---------------------------------------------------------------- connection ids, never in args


def test_a_connection_id_inside_args_is_rejected_as_an_extra_key(caller):
    connection = usable(make_connection(caller.tenant))
    response = caller.invoke(
        HTTP,
        args={"url": OUTSIDE, "connectionId": str(connection.pk)},
        connectionId=str(connection.pk),
    )
    code, message = failure(response)
    assert code == "validation"
    assert "connectionId" in message
    assert "Extra inputs are not permitted" in message


def test_a_connection_id_in_args_of_a_tool_without_connections_is_rejected(caller, test_tools):
    allow(caller.tenant, "test__echo", name="echo")
    code, message = failure(
        caller.invoke("test__echo", args={"text": "hi", "connectionId": str(uuid.uuid4())})
    )
    assert code == "validation"
    assert "connectionId" in message


class _SneakyParams(ToolParams):
    connectionId: str = Field(default="")  # the very name that is refused


class _Out(ToolOutput):
    ok: bool


def test_a_tool_schema_declaring_connection_id_cannot_be_registered():
    contract = ToolContract(
        name="sneaky",
        description="Asks for its connection in args.",
        params=_SneakyParams,
        result=_Out,
        execute=lambda params, ctx, caps: _Out(ok=True),
        effect="read_only",
        redaction=Redaction(result=("ok",), args=()),
        namespace="test",
    )
    fresh = ToolRegistry()
    with pytest.raises(ToolRegistrationError, match="connectionId"):
        fresh.register(contract)
    assert fresh.get("test__sneaky") is None


def test_the_http_capability_never_shows_its_credentials(agent):
    connection = make_connection(agent.tenant, token="SECRET-repr-check")
    client = broker.HttpClient(connection)
    assert "SECRET-repr-check" not in repr(client)
    assert "SECRET-repr-check" not in str(vars(client))


# ---------------------------------------------------------------- grant ∩ request


def test_http_request_without_a_connection_id_is_policy_denied(caller):
    usable(make_connection(caller.tenant))
    code, message = failure(call_http(caller, None))
    assert code == "policy_denied"
    assert message.startswith(f"{HTTP} needs a connection; none was given. ")
    assert "GET /api/v1/connections/" in message


def test_a_forged_uuid_is_policy_denied(caller):
    usable(make_connection(caller.tenant))
    code, message = failure(call_http(caller, str(uuid.uuid4())))
    assert code == "policy_denied"
    assert message == FORGED_OR_FOREIGN


@pytest.mark.parametrize("bogus", ["not-a-uuid", "1 OR 1=1", "../../etc/passwd", "0"])
def test_a_connection_id_that_is_not_a_uuid_is_policy_denied(caller, bogus):
    usable(make_connection(caller.tenant))
    code, message = failure(call_http(caller, bogus))
    assert code == "policy_denied"
    assert message == FORGED_OR_FOREIGN


def test_another_tenants_connection_gets_the_same_answer_as_a_forged_id(caller):
    other = make_agent("globex", caller.principal)  # same principal name, other tenant
    allow(other.tenant, HTTP, name="http")
    theirs = usable(make_connection(other.tenant, name="theirs"))

    foreign = call_http(caller, str(theirs.pk))
    forged = call_http(caller, str(uuid.uuid4()))
    assert failure(foreign) == failure(forged) == ("policy_denied", FORGED_OR_FOREIGN)
    assert str(theirs.pk) not in failure(foreign)[1]
    assert record_of(foreign).connection_id == ""
    # and the owner may use it
    assert_past_the_connection_check(call_http(other, str(theirs.pk)))


def test_a_connection_with_no_grant_is_policy_denied(caller):
    connection = make_connection(caller.tenant)
    permit_use(connection)
    code, message = failure(call_http(caller, str(connection.pk)))
    assert code == "policy_denied"
    assert message == FORGED_OR_FOREIGN


def test_a_grant_for_another_principal_does_not_apply(caller):
    connection = make_connection(caller.tenant)
    usable(connection, principal="agent:someone-else")
    code, _ = failure(call_http(caller, str(connection.pk)))
    assert code == "policy_denied"


def test_a_grant_without_use_connection_permission_is_authz_denied(caller):
    connection = make_connection(caller.tenant)
    grant(connection, caller.principal)
    code, message = failure(call_http(caller, str(connection.pk)))
    assert code == "authz_denied"
    assert caller.principal in message


def test_a_granted_and_permitted_connection_passes_the_check(caller):
    connection = usable(make_connection(caller.tenant))
    response = call_http(caller, str(connection.pk))
    assert_past_the_connection_check(response)
    assert record_of(response).connection_id == str(connection.pk)


def test_a_grant_revoked_between_two_calls_stops_the_second(caller):
    connection = make_connection(caller.tenant)
    permit_use(connection)
    the_grant = grant(connection, caller.principal)
    assert_past_the_connection_check(call_http(caller, str(connection.pk)))

    the_grant.revoke()
    code, message = failure(call_http(caller, str(connection.pk)))
    assert code == "policy_denied"
    assert message == FORGED_OR_FOREIGN


def test_an_expired_grant_is_policy_denied(caller):
    connection = make_connection(caller.tenant)
    permit_use(connection)
    grant(connection, caller.principal, expires_at=timezone.now() - timedelta(seconds=1))
    code, _ = failure(call_http(caller, str(connection.pk)))
    assert code == "policy_denied"


def test_a_grant_that_has_not_expired_yet_applies(caller):
    connection = make_connection(caller.tenant)
    usable(connection, caller.principal, expires_at=timezone.now() + timedelta(minutes=5))
    assert_past_the_connection_check(call_http(caller, str(connection.pk)))


def test_a_run_scoped_grant_only_works_in_that_run(caller):
    connection = usable(make_connection(caller.tenant), caller.principal, run_id="run-a")
    assert_past_the_connection_check(call_http(caller, str(connection.pk), runId="run-a"))
    for other_run in ({"runId": "run-b"}, {}):
        code, message = failure(call_http(caller, str(connection.pk), **other_run))
        assert code == "policy_denied"
        assert message == FORGED_OR_FOREIGN


def test_a_grant_to_anyone_in_a_run_applies_only_inside_that_run(caller):
    colleague = make_agent(caller.tenant.slug, "agent:colleague")
    connection = usable(make_connection(caller.tenant), principal="", run_id="run-shared")
    for who in (caller, colleague):
        assert_past_the_connection_check(call_http(who, str(connection.pk), runId="run-shared"))
        code, _ = failure(call_http(who, str(connection.pk), runId="run-other"))
        assert code == "policy_denied"


def test_grants_of_tenant_a_never_apply_to_tenant_b(caller):
    ours = usable(make_connection(caller.tenant, name="ours"))
    intruder = make_agent("globex", caller.principal)
    allow(intruder.tenant, HTTP, name="http")
    # Even a grant row filed under tenant B for A's connection (the admin refuses it) is ignored.
    Grant.objects.create(tenant=intruder.tenant, connection=ours, principal=caller.principal)
    permit_use(ours)
    code, message = failure(call_http(intruder, str(ours.pk)))
    assert code == "policy_denied"
    assert message == FORGED_OR_FOREIGN
    assert_past_the_connection_check(call_http(caller, str(ours.pk)))


def test_a_grant_cannot_pair_one_tenant_with_another_tenants_connection(caller):
    ours = make_connection(caller.tenant)
    other = make_agent("globex", "agent:other").tenant
    bad = Grant(tenant=other, connection=ours, principal="agent:other")
    with pytest.raises(ValidationError, match="another tenant"):
        bad.full_clean()


def test_a_grant_must_name_a_principal_or_a_run(caller):
    with pytest.raises(ValidationError):
        Grant(tenant=caller.tenant, connection=make_connection(caller.tenant)).full_clean()


# ---------------------------------------------------------------- the admin


@pytest.fixture
def admin_browser(db: None) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw-root-1234"))
    return client


def test_the_admin_add_form_stores_the_secret_encrypted_and_never_shows_it(agent, admin_browser):
    page = admin_browser.get("/admin/connections/connection/add/")
    assert page.status_code == 200
    response = admin_browser.post(
        "/admin/connections/connection/add/",
        {
            "tenant": str(agent.tenant.pk),
            "name": "github",
            "kind": "bearer",
            "allowed_hosts": '["api.github.com"]',
            "token": "SECRET-admin-token-55aa",
            "_save": "Save",
        },
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    connection = Connection.objects.get(name="github")
    assert "SECRET-admin-token-55aa" not in connection.secret_encrypted
    assert "SECRET-admin-token-55aa" not in raw_rows()
    assert connection.read_secret() == {"token": "SECRET-admin-token-55aa"}

    change = admin_browser.get(f"/admin/connections/connection/{connection.pk}/change/")
    assert change.status_code == 200
    html = change.content.decode()
    assert "SECRET-admin-token-55aa" not in html
    assert connection.secret_encrypted not in html
    assert "stored (encrypted; never shown)" in html


def test_the_admin_keeps_a_stored_secret_when_the_fields_are_left_blank(agent, admin_browser):
    connection = make_connection(agent.tenant, name="github", token="SECRET-keep-me")
    url = f"/admin/connections/connection/{connection.pk}/change/"
    data = {
        "tenant": str(agent.tenant.pk),
        "name": "github",
        "kind": "bearer",
        "allowed_hosts": '["api.github.com", "*.github.com"]',
        "_save": "Save",
    }
    response = admin_browser.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    connection.refresh_from_db()
    assert connection.allowed_hosts == ["api.github.com", "*.github.com"]
    assert connection.read_secret() == {"token": "SECRET-keep-me"}

    response = admin_browser.post(url, {**data, "token": "SECRET-replaced"})
    assert response.status_code == 302
    connection.refresh_from_db()
    assert connection.read_secret() == {"token": "SECRET-replaced"}


def test_the_admin_refuses_a_new_connection_without_its_secret(agent, admin_browser):
    response = admin_browser.post(
        "/admin/connections/connection/add/",
        {
            "tenant": str(agent.tenant.pk),
            "name": "nothing",
            "kind": "bearer",
            "allowed_hosts": '["api.github.com"]',
            "_save": "Save",
        },
    )
    assert response.status_code == 200
    assert "token" in str(response.context["adminform"].form.errors)
    assert not Connection.objects.filter(name="nothing").exists()


@pytest.mark.parametrize("hosts", ['["https://api.github.com"]', '["api.github.com/x"]', '"x"'])
def test_the_admin_refuses_allowed_hosts_that_are_not_host_names(agent, admin_browser, hosts):
    response = admin_browser.post(
        "/admin/connections/connection/add/",
        {
            "tenant": str(agent.tenant.pk),
            "name": "bad-hosts",
            "kind": "bearer",
            "allowed_hosts": hosts,
            "token": "t",
            "_save": "Save",
        },
    )
    assert response.status_code == 200
    assert "allowed_hosts" in response.context["adminform"].form.errors
    assert not Connection.objects.filter(name="bad-hosts").exists()


def test_rotation_re_encrypts_approval_webhook_secrets_too(agent, use_keys):
    from apps.approvals.models import ApprovalWebhook

    old, new = Fernet.generate_key(), Fernet.generate_key()
    use_keys(old)
    hook = ApprovalWebhook(tenant=agent.tenant, name="ops", url="https://hooks.example/in")
    hook.set_secret("hook-secret")
    hook.save()
    use_keys(new, old)
    call_command("rotate_connection_keys", stdout=StringIO())
    use_keys(new)  # the old key dropped: the webhook can still be signed
    hook.refresh_from_db()
    assert hook.signing_secret() == "hook-secret"
