"""The result cache of read-only tools (seed 004's cache stage).

A read-only tool whose row has a TTL (`Tool.cache_ttl_s`, set by staff; empty: off)
answers a repeated call from the cache instead of running again. The runner asks only
after every check (policy, permission, connection, validation, CEL rules, the approval
gate) has passed, so a cached answer never lets a call through that would be refused,
and it stores what left the runner: the result after output validation, secret
scrubbing and redaction, never the tool's raw output.

A key is the call's request hash (tool, canonical arguments, connection), the tool's
schema hash, the hook configuration (after_result hooks shaped what is stored), the
scope (`Tool.cache_scope`: the tenant, the principal or the run), and the authorization
epoch the call was checked at (apps/tenants/epoch.py). Every edit of a tool, a policy or
its rules, a permission, a connection or a grant gives the epoch a new value, so an
entry made before the edit is never read again: invalidation needs no list of what
depends on what, and holds in every process at once. (Edits of unrelated rows also
empty the cache; they are rare next to calls, and a miss is only a run of the tool.)

Django's cache framework holds the entries (settings.CACHES["results"]): local memory in
the embedded default, Redis when REDIS_URL is set. A cache that fails is a miss: the tool
runs, and the failure is logged. Hits and misses are counted per process (/metrics).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import Counter
from typing import Any

from django.core.cache import caches

from apps.tools.models import CacheScope, Effect, Tool

logger = logging.getLogger(__name__)

CACHE_ALIAS = "results"


class Lookups:
    """Hits and misses of this process, by (tenant slug, tool id, outcome)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str, str]] = Counter()

    def count(self, tenant: str, tool: str, outcome: str) -> None:
        with self._lock:
            self._counts[(tenant, tool, outcome)] += 1

    def snapshot(self) -> dict[tuple[str, str, str], int]:
        with self._lock:
            return dict(self._counts)


lookups = Lookups()


def cacheable(tool: Tool | None) -> bool:
    return tool is not None and tool.effect == Effect.READ_ONLY and (tool.cache_ttl_s or 0) > 0


def key(
    *,
    tool: Tool,
    tenant_id: int,
    principal: str,
    run_id: str,
    request_hash: str,
    epoch: int,
    hooks: str = "",
) -> str:
    """The entry's key: see the module docstring for why each part is in it."""
    scope = {
        CacheScope.TENANT: "",
        CacheScope.PRINCIPAL: principal,
        CacheScope.RUN: run_id,
    }.get(CacheScope(tool.cache_scope), principal)
    parts = [epoch, tenant_id, tool.cache_scope, scope, tool.schema_hash, request_hash, hooks]
    digest = hashlib.sha256(json.dumps(parts, separators=(",", ":")).encode()).hexdigest()
    return f"result:{digest}"


def get(tenant_slug: str, tool_id: str, cache_key: str) -> tuple[bool, Any]:
    """(True, the cached result) on a hit, (False, None) on a miss."""
    try:
        entry = caches[CACHE_ALIAS].get(cache_key)
    except Exception as exc:
        logger.warning("result cache read failed (%s): the tool runs", type(exc).__name__)
        entry = None
    hit = isinstance(entry, dict) and "result" in entry
    lookups.count(tenant_slug, tool_id, "hit" if hit else "miss")
    return (True, entry["result"]) if hit and entry is not None else (False, None)


def put(ttl_s: int | None, cache_key: str, result: Any) -> None:
    try:
        caches[CACHE_ALIAS].set(cache_key, {"result": result}, timeout=ttl_s)
    except Exception as exc:
        logger.warning("result cache write failed (%s)", type(exc).__name__)
