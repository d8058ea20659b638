"""The policy evaluator: the one place that says allow, deny or require_approval.

Precedence: deny beats require_approval beats allow, and nothing matching means
deny (DENY_BY_DEFAULT). A tool is allowed when an applicable policy lists it
(explicitly or by pattern) or an `allow` rule's condition holds; approval is
required when such a policy names the tool's effect, or a `require_approval`
rule holds; any `deny` rule that holds, or any rule that fails to evaluate,
denies. The catalog a caller sees and the runner's check both come from here.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import threading
from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Literal

from django.db.models import Q, QuerySet

from apps.policies import conditions
from apps.policies.models import Outcome, Policy, PolicyRule
from apps.tenants import epoch
from apps.tenants.epoch import EpochCache
from apps.tenants.models import Tenant
from apps.tools import grants, rows
from apps.tools.models import Tool
from apps.tools.rows import Rows

if TYPE_CHECKING:
    from django.contrib.auth.models import User

OutcomeName = Literal["allow", "deny", "require_approval"]
PRECEDENCE: dict[str, int] = {Outcome.ALLOW: 0, Outcome.REQUIRE_APPROVAL: 1, Outcome.DENY: 2}


@dataclass(frozen=True)
class Budgets:
    max_runtime_ms: int | None = None
    max_result_bytes: int | None = None
    calls_per_minute: int | None = None


@dataclass(frozen=True)
class ApprovalTerms:
    """How a held call is decided: the strictest terms of the policies admitting it."""

    timeout_minutes: int = 15
    four_eyes: bool = False
    high_consequence_quorum: int = 1


@dataclass(frozen=True)
class Decision:
    outcome: OutcomeName
    rule: str  # which policy or rule decided; recorded with the call
    reason: str
    budgets: Budgets = field(default_factory=Budgets)
    approval: ApprovalTerms = field(default_factory=ApprovalTerms)

    @property
    def allowed(self) -> bool:
        return self.outcome != "deny"

    @property
    def requires_approval(self) -> bool:
        return self.outcome == "require_approval"


DEFAULT_DENY = "default:deny"
# How a reason names what a matching rule did; the rule's name lets a model or a person
# see which condition to satisfy.
VERDICT_WORDS: dict[str, str] = {
    Outcome.ALLOW: "allows this call",
    Outcome.DENY: "denies this call",
    Outcome.REQUIRE_APPROVAL: "holds this call for a human",
}


class Evaluator:
    """The policies in force for one caller, loaded once (three queries), decided per tool."""

    _by_signature: dict[tuple[Any, ...], Decision]  # listed()'s decision per kind of answer
    _listing_tool: dict[str, list[Policy]]  # tool id -> the policies listing it, in order
    _listing_ids: dict[str, tuple[int, ...]]  # ... and their ids
    _seen: dict[str, tuple[Tool, Decision | None]]  # listed() per tool row
    # From the evaluator this one was patched from: its catalog, of which rows, and the
    # tools the policies written since may decide otherwise (allowed_of).
    _inherited: tuple[Rows, Catalog, frozenset[str]] | None

    def __init__(
        self,
        tenant: Tenant,
        principal: str,
        user: User | None,
        group_ids: frozenset[int] | None = None,
        *,
        base: Evaluator | None = None,
        changed: set[int] | None = None,
    ) -> None:
        """`base` and `changed`: an evaluator of the same caller at an older policies
        epoch, and the ids of the policies written since (the epoch's log): only those
        are read again, and what `base` decided of the tools they do not touch is kept."""
        # The user's groups as a subquery, not a query of their own (issue 13), unless
        # the caller read them (`group_ids`: evaluator_for keeps evaluators by them).
        if group_ids is not None:
            in_groups = Q(group__in=sorted(group_ids))
        else:
            in_groups = Q(group__in=user.groups.all()) if user is not None else Q(pk__in=[])
        self.principal = principal
        in_force = (
            Policy.objects.in_force(tenant)
            .filter(Q(group__isnull=True) | in_groups)
            .filter(Q(principal="") | Q(principal=principal))
        )
        if base is not None and changed is not None:
            self._read_changed(in_force, base, changed)
        else:
            self._read(in_force)
        self._index(base, changed)
        if base is not None and changed is not None:
            self._inherit(base, changed)

    def _read(self, in_force: QuerySet[Policy]) -> None:
        self.policies = list(in_force.order_by("pk"))
        self._read_of(self.policies, in_force.values("pk"))

    def _read_of(self, policies: list[Policy], ids: Any) -> None:
        """The listed tools' ids and rules of `policies` (`ids`: their ids, a subquery or
        a list), into tool_ids and rules_of."""
        by_id = {p.id: p for p in policies}
        # Their listed tools' ids and their rules in a query each, by policy id (policies
        # that came in force between the reads left out): not a Tool instance for each of
        # 10,000 listings, nor a related manager per policy (issue 45: 0.7 s of a cold
        # catalog with 1,000 policies).
        self.tool_ids: dict[int, list[str]] = {pk: [] for pk in by_id}
        listings = Policy.tools.through.objects.filter(policy__in=ids)
        for policy_id, tool_id in listings.order_by("pk").values_list("policy_id", "tool_id"):
            if policy_id in by_id:
                self.tool_ids[policy_id].append(tool_id)
        self.rules_of: dict[int, list[PolicyRule]] = {pk: [] for pk in by_id}
        in_rules = PolicyRule.objects.filter(policy__in=ids)
        for rule in in_rules.order_by("policy_id", "position", "pk"):
            if rule.policy_id in by_id:
                rule.policy = by_id[rule.policy_id]
                self.rules_of[rule.policy_id].append(rule)

    def _read_changed(self, in_force: QuerySet[Policy], base: Evaluator, changed: set[int]) -> None:
        """`base`'s policies, those in `changed` read again (three queries, whatever the
        number of policies: issue 45, a policy edited among 1,000)."""
        fresh = list(in_force.filter(pk__in=sorted(changed)).order_by("pk"))
        self._read_of(fresh, [p.id for p in fresh])
        tool_ids, rules_of = self.tool_ids, self.rules_of
        kept = [p for p in base.policies if p.id not in changed]
        self.policies = sorted(kept + fresh, key=lambda p: p.id)
        self.tool_ids = {
            p.id: tool_ids[p.id] if p.id in tool_ids else base.tool_ids[p.id] for p in self.policies
        }
        self.rules_of = {
            p.id: rules_of[p.id] if p.id in rules_of else base.rules_of[p.id] for p in self.policies
        }

    def _inherit(self, base: Evaluator, changed: set[int]) -> None:
        """Keep what `base` decided that the `changed` policies (as they were and as they
        are) cannot have changed: the decision of each kind of answer that names none of
        them or their rules, and each tool's they neither list nor name by a rule (every
        tool's, if one of them lists by pattern or has a wildcard rule)."""
        touched_rules: set[int] = set()
        touched_tools: set[str] = set()
        every_tool = False
        for source in (base, self):
            by_pk = {p.id: p for p in source.policies}
            for pk in changed:
                policy = by_pk.get(pk)
                if policy is None:
                    continue
                every_tool = every_tool or bool(policy.tool_patterns.strip())
                touched_tools.update(source.tool_ids[pk])
                for rule in source.rules_of[pk]:
                    touched_rules.add(rule.pk)
                    if _is_wildcard(rule.tool_pattern):
                        every_tool = True
                    else:
                        touched_tools.add(rule.tool_pattern)
        self._by_signature = {
            signature: decision
            for signature, decision in dict(base._by_signature).items()
            if changed.isdisjoint(signature[0]) and touched_rules.isdisjoint(signature[2])
        }
        if not every_tool:
            self._seen = {
                pk: found for pk, found in dict(base._seen).items() if pk not in touched_tools
            }
            before = base._allowed_of
            if before is not None:
                self._inherited = (before[0], before[1], frozenset(touched_tools))

    def _index_changed(self, base: Evaluator, changed: set[int]) -> None:
        """The listings' index: `base`'s, those of the tools the `changed` policies list
        (as they were or as they are) made again."""
        self._listing_tool = dict(base._listing_tool)
        self._listing_ids = dict(base._listing_ids)
        fresh = {p.id: (p, set(self.tool_ids[p.id])) for p in self.policies if p.id in changed}
        touched: set[str] = set()
        for pk in changed:
            touched.update(base.tool_ids.get(pk, ()))
            touched.update(self.tool_ids.get(pk, ()))
        for tool_id in touched:
            admitting = [p for p in base._listing_tool.get(tool_id, ()) if p.id not in changed]
            admitting += [p for p, listed in fresh.values() if tool_id in listed]
            if admitting:
                admitting.sort(key=lambda p: p.id)
                self._listing_tool[tool_id] = admitting
                self._listing_ids[tool_id] = tuple(p.id for p in admitting)
            else:
                self._listing_tool.pop(tool_id, None)
                self._listing_ids.pop(tool_id, None)

    def _index(self, base: Evaluator | None = None, changed: set[int] | None = None) -> None:
        # Indexed once, so a tool's decision reads the policies and rules that name it, not
        # all of them (issue 45: 10,000 tools and 1,000 policies took 100 s to list):
        # explicit listings by tool id (and their policies' ids, a decision's signature in
        # the catalog), patterns and rules apart, each in policy order.
        self._order = {p.id: i for i, p in enumerate(self.policies)}
        if base is not None and changed is not None:
            self._index_changed(base, changed)
        else:
            self._listing_tool = {}
            self._listing_ids = {}
            for policy in self.policies:
                for tool_id in dict.fromkeys(self.tool_ids[policy.id]):
                    self._listing_tool.setdefault(tool_id, []).append(policy)
            for tool_id, admitting in self._listing_tool.items():
                self._listing_ids[tool_id] = tuple(p.id for p in admitting)
        self._patterned = [(p, p.patterns) for p in self.policies if p.tool_patterns.strip()]
        # Read per call, so indexed once (issue 13): the rules in policy order, those for
        # one tool id apart from those with a wildcard.
        rules = [rule for policy in self.policies for rule in self.rules_of[policy.id]]
        self._exact_rules: dict[str, list[PolicyRule]] = {}
        self._wildcard_rules: list[PolicyRule] = []
        for rule in rules:
            if _is_wildcard(rule.tool_pattern):
                self._wildcard_rules.append(rule)
            else:
                self._exact_rules.setdefault(rule.tool_pattern, []).append(rule)
        self._rank = {rule.pk: i for i, rule in enumerate(rules)}
        self._admitting: dict[str, list[Policy]] = {}
        self._listing: dict[tuple[str, str], Decision] = {}
        self._by_signature = {}
        self._allowed_of: tuple[Rows, Catalog] | None = None
        self._inherited = None
        self._seen = {}
        # The last catalog made from allowed_of's list and a caller's grants (catalog()).
        self._visible: tuple[Any, Any, Catalog] | None = None

    @cached_property
    def version(self) -> str:
        """The policy version a call was decided under (receipts name it): a digest of
        every policy and rule in force for this caller, as they read now. Any edit that
        can change a decision changes it; a save that changes nothing does not. Worked
        out once per evaluator (per authorization epoch), not per call."""
        state = [
            [_content(policy), sorted(set(self.tool_ids[policy.pk]))]
            + [_content(rule) for rule in self.rules_of[policy.pk]]
            for policy in self.policies
        ]
        canonical = json.dumps(state, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def admitting(self, tool: Tool) -> list[Policy]:
        """The policies whose allowlist names the tool (callers do not change the list)."""
        if not self._patterned:  # listed by id alone: indexed in policy order already
            return self._listing_tool.get(tool.pk, [])
        found = self._admitting.get(tool.pk)
        if found is None:
            found = list(self._listing_tool.get(tool.pk, ()))
            found += [
                p
                for p, patterns in self._patterned
                if p not in found and any(fnmatch.fnmatchcase(tool.pk, x) for x in patterns)
            ]
            found.sort(key=lambda p: self._order[p.pk])
            self._admitting[tool.pk] = found
        return found

    def rules_for(self, tool: Tool) -> list[PolicyRule]:
        """The rules whose pattern matches the tool, in policy and position order."""
        matching = self._exact_rules.get(tool.pk, []) + [
            rule for rule in self._wildcard_rules if rule.matches(tool)
        ]
        matching.sort(key=lambda rule: self._rank[rule.pk])
        return matching

    def listed(self, tool: Tool) -> Decision | None:
        """The catalog's decision on a tool, None where it is denied: `decide(tool)`'s,
        made once per kind of answer, not per tool (issue 45: 10,000 tools). A tool no
        policy lists and no rule names is denied in O(1); otherwise the answer depends on
        which policies admit it, its effect and which allow rules name it, so tools alike
        in those share one decision."""
        pk = tool.id
        if not self._patterned and not self._wildcard_rules and pk not in self._exact_rules:
            admitted = self._listing_ids.get(pk)
            if admitted is None:
                return None  # nothing names it
            signature: tuple[Any, ...] = (admitted, tool.effect, ())
        else:
            admitting = self.admitting(tool)
            allowing = tuple(r.id for r in self.rules_for(tool) if r.outcome == Outcome.ALLOW)
            if not admitting and not allowing:
                return None  # only deny or approval rules name it: denied at catalog time
            signature = (tuple(p.id for p in admitting), tool.effect, allowing)
        found = self._by_signature.get(signature)
        if found is None:
            found = self._by_signature[signature] = self._decide(tool, None, "")
        return found if found.allowed else None

    def allowed_of(self, usable: Rows) -> Catalog:
        """The tools of `usable` (rows.usable()) this evaluator lists, each with its
        decision, in their order: kept for the last rows seen (both are kept across
        authorization epochs, so a cold catalog after a grant's edit reuses it). After a
        tool's edit only the rows loaded again are decided again (a row is one object
        per version of its tool), and the catalog made of the rows they were patched from
        is patched (`Catalog.patched`) rather than made again, as after a policy's edit
        is the catalog of the evaluator this one was patched from."""
        kept = self._allowed_of
        if kept is not None and kept[0] is usable:
            return kept[1]
        made = None
        if kept is not None and usable.base is kept[0]:
            made = self._patched(kept[1], usable, usable.changed)
        elif kept is None and self._inherited is not None and self._inherited[0] is usable:
            made = self._patched(self._inherited[1], usable, self._inherited[2])
        self._inherited = None
        if made is None:
            made = self._made_of(usable)
        self._allowed_of = (usable, made)
        return made

    def _patched(self, before: Catalog, usable: Rows, changed: frozenset[str]) -> Catalog | None:
        """`before` with the tools `changed` decided again, where none joins or leaves
        it (their places are kept; one that joins or leaves: None, a pass over all)."""
        positions = before.positions
        replaced: dict[int, tuple[Tool, Decision]] = {}
        for pk in changed:
            tool = usable.get(pk)
            decision = None
            if tool is not None:
                decision = self.listed(tool)
                self._seen[pk] = (tool, decision)
            at = positions.get(pk)
            if (at is None) != (decision is None):
                return None
            if at is not None and decision is not None and tool is not None:
                replaced[at] = (tool, decision)
        return before.patched(replaced)

    def _made_of(self, usable: Rows) -> Catalog:
        seen = self._seen
        allowed = []
        for tool in usable.values():
            found = seen.get(tool.id)
            if found is None or found[0] is not tool:
                found = seen[tool.id] = (tool, self.listed(tool))
            if found[1] is not None:
                allowed.append((tool, found[1]))
        if len(seen) > len(usable) + 1_000:  # tools gone since: forget them
            self._seen = {pk: seen[pk] for pk in usable if pk in seen}
        return Catalog(allowed)

    def decide(self, tool: Tool, args: dict[str, Any] | None = None, run_id: str = "") -> Decision:
        """Without `args` (the catalog, step 2 of a call) rules are not evaluated, and the
        decision depends on the tool's id and effect alone: made once per tool. With them,
        rules are evaluated on every call."""
        if args is not None:
            return self._decide(tool, args, run_id)
        key = (tool.pk, tool.effect)
        found = self._listing.get(key)
        if found is None:
            found = self._listing[key] = self._decide(tool, None, run_id)
        return found

    def _decide(self, tool: Tool, args: dict[str, Any] | None, run_id: str) -> Decision:
        candidates: list[tuple[str, str, str]] = []
        admitting = self.admitting(tool)
        for policy in admitting:
            if tool.effect in policy.approval_effects:
                reason = f"Policy {policy.name!r} requires approval for {tool.effect} tools."
                candidates.append((Outcome.REQUIRE_APPROVAL, policy.label, reason))
            else:
                candidates.append(
                    (Outcome.ALLOW, policy.label, f"Allowed by policy {policy.name!r}.")
                )
        budget = conditions.CallBudget()
        for rule in self.rules_for(tool):
            verdict = self._apply(rule, tool, args, run_id, budget)
            if verdict is not None:
                candidates.append(verdict)
        if not any(outcome != Outcome.DENY for outcome, _, _ in candidates):
            if candidates:  # only deny rules spoke
                return Decision("deny", candidates[0][1], candidates[0][2])
            return Decision("deny", DEFAULT_DENY, f"No policy of this tenant allows {tool.id}.")
        outcome, label, reason = max(candidates, key=lambda c: PRECEDENCE[c[0]])
        return Decision(outcome, label, reason, _budgets(admitting), _terms(admitting))  # type: ignore[arg-type]

    def _apply(
        self,
        rule: PolicyRule,
        tool: Tool,
        args: dict[str, Any] | None,
        run_id: str,
        budget: conditions.CallBudget,
    ) -> tuple[str, str, str] | None:
        if args is None:
            # Catalog time: an allow rule may admit the tool for some arguments;
            # deny and approval rules are judged when a call arrives.
            if rule.outcome == Outcome.ALLOW:
                return (Outcome.ALLOW, rule.label, "Allowed by a rule, depending on arguments.")
            return None
        variables = {
            "args": args,
            "tool": {
                "id": tool.id,
                "effect": tool.effect,
                "consequenceLevel": tool.consequence_level,
            },
            "principal": self.principal,
            "runId": run_id,
        }
        try:
            holds = conditions.holds(rule.condition, variables, budget)
        except conditions.ConditionError as exc:
            reason = f"{rule.name} could not be evaluated, so the call is denied: {exc}"
            return (Outcome.DENY, rule.label, reason)
        if not holds:
            return None
        return (rule.outcome, rule.label, f"{rule.name} {VERDICT_WORDS[rule.outcome]}.")


# Evaluators as of the authorization epoch, per tenant, principal and user: a policy,
# rule, listed tool, tool or group membership edited changes it, so the next call loads
# them again (issue 13). Threads share an evaluator: what it keeps per tool id is the
# same whichever thread computes it.
_EVALUATORS = EpochCache("policy evaluators")


def evaluator_for(tenant: Tenant, principal: str, user: User | None) -> Evaluator:
    """The caller's evaluator, built once per authorization epoch and process."""
    key = (tenant.pk, principal, user.pk if user is not None else None)
    return _EVALUATORS.get(key, lambda: _kept_evaluator(tenant, principal, user))


# Below the authorization epoch: evaluators by tenant, principal and the caller's groups
# (all an evaluator reads of the caller) as of the policies epoch, which only a policy's,
# rule's or listing's write changes (apps/policies/apps.py). So after an edit of anything
# else (a grant, a key, a tool) an evaluator costs a read of the caller's groups, not
# 1,000 policies and their 10,000 listings again (issue 45). After a policy's edit, the
# epoch's log names the policies written: the evaluator kept is patched (those policies
# read again), not built again.
_KEPT_LOCK = threading.Lock()
_kept: dict[tuple[Any, ...], tuple[int, Evaluator]] = {}  # key -> (policies epoch, evaluator)


def _kept_evaluator(tenant: Tenant, principal: str, user: User | None) -> Evaluator:
    global _kept
    at = epoch.read(epoch.POLICIES_ROW)  # before the policies: see apps/tenants/epoch.py
    groups = frozenset(user.groups.values_list("pk", flat=True)) if user is not None else None
    key = (tenant.pk, principal, groups)
    with _KEPT_LOCK:
        found = _kept.get(key)
    if found is not None and found[0] == at:
        return found[1]
    group_ids = groups if groups is not None else frozenset()
    built = None
    if found is not None:
        changed = epoch.changes_since(epoch.POLICIES_ROW, found[0], at)
        if changed is not None:
            built = Evaluator(tenant, principal, user, group_ids, base=found[1], changed=changed)
    if built is None:
        built = Evaluator(tenant, principal, user, group_ids)
    with _KEPT_LOCK:
        if len(_kept) >= epoch.MAX_ENTRIES:
            _kept = {}
        _kept[key] = (at, built)
    return built


def clear_kept() -> None:
    """Forget the evaluators kept below the authorization epoch (tests)."""
    global _kept
    with _KEPT_LOCK:
        _kept = {}


# What a decision does not depend on: a policy's or rule's words and timestamps.
_NOT_DECIDING = frozenset({"description", "created_at", "updated_at"})


def _content(row: Policy | PolicyRule) -> dict[str, Any]:
    return {
        f.attname: getattr(row, f.attname)
        for f in row._meta.concrete_fields
        if f.name not in _NOT_DECIDING
    }


def _is_wildcard(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _terms(policies: list[Policy]) -> ApprovalTerms:
    if not policies:
        return ApprovalTerms()
    return ApprovalTerms(
        timeout_minutes=min(p.approval_timeout_minutes for p in policies),
        four_eyes=any(p.four_eyes for p in policies),
        high_consequence_quorum=max(p.high_consequence_quorum for p in policies),
    )


def _budgets(policies: list[Policy]) -> Budgets:
    """The tightest budget any admitting policy sets."""

    def tightest(values: list[int | None]) -> int | None:
        present = [v for v in values if v is not None]
        return min(present) if present else None

    return Budgets(
        max_runtime_ms=tightest([p.max_runtime_ms for p in policies]),
        max_result_bytes=tightest([p.max_result_bytes for p in policies]),
        calls_per_minute=tightest([p.calls_per_minute for p in policies]),
    )


class Catalog(list[tuple["Tool", Decision]]):
    """A caller's catalog as catalog() returns it (read it, never change it): one object
    while nothing it was made of changes, so what is made from it (the API's encoded
    bodies and entries, apps/tools/listing.py) is kept on it. A catalog narrowed to the
    caller's grants names the one it was narrowed from (`source`) and the ids it left
    out of it (`missing`). A catalog patched from another (`patched`: the same tools in
    the same places, some rows or decisions new) shares its ids and positions and names
    its encoded entries (`entries_before`) and the places that changed (`replaced`)."""

    def __init__(
        self,
        entries: list[tuple[Tool, Decision]],
        source: Catalog | None = None,
        missing: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__(entries)
        self.source = source
        self.missing = missing
        self.bodies: dict[Any, bytes] = {}
        self.entries: dict[str, list[bytes]] = {}
        self.entries_before: dict[str, list[bytes]] = {}
        self.replaced: frozenset[int] = frozenset()

    def patched(self, replaced: dict[int, tuple[Tool, Decision]]) -> Catalog:
        """This catalog with the entries at those places replaced."""
        items = list(self)
        for at, item in replaced.items():
            items[at] = item
        made = Catalog(items)
        for name in ("ids", "positions", "in_id_order"):  # the same ids, in the same order
            if name in self.__dict__:
                made.__dict__[name] = self.__dict__[name]
        # Its encodings (not itself: a chain of catalogs would be kept alive).
        made.entries_before = self.entries
        made.replaced = frozenset(replaced)
        return made

    @cached_property
    def ids(self) -> frozenset[str]:
        return frozenset(tool.id for tool, _ in self)

    @cached_property
    def in_id_order(self) -> bool:
        """Its ids ascend as Python compares them (the database's collation may not)."""
        return all(a[0].id < b[0].id for a, b in pairwise(self))

    @cached_property
    def positions(self) -> dict[str, int]:
        return {tool.id: i for i, (tool, _) in enumerate(self)}

    def without(self, missing: frozenset[str]) -> Catalog:
        """This catalog less the tools `missing` names (ids of its own)."""
        return Catalog(drop(self, self.positions, missing), self, missing)


FEW = 0.1  # left out of a catalog by position rather than by a pass over it, up to this share


def drop(items: list[Any], positions: dict[str, int], missing: frozenset[str]) -> list[Any]:
    """`items` (in a catalog's order) less those at the positions of `missing`."""
    if len(missing) > len(items) * FEW:
        gone = {positions[pk] for pk in missing}
        return [item for i, item in enumerate(items) if i not in gone]
    kept = list(items)
    for i in sorted((positions[pk] for pk in missing), reverse=True):
        del kept[i]
    return kept


def catalog(tenant: Tenant, principal: str, user: User) -> Catalog:
    """The usable tools this caller may see, each with its decision (CATALOG_IS_EXPLICIT).

    Filtered by `execute_tool` permission, and cached per process as of the
    authorization epoch (a staff user's flags are part of the key: they are read from the
    session's user, not from a cached row).
    """
    key = (tenant.pk, principal, user.pk, user.is_active, user.is_superuser)
    return _CATALOGS.get(key, lambda: _catalog(tenant, principal, user))


_CATALOGS = EpochCache("catalogs")
_VISIBLE_LOCK = threading.Lock()


def _catalog(tenant: Tenant, principal: str, user: User) -> Catalog:
    """Made of three things kept below the authorization epoch, each under its own: the
    evaluator (policies epoch, per tenant, principal and groups), the usable tools' rows
    (tools epoch, apps/tools/rows.py) and the caller's executable tool ids (grants epoch,
    apps/tools/grants.py). The catalog made of the same three objects is the same object:
    an edit that changed none of them (another tenant's policy, a key, a connection) costs
    the epochs' reads and the caller's groups, not 10,000 tools again (issue 45)."""
    evaluator = evaluator_for(tenant, principal, user)
    usable = rows.usable()
    granted = grants.executable_ids(user)
    allowed = evaluator.allowed_of(usable)
    with _VISIBLE_LOCK:
        kept = evaluator._visible
    if kept is not None and kept[0] is allowed and kept[1] is granted:
        return kept[2]
    missing = frozenset() if granted is grants.EVERY else allowed.ids - granted
    made = allowed.without(missing) if missing else allowed
    with _VISIBLE_LOCK:
        evaluator._visible = (allowed, granted, made)
    return made
