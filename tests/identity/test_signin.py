"""Staff sign-in with the OpenID provider: roles from groups, refusals, session ends."""

from __future__ import annotations

import http.cookiejar
import logging
from urllib.parse import parse_qsl, urlencode, urlsplit

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.models import User
from django.test import Client, override_settings

from apps.identity.models import ExternalIdentity, GroupMapping
from apps.tenants.models import Membership, Role, Tenant
from apps.tenants.roles import grant_role
from tests.identity.conftest import (
    CALLBACK,
    SignIn,
    back_to_toolhub,
    oidc_settings,
    roles,
    start,
)
from tests.identity.provider import OpenIDProvider

# The sign-in protocol against a real provider, not the database: one leg.
pytestmark = [pytest.mark.django_db, pytest.mark.one_leg("postgresql")]


@pytest.fixture(autouse=True)
def quick_hashing(settings) -> None:
    """Superusers' passwords are hashed; the production hasher would make each slow."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def mappings(tenants: dict[str, Tenant]) -> None:
    GroupMapping.objects.create(group="platform-ops", tenant=tenants["acme"], role=Role.OPERATOR)
    GroupMapping.objects.create(group="toolhub-{tenant}-admins", role=Role.ADMIN)


def user_of(login: str) -> User:
    return ExternalIdentity.objects.select_related("user").get(subject=login).user


def is_signed_in(client: Client) -> bool:
    return client.get("/admin/").status_code == 200


def test_groups_give_their_roles_in_their_tenants(idp, sign_in: SignIn, mappings) -> None:
    idp.set_user("ada", "pw-ada", groups=["platform-ops", "toolhub-globex-admins", "other"])
    client = Client()
    response = sign_in(client, "ada", "pw-ada")
    assert response.status_code == 302 and response["Location"] == "/admin/"
    user = user_of("ada")
    assert roles(user) == {"acme": Role.OPERATOR, "globex": Role.ADMIN}
    assert user.is_staff and not user.is_superuser
    assert not user.has_usable_password()
    assert is_signed_in(client)


def test_the_highest_role_wins_where_two_groups_name_one_tenant(
    idp, sign_in: SignIn, mappings
) -> None:
    idp.set_user("ben", "pw-ben", groups=["platform-ops", "toolhub-acme-admins"])
    sign_in(Client(), "ben", "pw-ben")
    assert roles(user_of("ben")) == {"acme": Role.ADMIN}


def test_a_removed_group_loses_its_role_at_the_next_sign_in(
    idp, sign_in: SignIn, mappings, tenants
) -> None:
    idp.set_user("cy", "pw-cy", groups=["platform-ops", "toolhub-globex-admins"])
    sign_in(Client(), "cy", "pw-cy")
    user = user_of("cy")
    grant_role(user, tenants["globex"], Role.MEMBER)  # by hand: the groups still decide
    idp.set_user("cy", "pw-cy", groups=["platform-ops"])
    client = Client()
    sign_in(client, "cy", "pw-cy")
    assert roles(user) == {"acme": Role.OPERATOR}
    assert is_signed_in(client)


def test_a_user_in_no_group_gets_no_tenant_and_a_clear_page(idp, sign_in: SignIn, mappings) -> None:
    idp.set_user("dee", "pw-dee", groups=["platform-ops"])
    sign_in(Client(), "dee", "pw-dee")
    idp.set_user("dee", "pw-dee", groups=["unmapped"])
    client = Client()
    response = sign_in(client, "dee", "pw-dee")
    assert response.status_code == 403
    page = response.content.decode()
    assert "none of your groups gives you a role in" in page
    assert "<code>unmapped</code>" in page
    user = user_of("dee")
    assert not Membership.objects.filter(user=user).exists()
    assert not user.is_staff
    assert not is_signed_in(client)


def test_a_user_without_a_groups_claim_is_refused(idp, sign_in: SignIn, mappings) -> None:
    idp.set_user("eve", "pw-eve")
    response = sign_in(Client(), "eve", "pw-eve")
    assert response.status_code == 403
    assert "The provider sent no groups for you." in response.content.decode()


def test_a_group_naming_a_missing_tenant_creates_nothing_and_says_so(
    idp, sign_in: SignIn, mappings, caplog
) -> None:
    idp.set_user("fay", "pw-fay", groups=["toolhub-nosuch-admins"])
    with caplog.at_level(logging.WARNING, logger="apps.identity.signin"):
        response = sign_in(Client(), "fay", "pw-fay")
    assert response.status_code == 403
    page = response.content.decode()
    assert "names tenant <code>nosuch</code>" in page and "does not exist" in page
    assert not Tenant.objects.filter(slug="nosuch").exists()
    assert "'toolhub-nosuch-admins' names tenant 'nosuch', which does not exist" in caplog.text

    # Beside a group that does give a role: signed in, told about the other one.
    idp.set_user("fay", "pw-fay", groups=["toolhub-nosuch-admins", "platform-ops"])
    client = Client()
    sign_in(client, "fay", "pw-fay")
    assert roles(user_of("fay")) == {"acme": Role.OPERATOR}
    page = client.get("/admin/").content.decode()
    assert "names tenant nosuch, which does not exist here" in page
    assert not Tenant.objects.filter(slug="nosuch").exists()


def test_a_provider_account_never_becomes_a_local_account_of_the_same_name(
    idp, sign_in: SignIn, mappings
) -> None:
    root = User.objects.create_superuser("root", "root@example.com", "pw-root-123")
    idp.set_user("root", "pw-x", groups=["platform-ops"], email="root@example.com")
    sign_in(Client(), "root", "pw-x")
    user = user_of("root")
    assert user != root and user.username.startswith("oidc-")
    assert not user.is_superuser


def test_a_wrong_client_secret_is_refused_with_a_clear_error(idp: OpenIDProvider, mappings) -> None:
    idp.set_user("gus", "pw-gus", groups=["platform-ops"])
    client = Client()
    with override_settings(**oidc_settings(idp.issuer, secret="not-the-secret")):
        url = idp.follow(start(client), "gus", "pw-gus", until=CALLBACK)
        response = back_to_toolhub(client, url)
    assert response.status_code == 403
    page = response.content.decode()
    assert "invalid_client" in page and "TOOLHUB_OIDC_CLIENT_SECRET" in page
    assert not is_signed_in(client)
    assert not ExternalIdentity.objects.exists()


def test_a_wrong_issuer_is_refused_with_a_clear_error(idp: OpenIDProvider) -> None:
    # The same provider under another name: its discovery document names its own issuer.
    elsewhere = idp.issuer.replace("127.0.0.1", "localhost")
    with override_settings(**oidc_settings(elsewhere)):
        response = Client().get("/oidc/authenticate/")
    assert response.status_code == 403
    page = response.content.decode()
    assert f"says its issuer is &#x27;{idp.issuer}&#x27;" in page
    assert "TOOLHUB_OIDC_ISSUER" in page


def test_an_answer_naming_another_issuer_is_refused(idp, sign_in: SignIn, mappings) -> None:
    """RFC 9207: the authorization response's iss must be the configured issuer."""
    idp.set_user("hal", "pw-hal", groups=["platform-ops"])
    client = Client()
    url = idp.follow(start(client), "hal", "pw-hal", until=CALLBACK)
    query = dict(parse_qsl(urlsplit(url).query))
    query["iss"] = "https://attacker.example"
    response = client.get(f"/oidc/callback/?{urlencode(query)}")
    assert response.status_code == 403
    assert "a mix-up of providers" in response.content.decode()
    assert not is_signed_in(client)


def test_the_session_ends_when_the_provider_session_does(idp, sign_in: SignIn, mappings) -> None:
    idp.set_user("ivy", "pw-ivy", groups=["platform-ops", "toolhub-globex-admins"])
    client, browser = Client(), http.cookiejar.CookieJar()
    sign_in(client, "ivy", "pw-ivy", jar=browser)

    def recheck(jar: http.cookiejar.CookieJar) -> None:
        session = client.session
        session["oidc_id_token_expiration"] = 0  # the recheck is due
        session.save()
        # A page's own fetch is not sent to the provider (it could not follow).
        assert client.get("/admin/", headers={"Sec-Fetch-Mode": "cors"}).status_code == 200
        response = client.get("/admin/", headers={"Sec-Fetch-Mode": "navigate"})
        assert response.status_code == 302 and "prompt=none" in response["Location"]
        url = idp.follow(response["Location"], None, None, until=CALLBACK, jar=jar)
        back_to_toolhub(client, url)

    # The provider's session lives: the recheck passes, and reads the groups again.
    idp.set_user("ivy", "pw-ivy", groups=["platform-ops"])
    recheck(browser)
    assert is_signed_in(client)
    assert roles(user_of("ivy")) == {"acme": Role.OPERATOR}

    # No session at the provider any more: login_required, and signed out here too.
    recheck(http.cookiejar.CookieJar())
    assert not is_signed_in(client)


def test_sign_out_ends_the_provider_session_too(idp, sign_in: SignIn, mappings) -> None:
    idp.set_user("jo", "pw-jo", groups=["platform-ops"])
    client = Client()
    sign_in(client, "jo", "pw-jo")
    id_token = client.session["oidc_id_token"]
    response = client.post("/admin/logout/")
    assert response.status_code == 302
    end = urlsplit(response["Location"])
    assert f"{end.scheme}://{end.netloc}{end.path}" == idp.discovery()["end_session_endpoint"]
    query = dict(parse_qsl(end.query))
    assert query["id_token_hint"] == id_token
    assert query["post_logout_redirect_uri"] == "http://testserver/admin/login/"
    assert not is_signed_in(client)


def test_password_login_off_refuses_staff_and_lets_superusers_in(idp, staff) -> None:
    User.objects.create_superuser("root", "root@example.com", "pw-root-123")
    with override_settings(TOOLHUB_PASSWORD_LOGIN=False):
        page = Client().get("/admin/login/").content.decode()
        assert "Sign in with Test IdP" in page
        assert 'id="login-form"' not in page and "Password sign-in is switched off" in page
        assert 'id="login-form"' in Client().get("/admin/login/?password").content.decode()
        refused = Client().post(
            "/admin/login/?password", {"username": "olivia", "password": "pw-olivia-123"}
        )
        assert refused.status_code == 200
        assert "Password sign-in is switched off here: sign in with Test IdP" in (
            refused.content.decode()
        )
        root = Client()
        assert (
            root.post(
                "/admin/login/?password", {"username": "root", "password": "pw-root-123"}
            ).status_code
            == 302
        )
        assert is_signed_in(root)


def test_the_login_page_offers_both_by_default(idp) -> None:
    page = Client().get("/admin/login/?next=/console/").content.decode()
    assert 'href="/oidc/authenticate/?next=/console/"' in page
    assert 'id="login-form"' in page


def test_login_throttling_still_holds_with_the_provider_on(idp, staff, settings) -> None:
    for _ in range(settings.AXES_FAILURE_LIMIT):
        Client().post("/admin/login/", {"username": "olivia", "password": "wrong"})
    locked = Client().post("/admin/login/", {"username": "olivia", "password": "pw-olivia-123"})
    assert locked.status_code == 429
    assert AccessAttempt.objects.filter(username="olivia").exists()


def test_the_mappings_are_a_superusers_to_edit(idp, tenants) -> None:
    admin_user = User.objects.create_user("ta", password="pw-ta-123")
    grant_role(admin_user, tenants["acme"], Role.ADMIN)
    tenant_admin = Client()
    tenant_admin.force_login(admin_user, backend="apps.tenants.backends.TenantRoleBackend")
    assert tenant_admin.get("/admin/identity/groupmapping/").status_code == 403
    root = Client()
    root.force_login(User.objects.create_superuser("root", "r@example.com", "pw-root-123"))
    added = root.post(
        "/admin/identity/groupmapping/add/",
        {"group": "toolhub-{tenant}-ops", "tenant": tenants["acme"].pk, "role": "operator"},
    )
    assert "Leave the tenant empty" in added.content.decode()
    added = root.post(
        "/admin/identity/groupmapping/add/", {"group": "toolhub-{tenant}-ops", "role": "operator"}
    )
    assert added.status_code == 302
    assert GroupMapping.objects.get().slug_in("toolhub-acme-ops") == "acme"
