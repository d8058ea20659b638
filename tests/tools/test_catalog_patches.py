"""The catalog patched from the epochs' logs (issue 45) answers as one made from scratch.

After a tool's or a policy's edit, the tools and policies epochs' logs (EpochChange) name
the rows written, and the catalog reloads those, re-decides the tools they touch and
patches what it kept: the rows, the evaluator, its catalog and the encoded entries. Each
test makes a long run of random edits of every kind and, after each, compares what the
API lists and what the kept evaluator decides with what a fresh read of everything gives.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from guardian.shortcuts import assign_perm, remove_perm

from apps.policies.models import Outcome, Policy, PolicyRule
from apps.policies.policy import Catalog, Evaluator, evaluator_for
from apps.tenants import epoch
from apps.tenants.models import ApiKey, EpochChange
from apps.tenants.principals import agents_group
from apps.tenants.scoping import tenant_group_name
from apps.tools import grants, listing, rows
from apps.tools.models import Tool
from tests.conftest import Agent
from tests.tools.test_catalog_caches import bulk_tools

EFFECTS = ["read_only", "state_change", "external_side_effect"]
PATTERNS = ["", "bulk__tool_000*", "core__*", "bulk__tool_001?\ncore__planning_*"]
CONDITIONS = ["true", "false", "args.q == 'x'", "principal == 'agent:test'"]


def fresh_catalog(agent: Agent, user: User, wire_format: str) -> list[Any]:
    """The catalog from nothing kept: every row, policy and grant read now."""
    evaluator = Evaluator(agent.tenant, agent.principal, user)
    usable = Tool.objects.usable().order_by("pk")
    granted = grants._read(user)
    made = []
    for tool in usable:
        decision = evaluator.listed(tool)
        if decision is not None and (granted is grants.EVERY or tool.pk in granted):
            made.append(json.loads(listing._entry(tool, decision, wire_format)))
    return made


def decisions(evaluator: Evaluator, tools: list[Tool]) -> list[Any]:
    """Each tool's decision with arguments (its rules evaluated) and without."""
    out = []
    for tool in tools:
        for args in (None, {"q": "x"}, {"q": "y"}):
            out.append((tool.pk, args, evaluator.decide(tool, args)))
    return out


class Edits:
    def __init__(self, agent: Agent, rng: random.Random) -> None:
        self.agent, self.rng = agent, rng
        self.tenant = agent.tenant
        self.group = agents_group(self.tenant)
        self.other_group = Group.objects.create(name=tenant_group_name(self.tenant, "other"))
        self.ids = bulk_tools(24)
        assign_perm("tools.execute_tool", self.group, Tool.objects.filter(pk__in=self.ids))  # type: ignore[arg-type]
        for n in range(6):
            self.new_policy(f"p{n}")

    def tool(self) -> Tool:
        return Tool.objects.get(pk=self.rng.choice([*self.ids, "core__get_current_time"]))

    def policy(self) -> Policy:
        found = list(Policy.objects.filter(tenant=self.tenant).order_by("pk"))
        return self.rng.choice(found)

    def new_policy(self, name: str) -> None:
        policy = Policy.objects.create(tenant=self.tenant, name=name)
        policy.tools.add(*Tool.objects.filter(pk__in=self.rng.sample(self.ids, 6)))

    def run(self) -> str:
        edit = self.rng.choice([m for m in dir(self) if m.startswith("e_")])
        getattr(self, edit)()
        return edit

    # Policies, by save
    def e_enabled(self) -> None:
        p = self.policy()
        p.enabled = not p.enabled
        p.save()

    def e_terms(self) -> None:
        p = self.policy()
        p.approval_effects = self.rng.sample(EFFECTS, self.rng.randint(0, 2))
        p.four_eyes = self.rng.random() < 0.5
        p.approval_timeout_minutes = self.rng.randint(1, 30)
        p.max_runtime_ms = self.rng.choice([None, 500, 2000])
        p.calls_per_minute = self.rng.choice([None, 10])
        p.name = f"{p.name.split('~')[0]}~{self.rng.randint(0, 99)}"
        p.save()

    def e_caller(self) -> None:
        p = self.policy()
        p.principal = self.rng.choice(["", self.agent.principal, "agent:other"])
        p.group = self.rng.choice([None, self.group, self.other_group])
        p.save()

    def e_patterns(self) -> None:
        p = self.policy()
        p.tool_patterns = self.rng.choice(PATTERNS)
        p.save()

    # Listings, from either side, and in bulk
    def e_list(self) -> None:
        self.policy().tools.add(self.tool())

    def e_unlist(self) -> None:
        p = self.policy()
        listed = list(p.tools.all())
        if listed:
            p.tools.remove(self.rng.choice(listed))

    def e_list_from_the_tool(self) -> None:
        tool = self.tool()
        if self.rng.random() < 0.5:
            tool.policies.add(self.policy())
        else:
            tool.policies.remove(self.policy())

    def e_policies_in_bulk(self) -> None:
        chosen = [self.policy().pk for _ in range(2)]
        Policy.objects.filter(pk__in=chosen).update(enabled=self.rng.random() < 0.6)

    def e_create_or_delete_policy(self) -> None:
        if self.rng.random() < 0.5 or Policy.objects.filter(tenant=self.tenant).count() < 3:
            self.new_policy(f"new{self.rng.randint(0, 10**6)}")
        else:
            self.policy().delete()

    # Rules
    def e_rule(self) -> None:
        pattern = self.rng.choice([self.tool().pk, "bulk__tool_00*", "*"])
        PolicyRule.objects.create(
            policy=self.policy(),
            position=self.rng.randint(0, 3),
            tool_pattern=pattern,
            condition=self.rng.choice(CONDITIONS),
            outcome=self.rng.choice(Outcome.values),
        )

    def e_rule_edited_or_deleted(self) -> None:
        rules = list(PolicyRule.objects.filter(policy__tenant=self.tenant))
        if not rules:
            return
        rule = self.rng.choice(rules)
        if self.rng.random() < 0.4:
            rule.delete()
        elif self.rng.random() < 0.5:
            PolicyRule.objects.filter(pk=rule.pk).update(condition=self.rng.choice(CONDITIONS))
        else:
            rule.outcome = self.rng.choice(Outcome.values)
            rule.tool_pattern = self.rng.choice([self.tool().pk, "*"])
            rule.save()

    # Tools
    def e_tool_saved(self) -> None:
        tool = self.tool()
        tool.effect = self.rng.choice(EFFECTS)
        tool.requires_confirmation = self.rng.random() < 0.3
        tool.description = f"Edited {self.rng.randint(0, 99)}"
        tool.save()

    def e_tool_enabled_in_bulk(self) -> None:
        Tool.objects.filter(pk__in=[self.tool().pk, self.tool().pk]).update(
            enabled=self.rng.random() < 0.7
        )

    def e_tool_created_or_deleted(self) -> None:
        made = f"made__tool_{self.rng.randint(0, 10**6):07}"
        if self.rng.random() < 0.5:
            Tool.objects.bulk_create(
                [
                    Tool(
                        id=made,
                        name=made,
                        description="made",
                        input_schema={"type": "object"},
                        effect="read_only",
                    )
                ]
            )
            assign_perm("tools.execute_tool", self.group, Tool.objects.get(pk=made))
            self.ids.append(made)
        else:
            victim = self.rng.choice(self.ids)
            Tool.objects.filter(pk=victim).delete()
            self.ids.remove(victim)

    # Grants, and edits of nothing the catalog is made of
    def e_grant(self) -> None:
        tool = self.tool()
        if self.rng.random() < 0.5:
            remove_perm("tools.execute_tool", self.group, tool)
        else:
            assign_perm("tools.execute_tool", self.group, tool)

    def e_user_grant_or_membership(self) -> None:
        user = ApiKey.objects.get(tenant=self.tenant, principal=self.agent.principal).user
        choice = self.rng.random()
        if choice < 0.3:
            assign_perm("tools.execute_tool", self.other_group, self.tool())
        elif choice < 0.6:
            assign_perm("tools.execute_tool", user, self.tool())
        elif choice < 0.8:
            user.groups.add(self.other_group)
        else:
            user.groups.remove(self.other_group)

    def e_unrelated(self) -> None:
        epoch.bump()


@pytest.mark.django_db
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_long_run_of_edits_lists_and_decides_as_a_fresh_read(
    agent: Agent, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken: Counter[str] = Counter()  # the patched paths did run, not only the full ones
    for owner, name in (
        (Evaluator, "_read_changed"),
        (Evaluator, "_patched"),
        (Catalog, "patched"),
        (rows, "_patched"),
        (grants, "_patched"),
    ):
        real = getattr(owner, name)

        label = f"grants {name}" if owner is grants else name

        def counted(*args: Any, _real: Any = real, _label: str = label, **kw: Any) -> Any:
            found = _real(*args, **kw)
            taken[_label] += 1
            taken[f"{_label} declined"] += found is None
            return found

        monkeypatch.setattr(owner, name, counted)
    rng = random.Random(seed)
    user = ApiKey.objects.get(tenant=agent.tenant, principal=agent.principal).user
    edits = Edits(agent, rng)
    done = []
    for _ in range(70):
        done.append(edits.run())
        wire_format = rng.choice(["", "openai"])
        response = agent.tools(format=wire_format) if wire_format else agent.tools()
        assert response.status_code == 200
        body = response.json()
        expected = fresh_catalog(agent, user, wire_format)
        assert body.get("tools", []) == expected, done
        with epoch.pinned():
            kept = evaluator_for(agent.tenant, agent.principal, user)
        sample = [edits.tool() for _ in range(4)]
        fresh = Evaluator(agent.tenant, agent.principal, user)
        assert decisions(kept, sample) == decisions(fresh, sample), done
    assert taken["_read_changed"] >= 10, taken  # evaluators patched
    assert taken["_patched"] - taken["_patched declined"] >= 10, taken  # rows, catalogs
    assert taken["patched"] >= 10, taken
    assert taken["grants _patched"] - taken["grants _patched declined"] >= 2, taken


@pytest.mark.django_db
def test_the_logs_name_what_each_write_changed(agent: Agent) -> None:
    def last(row: int) -> Any:
        return EpochChange.objects.filter(row=row).order_by("id").last().keys  # type: ignore[union-attr]

    ids = bulk_tools(3)
    assert last(epoch.TOOLS_ROW) == ids
    Tool.objects.filter(pk=ids[1]).update(description="edited")
    assert last(epoch.TOOLS_ROW) == [ids[1]]
    policy = Policy.objects.get(tenant=agent.tenant)
    policy.tools.add(Tool.objects.get(pk=ids[0]))
    assert last(epoch.POLICIES_ROW) == [policy.pk]
    Tool.objects.get(pk=ids[2]).policies.add(policy)  # from the tool's side
    assert last(epoch.POLICIES_ROW) == [policy.pk]
    rule = PolicyRule.objects.create(policy=policy, condition="true", outcome="deny")
    assert last(epoch.POLICIES_ROW) == [policy.pk]
    PolicyRule.objects.filter(pk=rule.pk).update(condition="false")
    assert last(epoch.POLICIES_ROW) == [policy.pk]
    Tool.objects.filter(pk=ids[2]).delete()  # its listings went: which policies is not known
    assert last(epoch.TOOLS_ROW) == [ids[2]]
    assert last(epoch.POLICIES_ROW) is None
    Tool.objects.get(pk=ids[0]).policies.clear()  # a clear from the tool's side names none
    assert last(epoch.POLICIES_ROW) is None
    group = agents_group(agent.tenant)
    assign_perm("tools.execute_tool", group, Tool.objects.get(pk=ids[0]))
    assert last(epoch.GRANTS_ROW) == [ids[0]]
    assign_perm("tools.execute_tool", group, Tool.objects.filter(pk__in=ids[:2]))  # type: ignore[arg-type]
    assert last(epoch.GRANTS_ROW) == [ids[1]]  # (ids[0] held already: not written)
    remove_perm("tools.execute_tool", group, Tool.objects.get(pk=ids[1]))
    assert last(epoch.GRANTS_ROW) == [ids[1]]
    user = ApiKey.objects.get(tenant=agent.tenant, principal=agent.principal).user
    user.groups.remove(group)  # a membership: which objects is not known
    assert last(epoch.GRANTS_ROW) is None


@pytest.mark.django_db
def test_changes_since_a_value_it_cannot_account_for_are_not_known(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = bulk_tools(2)
    start = epoch.read(epoch.TOOLS_ROW)
    Tool.objects.filter(pk=ids[0]).update(description="one")
    Tool.objects.filter(pk=ids[1]).update(description="two")
    now = epoch.read(epoch.TOOLS_ROW)
    assert epoch.changes_since(epoch.TOOLS_ROW, start, now) == {ids[0], ids[1]}
    assert epoch.changes_since(epoch.TOOLS_ROW, now, now) == set()
    assert epoch.changes_since(epoch.TOOLS_ROW, None, now) is None
    assert epoch.changes_since(epoch.TOOLS_ROW, 12345, now) is None  # not in the log
    assert epoch.changes_since(epoch.TOOLS_ROW, start, 12345) is None  # `now` not reached
    # A bulk write of more tools than the log names: not known.
    monkeypatch.setattr(epoch, "MAX_KEYS", 3)
    Tool.objects.update(description="all of them")
    assert epoch.changes_since(epoch.TOOLS_ROW, now, epoch.read(epoch.TOOLS_ROW)) is None
    # The log keeps the last KEEP_CHANGES per row: an older value is not known.
    EpochChange.objects.filter(row=epoch.TOOLS_ROW, value=start).delete()
    assert epoch.changes_since(epoch.TOOLS_ROW, start, now) is None


@pytest.mark.django_db
def test_a_patched_catalog_encodes_only_what_changed(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = bulk_tools(50)
    Policy.objects.get(tenant=agent.tenant).tools.add(*Tool.objects.filter(pk__in=ids))
    assign_perm("tools.execute_tool", agents_group(agent.tenant), Tool.objects.filter(pk__in=ids))  # type: ignore[arg-type]
    agent.tools()
    before = rows.usable()
    Tool.objects.filter(pk=ids[3]).update(description="Patched")
    encoded: list[str] = []
    real = listing._entry

    def spy(tool: Tool, decision: Any, wire_format: str) -> bytes:
        encoded.append(tool.pk)
        return real(tool, decision, wire_format)

    monkeypatch.setattr(listing, "_entry", spy)
    body = agent.tools().json()
    after = rows.usable()
    assert after.base is before and after.changed == {ids[3]}
    assert encoded == [ids[3]]  # one entry encoded again, not 55
    assert {t["id"]: t for t in body["tools"]}[ids[3]]["description"] == "Patched"
    # A policy edited that lists some of them: those decided and encoded again.
    encoded.clear()
    policy = Policy.objects.create(tenant=agent.tenant, name="approve some")
    policy.approval_effects = ["read_only"]
    policy.save()
    policy.tools.add(*Tool.objects.filter(pk__in=ids[:5]))
    body = agent.tools().json()
    assert sorted(encoded) == sorted(ids[:5])
    held = {t["id"] for t in body["tools"] if t["requiresApproval"]}
    assert held == set(ids[:5])


@pytest.mark.django_db
def test_a_tool_only_a_rule_allows_follows_that_rules_policy(agent: Agent) -> None:
    """Its decision names the rule's policy, which does not list it: a rename of that
    policy is a new decision though no policy listing the tool changed."""
    (pk,) = bulk_tools(1)
    tool = Tool.objects.get(pk=pk)
    policy = Policy.objects.create(tenant=agent.tenant, name="rules only")
    PolicyRule.objects.create(policy=policy, tool_pattern=pk, condition="true", outcome="allow")
    user = ApiKey.objects.get(tenant=agent.tenant, principal=agent.principal).user

    def listed() -> Any:
        with epoch.pinned():
            return evaluator_for(agent.tenant, agent.principal, user).listed(tool)

    assert "rules only" in listed().rule
    policy.name = "renamed"
    policy.save()
    assert "renamed" in listed().rule


@pytest.mark.django_db
def test_the_log_forgets_its_oldest_changes_and_a_process_that_kept_one_reads_all(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(epoch, "KEEP_CHANGES", 5)
    (pk,) = bulk_tools(1)
    agent.tools()
    start = epoch.read(epoch.TOOLS_ROW)
    before = rows.usable()
    for n in range(130):
        Tool.objects.filter(pk=pk).update(description=f"edit {n}")
    assert EpochChange.objects.filter(row=epoch.TOOLS_ROW).count() <= 5 + 64
    assert epoch.changes_since(epoch.TOOLS_ROW, start, epoch.read(epoch.TOOLS_ROW)) is None
    after = rows.usable()  # every stamp read: the edited row, the others kept
    assert after.base is None and after[pk].description == "edit 129"
    assert all(after[k] is before[k] for k in before if k != pk)
