"""Telling operators about a new pending call: one email to those who may decide it (the
webhooks: test_webhooks.py)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps.tenants.roles import Role, grant_role
from tests.approvals.support import CONFIRM, ECHO, drain_queue, hold, make_operator

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
