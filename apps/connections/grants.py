"""Which connections a caller may use now: the grant half of the runner's step 4, cached.

The runner asks it on every call with a connection (issue 13). Its answer changes only
when a grant or a connection row changes, and every such write gives the authorization
epoch a new value in its own transaction (apps/tenants/epoch.py: saves and deletes,
bulk updates and deletes, a connection's cascade), so each process caches the answer
until the epoch moves. Time is not an edit: what is cached is each connection with the
moment its grants run out, and that moment is compared with the clock on every call, so
a grant that expires between two calls stops working on the second.

Two caches, so that run ids, which are unbounded, cannot push the principals' answers
out (each cache starts over past `epoch.MAX_ENTRIES`):

- standing grants, per (tenant, principal): those naming the principal in every run;
- run grants, per (tenant, principal, run id): those naming the run, for the principal
  or for anyone in it; asked only while the tenant has any run grant at all (a yes/no
  cached per tenant), so a tenant without them never queries per run.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db.models import Q
from django.utils import timezone

from apps.connections.models import Grant
from apps.tenants.epoch import EpochCache
from apps.tenants.models import Tenant

# A granted connection's pk -> until when (None: no grant of it expires).
Granted = dict[uuid.UUID, datetime | None]

_STANDING = EpochCache("standing grants")
_RUN = EpochCache("run grants")


def usable_until(tenant: Tenant, principal: str, run_id: str) -> Granted:
    """The connections of `tenant` a grant lets this principal, or this run, use now,
    each with the moment the last such grant expires: `GrantQuerySet.usable_by`, whose
    rows (principal, ""), (principal, run id) and ("", run id) are asked in two parts."""
    found = dict(_STANDING.get((tenant.pk, principal), lambda: _load(tenant, principal, "")))
    if run_id and _has_run_grants(tenant):
        scoped = _RUN.get((tenant.pk, principal, run_id), lambda: _load(tenant, principal, run_id))
        for pk, until in scoped.items():
            found[pk] = _later(found[pk], until) if pk in found else until
    now = timezone.now()
    return {pk: until for pk, until in found.items() if until is None or until > now}


def may_use(tenant: Tenant, principal: str, run_id: str, connection_pk: uuid.UUID) -> bool:
    return connection_pk in usable_until(tenant, principal, run_id)


def _load(tenant: Tenant, principal: str, run_id: str) -> Granted:
    who = Q(principal=principal) | Q(principal="") if run_id else Q(principal=principal)
    rows = (
        Grant.objects.active()
        # A grant row filed under this tenant for another tenant's connection (the admin
        # refuses one; the ORM does not) gives nothing.
        .filter(tenant=tenant, connection__tenant=tenant, run_id=run_id)
        .filter(who)
        .order_by()
        .values_list("connection_id", "expires_at")
    )
    granted: Granted = {}
    for pk, until in rows:
        granted[pk] = _later(granted[pk], until) if pk in granted else until
    return granted


def _has_run_grants(tenant: Tenant) -> bool:
    return _STANDING.get(
        ("any run grant", tenant.pk),
        lambda: Grant.objects.active().filter(tenant=tenant).exclude(run_id="").exists(),
    )


def _later(a: datetime | None, b: datetime | None) -> datetime | None:
    return None if a is None or b is None else max(a, b)
