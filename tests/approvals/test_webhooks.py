"""Held calls announced where teams are: Slack, Teams and signed JSON webhooks, per tenant
and per policy rule, with retries and a record of each delivery; real HTTP receivers that
verify what they get."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from apps.approvals import tasks, webhooks
from apps.approvals.models import (
    ApprovalRequest,
    ApprovalStatus,
    ApprovalWebhook,
    DeliveryStatus,
    WebhookDelivery,
)
from apps.policies.models import Outcome, Policy, PolicyRule
from apps.tenants.models import Tenant
from apps.tenants.roles import Role, grant_role
from tests.approvals.support import CONFIRM, ECHO, add_rule, drain_queue, hold, make_operator

# HTTP receivers and formats; the queue and rows are the same on both databases: one leg.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_leg("postgresql")]

SECRET = "s3cret-for-the-receiver"


class Receiver:
    """A local HTTP receiver that verifies X-Toolhub-Signature the way the docs tell a
    receiver to (HMAC-SHA256 over "<t>.<body>", at most 5 minutes old) and answers 401
    when it does not hold. `answers` is a list of what to do with the next requests:
    an HTTP status, ("sleep", seconds) or ("redirect", location); then 204."""

    def __init__(self, secret: str = "") -> None:
        self.requests: list[dict[str, Any]] = []
        self.answers: list[Any] = []
        self.verified: list[bool] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": body}
                )
                if secret:
                    ok = outer.verify(secret, self.headers.get("X-Toolhub-Signature", ""), body)
                    outer.verified.append(ok)
                    if not ok:
                        return self._status(401)
                answer = outer.answers.pop(0) if outer.answers else 204
                if isinstance(answer, tuple) and answer[0] == "sleep":
                    time.sleep(answer[1])
                    return self._status(204)
                if isinstance(answer, tuple) and answer[0] == "redirect":
                    self.send_response(302)
                    self.send_header("Location", answer[1])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                return self._status(answer)

            def _status(self, status: int) -> None:
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/approvals"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @staticmethod
    def verify(secret: str, header: str, body: bytes) -> bool:
        parts = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
        if "t" not in parts or "v1" not in parts or abs(time.time() - int(parts["t"])) > 300:
            return False
        expected = hmac.new(secret.encode(), f"{parts['t']}.".encode() + body, hashlib.sha256)
        return hmac.compare_digest(expected.hexdigest(), parts["v1"])

    def json(self, index: int = -1) -> Any:
        return json.loads(self.requests[index]["body"])

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver(SECRET) as server:
        yield server


def webhook(tenant: Tenant, url: str, **fields: Any) -> ApprovalWebhook:
    secret = fields.pop("secret", SECRET)
    rules = fields.pop("rules", ())
    fields.setdefault("private_network", True)  # the receivers are on loopback
    hook = ApprovalWebhook(tenant=tenant, name=fields.pop("name", "ops"), url=url, **fields)
    hook.set_secret(secret)
    hook.save()
    hook.rules.set(rules)
    return hook


def retry_due(delivery: WebhookDelivery) -> None:
    """Make the delivery's queued retry due now (the queue honours run_after)."""
    queued = DBTaskResult.objects.filter(
        task_path=tasks.deliver_webhook.module_path, status="READY"
    )
    assert queued.filter(args_kwargs__args=[str(delivery.pk)]).exists()
    assert delivery.next_attempt_at is not None
    queued.update(run_after=timezone.now())


def only_delivery() -> WebhookDelivery:
    (delivery,) = WebhookDelivery.objects.all()
    return delivery


# ---------------------------------------------------------------- formats


def test_a_generic_webhook_gets_a_signed_notice_the_receiver_verifies(caller, receiver):
    webhook(caller.tenant, receiver.url)
    _, approval = hold(caller, CONFIRM, runId="run-hook")

    drain_queue()

    assert receiver.verified == [True]
    notice = receiver.json()
    assert notice["type"] == "approval_required"
    assert notice["approvalId"] == str(approval.pk)
    assert (notice["tenant"], notice["toolId"], notice["runId"]) == ("acme", CONFIRM, "run-hook")
    assert notice["consoleUrl"].endswith(f"/console/approvals/{approval.pk}/")
    assert "args" not in notice  # the notice names the call; the console shows it
    delivery = only_delivery()
    assert (delivery.status, delivery.attempts, delivery.last_status) == ("delivered", 1, 204)
    assert delivery.approval_id == approval.pk and delivery.finished_at is not None


def test_a_wrong_secret_fails_the_receivers_check(caller, receiver):
    webhook(caller.tenant, receiver.url, secret="not-the-receivers")
    hold(caller, CONFIRM)
    drain_queue()
    assert receiver.verified == [False]
    delivery = only_delivery()
    assert (delivery.status, delivery.last_status) == ("failed", 401)  # a 4xx: no retry
    assert "HTTP 401" in delivery.last_error


def test_without_a_secret_messages_are_unsigned(caller):
    with Receiver() as plain:
        webhook(caller.tenant, plain.url, secret="")
        hold(caller, CONFIRM)
        drain_queue()
    assert len(plain.requests) == 1
    assert "X-Toolhub-Signature" not in plain.requests[0]["headers"]


def test_a_slack_webhook_gets_blocks_with_a_link_to_the_console(caller, receiver):
    webhook(caller.tenant, receiver.url, format="slack")
    _, approval = hold(caller, CONFIRM)
    ApprovalRequest.objects.filter(pk=approval.pk).update(hold_reason="a <b> & c")

    drain_queue()

    message = receiver.json()
    assert message["text"].startswith(f"Approval needed: {CONFIRM} for agent:test")
    header, section, actions = message["blocks"]
    assert header["type"] == "header"
    facts = {
        field["text"].split("\n")[0]: field["text"].split("\n", 1)[1] for field in section["fields"]
    }
    assert facts["*Tool*"] == CONFIRM and facts["*Tenant*"] == "acme"
    assert facts["*Why it waits*"] == "a &lt;b&gt; &amp; c"  # mrkdwn control characters
    (button,) = actions["elements"]
    assert button["url"].endswith(f"/console/approvals/{approval.pk}/")


def test_a_teams_webhook_gets_an_adaptive_card(caller, receiver):
    webhook(caller.tenant, receiver.url, format="teams")
    _, approval = hold(caller, CONFIRM)

    drain_queue()

    message = receiver.json()
    assert message["type"] == "message"
    (attachment,) = message["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = attachment["content"]
    assert card["type"] == "AdaptiveCard"
    facts = {fact["title"]: fact["value"] for fact in card["body"][1]["facts"]}
    assert facts["Tool"] == CONFIRM and facts["Principal"] == "agent:test"
    (action,) = card["actions"]
    assert action["type"] == "Action.OpenUrl"
    assert action["url"].endswith(f"/console/approvals/{approval.pk}/")


# ---------------------------------------------------------------- which webhooks


def test_webhooks_limited_to_a_rule_hear_only_the_calls_it_held(caller):
    policy = Policy.objects.get(tenant=caller.tenant, name="test tools")
    big = add_rule(policy, 'args.text == "big"', Outcome.REQUIRE_APPROVAL, ECHO)
    with Receiver() as rule_hook, Receiver() as every_hook:
        webhook(caller.tenant, rule_hook.url, name="big only", secret="", rules=[big])
        webhook(caller.tenant, every_hook.url, name="everything", secret="")
        _, by_rule = hold(caller, ECHO, args={"text": "big"})
        _, by_tool = hold(caller, CONFIRM)
        drain_queue()
        heard_by_rule = [json.loads(r["body"])["approvalId"] for r in rule_hook.requests]
        heard_by_all = {json.loads(r["body"])["approvalId"] for r in every_hook.requests}
    assert webhooks.rule_pk(by_rule) == big.pk
    assert heard_by_rule == [str(by_rule.pk)]
    assert heard_by_all == {str(by_rule.pk), str(by_tool.pk)}


def test_another_tenants_calls_and_disabled_webhooks_are_not_announced(caller, other, receiver):
    webhook(caller.tenant, receiver.url)
    webhook(other.tenant, receiver.url, name="off", enabled=False)
    hold(other, CONFIRM)
    drain_queue()
    assert receiver.requests == [] and not WebhookDelivery.objects.exists()


def test_a_notification_task_run_twice_announces_once(caller, receiver):
    webhook(caller.tenant, receiver.url)
    _, approval = hold(caller, CONFIRM)
    drain_queue()
    tasks.notify_pending.call(str(approval.pk))  # a queue entry run again
    assert len(receiver.requests) == 1
    assert WebhookDelivery.objects.count() == 1


# ---------------------------------------------------------------- failures and retries


def test_a_500_is_tried_again_later_and_delivered(caller, receiver):
    receiver.answers = [500]
    webhook(caller.tenant, receiver.url)
    hold(caller, CONFIRM)

    drain_queue()
    delivery = only_delivery()
    assert (delivery.status, delivery.attempts, delivery.last_status) == ("pending", 1, 500)
    assert delivery.next_attempt_at is not None
    drain_queue()  # not due yet: nothing sent
    assert len(receiver.requests) == 1

    retry_due(delivery)
    drain_queue()

    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_status) == ("delivered", 2, 204)
    assert receiver.verified == [True, True]


def test_a_receiver_that_never_answers_in_time_is_tried_again(caller, receiver, monkeypatch):
    monkeypatch.setattr(webhooks, "TIMEOUT_S", 0.3)
    receiver.answers = [("sleep", 1.0)]
    webhook(caller.tenant, receiver.url)
    hold(caller, CONFIRM)
    drain_queue()
    delivery = only_delivery()
    assert delivery.status == "pending" and "TimeoutError" in delivery.last_error


def test_every_attempt_failing_ends_failed_after_the_last(caller, receiver, caplog):
    receiver.answers = [503] * webhooks.MAX_ATTEMPTS
    webhook(caller.tenant, receiver.url)
    hold(caller, CONFIRM)
    with caplog.at_level(logging.WARNING, logger="apps.approvals.webhooks"):
        drain_queue()
        for _ in range(webhooks.MAX_ATTEMPTS - 1):
            retry_due(only_delivery())
            drain_queue()
    delivery = only_delivery()
    assert (delivery.status, delivery.attempts) == ("failed", webhooks.MAX_ATTEMPTS)
    assert delivery.next_attempt_at is None
    assert len(receiver.requests) == webhooks.MAX_ATTEMPTS
    assert "approval webhook 'ops' of tenant acme failed (attempt 4): HTTP 503" in caplog.text


def test_a_redirect_is_not_followed(caller, receiver):
    with Receiver() as elsewhere:
        receiver.answers = [("redirect", elsewhere.url)]
        webhook(caller.tenant, receiver.url)
        hold(caller, CONFIRM)
        drain_queue()
        assert elsewhere.requests == []
    delivery = only_delivery()
    assert (delivery.status, delivery.last_status) == ("failed", 302)
    assert "webhooks are not followed" in delivery.last_error


def test_a_private_address_is_refused_unless_a_superuser_allowed_it(caller, receiver, mailoutbox):
    make_operator("dora", caller.tenant)
    webhook(caller.tenant, receiver.url, private_network=False)
    hold(caller, CONFIRM)
    drain_queue()
    assert receiver.requests == []
    delivery = only_delivery()
    assert delivery.status == "failed" and delivery.last_error.startswith("Blocked")
    assert len(mailoutbox) == 1  # the email still goes out


def test_the_metadata_address_is_refused_even_when_private_networks_are_allowed(
    caller, monkeypatch
):
    attempts: list[Any] = []

    def no_connections(address: Any, *args: Any, **kwargs: Any) -> Any:
        attempts.append(address)
        raise AssertionError(f"tried to connect to {address}")

    monkeypatch.setattr("apps.connections.netguard.socket.create_connection", no_connections)
    webhook(caller.tenant, "http://169.254.169.254/latest/meta-data/")
    hold(caller, CONFIRM)
    drain_queue()
    assert attempts == []
    assert only_delivery().status == "failed"


def test_a_webhook_deleted_before_its_retry_drops_the_delivery(caller, receiver):
    receiver.answers = [500]
    hook = webhook(caller.tenant, receiver.url)
    hold(caller, CONFIRM)
    drain_queue()
    delivery = only_delivery()
    hook.delete()  # a tenant admin removed it meanwhile

    retry_due(delivery)
    drain_queue()

    delivery.refresh_from_db()
    assert (delivery.status, delivery.webhook) == ("dropped", None)
    assert "deleted or disabled" in delivery.last_error
    assert delivery.url == receiver.url  # the record keeps where it went
    assert len(receiver.requests) == 1


def test_a_call_decided_before_its_retry_is_not_announced_again(caller, receiver):
    receiver.answers = [500]
    webhook(caller.tenant, receiver.url)
    _, approval = hold(caller, CONFIRM)
    drain_queue()
    ApprovalRequest.objects.filter(pk=approval.pk).update(status=ApprovalStatus.REJECTED)

    retry_due(only_delivery())
    drain_queue()

    delivery = only_delivery()
    assert delivery.status == DeliveryStatus.DROPPED and "rejected" in delivery.last_error
    assert len(receiver.requests) == 1


# ---------------------------------------------------------------- the admin


@pytest.fixture
def tenant_admin(caller) -> Client:
    user = make_operator("tina", tools=())
    grant_role(user, caller.tenant, Role.ADMIN)
    client = Client()
    client.force_login(user)
    return client


def add_form(tenant: Tenant, **fields: Any) -> dict[str, Any]:
    return {
        "tenant": tenant.pk,
        "name": "ops",
        "format": "slack",
        "url": "https://hooks.slack.com/services/T0/B0/x",
        "enabled": "on",
        "signing_secret": "",
        "deliveries-TOTAL_FORMS": "0",
        "deliveries-INITIAL_FORMS": "0",
        **fields,
    }


def test_a_tenant_admin_adds_a_webhook_but_not_private_network_access(caller, tenant_admin):
    response = tenant_admin.post(
        "/admin/approvals/approvalwebhook/add/",
        add_form(caller.tenant, private_network="on", signing_secret="abc"),
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    hook = ApprovalWebhook.objects.get()
    assert hook.private_network is False  # a superuser's field
    assert hook.signing_secret() == "abc" and "abc" not in hook.secret  # encrypted
    page = tenant_admin.get(f"/admin/approvals/approvalwebhook/{hook.pk}/change/").content
    assert b"abc" not in page


def test_a_tenant_admin_cannot_repoint_a_webhook_a_superuser_opened(caller, tenant_admin):
    hook = webhook(caller.tenant, "http://10.0.0.5/hook")
    response = tenant_admin.post(
        f"/admin/approvals/approvalwebhook/{hook.pk}/change/",
        add_form(caller.tenant, url="http://127.0.0.1:8000/admin/", format="generic"),
    )
    assert response.status_code == 200
    assert "only a superuser may change it" in response.content.decode()
    hook.refresh_from_db()
    assert hook.url == "http://10.0.0.5/hook"


def test_rules_of_another_tenant_cannot_trigger_a_webhook(caller, other, tenant_admin):
    foreign = PolicyRule.objects.create(
        policy=Policy.objects.create(tenant=other.tenant, name="theirs"),
        condition="true",
        outcome=Outcome.REQUIRE_APPROVAL,
    )
    response = tenant_admin.post(
        "/admin/approvals/approvalwebhook/add/", add_form(caller.tenant, rules=[foreign.pk])
    )
    assert response.status_code == 200
    assert not ApprovalWebhook.objects.exists()


def test_operators_read_deliveries_and_nobody_edits_them(caller, receiver):
    webhook(caller.tenant, receiver.url)
    hold(caller, CONFIRM)
    drain_queue()
    delivery = only_delivery()
    operator = make_operator("oscar", tools=())
    grant_role(operator, caller.tenant, Role.OPERATOR)
    client = Client()
    client.force_login(operator)
    assert client.get("/admin/approvals/webhookdelivery/").status_code == 200
    page = client.get(f"/admin/approvals/webhookdelivery/{delivery.pk}/change/")
    assert page.status_code == 200 and b"delivered" in page.content
    assert client.get("/admin/approvals/approvalwebhook/").status_code == 403
