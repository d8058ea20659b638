"""The operator console in a real browser, against a real Daphne with its embedded worker.

An agent calls the API over HTTP, an operator decides in headless Chromium, and the
agent reads the outcome back from the API: no mocks between the three.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import OPERATOR_PASSWORD, TIMEOUT_MS
from tests.conftest import allow, make_agent
from tests.support.http import api
from tests.support.server import daphne

# The pages, not the database, are the subject: one leg (the queries are tested on both).
pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.one_leg("postgresql"),
]

# Set to a directory (outside the repository) to keep screenshots of the pages.
SCREENSHOTS = os.environ.get("TOOLHUB_BROWSER_SCREENSHOTS", "")
SERVER_ENV = {
    "TOOLHUB_EMBEDDED_WORKER": "1",
    # The browser fixture lifts Django's async-safety check in this process only;
    # the server under test keeps it.
    "DJANGO_ALLOW_ASYNC_UNSAFE": "",
}
TERMINAL = {"succeeded", "failed", "cancelled"}


def submit(base: str, key: str, tool_id: str, **body: Any) -> dict[str, Any]:
    status, held = api(base, key, "POST", "/api/v1/invocations/", {"toolId": tool_id, **body})
    assert status == 202, held
    assert held["status"] == "pending_approval", held
    return held


def outcome(base: str, key: str, invocation_id: str, timeout: float = 15.0) -> dict[str, Any]:
    """The caller's view of the call once it has ended (the embedded worker runs it)."""
    deadline = time.monotonic() + timeout
    while True:
        status, record = api(base, key, "GET", f"/api/v1/invocations/{invocation_id}/")
        assert status == 200, record
        if record["status"] in TERMINAL or time.monotonic() > deadline:
            return record
        time.sleep(0.25)


def log_in(page: Page, username: str, next_path: str = "/console/") -> None:
    """Through the real admin login form, landing on `next_path`."""
    page.goto(f"/admin/login/?next={next_path}")
    page.fill("#id_username", username)
    page.fill("#id_password", OPERATOR_PASSWORD)
    page.click("input[type=submit]")
    expect(page).to_have_url(at(page, next_path))


def at(page: Page, path: str) -> str:
    """The absolute URL of `path` on the page's server."""
    return urljoin(page.url, path)


# A spy on the page's own WebSocket (the real one is used): records the stream's
# messages and, once the stream is open, every re-render of the queue's rows, so a
# test can tell when the queue is live without racing an earlier page's socket.
SPY = """
(() => {
  const Native = window.WebSocket;
  window.__frames = [];
  window.__socketsOpen = 0;
  window.__rowsRendered = 0;
  window.WebSocket = function (url, protocols) {
    const socket = protocols === undefined ? new Native(url) : new Native(url, protocols);
    socket.addEventListener("open", () => {
      window.__socketsOpen += 1;
      const rows = document.getElementById("queue-rows");
      if (rows) {
        new MutationObserver(() => { window.__rowsRendered += 1; })
          .observe(rows, { childList: true });
      }
    });
    socket.addEventListener("message", (event) => window.__frames.push(JSON.parse(event.data)));
    return socket;
  };
})();
"""


def operator_page(new_context: Any, base: str) -> Page:
    context = new_context(base)
    context.add_init_script(SPY)
    return context.new_page()


def open_queue(page: Page) -> None:
    """Opens the queue (unless it is open) and waits until it is live: its stream is
    connected and the rows it re-fetches on connecting have been rendered."""
    if page.url != at(page, "/console/"):
        page.goto("/console/")
    page.wait_for_function("window.__socketsOpen > 0 && window.__rowsRendered > 0")
    # A marker a reload would wipe: proves later changes arrive without one.
    page.evaluate("window.__notReloaded = true")


def frames(page: Page) -> list[dict[str, Any]]:
    """The messages the queue's stream has delivered to this page."""
    return list(page.evaluate("window.__frames"))


def wait_until(page: Page, condition: Any, what: str) -> None:
    """Lets the page run (its events are handled meanwhile) until `condition()` holds."""
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        page.wait_for_timeout(100)


def assert_not_reloaded(page: Page) -> None:
    assert page.evaluate("window.__notReloaded === true"), "the page was reloaded"


def row(page: Page, approval_id: str) -> Any:
    return page.locator(f'tr[data-approval-id="{approval_id}"]')


def screenshot(page: Page, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"), full_page=True)


def test_a_held_call_appears_live_and_runs_once_the_operator_approves_it(
    test_tools, make_operator, new_context
):
    agent = make_agent("acme")
    allow(agent.tenant, "test__confirm")
    make_operator(agent.tenant, "opal", "test__confirm")
    with daphne(SERVER_ENV) as base:
        page = operator_page(new_context, base)
        log_in(page, "opal")
        open_queue(page)
        expect(page.locator("tr.empty")).to_contain_text("Nothing is waiting for you.")

        held = submit(base, agent.key, "test__confirm", toolCallId="call-1", runId="run-review")

        queued = row(page, held["approvalId"])
        expect(queued).to_be_visible(timeout=TIMEOUT_MS)
        assert_not_reloaded(page)
        assert [(m["type"], m["approvalId"]) for m in frames(page)] == [
            ("approval_required", held["approvalId"])
        ]
        expect(queued).to_contain_text("test__confirm")
        expect(queued).to_contain_text("agent:test")
        screenshot(page, "queue")

        queued.get_by_role("link", name="Review").click()
        expect(page).to_have_url(at(page, f"/console/approvals/{held['approvalId']}/"))
        expect(page.locator("h1")).to_contain_text("test__confirm")
        expect(page.locator("#args")).to_have_text("{}")
        facts = page.locator("dl.facts")
        expect(facts).to_contain_text("run-review")
        expect(facts).to_contain_text("call-1")
        screenshot(page, "detail")

        page.click("#approve")
        expect(page).to_have_url(at(page, "/console/"))
        expect(page.locator(".messages")).to_contain_text("Approved: test__confirm")
        expect(row(page, held["approvalId"])).to_have_count(0)

        record = outcome(base, agent.key, held["invocationId"])
    assert record["status"] == "succeeded", record
    assert record["ok"] is True, record
    assert record["result"] == {"waited": 0}, record


def test_a_rejection_reason_typed_by_an_operator_reaches_the_caller(
    test_tools, make_operator, new_context
):
    agent = make_agent("acme")
    allow(agent.tenant, "test__confirm")
    make_operator(agent.tenant, "opal", "test__confirm")
    make_operator(agent.tenant, "rita", "test__confirm")
    reason = "Not during the change freeze; ask again on Monday."
    with daphne(SERVER_ENV) as base:
        held = submit(base, agent.key, "test__confirm")
        page = operator_page(new_context, base)
        log_in(page, "rita", f"/console/approvals/{held['approvalId']}/")

        page.click("#reject")  # a rejection needs a reason: the form says so, nothing changes
        expect(page.locator("form.decision .errorlist")).to_contain_text("Say why you reject it")
        _, record = api(base, agent.key, "GET", f"/api/v1/invocations/{held['invocationId']}/")
        assert record["status"] == "pending_approval", record

        page.fill("#id_reason", reason)
        page.click("#reject")
        expect(page).to_have_url(at(page, "/console/"))
        expect(page.locator(".messages")).to_contain_text("Rejected: test__confirm")

        record = outcome(base, agent.key, held["invocationId"])
    assert record["status"] == "failed", record
    assert record["ok"] is False, record
    assert record["errorCode"] == "approval_rejected", record
    assert record["safeMessage"] == reason, record


def test_an_operator_approves_edited_arguments_and_the_tool_runs_with_them(
    test_tools, make_operator, new_context
):
    agent = make_agent("acme")
    policy = allow(agent.tenant, "test__echo")
    policy.approval_effects = ["read_only"]
    policy.save()
    make_operator(agent.tenant, "opal", "test__echo")
    with daphne(SERVER_ENV) as base:
        held = submit(base, agent.key, "test__echo", args={"text": "hello"})
        page = operator_page(new_context, base)
        log_in(page, "opal", f"/console/approvals/{held['approvalId']}/")
        expect(page.locator("#args")).to_contain_text('"text": "hello"')

        edit = page.locator("details#edit-args")
        edit.locator("summary").click()
        editor = edit.locator("textarea[name=args]")
        expect(editor).to_be_visible()
        assert json.loads(editor.input_value())["text"] == "hello"
        editor.fill(json.dumps({"text": "edited"}))
        screenshot(page, "edit")
        edit.get_by_role("button", name="Approve with these arguments").click()

        expect(page).to_have_url(at(page, "/console/"))
        expect(page.locator(".messages")).to_contain_text("Approved with edits: test__echo")
        record = outcome(base, agent.key, held["invocationId"])

        # The decided request shows what ran and what the operator changed.
        page.goto(f"/console/approvals/{held['approvalId']}/")
        expect(page.locator("h1 .status")).to_have_text("succeeded")
        expect(page.locator("#args")).to_contain_text('"text": "edited"')
        edits = page.locator("table", has=page.locator("th", has_text="Before"))
        expect(edits).to_contain_text("hello")
        expect(edits).to_contain_text("edited")
        screenshot(page, "decided")
    assert record["status"] == "succeeded", record
    assert record["ok"] is True, record
    assert record["result"]["text"] == "edited", record


def test_a_call_decided_by_another_operator_leaves_the_open_queue_live(
    test_tools, make_operator, new_context
):
    agent = make_agent("acme")
    allow(agent.tenant, "test__confirm")
    make_operator(agent.tenant, "opal", "test__confirm")
    make_operator(agent.tenant, "rita", "test__confirm")
    with daphne(SERVER_ENV) as base:
        first, second = (submit(base, agent.key, "test__confirm") for _ in range(2))
        watching = operator_page(new_context, base)
        log_in(watching, "opal")
        open_queue(watching)
        expect(row(watching, first["approvalId"])).to_be_visible()
        expect(row(watching, second["approvalId"])).to_be_visible()

        deciding = operator_page(new_context, base)  # another operator, another session
        log_in(deciding, "rita", f"/console/approvals/{first['approvalId']}/")
        deciding.click("#approve")
        expect(deciding.locator(".messages")).to_contain_text("Approved: test__confirm")

        expect(row(watching, first["approvalId"])).to_have_count(0, timeout=TIMEOUT_MS)
        expect(row(watching, second["approvalId"])).to_be_visible()
        assert_not_reloaded(watching)
        decided = [m for m in frames(watching) if m["type"] == "approval_decided"]
        assert [(m["approvalId"], m["decision"], m["decidedBy"]) for m in decided] == [
            (first["approvalId"], "approve", "rita")
        ]
        assert outcome(base, agent.key, first["invocationId"])["ok"] is True


def test_a_call_held_while_the_queue_is_refreshing_still_appears(
    test_tools, make_operator, new_context
):
    """A stream message that arrives while the rows are being fetched must not be lost:
    the fetch in flight may have been answered before that call existed."""
    agent = make_agent("acme")
    allow(agent.tenant, "test__confirm")
    make_operator(agent.tenant, "opal", "test__confirm")
    with daphne(SERVER_ENV) as base:
        page = operator_page(new_context, base)
        log_in(page, "opal")
        open_queue(page)
        # Hold the refresh that the first call's message starts, with the answer the
        # server gave at that moment, until the second call's message has arrived too.
        stale: list[tuple[Any, Any]] = []
        page.route(
            "**/console/queue/rows/",
            lambda route: stale.append((route, route.fetch())),
            times=1,
        )
        first = submit(base, agent.key, "test__confirm")
        wait_until(page, lambda: stale, "the refresh after the first call")
        second = submit(base, agent.key, "test__confirm")
        page.wait_for_function("window.__frames.length >= 2")
        route, answer = stale[0]
        route.fulfill(response=answer)

        expect(row(page, first["approvalId"])).to_be_visible()
        expect(row(page, second["approvalId"])).to_be_visible(timeout=TIMEOUT_MS)
        assert_not_reloaded(page)
        messages = frames(page)
        assert [m["type"] for m in messages] == ["approval_required"] * 2, messages
        assert {m["approvalId"] for m in messages} == {first["approvalId"], second["approvalId"]}


def test_the_console_is_styled_and_scripted_in_the_configuration_it_runs_with(
    make_operator, new_context
):
    """The stylesheet and script load (WhiteNoise serves them from STATIC_ROOT
    outside debug mode) and the stylesheet applies."""
    tenant = make_agent("acme").tenant
    make_operator(tenant, "opal")
    with daphne(SERVER_ENV) as base:
        page = operator_page(new_context, base)
        assets: dict[str, int] = {}  # first response per file name (later ones may be 304s)
        page.on("response", lambda r: assets.setdefault(r.url.rsplit("/", 1)[-1], r.status))
        log_in(page, "opal")
        page.wait_for_load_state("load")
        assert assets.get("toolhub.css") == 200, assets
        assert assets.get("console.js") == 200, assets
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(247, 248, 250)", background


def test_an_operator_ticks_calls_in_the_live_queue_and_approves_them_at_once(
    test_tools, make_operator, new_context
):
    agent = make_agent("acme")
    allow(agent.tenant, "test__confirm")
    make_operator(agent.tenant, "opal", "test__confirm")
    with daphne(SERVER_ENV) as base:
        first = submit(base, agent.key, "test__confirm", runId="run-bulk")
        second = submit(base, agent.key, "test__confirm", runId="run-bulk")
        page = operator_page(new_context, base)
        log_in(page, "opal")
        open_queue(page)
        row(page, first["approvalId"]).locator("input[name=ids]").check()
        row(page, second["approvalId"]).locator("input[name=ids]").check()
        # A call arriving meanwhile re-renders the rows: the ticks survive, it is not ticked.
        third = submit(base, agent.key, "test__confirm", runId="run-bulk")
        expect(row(page, third["approvalId"])).to_be_visible(timeout=TIMEOUT_MS)
        expect(row(page, first["approvalId"]).locator("input[name=ids]")).to_be_checked()
        expect(row(page, third["approvalId"]).locator("input[name=ids]")).not_to_be_checked()
        screenshot(page, "queue-bulk")

        page.fill("#bulk-reason", "routine run")
        page.click("#bulk-approve")

        expect(page.locator(".messages")).to_contain_text("2 of 2 decided")
        expect(row(page, first["approvalId"])).to_have_count(0)
        expect(row(page, third["approvalId"])).to_have_count(1)
        records = [outcome(base, agent.key, held["invocationId"]) for held in (first, second)]
    assert [record["status"] for record in records] == ["succeeded", "succeeded"], records


def test_the_overview_draws_counts_to_scale_and_only_real_tools(
    test_tools, make_operator, new_context
):
    agent = make_agent("acme")
    allow(agent.tenant, "test__echo")
    make_operator(agent.tenant, "opal", "test__echo")
    with daphne(SERVER_ENV) as base:
        status, _ = api(base, agent.key, "POST", "/api/v1/invocations/",
                        {"toolId": "test__echo", "args": {"text": "x"}})  # fmt: skip
        assert status == 200
        api(base, agent.key, "POST", "/api/v1/invocations/", {"toolId": "no__such_tool"})
        api(base, agent.key, "POST", "/api/v1/invocations/", {"toolId": "test__crash"})  # denied
        page = operator_page(new_context, base)
        log_in(page, "opal", "/console/overview/")
        page.wait_for_function(
            # Chart.js is a deferred script: before it runs, `Chart` is not yet defined
            "window.Chart?.getChart('chart-latency')?.data.labels.length > 0"
            " && window.Chart.getChart('chart-denied-tools')?.data.labels.length > 0"
        )
        latency_tools = page.evaluate("Chart.getChart('chart-latency').data.labels")
        denied_axis_max = page.evaluate("Chart.getChart('chart-denied-tools').scales.x.max")
        screenshot(page, "overview")
    assert "test__echo" in latency_tools
    assert "no__such_tool" not in latency_tools  # an unknown id is no tool
    assert denied_axis_max >= 5  # one denial is a short bar, not the whole width


def test_the_demo_chat_fills_templates_says_what_is_wrong_and_shows_every_event(
    test_tools, make_operator, new_context
):
    from guardian.shortcuts import assign_perm

    from apps.approvals import decisions
    from apps.approvals.models import ApprovalRequest
    from apps.tools.models import Tool

    agent = make_agent("acme")
    allow(agent.tenant, "test__echo", "test__confirm")
    opal = make_operator(agent.tenant, "opal")
    rita = make_operator(agent.tenant, "rita", "test__confirm")
    for tool in Tool.objects.filter(pk__in=["test__echo", "test__confirm"]):
        assign_perm("tools.execute_tool", opal, tool)
    dialogs: list[str] = []
    with daphne(SERVER_ENV) as base:
        page = operator_page(new_context, base)
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        log_in(page, "opal", "/demo/chat/?run=run-chat")
        expect(page.locator("#live-state")).to_have_text("live", timeout=TIMEOUT_MS)

        page.select_option("select[name=toolId]", "test__echo")
        assert json.loads(page.input_value("textarea[name=args]")) == {"text": ""}
        page.fill("textarea[name=args]", '{"text": "hi"')  # not valid JSON
        page.click("#call-form button")
        expect(page.locator("#call-error")).to_contain_text("not valid JSON")
        assert dialogs == []  # said on the page, not in a browser alert
        assert page.get_attribute("textarea[name=args]", "aria-invalid") == "true"

        page.select_option("select[name=toolId]", "test__confirm")
        assert page.input_value("textarea[name=args]") == '{"text": "hi"'  # typed by hand: kept
        page.fill("textarea[name=args]", "{}")
        page.click("#call-form button")
        card = page.locator("li.call").last
        expect(card.locator(".call-events")).to_contain_text(
            "waiting for a human", timeout=TIMEOUT_MS
        )

        approval = ApprovalRequest.objects.get(run_id="run-chat")
        decisions.decide(approval.pk, rita, "approve", "looks fine")

        events = card.locator(".call-events li")
        expect(events.last).to_contain_text("done in", timeout=TIMEOUT_MS)
        texts = events.all_inner_texts()
        screenshot(page, "demo-chat")
    assert any("approved by rita — looks fine" in text for text in texts), texts
    order = ["waiting for a human", "approved by rita", "running", "done in"]
    assert [next(i for i, t in enumerate(texts) if step in t) for step in order] == [0, 1, 2, 3]
