"""Per-run narrowing: a run started with a tool allowlist (seed 000's per-run `toolIds`).

An agent run may be limited to a few of the tools its principal may use: the run's
catalog (REST, the OpenAI/Anthropic shapes, MCP `tools/list`) lists only those, and the
runner refuses a call outside them as `policy_denied` (check_run). Narrowing only
narrows: every other check still applies, so a run never gains a tool its principal
lacks, and starting one refuses tools outside the caller's catalog.

The allowlist is set when the run starts and fixed from then on: starting it again with
the same tools is a no-op, with any others a conflict, and a run that already has calls
without one cannot get one (start a new run instead). That is also what lets each
process cache the answer for a run: once a run has an allowlist or has had calls without
one, its answer never changes, so only a run not started yet is read again per call.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import IntegrityError, transaction

from apps.invocations.models import Run
from apps.policies.policy import catalog
from apps.tenants import epoch
from apps.tenants.callers import Caller
from apps.tenants.epoch import EpochCache
from apps.tenants.models import Tenant

MAX_TOOLS = 1000
SHOWN = 20  # ids named in one message, at most


class RunError(Exception):
    """A start refused: `status` 400 (the list is wrong) or 409 (the run has another)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Started:
    run_id: str
    tools: list[str]
    started_by: str
    created: bool  # False: the same start again


def start(caller: Caller, run_id: str, tools: list[str]) -> Started:
    """Start `run_id` (already a valid run id) limited to `tools`, or say why not."""
    wanted = set(tools)
    if not wanted:
        raise RunError(400, "An allowlist names at least one tool; omit it to use any tool.")
    if len(wanted) > MAX_TOOLS:
        raise RunError(400, f"An allowlist names at most {MAX_TOOLS} tools.")
    usable = {tool.pk for tool, _ in catalog(caller.tenant, caller.principal, caller.user)}
    # One answer for a tool that does not exist and one this caller may not use: the
    # caller learns nothing about tools outside its catalog, only which of its ids failed.
    outside = sorted(wanted - usable)
    if outside:
        raise RunError(
            400,
            f"Not in this caller's catalog (GET /api/v1/tools/ lists it): {_named(outside)}.",
        )
    allowlist = sorted(wanted)
    with transaction.atomic():
        run = _locked(caller.tenant, run_id)
        created = run is None
        if run is None:
            if not _narrows(caller.tenant):
                epoch.bump()  # its first: every process asks this tenant's runs from now
            try:
                with transaction.atomic():
                    run = Run.objects.create(
                        tenant=caller.tenant,
                        run_id=run_id,
                        tool_allowlist=allowlist,
                        started_by=caller.principal,
                    )
            except IntegrityError:  # started (or called) at the same moment elsewhere
                run = _locked(caller.tenant, run_id)
                created = False
        assert run is not None
        if not created:
            _check_same(run, allowlist)
    return Started(run_id, allowlist, run.started_by, created)


def _locked(tenant: Tenant, run_id: str) -> Run | None:
    return Run.objects.select_for_update().filter(tenant=tenant, run_id=run_id).first()


def _check_same(run: Run, allowlist: list[str]) -> None:
    if run.tool_allowlist is None:
        raise RunError(
            409,
            f"The run {run.run_id} already has calls without an allowlist; an allowlist is "
            "set when a run starts: start a new run.",
        )
    if sorted(run.tool_allowlist) != allowlist:
        added = sorted(set(allowlist) - set(run.tool_allowlist))
        detail = f" (it does not list {_named(added)})" if added else ""
        raise RunError(
            409,
            f"The run {run.run_id} was started with another allowlist{detail}; a run's "
            "allowlist is fixed once set: start a new run.",
        )


# Per tenant: whether any of its runs has an allowlist. Runs are asked only while one
# has (as connections/grants.py asks run grants), so a tenant that never narrows a run
# pays nothing per call; the start of its first narrowed run changes the epoch.
_NARROWING = EpochCache("tenants narrowing runs")

# Per (tenant, run): the run's allowlist, or None. Kept only once it cannot change (the
# run has an allowlist, or has had calls without one), so a run started after a call
# asked about it is read again; edits of tools or policies do not change it, but they
# change the epoch, which empties the cache: it is refilled on the next call.
_ALLOWLISTS = EpochCache("run allowlists")


def allowlist(tenant: Tenant, run_id: str) -> frozenset[str] | None:
    """The tools `run_id` may call, or None when it is not narrowed."""
    if not _NARROWING.get(tenant.pk, lambda: _narrows(tenant)):
        return None
    found = _ALLOWLISTS.get((tenant.pk, run_id), lambda: _load(tenant, run_id), _settled)
    return found[0]


def _narrows(tenant: Tenant) -> bool:
    return Run.objects.filter(tenant=tenant, tool_allowlist__isnull=False).exists()


def _load(tenant: Tenant, run_id: str) -> tuple[frozenset[str] | None, bool]:
    row = Run.objects.filter(tenant=tenant, run_id=run_id).values_list("tool_allowlist", "last_seq")
    found = row.first()
    if found is None:
        return None, False
    tools, last_seq = found
    if tools is None:
        return None, last_seq > 0
    return frozenset(tools), True


def _settled(found: tuple[frozenset[str] | None, bool]) -> bool:
    return found[1]


def refusal(run_id: str, allowed: frozenset[str], tool_id: str) -> str:
    """The safe message of a call outside its run's allowlist, naming the allowlist."""
    return (
        f"The run {run_id} may call only {_named(sorted(allowed))} (its allowlist); "
        f"{tool_id[:140]} is not on it."
    )


def _named(ids: list[str]) -> str:
    shown = ", ".join(tool_id[:140] for tool_id in ids[:SHOWN])
    return shown + (f" and {len(ids) - SHOWN} more" if len(ids) > SHOWN else "")
