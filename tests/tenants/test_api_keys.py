"""API keys: authentication, storage, and the tenant/key/demo management commands."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from apps.invocations.models import InvocationRecord
from apps.policies.models import Policy
from apps.tenants.models import ApiKey, Tenant
from apps.tools.models import Source, Tool

pytestmark = pytest.mark.django_db

URL = "/api/v1/invocations/"
CLOCK_CALL = {"toolId": "core__get_current_time", "args": {}}
# RFC 6750 with where the resource metadata is (RFC 9728, MCP authorization): OAuth
# clients start there (apps/oauth). No error code: no credential was given.
CHALLENGE = (
    'Bearer realm="toolhub", '
    'resource_metadata="http://testserver/.well-known/oauth-protected-resource/mcp", '
    'scope="mcp"'
)
KEY_RE = re.compile(r"th_[0-9a-f]{8}_[A-Za-z0-9_-]{20,}")


def client_with(header: str | None) -> APIClient:
    client = APIClient()
    if header is not None:
        client.credentials(HTTP_AUTHORIZATION=header)
    return client


def run(command: str, *args: str) -> str:
    out = StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


# ---------------------------------------------------------------- authentication


def test_a_call_without_authorization_is_401_with_a_challenge(agent):
    response = client_with(None).post(URL, CLOCK_CALL, format="json")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == CHALLENGE
    assert InvocationRecord.objects.count() == 0


def test_it_rejects_a_wrong_api_key(agent):
    wrong = agent.key[:-4] + ("AAAA" if not agent.key.endswith("AAAA") else "BBBB")
    response = client_with(f"Bearer {wrong}").post(URL, CLOCK_CALL, format="json")
    assert response.status_code == 401
    assert response.json() == {"detail": "Invalid or revoked API key."}
    assert InvocationRecord.objects.count() == 0


@pytest.mark.parametrize("key", ["nonsense", "th_", "th_deadbeef_" + "x" * 43, "th_" + "_" * 300])
def test_it_rejects_keys_that_were_never_issued(agent, key):
    response = client_with(f"Bearer {key}").post(URL, CLOCK_CALL, format="json")
    assert response.status_code == 401
    assert response.json() == {"detail": "Invalid or revoked API key."}


def test_it_rejects_a_revoked_api_key(agent):
    assert agent.client.post(URL, CLOCK_CALL, format="json").status_code == 200
    ApiKey.objects.get(tenant=agent.tenant).revoke()
    response = agent.client.post(URL, CLOCK_CALL, format="json")
    assert response.status_code == 401
    assert response.json() == {"detail": "Invalid or revoked API key."}
    assert InvocationRecord.objects.count() == 1


@pytest.mark.parametrize("header", ["Bearer", "Bearer a b", "Bearer  key extra"])
def test_it_rejects_a_malformed_bearer_header(agent, header):
    response = client_with(header).post(URL, CLOCK_CALL, format="json")
    assert response.status_code == 401
    assert "Malformed Authorization header" in response.json()["detail"]


@pytest.mark.parametrize("header", ["   ", "Basic dXNlcjpwYXNz", "Token abc"])
def test_it_treats_a_header_of_another_scheme_as_no_credentials(agent, header):
    response = client_with(header).post(URL, CLOCK_CALL, format="json")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == CHALLENGE


def test_the_bearer_keyword_is_case_insensitive(agent):
    response = client_with(f"bearer {agent.key}").post(URL, CLOCK_CALL, format="json")
    assert response.status_code == 200


def test_a_key_records_when_it_was_last_used(agent):
    key = ApiKey.objects.get(tenant=agent.tenant)
    assert key.last_used_at is None
    agent.client.get("/api/v1/tools/")
    key.refresh_from_db()
    assert key.last_used_at is not None


# ---------------------------------------------------------------- storage


def test_a_key_is_stored_only_as_a_hash_with_a_visible_prefix(db):
    tenant = Tenant.objects.create(slug="hashco")
    key, raw = ApiKey.objects.issue(tenant, "agent:bot")
    key.refresh_from_db()
    secret = raw.split("_", 2)[2]
    assert KEY_RE.fullmatch(raw)
    assert key.key_hash != raw
    assert len(key.key_hash) == 64
    for field in ApiKey._meta.concrete_fields:
        value = str(getattr(key, field.attname))
        assert raw not in value
        assert secret not in value
    assert raw.startswith(f"th_{key.prefix}_")
    assert key.display_prefix == f"th_{key.prefix}_…"
    assert raw not in str(key)
    assert ApiKey.objects.for_raw_key(raw) == key


def test_issuing_refuses_a_principal_that_is_not_kind_colon_name(db):
    tenant = Tenant.objects.create(slug="pco")
    for bad in ["support-bot", "Agent:x", "agent:", "agent:has space", "agent:x\n"]:
        with pytest.raises(Exception, match="principal"):
            ApiKey.objects.issue(tenant, bad)
    assert ApiKey.objects.count() == 0


# ---------------------------------------------------------------- create_tenant


def test_create_tenant_creates_a_tenant_without_a_policy(db):
    out = run("create_tenant", "umbrella", "--name", "Umbrella Corp")
    tenant = Tenant.objects.get(slug="umbrella")
    assert tenant.name == "Umbrella Corp"
    assert "umbrella" in out
    assert not Policy.objects.filter(tenant=tenant).exists()


def test_create_tenant_refuses_a_duplicate(db):
    run("create_tenant", "umbrella")
    with pytest.raises(CommandError, match="already exists"):
        run("create_tenant", "umbrella")
    assert Tenant.objects.filter(slug="umbrella").count() == 1


@pytest.mark.parametrize("slug", ["not a slug", "bad/slug", "", "x" * 65])
def test_create_tenant_refuses_a_bad_slug(db, slug):
    with pytest.raises(CommandError):
        run("create_tenant", slug)
    assert Tenant.objects.count() == 0


# ---------------------------------------------------------------- create_api_key


def test_create_api_key_prints_a_working_key_alone_on_the_last_line(db):
    run("create_tenant", "umbrella")
    out = run("create_api_key", "--tenant", "umbrella", "--principal", "agent:x", "--name", "ci")
    raw = out.strip().splitlines()[-1]
    assert KEY_RE.fullmatch(raw)
    key = ApiKey.objects.get(tenant__slug="umbrella")
    assert (key.principal, key.name) == ("agent:x", "ci")
    assert ApiKey.objects.for_raw_key(raw) == key
    response = client_with(f"Bearer {raw}").get("/api/v1/tools/")
    assert response.status_code == 200
    assert response.json()["tools"] == []
    assert "agent:x" in response.json()["notice"]


def test_create_api_key_refuses_an_unknown_tenant(db):
    with pytest.raises(CommandError, match="No tenant 'nowhere'"):
        run("create_api_key", "--tenant", "nowhere", "--principal", "agent:x")
    assert ApiKey.objects.count() == 0


@pytest.mark.parametrize("principal", ["not-a-principal", "agent:", "Agent:x", "agent:a b"])
def test_create_api_key_refuses_a_bad_principal(db, principal):
    run("create_tenant", "umbrella")
    with pytest.raises(CommandError, match="principal"):
        run("create_api_key", "--tenant", "umbrella", "--principal", principal)
    assert ApiKey.objects.count() == 0


# ---------------------------------------------------------------- seed_demo


CORE_TOOLS = {
    "core__get_current_time",
    "core__planning_setup_plan",
    "core__planning_add_step",
    "core__planning_update_step",
    "core__planning_read_plan",
}


def demo_counts() -> dict[str, int]:
    return {
        "tenants": Tenant.objects.count(),
        "users": User.objects.count(),
        "keys": ApiKey.objects.count(),
        "policies": Policy.objects.count(),
        "policy_tools": Policy.tools.through.objects.count(),
    }


def test_seed_demo_is_idempotent_and_keeps_its_key(db, tmp_path):
    key_file = tmp_path / "keys" / "demo.key"
    first = run("seed_demo", "--key-file", str(key_file), "--port", "8123")
    after_first = demo_counts()
    second = run("seed_demo", "--key-file", str(key_file), "--port", "8123")
    assert demo_counts() == after_first

    first_key = KEY_RE.search(first).group()
    assert KEY_RE.search(second).group() == first_key
    assert key_file.read_text().strip() == first_key
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert "http://127.0.0.1:8123/" in first

    assert Tenant.objects.filter(slug="demo").count() == 1
    demo = Tenant.objects.get(slug="demo")
    assert ApiKey.objects.filter(tenant=demo).count() == 1
    key = ApiKey.objects.for_raw_key(first_key)
    assert key is not None
    assert key.principal == "agent:demo"

    admin = User.objects.get(username="admin")
    operator = User.objects.get(username="operator")
    assert admin.check_password("admin") and admin.is_superuser and admin.is_staff
    assert operator.check_password("operator") and operator.is_staff
    assert not operator.is_superuser
    assert set(demo.members.all()) == {admin, operator}

    allowed = set(
        Policy.objects.filter(tenant=demo, enabled=True).values_list("tools__pk", flat=True)
    )
    assert allowed >= CORE_TOOLS
    assert allowed <= set(Tool.objects.filter(source=Source.CORE).values_list("pk", flat=True))

    listed = client_with(f"Bearer {first_key}").get("/api/v1/tools/").json()["tools"]
    assert {tool["id"] for tool in listed} >= CORE_TOOLS


def test_seed_demo_issues_a_new_key_when_the_kept_one_was_revoked(db, tmp_path):
    key_file = tmp_path / "demo.key"
    first = KEY_RE.search(run("seed_demo", "--key-file", str(key_file))).group()
    ApiKey.objects.for_raw_key(first).revoke()
    second = KEY_RE.search(run("seed_demo", "--key-file", str(key_file))).group()
    assert second != first
    assert key_file.read_text().strip() == second
    assert ApiKey.objects.for_raw_key(second) is not None


def test_seed_demo_keeps_a_password_an_admin_changed(db, tmp_path):
    run("seed_demo")
    admin = User.objects.get(username="admin")
    admin.set_password("a-better-password")
    admin.save()
    run("seed_demo")
    admin.refresh_from_db()
    assert admin.check_password("a-better-password")
