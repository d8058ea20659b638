"""Fixtures for the browser tests: Debian's Chromium driven by Playwright, operators.

Playwright's sync API keeps an asyncio event loop running in the test thread, so
Django's ORM would take every test-side query for one made from async code and
refuse it (SynchronousOnlyOperation). DJANGO_ALLOW_ASYNC_UNSAFE lifts that check
for this folder only, while a browser is up; the Daphne server under test is
started with the check on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from guardian.shortcuts import assign_perm
from playwright.sync_api import Browser, BrowserContext, sync_playwright

from apps.tenants.models import Tenant
from apps.tools.models import Tool

CHROMIUM = Path("/usr/bin/chromium")
# Without the networking switches Chromium phones home at start-up, and on a closed
# network those connections are refused (and slow the launch down).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Generous: a 2-core CI machine runs Chromium, Daphne and its worker side by side.
TIMEOUT_MS = 15_000
OPERATOR_PASSWORD = "pw-operator-!23"


@pytest.fixture(scope="module")
def _async_unsafe_allowed() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture(scope="module")
def _static_collected() -> None:
    """What every deployment does (scripts/run, docs/deployment.md): outside debug mode
    WhiteNoise serves the console's CSS and JS only from STATIC_ROOT."""
    call_command("collectstatic", interactive=False, verbosity=0)


@pytest.fixture(scope="module")
def browser(_async_unsafe_allowed: None, _static_collected: None) -> Iterator[Browser]:
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        pytest.fail(
            f"{CHROMIUM} is missing: the browser tests drive Debian's Chromium "
            "(apt-get install chromium; scripts/test installs it in its system-packages stage).",
            pytrace=False,
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def new_context(browser: Browser) -> Iterator[Callable[[str], BrowserContext]]:
    """Opens isolated browser sessions (own cookies) against a base URL; closes them after."""
    contexts: list[BrowserContext] = []

    def open_context(base_url: str) -> BrowserContext:
        context = browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 900})
        context.set_default_timeout(TIMEOUT_MS)
        context.set_default_navigation_timeout(TIMEOUT_MS)
        contexts.append(context)
        return context

    yield open_context
    for context in contexts:
        context.close()


@pytest.fixture
def make_operator(transactional_db: None) -> Callable[..., User]:
    """A staff member of `tenant` who may decide the calls of the given tools."""

    def make(tenant: Tenant, username: str, *tool_ids: str) -> User:
        user = User.objects.create_user(username, password=OPERATOR_PASSWORD, is_staff=True)
        tenant.members.add(user)
        for tool in Tool.objects.filter(pk__in=tool_ids):
            assign_perm("tools.decide_approval", user, tool)
        return user

    return make
