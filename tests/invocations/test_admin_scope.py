"""Staff see only their own tenants' records in the admin."""

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.tenants.roles import Role, grant_role
from tests.conftest import allow, make_agent

pytestmark = pytest.mark.django_db(transaction=True)


def test_staff_see_only_their_tenants_records_and_events_in_the_admin():
    acme, globex = make_agent("acme"), make_agent("globex", "agent:other")
    for agent, text in ((acme, "acme-call"), (globex, "globex-call")):
        allow(agent.tenant, "core__get_current_time")
        agent.invoke("core__get_current_time", args={}, runId=f"run-{text}")
    viewer = User.objects.create_user("vera", password="pw-vera-1234", is_staff=True)
    grant_role(viewer, acme.tenant, Role.OPERATOR)  # views records and events
    client = Client()
    client.force_login(viewer)

    records = client.get("/admin/invocations/invocationrecord/").content.decode()
    events = client.get("/admin/invocations/runevent/").content.decode()

    assert "run-acme-call" in events and "run-globex-call" not in events
    assert "1 invocation record" in records
