"""Telling operators about a new pending call: one email to those who may decide it, a
signed webhook per tenant, and no webhook to a metadata address."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from django.contrib.auth.models import User

from apps.approvals import notify
from apps.tenants.roles import Role, grant_role
from tests.approvals.support import CONFIRM, ECHO, drain_queue, hold, make_operator
from tests.connections import local_server

pytestmark = pytest.mark.django_db(transaction=True)


# ---------------------------------------------------------------- email


def test_a_pending_call_emails_exactly_the_operators_who_may_decide_it(caller, other, mailoutbox):
    tenant = caller.tenant
    decider = make_operator("dora", tenant, email="dora@example.com")
    make_operator("ed", tenant, tools=(ECHO,), email="ed@example.com")  # not this tool
    make_operator("gus", other.tenant, email="gus@example.com")  # another tenant
    make_operator("nils", tenant, email="nils@example.com", is_staff=False)  # not staff
    make_operator("quiet", tenant, email="")  # may decide, but has no address
    inactive = make_operator("ina", tenant, email="ina@example.com")
    inactive.is_active = False
    inactive.save()
    global_decider = User.objects.create_user(
        "gwen", email="gwen@example.com", is_staff=True
    )  # decide_approval on every tool: the operator role of the tenant
    grant_role(global_decider, tenant, Role.OPERATOR)

    _, approval = hold(caller, CONFIRM)
    assert mailoutbox == []  # sent from the queue, not inline

    drain_queue()

    assert len(mailoutbox) == 1
    message = mailoutbox[0]
    assert sorted(message.bcc) == sorted([decider.email, global_decider.email])
    assert message.to == [] and message.cc == []
    assert CONFIRM in message.subject
    assert f"/console/approvals/{approval.pk}/" in message.body
    assert "agent:test" in message.body
    drain_queue()
    assert len(mailoutbox) == 1  # sent once


def test_no_email_when_nobody_may_decide(caller, mailoutbox):
    make_operator("ed", caller.tenant, tools=(ECHO,))
    hold(caller, CONFIRM)
    drain_queue()
    assert mailoutbox == []


def test_each_pending_call_is_notified_once(caller, mailoutbox):
    make_operator("dora", caller.tenant)
    _, first = hold(caller, CONFIRM)
    _, second = hold(caller, CONFIRM)
    drain_queue()
    assert len(mailoutbox) == 2
    bodies = "\n".join(message.body for message in mailoutbox)
    assert str(first.pk) in bodies and str(second.pk) in bodies


# ---------------------------------------------------------------- webhook


class Receiver:
    """A local HTTP server on 127.0.0.1 that records the POSTs it gets."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                received.append(
                    {
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": self.rfile.read(length),
                    }
                )
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/approvals"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as server:
        yield server


def test_the_tenants_webhook_gets_a_signed_notice(caller, receiver):
    tenant = caller.tenant
    tenant.approval_webhook_url = receiver.url
    tenant.webhook_private_network = True  # the receiver is on loopback
    tenant.set_webhook_secret("s3cret")
    tenant.save()
    _, approval = hold(caller, CONFIRM, runId="run-hook")

    drain_queue()

    assert len(receiver.requests) == 1
    request = receiver.requests[0]
    assert request["path"] == "/hooks/approvals"
    body = request["body"]
    header = request["headers"]["X-Toolhub-Signature"]
    match = re.fullmatch(r"t=(\d+),v1=([0-9a-f]{64})", header)
    assert match, header
    assert header == notify.signature("s3cret", int(match.group(1)), body)
    assert header != notify.signature("wrong", int(match.group(1)), body)
    notice = json.loads(body)
    assert notice["type"] == "approval_required"
    assert notice["approvalId"] == str(approval.pk)
    assert notice["tenant"] == "acme"
    assert notice["toolId"] == CONFIRM
    assert notice["runId"] == "run-hook"
    assert "args" not in notice  # the notice names the call; the console shows it


def test_a_webhook_without_a_secret_is_sent_unsigned(caller, receiver):
    caller.tenant.approval_webhook_url = receiver.url
    caller.tenant.webhook_private_network = True
    caller.tenant.save()
    hold(caller, CONFIRM)

    drain_queue()

    assert len(receiver.requests) == 1
    assert "X-Toolhub-Signature" not in receiver.requests[0]["headers"]


def test_another_tenants_calls_do_not_reach_this_webhook(caller, other, receiver):
    caller.tenant.approval_webhook_url = receiver.url
    caller.tenant.webhook_private_network = True
    caller.tenant.save()
    hold(other, CONFIRM)
    drain_queue()
    assert receiver.requests == []


def test_a_webhook_to_the_metadata_address_is_refused_and_logged(
    caller, monkeypatch, caplog, mailoutbox
):
    make_operator("dora", caller.tenant)
    tenant = caller.tenant
    tenant.approval_webhook_url = "http://169.254.169.254/latest/meta-data/"
    tenant.webhook_private_network = True  # even so
    tenant.set_webhook_secret("s3cret")
    tenant.save()
    attempts: list[Any] = []

    def no_connections(address: Any, *args: Any, **kwargs: Any) -> Any:
        attempts.append(address)
        raise AssertionError(f"tried to connect to {address}")

    monkeypatch.setattr("apps.connections.netguard.socket.create_connection", no_connections)
    hold(caller, CONFIRM)

    with caplog.at_level(logging.WARNING, logger="apps.approvals.notify"):
        drain_queue()

    assert attempts == []
    assert any(
        "approval webhook for tenant acme failed: Blocked" in record.getMessage()
        for record in caplog.records
    ), caplog.text
    assert len(mailoutbox) == 1  # the email still goes out


def test_a_webhook_on_loopback_is_refused_unless_a_superuser_allowed_it(
    caller, receiver, caplog, mailoutbox
):
    """A tenant admin sets the URL; reaching the host's own ports needs a superuser."""
    make_operator("dora", caller.tenant)
    caller.tenant.approval_webhook_url = receiver.url
    caller.tenant.save()
    hold(caller, CONFIRM)
    with caplog.at_level(logging.WARNING, logger="apps.approvals.notify"):
        drain_queue()
    assert receiver.requests == []
    assert "approval webhook for tenant acme failed: Blocked" in caplog.text
    assert len(mailoutbox) == 1


@pytest.mark.parametrize("path", ["/short", "/not-http"])
def test_a_webhook_that_answers_a_broken_response_is_logged_as_failed(
    caller, caplog, mailoutbox, path
):
    make_operator("dora", caller.tenant)
    with local_server() as server:
        caller.tenant.approval_webhook_url = f"{server.base}{path}"
        caller.tenant.webhook_private_network = True
        caller.tenant.save()
        hold(caller, CONFIRM)
        with caplog.at_level(logging.WARNING, logger="apps.approvals.notify"):
            drain_queue()
        assert [seen.method for seen in server.seen] == ["POST"]
    assert any(
        "approval webhook for tenant acme failed: BrokenResponse" in record.getMessage()
        for record in caplog.records
    ), caplog.text
    assert len(mailoutbox) == 1  # the email still goes out
