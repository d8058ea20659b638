"""The catalog's process caches (issue 45): tool rows per tools epoch, executable tool ids
per grants epoch, encoded entries per tool version, decisions per kind of answer, bodies
per catalog. Each must let an edit show on the very next catalog, in this process and in
every other, and per caller, tenant and format."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from guardian.models import GroupObjectPermission
from guardian.shortcuts import assign_perm, remove_perm

from apps.policies.models import Outcome, Policy, PolicyRule
from apps.policies.policy import Evaluator, evaluator_for
from apps.tenants import epoch
from apps.tenants.models import ApiKey, EpochChange, Tenant
from apps.tenants.principals import agents_group
from apps.tenants.scoping import tenant_group_name
from apps.tools import grants, rows
from apps.tools.models import Tool
from tests.conftest import CORE_TOOLS, Agent, allow, make_agent
from tests.support.server import ROOT, database_url

TOOL = "core__get_current_time"


def listed(agent: Agent, **params: str) -> dict[str, dict[str, Any]]:
    response = agent.tools(**params)
    assert response.status_code == 200, response.content
    return {
        t.get("id") or t.get("name") or t["function"]["name"]: t for t in response.json()["tools"]
    }


def bulk_tools(count: int) -> list[str]:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    ids = [f"bulk__tool_{i:04}" for i in range(count)]
    Tool.objects.bulk_create(
        [
            Tool(
                id=pk,
                name=pk,
                description=f"Tool {pk}",
                input_schema=schema,
                schema_hash=f"{i:016x}",
                effect="read_only",
                consequence_level="low",
                enabled=True,
            )
            for i, pk in enumerate(ids)
        ]
    )
    return ids


@pytest.mark.django_db
def test_one_tool_edited_among_many_reloads_that_row_alone(agent: Agent) -> None:
    ids = bulk_tools(300)
    made = Tool.objects.filter(pk__in=ids)
    Policy.objects.get(tenant=agent.tenant).tools.add(*made)
    # (guardian's stubs name one object; a queryset is one bulk write)
    assign_perm("tools.execute_tool", agents_group(agent.tenant), made)  # type: ignore[arg-type]
    assert len(listed(agent)) == 300 + len(CORE_TOOLS)
    before = rows.usable()
    Tool.objects.filter(pk=ids[7]).update(description="Edited in bulk")
    after = rows.usable()
    assert after[ids[7]] is not before[ids[7]]
    assert after[ids[7]].description == "Edited in bulk"
    assert all(after[pk] is before[pk] for pk in ids if pk != ids[7])
    assert listed(agent)[ids[7]]["description"] == "Edited in bulk"
    changed = Tool.objects.get(pk=ids[8])
    changed.description = "Edited by a save"
    changed.save()
    assert listed(agent)[ids[8]]["description"] == "Edited by a save"


@pytest.mark.django_db
def test_every_kind_of_tool_write_changes_the_tools_epoch_and_the_stamp(agent: Agent) -> None:
    tool = Tool.objects.get(pk=TOOL)
    writes = [
        lambda: Tool.objects.get(pk=TOOL).save(),
        lambda: Tool.objects.filter(pk=TOOL).update(timeout_ms=999),
        lambda: Tool.objects.bulk_update([Tool.objects.get(pk=TOOL)], ["description"]),
        lambda: bulk_tools(1),
        lambda: Tool.objects.filter(pk="bulk__tool_0000").delete(),
    ]
    for write in writes:
        at, stamp = epoch.read(epoch.TOOLS_ROW), Tool.objects.get(pk=TOOL).updated_at
        write()
        assert epoch.read(epoch.TOOLS_ROW) != at
        if write in writes[:3]:
            assert Tool.objects.get(pk=TOOL).updated_at > stamp
    assert tool.updated_at < Tool.objects.get(pk=TOOL).updated_at


@pytest.mark.django_db
def test_a_policy_edit_reloads_no_tool_row(agent: Agent) -> None:
    listed(agent)
    before = rows.usable()
    Policy.objects.filter(tenant=agent.tenant).update(approval_effects=["read_only"])
    assert rows.usable() is before
    # ...and the entry's requiresApproval follows the decision, not the cached encoding.
    assert listed(agent)[TOOL]["requiresApproval"] is True
    Policy.objects.filter(tenant=agent.tenant).update(approval_effects=[])
    assert listed(agent)[TOOL]["requiresApproval"] is False


@pytest.mark.django_db
def test_a_disabled_tool_an_unlisted_tool_and_a_revoked_grant_leave_the_next_catalog(
    agent: Agent,
) -> None:
    for wire_format in ("", "openai", "anthropic"):
        assert TOOL in listed(agent, format=wire_format) if wire_format else listed(agent)
    Tool.objects.filter(pk=TOOL).update(enabled=False)
    assert TOOL not in listed(agent)
    assert TOOL not in listed(agent, format="openai")
    Tool.objects.filter(pk=TOOL).update(enabled=True)
    assert TOOL in listed(agent)
    policy = Policy.objects.get(tenant=agent.tenant)
    policy.tools.remove(Tool.objects.get(pk=TOOL))
    assert TOOL not in listed(agent)
    policy.tools.add(Tool.objects.get(pk=TOOL))
    assert TOOL in listed(agent)
    remove_perm("tools.execute_tool", agents_group(agent.tenant), Tool.objects.get(pk=TOOL))
    assert TOOL not in listed(agent)
    assert TOOL not in listed(agent, format="anthropic")


@pytest.mark.django_db
def test_each_caller_and_tenant_sees_its_own_catalog(agent: Agent, stranger: Agent) -> None:
    second = make_agent(agent.tenant.slug, "agent:second")  # same tenant, its own user
    assert TOOL in listed(agent) and TOOL in listed(stranger) and TOOL in listed(second)
    # Revoked for the second agent's user alone: its own group, not the tenant's agents.
    user = ApiKey.objects.get(tenant=agent.tenant, principal="agent:second").user
    user.groups.remove(agents_group(agent.tenant))
    assert TOOL not in listed(second)
    assert TOOL in listed(agent) and TOOL in listed(stranger)
    Policy.objects.filter(tenant=stranger.tenant).update(enabled=False)
    assert listed(stranger) == {}
    assert TOOL in listed(agent)


@pytest.mark.django_db
def test_a_rule_of_a_principal_lists_its_tool_for_that_principal_only(agent: Agent) -> None:
    (extra,) = bulk_tools(1)
    second = make_agent(agent.tenant.slug, "agent:second")
    allow(agent.tenant, extra, name="granted only")
    Policy.objects.filter(name="granted only").update(enabled=False)
    policy = Policy.objects.create(tenant=agent.tenant, name="by rule", principal="agent:second")
    PolicyRule.objects.create(
        policy=policy, tool_pattern="bulk__*", condition="true", outcome=Outcome.ALLOW
    )
    assert extra in listed(second) and extra not in listed(agent)
    PolicyRule.objects.filter(policy=policy).update(outcome=Outcome.DENY)
    assert extra not in listed(second)


@pytest.mark.django_db
def test_listed_decides_as_decide_does(agent: Agent) -> None:
    """Evaluator.listed (one decision per kind of answer) against decide (per tool), over
    explicit listings, patterns, approval effects and allow, deny and approval rules."""
    ids = bulk_tools(12)
    allow(agent.tenant, *ids[:4], name="explicit")
    patterned = Policy.objects.create(
        tenant=agent.tenant, name="patterned", tool_patterns="bulk__tool_000[4-6]"
    )
    Policy.objects.create(
        tenant=agent.tenant,
        name="held",
        tool_patterns="bulk__tool_0002\nbulk__tool_0005",
        approval_effects=["read_only"],
    )
    for pattern, outcome in (
        ("bulk__tool_0007", Outcome.ALLOW),
        ("bulk__tool_0008", Outcome.DENY),
        ("bulk__tool_000[89]", Outcome.REQUIRE_APPROVAL),
        ("bulk__tool_001*", Outcome.ALLOW),
        ("bulk__tool_0000", Outcome.DENY),
    ):
        PolicyRule.objects.create(
            policy=patterned, tool_pattern=pattern, condition="true", outcome=outcome
        )
    user = ApiKey.objects.get(tenant=agent.tenant, principal=agent.principal).user
    evaluator = Evaluator(agent.tenant, agent.principal, user)
    for tool in Tool.objects.all():
        expected = Evaluator(agent.tenant, agent.principal, user).decide(tool)
        assert evaluator.listed(tool) == (expected if expected.allowed else None), tool.pk
    assert {t.pk for t in Tool.objects.filter(pk__in=ids) if evaluator.listed(t)} == {
        *ids[:8],
        *ids[10:],
    }


@pytest.mark.django_db
def test_an_evaluator_is_kept_across_other_edits_and_rebuilt_after_a_policy_edit(
    agent: Agent,
) -> None:
    user = ApiKey.objects.get(tenant=agent.tenant, principal=agent.principal).user
    policy = Policy.objects.get(tenant=agent.tenant)

    def evaluator() -> Evaluator:
        with epoch.pinned():
            return evaluator_for(agent.tenant, agent.principal, user)

    kept = evaluator()
    epoch.bump()  # an edit of something else: a grant, a key, a tool
    assert evaluator() is kept
    for write in (
        lambda: Policy.objects.get(pk=policy.pk).save(),
        lambda: Policy.objects.filter(pk=policy.pk).update(four_eyes=True),
        lambda: PolicyRule.objects.create(policy=policy, tool_pattern=TOOL, condition="true"),
        lambda: PolicyRule.objects.filter(policy=policy).update(condition="false"),
        lambda: PolicyRule.objects.filter(policy=policy).delete(),
        lambda: policy.tools.remove(Tool.objects.get(pk=TOOL)),
        lambda: Tool.objects.filter(pk__in=bulk_tools(1)).delete(),
    ):
        write()
        assert evaluator() is not kept
        kept = evaluator()
    assert TOOL not in listed(agent)
    # The caller's groups are part of the key: a group's policy holds for its members.
    group = Group.objects.create(name=tenant_group_name(agent.tenant, "extra"))
    Policy.objects.create(tenant=agent.tenant, name="extra", group=group).tools.add(
        Tool.objects.get(pk=TOOL)
    )
    assert TOOL not in listed(agent)
    kept = evaluator()
    user.groups.add(group)
    assert evaluator() is not kept
    assert TOOL in listed(agent)
    user.groups.remove(group)
    assert TOOL not in listed(agent)


@contextmanager
def edit_mid_build(tool_id: str, **change: Any) -> Iterator[None]:
    """A connection wrapper: right after the catalog reads the tools' stamps, `change` is
    written to the tool (another request's edit landing between two of this one's reads)."""
    done: list[str] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if not done and '"updated_at"' in sql and "tools_tool" in sql and "SELECT" in sql:
            done.append(sql)
            Tool.objects.filter(pk=tool_id).update(**change)
        return result

    with connection.execute_wrapper(wrapper):
        yield
    assert done, "the catalog did not read the tools' stamps"


@pytest.mark.django_db
@pytest.mark.parametrize("log", ["kept", "lost"])
def test_a_tool_edited_while_a_catalog_is_built(agent: Agent, log: str) -> None:
    """With the tools epoch's log, the rows written since are loaded again (one read);
    without it (lost: too old, a flushed table), every stamp is read, then the stale rows."""
    ids = bulk_tools(3)
    allow(agent.tenant, *ids)
    listed(agent)

    def forget() -> None:
        if log == "lost":
            EpochChange.objects.all().delete()

    Tool.objects.filter(pk=ids[1]).update(description="first edit")
    forget()
    with edit_mid_build(ids[1], description="landed mid-build"):
        listed(agent)
    assert listed(agent)[ids[1]]["description"] == "landed mid-build"
    Tool.objects.filter(pk=ids[2]).update(description="another edit")
    forget()
    with edit_mid_build(ids[2], enabled=False):
        mid_build = listed(agent)
    if log == "lost":
        assert ids[2] not in mid_build  # loaded after the stamps: usable() again
    assert ids[2] not in listed(agent)  # either way, the next catalog has the edit
    assert ids[0] in listed(agent)


_EDITOR = textwrap.dedent(
    """
    import sys
    import django
    django.setup()
    from django.contrib.auth.models import Group, User
    from guardian.shortcuts import assign_perm, remove_perm
    from apps.policies.models import Policy
    from apps.tools.models import Tool
    for line in sys.stdin:
        model, pk, field, value = line.strip().split(" ", 3)
        if model == "grant":  # grant <group id> <assign|remove> <tool id>
            change = assign_perm if field == "assign" else remove_perm
            change("tools.execute_tool", Group.objects.get(pk=pk), Tool.objects.get(pk=value))
        elif model == "user":  # user <user id> <join|leave> <group id>
            groups = User.objects.get(pk=pk).groups
            (groups.add if field == "join" else groups.remove)(Group.objects.get(pk=value))
        else:
            row = (Tool if model == "tool" else Policy).objects.get(pk=pk)
            setattr(row, field, value == "True" if field == "enabled" else value)
            row.save()
        print("saved", flush=True)
    """
)


@pytest.fixture
def other_process() -> Iterator[subprocess.Popen[str]]:
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "toolhub.settings",
        "TOOLHUB_SECRET_KEY": os.environ.get("TOOLHUB_SECRET_KEY") or "x" * 50,
    }
    editor = subprocess.Popen(
        [sys.executable, "-c", _EDITOR],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield editor
    finally:
        assert editor.stdin is not None
        editor.stdin.close()
        editor.wait(30)


def edit(editor: subprocess.Popen[str], line: str) -> None:
    assert editor.stdin is not None and editor.stdout is not None
    editor.stdin.write(line + "\n")
    editor.stdin.flush()
    assert editor.stdout.readline().strip() == "saved"


@pytest.mark.django_db(transaction=True)
def test_an_edit_in_another_process_shows_on_the_next_catalog_here(
    other_process: subprocess.Popen[str],
) -> None:
    agent = make_agent("acme")
    allow(agent.tenant, *CORE_TOOLS)
    assert listed(agent)[TOOL]["description"] != "Edited elsewhere"
    assert TOOL in listed(agent, format="openai")
    edit(other_process, f"tool {TOOL} description Edited elsewhere")
    assert listed(agent)[TOOL]["description"] == "Edited elsewhere"
    assert listed(agent, format="openai")[TOOL]["function"]["description"] == "Edited elsewhere"
    edit(other_process, f"tool {TOOL} enabled False")
    assert TOOL not in listed(agent)
    edit(other_process, f"tool {TOOL} enabled True")
    assert TOOL in listed(agent)
    # The evaluator kept under the policies epoch: a policy disabled there holds here.
    policy = Policy.objects.get(tenant=agent.tenant)
    edit(other_process, f"policy {policy.pk} enabled False")
    assert listed(agent) == {}
    edit(other_process, f"policy {policy.pk} enabled True")
    assert TOOL in listed(agent)


@pytest.mark.django_db(transaction=True)
def test_a_grant_or_membership_edited_in_another_process_shows_on_the_next_catalog_here(
    other_process: subprocess.Popen[str],
) -> None:
    agent = make_agent("acme")
    allow(agent.tenant, *CORE_TOOLS)
    group = agents_group(agent.tenant)
    user = ApiKey.objects.get(tenant=agent.tenant, principal=agent.principal).user
    assert TOOL in listed(agent)
    edit(other_process, f"grant {group.pk} remove {TOOL}")
    assert TOOL not in listed(agent)
    assert TOOL not in listed(agent, format="openai")
    edit(other_process, f"grant {group.pk} assign {TOOL}")
    assert TOOL in listed(agent)
    edit(other_process, f"user {user.pk} leave {group.pk}")
    assert listed(agent) == {}
    edit(other_process, f"user {user.pk} join {group.pk}")
    assert TOOL in listed(agent)


@pytest.mark.django_db
def test_only_writes_of_who_holds_a_permission_change_the_grants_epoch(agent: Agent) -> None:
    user = ApiKey.objects.get(tenant=agent.tenant, principal=agent.principal).user
    group = agents_group(agent.tenant)
    extra = Group.objects.create(name=tenant_group_name(agent.tenant, "extra"))
    tool = Tool.objects.get(pk=TOOL)
    (other,) = bulk_tools(1)
    execute = Permission.objects.get(codename="execute_tool")
    granting = [
        lambda: remove_perm("tools.execute_tool", group, tool),  # a delete
        lambda: assign_perm("tools.execute_tool", group, tool),  # a save
        # (guardian's stubs name one object; a queryset is one bulk write)
        lambda: assign_perm("tools.execute_tool", extra, Tool.objects.filter(pk=other)),  # type: ignore[arg-type]
        lambda: assign_perm("tools.execute_tool", user, tool),  # a user's own grant
        lambda: user.groups.add(extra),
        lambda: user.groups.remove(extra),
        lambda: extra.user_set.add(user),
        lambda: user.user_permissions.add(execute),
        lambda: user.user_permissions.clear(),
        lambda: extra.permissions.add(execute),
        lambda: Group.objects.filter(pk=extra.pk).delete(),
        lambda: User.objects.filter(pk=user.pk).update(is_active=True),
    ]
    for write in granting:
        at = epoch.read(epoch.GRANTS_ROW)
        write()
        assert epoch.read(epoch.GRANTS_ROW) != at
    unrelated = [
        lambda: Policy.objects.filter(tenant=agent.tenant).update(four_eyes=True),
        lambda: Tool.objects.filter(pk=TOOL).update(description="edited"),
        lambda: Tenant.objects.filter(pk=agent.tenant.pk).update(name="Renamed"),
        lambda: epoch.bump(),
    ]
    for write in unrelated:
        at, authz = epoch.read(epoch.GRANTS_ROW), epoch.read()
        write()
        assert epoch.read(epoch.GRANTS_ROW) == at
        assert epoch.read() != authz


@pytest.mark.django_db
def test_an_unrelated_edit_keeps_the_grants_the_catalog_and_its_body(agent: Agent) -> None:
    user = ApiKey.objects.get(tenant=agent.tenant, principal=agent.principal).user
    with epoch.pinned():
        granted = grants.executable_ids(user)
        kept = catalog_of(agent, user)
    assert granted is not None and TOOL in granted
    body = agent.tools().content
    for write in (
        lambda: epoch.bump(),
        lambda: Tenant.objects.filter(pk=agent.tenant.pk).update(name="Renamed"),
        # another user's grant: the grants are read again, equal, and so the same object
        lambda: assign_perm("tools.execute_tool", User.objects.create(username="x"), tool_row()),
    ):
        write()
        with epoch.pinned():
            assert grants.executable_ids(user) is granted
            assert catalog_of(agent, user) is kept
        assert agent.tools().content == body
    # A grant of this caller's is a new answer and a new catalog.
    remove_perm("tools.execute_tool", agents_group(agent.tenant), tool_row())
    with epoch.pinned():
        assert TOOL not in (grants.executable_ids(user) or ())
        assert catalog_of(agent, user) is not kept
    assert TOOL not in listed(agent)


def tool_row() -> Tool:
    return Tool.objects.get(pk=TOOL)


def catalog_of(agent: Agent, user: User) -> list[Any]:
    from apps.policies.policy import catalog

    return catalog(agent.tenant, agent.principal, user)


@contextmanager
def revoke_mid_build(group: Group, tool_id: str) -> Iterator[None]:
    """A connection wrapper: right after the catalog reads the caller's grants, the grant
    on `tool_id` is revoked (another request's edit landing between two of this one's
    reads: after the grants epoch was read, before the catalog is kept)."""
    done: list[str] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if not done and "groupobjectpermission" in sql and "SELECT" in sql:
            done.append(sql)
            remove_perm("tools.execute_tool", group, Tool.objects.get(pk=tool_id))
        return result

    with connection.execute_wrapper(wrapper):
        yield
    assert done, "the catalog did not read the grants"


@pytest.mark.django_db
def test_a_grant_revoked_while_a_catalog_is_built_leaves_the_next_catalog(agent: Agent) -> None:
    listed(agent)
    epoch.bump_row(epoch.GRANTS_ROW)  # so the next catalog reads the grants again
    epoch.bump()
    with revoke_mid_build(agents_group(agent.tenant), TOOL):
        listed(agent)  # read before the revocation: may list it
    assert TOOL not in listed(agent)
    assert TOOL not in listed(agent, format="anthropic")
    assert "core__planning_read_plan" in listed(agent)


@pytest.mark.django_db
def test_ten_thousand_tools_with_one_changed(agent: Agent) -> None:
    """Each change to one of 10,000 tools shows on the next catalog, and the rest stay."""
    ids = bulk_tools(10_000)
    policy = Policy.objects.get(tenant=agent.tenant)
    # Written as the bench writes them (signals for 10,000 rows would be most of the test).
    Policy.tools.through.objects.bulk_create(
        [Policy.tools.through(policy_id=policy.pk, tool_id=pk) for pk in ids]
    )
    epoch.bump_row(epoch.POLICIES_ROW)
    group = agents_group(agent.tenant)
    execute = Permission.objects.get(codename="execute_tool")
    kind = ContentType.objects.get_for_model(Tool)
    GroupObjectPermission.objects.bulk_create(
        [
            GroupObjectPermission(group=group, permission=execute, content_type=kind, object_pk=pk)
            for pk in ids
        ]
    )
    user = ApiKey.objects.get(tenant=agent.tenant, principal=agent.principal).user

    def ids_listed() -> set[str]:
        with epoch.pinned():
            return {tool.id for tool, _ in catalog_of(agent, user)}

    everything = set(ids) | set(CORE_TOOLS)
    assert ids_listed() == everything
    remove_perm("tools.execute_tool", group, Tool.objects.get(pk=ids[4321]))
    assert ids_listed() == everything - {ids[4321]}
    Tool.objects.filter(pk=ids[17]).update(enabled=False)
    assert ids_listed() == everything - {ids[4321], ids[17]}
    Tool.objects.filter(pk=ids[9999]).update(description="the last one, edited")
    after = listed(agent)  # the body too, once
    assert set(after) == everything - {ids[4321], ids[17]}
    assert after[ids[9999]]["description"] == "the last one, edited"
    assign_perm("tools.execute_tool", group, Tool.objects.get(pk=ids[4321]))
    Tool.objects.filter(pk=ids[17]).update(enabled=True)
    assert ids_listed() == everything


@pytest.mark.django_db
def test_a_principal_whose_groups_change(agent: Agent) -> None:
    """Grants held through a group follow the membership, and the group's existence."""
    (extra_tool,) = bulk_tools(1)
    Policy.objects.get(tenant=agent.tenant).tools.add(Tool.objects.get(pk=extra_tool))
    user = ApiKey.objects.get(tenant=agent.tenant, principal=agent.principal).user
    extra = Group.objects.create(name=tenant_group_name(agent.tenant, "extra"))
    assign_perm("tools.execute_tool", extra, Tool.objects.get(pk=extra_tool))
    assert extra_tool not in listed(agent)
    user.groups.add(extra)
    assert extra_tool in listed(agent)
    user.groups.remove(extra)
    assert extra_tool not in listed(agent)
    extra.user_set.add(user)
    assert extra_tool in listed(agent)
    Group.objects.filter(pk=extra.pk).delete()  # its members and grants go with it
    assert extra_tool not in listed(agent)
    # execute_tool held globally through a group: every usable listed tool.
    user.groups.remove(agents_group(agent.tenant))
    assert listed(agent) == {}
    every = Group.objects.create(name=tenant_group_name(agent.tenant, "every"))
    every.permissions.add(Permission.objects.get(codename="execute_tool"))
    user.groups.add(every)
    assert set(listed(agent)) == {*CORE_TOOLS, extra_tool}
    every.permissions.clear()
    assert listed(agent) == {}
