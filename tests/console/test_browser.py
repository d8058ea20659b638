"""The overview's charts and the console at phone width, in real Chromium against a real
Daphne: data made through the API, charts read back from the page's Chart.js objects
and pixels. Screenshots go to $TOOLHUB_BROWSER_SCREENSHOTS, or <var dir>/screenshots."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from playwright.sync_api import Page, expect

from tests.browser.conftest import OPERATOR_PASSWORD, TIMEOUT_MS
from tests.conftest import allow, make_agent
from tests.support.http import api
from tests.support.server import daphne

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.one_leg]

SERVER_ENV = {"TOOLHUB_EMBEDDED_WORKER": "1", "DJANGO_ALLOW_ASYNC_UNSAFE": ""}
CHARTS = ("calls", "latency", "pending", "deniedTools", "deniedPrincipals")
PHONE = {"width": 390, "height": 844}


def screenshots_dir() -> Path:
    path = Path(os.environ.get("TOOLHUB_BROWSER_SCREENSHOTS") or settings.VAR_DIR / "screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def screenshot(page: Page, name: str) -> None:
    page.screenshot(path=str(screenshots_dir() / f"console-{name}.png"), full_page=True)


def call(base: str, key: str, tool_id: str, **body: Any) -> tuple[int, Any]:
    return api(base, key, "POST", "/api/v1/invocations/", {"toolId": tool_id, **body})


def log_in(page: Page, username: str, next_path: str) -> None:
    page.goto(f"/admin/login/?next={next_path}")
    page.fill("#id_username", username)
    page.fill("#id_password", OPERATOR_PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"**{next_path}")


def drawn_pixels(page: Page, canvas_id: str) -> int:
    """How many pixels of the canvas are not transparent: 0 for a chart never drawn."""
    return int(
        page.evaluate(
            """(id) => {
              const canvas = document.getElementById(id);
              const {width, height} = canvas;
              const pixels = canvas.getContext("2d").getImageData(0, 0, width, height).data;
              let painted = 0;
              for (let i = 3; i < pixels.length; i += 4) if (pixels[i] !== 0) painted += 1;
              return painted;
            }""",
            canvas_id,
        )
    )


def chart_data(page: Page) -> dict[str, Any]:
    return dict(
        page.evaluate(
            """(names) => Object.fromEntries(names.map((name) => {
              const chart = window.toolhubOverview.charts[name];
              const datasets = chart.data.datasets.map((d) => ({label: d.label, data: d.data}));
              return [name, {labels: chart.data.labels, datasets}];
            }))""",
            list(CHARTS),
        )
    )


def no_sideways_scroll(page: Page) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the page is {width} px wide at {PHONE['width']} px"


def test_the_overview_draws_charts_from_real_calls_and_updates_live(
    test_tools, make_operator, new_context
):
    agent = make_agent("acme")
    allow(agent.tenant, "test__echo", "test__confirm")
    make_operator(agent.tenant, "olga", "test__confirm")
    with daphne(SERVER_ENV) as base:
        for text in ("a", "b", "c"):
            assert call(base, agent.key, "test__echo", args={"text": text})[0] == 200
        for _ in range(2):
            assert call(base, agent.key, "test__crash", args={})[1]["errorCode"].endswith("denied")
        assert call(base, agent.key, "test__confirm", args={})[0] == 202

        page = new_context(base).new_page()
        log_in(page, "olga", "/console/overview/")
        page.wait_for_function("window.toolhubOverview && window.toolhubOverview.draws > 0")
        served = page.evaluate(
            "fetch('/console/overview/data/').then((response) => response.json())"
        )
        charts = chart_data(page)

        calls = {d["label"]: sum(d["data"]) for d in charts["calls"]["datasets"]}
        assert calls["succeeded"] == 3 and calls["failed"] == 2 and calls["pending_approval"] == 1
        assert charts["calls"]["datasets"] == [
            {"label": s["label"], "data": s["data"]} for s in served["callsPerMinute"]
        ]
        assert "test__echo" in charts["latency"]["labels"]
        assert max(charts["pending"]["datasets"][0]["data"]) == 1
        assert charts["deniedTools"]["labels"] == ["test__crash"]
        assert charts["deniedTools"]["datasets"][0]["data"] == [2]
        assert charts["deniedPrincipals"]["labels"] == ["agent:test"]
        for canvas in ("calls", "latency", "pending", "denied-tools", "denied-principals"):
            assert drawn_pixels(page, f"chart-{canvas}") > 500, canvas
        expect(page.locator("#pending-now")).to_have_text("1 call waiting for a decision now.")
        screenshot(page, "overview")

        draws = page.evaluate("window.toolhubOverview.draws")
        assert call(base, agent.key, "test__echo", args={"text": "d"})[0] == 200
        page.wait_for_function(
            """(before) => {
              const o = window.toolhubOverview;
              const ok = o.last.callsPerMinute.find((s) => s.label === "succeeded");
              return o.draws > before && ok.data.reduce((a, b) => a + b, 0) === 4;
            }""",
            arg=draws,
            timeout=TIMEOUT_MS,
        )
        assert page.url.endswith("/console/overview/")  # updated in place, no reload


def test_the_console_is_usable_at_390_px(test_tools, make_operator, new_context):
    agent = make_agent("acme")
    allow(agent.tenant, "test__confirm")
    make_operator(agent.tenant, "pia", "test__confirm")
    with daphne(SERVER_ENV) as base:
        status, held = call(
            base, agent.key, "test__confirm", args={}, toolCallId="call-phone", runId="run-phone"
        )
        assert status == 202
        context = new_context(base)
        context.set_default_timeout(TIMEOUT_MS)
        page = context.new_page()
        page.set_viewport_size(PHONE)
        log_in(page, "pia", "/console/")

        row = page.locator(f'tr[data-approval-id="{held["approvalId"]}"]')
        expect(row).to_be_visible()
        expect(page).to_have_title("(1) Pending calls · toolhub")
        no_sideways_scroll(page)
        review = row.get_by_role("link", name="Review")
        expect(review).to_be_visible()
        # The live queue may swap its rows at any moment (a re-render on a stream event), so
        # the link is found and measured in one step in the page, not by a handle that the
        # swap can detach between two calls.
        box = page.wait_for_function(
            """(id) => {
              const row = document.querySelector(`tr[data-approval-id="${id}"]`);
              const link = row && [...row.querySelectorAll("a")].find(
                (a) => a.textContent.trim() === "Review");
              const r = link && link.getBoundingClientRect();
              return r && r.width > 0 ? {x: r.x, width: r.width, height: r.height} : null;
            }""",
            arg=held["approvalId"],
            timeout=TIMEOUT_MS,
        ).json_value()
        assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], box
        assert box["height"] >= 32, box  # a thumb can hit it
        screenshot(page, "queue-390")

        review.click()
        page.wait_for_url(f"**/console/approvals/{held['approvalId']}/")
        no_sideways_scroll(page)
        approve = page.locator("#approve")
        expect(approve).to_be_visible()
        screenshot(page, "detail-390")
        approve.click()

        page.wait_for_url("**/console/")
        expect(page.locator("tr.empty")).to_contain_text("Nothing is waiting for you.")
        expect(page).to_have_title("Pending calls · toolhub")
        no_sideways_scroll(page)

        page.goto(f"/console/approvals/{held['approvalId']}/")
        expect(page.locator("#outcome-result")).to_be_visible(timeout=TIMEOUT_MS)
        no_sideways_scroll(page)
        screenshot(page, "outcome-390")


def test_the_run_timeline_appends_new_events_live(test_tools, make_operator, new_context):
    agent = make_agent("acme")
    allow(agent.tenant, "test__echo")
    make_operator(agent.tenant, "tim")
    with daphne(SERVER_ENV) as base:
        assert call(base, agent.key, "test__echo", args={"text": "1"}, runId="run-live")[0] == 200
        page = new_context(base).new_page()
        log_in(page, "tim", "/console/runs/run-live/")
        expect(page.locator("#live-state")).to_have_text("live")
        expect(page.locator("li.event")).to_have_count(2)
        page.evaluate("window.__notReloaded = true")

        assert call(base, agent.key, "test__echo", args={"text": "2"}, runId="run-live")[0] == 200

        expect(page.locator("li.event")).to_have_count(4)
        seqs = page.locator("li.event").evaluate_all("items => items.map(i => +i.dataset.seq)")
        assert seqs == [1, 2, 3, 4]
        assert page.evaluate("window.__notReloaded === true")
        expect(page.locator("li.event").last).to_contain_text("tool_call_result")
        screenshot(page, "run-timeline")
