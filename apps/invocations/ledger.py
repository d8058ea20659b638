"""The idempotency ledger (seed 002, DESIGN.md): which call a key belongs to, for how long.

Durable and concurrency-safe, where the seed's is neither: one `IdempotencyEntry` row per
key and partition, unique in the database. The runner claims a key in the transaction
that writes the call's record (step 8, or step 7 for a held call), so two first uses of a
key cannot both run: the second one's insert fails and it answers with the first call.

What a key says is read from the call that holds it, not kept in a second place that
every path ending a call would have to update (the runner, a worker's batch, the
sweeper, an admin's edit):

- the call is unfinished (held, queued, running): a retry waits for it (runner step 6);
- it succeeded and the entry has not expired: a retry answers with it (replay);
- it failed or was cancelled, or the entry expired or was invalidated: the key is free,
  and the next call with it takes the row over (compare-and-set on its record), linked
  to a failed predecessor (`retryOf`, `attempt`).

Invalidation and expiry set `expires_at`; they never free the key of an unfinished call:
it finishes, and only then may the key run again (EXACTLY_ONCE for external effects).

Only a call that is held (step 7) or started (step 8) claims its key. A call refused
earlier (unknown tool, policy, permission, validation) is recorded without it, so a
retry with that key is evaluated afresh. A replay still passes the checks before step 6
first, so a caller who lost access since gets the refusal, not the stored result. The
same key with another request hash is refused (validation); an approved call with
edited args takes the edited hash, so retrying the original request is refused too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from apps.invocations.models import IdempotencyEntry, InvocationRecord, Status
from apps.tenants.models import Tenant
from apps.tools.contracts import Idempotency
from apps.tools.models import Effect, Tool

_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Key:
    """A call's key: what the record shows (`key`) and what the ledger is unique on."""

    key: str
    digest: str
    strategy: str
    scope: str
    ttl_s: int


def effective(tool: Tool) -> Idempotency:
    """The tool's strategy, with the one guard a stale row could break: `none` on an
    external side effect (refused when saved, but an MCP tool's effect may change
    after) is the caller's key, so exactly-once holds whatever was saved."""
    idempotency = tool.idempotency
    if idempotency.strategy == "none" and tool.effect == Effect.EXTERNAL_SIDE_EFFECT:
        return Idempotency(scope=idempotency.scope, ttl_s=idempotency.ttl_s)
    return idempotency


def key_for(
    tool: Tool,
    principal: str,
    run_id: str,
    caller_key: str | None,
    args: dict[str, Any],
    connection_id: str,
) -> Key | None:
    """The call's key, or None when it has none. `run_id` is the run the caller named
    ("" for none). A caller's own key wins over a derived one, whatever the strategy
    (but `none`): API.md promises that a retry with the same key never runs again. A
    derived key (auto, params) scoped to the run needs a run: without one the call is
    deduplicated by the caller's key only, as `custom`. `Key.strategy` is what applied."""
    settings = effective(tool)
    if settings.strategy == "none":
        return None
    if caller_key is not None:
        key, strategy = caller_key, "custom"
    elif settings.strategy == "custom" or (settings.scope == "run" and not run_id):
        return None
    elif settings.strategy == "auto":
        key, strategy = "auto:" + _hash([tool.id, args, connection_id or ""])[:40], "auto"
    else:
        named = {name: args.get(name) for name in settings.params}
        key, strategy = "params:" + _hash([tool.id, named, connection_id or ""])[:40], "params"
    digest = _hash([*partition(settings.scope, principal, run_id), key])
    return Key(key, digest, strategy, settings.scope, settings.ttl_s)


def partition(scope: str, principal: str, run_id: str) -> list[str]:
    """Who shares a key (within a tenant): everyone, one principal, one principal's run."""
    if scope == "tenant":
        return ["tenant"]
    if scope == "run":
        return ["run", principal, run_id]
    return ["principal", principal]


def _hash(value: Any) -> str:
    return hashlib.sha256(_CANONICAL.encode(value).encode()).hexdigest()


def find(tenant: Tenant, key: Key) -> IdempotencyEntry | None:
    return (
        IdempotencyEntry.objects.select_related("record")
        .filter(tenant=tenant, digest=key.digest)
        .first()
    )


def holds(entry: IdempotencyEntry, now: datetime | None = None) -> bool:
    """Whether the entry's call still owns its key: unfinished, or succeeded and not
    expired (nor invalidated)."""
    record = entry.record
    if record.ended_at is None or record.status not in FINAL:
        return True
    return record.status == Status.SUCCEEDED and entry.expires_at > (now or timezone.now())


FINAL = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)


def claim(
    tenant: Tenant,
    key: Key,
    record: InvocationRecord,
    principal: str,
    run_id: str,
    previous: IdempotencyEntry | None,
) -> bool:
    """Give the key to `record` (call inside the transaction that writes it). A first
    use inserts the entry: a concurrent first use fails on the unique constraint
    (IntegrityError, the caller's transaction rolls back). A free key is taken over only
    if it still names the call `previous` named (False: another call took it first)."""
    now = timezone.now()
    fields = {
        "key": key.key,
        "tool_ref": record.tool_ref,
        "principal": principal,
        "run_id": run_id,
        "strategy": key.strategy,
        "scope": key.scope,
        "record": record,
        "claimed_at": now,
        "expires_at": now + timedelta(seconds=key.ttl_s),
    }
    if previous is None:
        IdempotencyEntry.objects.create(tenant=tenant, digest=key.digest, **fields)
        return True
    taken = IdempotencyEntry.objects.filter(pk=previous.pk, record_id=previous.record_id)
    return taken.update(**fields) == 1


def link_retry(record: InvocationRecord, previous: IdempotencyEntry | None) -> None:
    """A call that takes over a key whose last call failed is that call's retry."""
    if previous is None or previous.record.status == Status.SUCCEEDED:
        return
    record.retry_of_id = previous.record_id
    record.attempt = (previous.record.attempt or 1) + 1


def invalidate(tenant: Tenant, *, key: str = "", tool_ref: str = "", principal: str = "") -> int:
    """Forget the keys matching every filter given (at least one): their calls' outcomes
    are no longer replayed. A call still running keeps its key until it ends (its
    retries wait for it, as before), then the key is free. Answers how many."""
    if not (key or tool_ref or principal):
        raise ValueError("invalidate by key, tool or principal")
    now = timezone.now()
    entries = IdempotencyEntry.objects.filter(tenant=tenant, expires_at__gt=now)
    if key:
        entries = entries.filter(key=key)
    if tool_ref:
        entries = entries.filter(tool_ref=tool_ref)
    if principal:
        entries = entries.filter(principal=principal)
    return entries.update(expires_at=now)


def invalidate_tools(tenants: Iterable[Tenant], tool_refs: Iterable[str]) -> int:
    """Forget every remembered key of these tools in these tenants (the tool admin's
    action; `invalidate` per tenant and tool that holds any). Answers how many."""
    refs = list(tool_refs)
    held = (
        IdempotencyEntry.objects.filter(
            tenant__in=tenants, tool_ref__in=refs, expires_at__gt=timezone.now()
        )
        .values_list("tenant_id", "tool_ref")
        .distinct()
        .order_by()
    )
    by_pk = {tenant.pk: tenant for tenant in tenants}
    return sum(invalidate(by_pk[tenant_id], tool_ref=ref) for tenant_id, ref in held)


def prune(limit: int = 1000) -> int:
    """Delete forgotten entries (expired or invalidated, their call ended), at most
    `limit` per pass: read through the expiry index, never the history. The records stay
    (retention's business); only the key's claim goes."""
    pks = IdempotencyEntry.objects.forgettable(limit)
    if not pks:
        return 0
    return IdempotencyEntry.objects.filter(pk__in=pks).delete()[0]


def unfinished_or_remembered() -> Q:
    """For admin lists: the entries that still hold their key (see `holds`)."""
    return Q(record__ended_at__isnull=True) | Q(
        record__status=Status.SUCCEEDED, expires_at__gt=timezone.now()
    )
