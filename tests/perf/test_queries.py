"""The call path's database work stays small (issue 13): these fail when a change adds
queries to every call, and prove the one-query permission check answers like the four
it replaced."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from guardian.shortcuts import assign_perm, get_objects_for_user

from apps.invocations.models import InvocationRecord
from apps.tools.models import Tool
from apps.tools.permissions import can_execute, executable_tools
from tests.conftest import Agent

TOOL = "core__get_current_time"


def statements(context: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in context.captured_queries if "SAVEPOINT" not in q["sql"]]


@pytest.mark.django_db
@pytest.mark.parametrize("run", ["known", "new"])
def test_it_makes_a_no_op_call_in_four_statements(agent: Agent, run: str) -> None:
    assert agent.invoke(TOOL, runId="run-q").json()["ok"] is True
    same_run = {"runId": "run-q"} if run == "known" else {}  # none: the server makes one
    with CaptureQueriesContext(connection) as queries:
        answer = agent.invoke(TOOL, **same_run).json()
    assert answer["ok"] is True and "approvalId" not in answer
    assert answer["runId"] == "run-q" if run == "known" else answer["runId"] != "run-q"
    # The authorization epoch (key, tool, policies and permission come from the caches it
    # guards), the record's insert, the run's event numbers (one upsert, also for a new
    # run), both events' insert: 4 (24 before issue 13's work, 12 after its first round).
    assert len(statements(queries)) <= 4, "\n".join(statements(queries))


@pytest.fixture
def tool(db: None) -> Tool:
    return Tool.objects.get(pk=TOOL)


def fresh(user: User) -> User:
    """The same user without Django's per-instance permission caches."""
    return User.objects.get(pk=user.pk)


@pytest.mark.django_db
@pytest.mark.parametrize("route", ["user-global", "group-global", "user-object", "group-object"])
def test_it_answers_execute_tool_like_django_and_guardian_for_every_grant_route(
    tool: Tool, route: str
) -> None:
    user = User.objects.create_user("svc")
    other = Tool.objects.exclude(pk=TOOL).first()
    assert other is not None
    group = Group.objects.create(name="g")
    user.groups.add(group)
    assert not can_execute(fresh(user), tool)
    holder = user if route.startswith("user") else group
    if route.endswith("global"):
        permission = Permission.objects.get(codename="execute_tool")
        holder.user_permissions.add(permission) if isinstance(holder, User) else (
            holder.permissions.add(permission)
        )
    else:
        assign_perm("tools.execute_tool", holder, tool)
    user = fresh(user)
    expected = user.has_perm("tools.execute_tool") or user.has_perm("tools.execute_tool", tool)
    assert expected and can_execute(user, tool)
    # An object permission on one tool says nothing about another.
    assert can_execute(user, other) is route.endswith("global")
    # The catalog's list: what guardian's get_objects_for_user answers, in one query.
    usable = Tool.objects.usable()
    expected_tools = get_objects_for_user(
        user, "tools.execute_tool", klass=usable, accept_global_perms=True
    )
    with CaptureQueriesContext(connection) as queries:
        listed = set(executable_tools(user))
    assert listed == set(expected_tools) and tool in listed
    assert len(queries.captured_queries) == 1
    user.is_active = False
    assert not can_execute(user, tool)
    assert not executable_tools(user).exists()


@pytest.mark.django_db
def test_it_lets_an_active_superuser_execute_any_tool(tool: Tool) -> None:
    root = User.objects.create_superuser("root", password="pw-root-12345")
    assert can_execute(root, tool)
    assert set(executable_tools(root)) == set(Tool.objects.usable())


@pytest.mark.django_db
def test_a_call_recorded_before_it_runs_is_closed_with_an_update_of_its_end_only(
    agent: Agent,
) -> None:
    """Not an UPDATE of every column (issue 13): the args, the hash, the key, the tool and
    the principal were written with the start and stay as they are."""
    agent.invoke(TOOL, runId="run-u", idempotencyKey="k-0")
    with CaptureQueriesContext(connection) as queries:
        answer = agent.invoke(TOOL, runId="run-u", idempotencyKey="k-1").json()
    assert answer["ok"] is True
    # On its own, or on PostgreSQL a part of the end's one statement (combined.record).
    marker = 'UPDATE "invocations_invocationrecord"'
    (update,) = [
        q["sql"][q["sql"].index(marker) :] for q in queries.captured_queries if marker in q["sql"]
    ]
    assigned = update.split(" SET ")[1].split(" WHERE ")[0]
    for untouched in ("args", "request_hash", "idempotency_key", "principal", "tool_id"):
        assert f'"{untouched}" =' not in assigned, update
    record = InvocationRecord.objects.get(pk=answer["invocationId"])
    assert (record.status, record.ok, record.idempotency_key) == ("succeeded", True, "k-1")
    assert record.ended_at is not None and record.duration_ms is not None
