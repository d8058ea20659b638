"""Staff sign-in in Chromium through the real provider's login form, against real Daphne:
the role from a group, sign-out at the provider, and a removed group's role gone at the
next sign-in."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page, expect

from apps.identity.models import ExternalIdentity, GroupMapping
from apps.tenants.models import Role, Tenant
from tests.browser.conftest import (  # the browser fixtures of tests/browser
    _async_unsafe_allowed,
    _static_collected,
    browser,
    new_context,
)
from tests.browser.test_operator_console import SERVER_ENV, screenshot
from tests.identity.conftest import CLIENT_ID, CLIENT_SECRET, roles
from tests.identity.provider import OpenIDProvider, oidc_provider
from tests.support.server import daphne

pytestmark = [
    pytest.mark.browser,
    pytest.mark.server,
    pytest.mark.django_db(transaction=True),
    # The sign-in's database work runs on both legs in test_signin.py.
    pytest.mark.one_leg,
]

__all__ = ["_async_unsafe_allowed", "_static_collected", "browser", "new_context", "oidc_provider"]


def sign_in_at_the_provider(page: Page, login: str, password: str) -> None:
    page.goto("/admin/login/")
    page.get_by_role("link", name="Sign in with Test IdP").click()
    expect(page).to_have_title("Sign in to the test provider")
    page.get_by_label("Username").fill(login)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()


def test_staff_sign_in_sign_out_and_a_removed_group(
    new_context: Any, oidc_provider: OpenIDProvider
) -> None:
    acme = Tenant.objects.create(slug="acme", name="Acme")
    GroupMapping.objects.create(group="platform-ops", tenant=acme, role=Role.OPERATOR)
    GroupMapping.objects.create(group="toolhub-{tenant}-admins", role=Role.ADMIN)
    oidc_provider.set_user("kim", "pw-kim", groups=["toolhub-acme-admins", "platform-ops"])
    env = {
        **SERVER_ENV,
        "TOOLHUB_OIDC_ISSUER": oidc_provider.issuer,
        "TOOLHUB_OIDC_CLIENT_ID": CLIENT_ID,
        "TOOLHUB_OIDC_CLIENT_SECRET": CLIENT_SECRET,
        "TOOLHUB_OIDC_SCOPES": "openid email profile groups",
        "TOOLHUB_OIDC_NAME": "Test IdP",
    }
    with daphne(env) as base:
        oidc_provider.add_client(
            CLIENT_ID,
            CLIENT_SECRET,
            redirect_uris=[f"{base}/oidc/callback/"],
            post_logout_redirect_uris=[f"{base}/admin/login/"],
        )
        page = new_context(base).new_page()
        sign_in_at_the_provider(page, "kim", "pw-kim")
        expect(page).to_have_url(f"{base}/admin/")
        expect(page.locator("#user-tools")).to_contain_text("kim")
        screenshot(page, "oidc-signed-in")
        user = ExternalIdentity.objects.get(subject="kim").user
        assert roles(user) == {"acme": Role.ADMIN}

        # Sign-out goes through the provider's end-session page and back to the login.
        page.locator("#logout-form button").click()
        page.get_by_role("button", name="Yes, sign me out").click()
        expect(page).to_have_url(f"{base}/admin/login/")
        page.goto("/admin/")
        expect(page).to_have_url(f"{base}/admin/login/?next=/admin/")

        # Out of the admins' group at the provider: an operator at the next sign-in.
        oidc_provider.set_user("kim", "pw-kim", groups=["platform-ops"])
        sign_in_at_the_provider(page, "kim", "pw-kim")  # the provider's session ended too
        expect(page).to_have_url(f"{base}/admin/")
        assert roles(user) == {"acme": Role.OPERATOR}
