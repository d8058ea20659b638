"""Issue 46, pages a newcomer opens first, in Chromium against a real Daphne."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.test_operator_console import SERVER_ENV, screenshot
from tests.support.server import daphne

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.one_leg]


def test_the_websocket_docs_page_shows_no_raw_python_dicts(new_context: Any):
    with daphne(SERVER_ENV) as base:
        page = new_context(base).new_page()
        page.goto("/api/docs/websockets/")
        # The flash-message list of base.html stays empty (it showed the documented
        # messages as Python dicts when the view named its context `messages`).
        expect(page.locator("ul.messages")).to_have_count(0)
        text = page.locator("body").inner_text()
        assert "{'key'" not in text and "'fields':" not in text
        section = page.locator("#message-toolCallStart")
        expect(section.locator("h3")).to_contain_text("tool_call_start")
        expect(section.locator("pre.args").first).to_contain_text('"type": "tool_call_start"')
        screenshot(page, "websocket-docs")
