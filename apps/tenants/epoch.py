"""The authorization epoch: what lets every process cache who may do what, safely.

A call asks the same questions every time: whose key is this, does the tool exist, which
policies apply, may this user execute it. Their answers change only when someone edits
the rows behind them, so they are cached in each process (issue 13) and checked against
one number in the database, the epoch:

- every edit that can change an answer gives the epoch a new random value, in the
  edit's own transaction: saves and deletes of keys, tenants, users, groups, tools,
  policies, rules, permissions, connections and grants, membership and permission m2m
  changes (`_SENDERS`), and their bulk writes (`EpochQuerySet`: `update()`,
  `bulk_create()`, `bulk_update()`), which send no signals;
- a request reads the epoch once (one small query), before anything it caches; a
  different value than the cache was filled at empties the cache.

So an admin's edit holds on the next call in every process, with no expiry to wait for.
Reading the epoch before the data means a cache can hold newer data under an older
epoch (refilled at once on the next change), never older data under a newer one. The
value is random rather than a counter so that a restored backup, a flushed table or a
rolled-back test cannot bring back a value a process has already cached under.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, connections, models, transaction
from django.db.models import Subquery
from django.db.models.signals import m2m_changed, post_delete, post_save

from toolhub.db.postgresql import statement_cursor

T = TypeVar("T")
_M = TypeVar("_M", bound=models.Model)

MAX_ENTRIES = 10_000  # per cache; past it the cache starts over (a bound, not a policy)


def _new_value() -> int:
    return secrets.randbits(62)


ROW = 1  # the one row of AuthzEpoch
# A second row, the tools epoch: only edits of tool rows change it (apps/tools/rows.py
# keeps the usable tools' rows under it, so a policy's or grant's edit reloads no tool).
TOOLS_ROW = 2
# A third, the policies epoch: only edits of policies, their rules and listings change it
# (apps/policies/policy.py keeps evaluators under it, per tenant, principal and groups).
POLICIES_ROW = 3
# A fourth, the grants epoch: only edits of who holds a permission change it (object and
# global permissions, groups and their members: `_GRANT_SENDERS`); apps/tools/grants.py
# keeps each caller's executable tools under it, so a policy's, tool's or key's edit
# reads no grant again.
GRANTS_ROW = 4

_select: dict[tuple[str, int], str] = {}  # the read's SQL per database alias and row


def _select_sql(using: str, row: int = ROW) -> str:
    sql = _select.get((using, row))
    if sql is None:
        model = apps.get_model("tenants", "AuthzEpoch")
        quote = connections[using].ops.quote_name
        sql = _select[using, row] = (
            f"SELECT {quote('value')} FROM {quote(model._meta.db_table)} "  # noqa: S608
            f"WHERE {quote('id')} = {row}"
        )
    return sql


def _read_value(using: str = "default", row: int = ROW) -> int | None:
    """One SELECT whose text is built once: every request and every queued call reads the
    epoch, and compiling the ORM's query each time was a measurable part of it (issue 13).

    On PostgreSQL's pool the check of a connection taken from it sends this SELECT
    (`checkout_sql`): when this read is what takes the connection, the check's answer is
    this read's, a round trip fewer. A connection already open (a request's earlier
    statement, a transaction begun, a worker's kept connection) is read afresh."""
    wrapper = connections[using]
    if wrapper.connection is None and _checkout_sql_set and using == "default" and row == ROW:
        wrapper.ensure_connection()
        from toolhub.db.postgresql.pool import NOTHING, taken_at_checkout

        answer = taken_at_checkout(wrapper.connection)
        if answer is not NOTHING:
            return None if answer is None else int(answer)
    with statement_cursor(wrapper) as cursor:
        cursor.execute(_select_sql(using, row))
        found = cursor.fetchone()
    return None if found is None else int(found[0])


_checkout_sql_set = False  # checkout_sql() handed to the pool (PostgreSQL with its pool)


def checkout_sql() -> None:
    """Called from TenantsConfig.ready(): on PostgreSQL with psycopg's pool, the pool's
    checkout check sends the epoch's read (toolhub/db/postgresql/pool.py)."""
    global _checkout_sql_set
    wrapper = connections["default"]
    if wrapper.vendor != "postgresql" or not wrapper.settings_dict["OPTIONS"].get("pool"):
        return
    from toolhub.db.postgresql.pool import read_at_checkout

    read_at_checkout(_select_sql("default"))
    _checkout_sql_set = True


def value_sql(using: str = "default") -> str:
    """The epoch as a scalar subquery (NULL without its row): a statement that must apply
    only at the epoch its checks were answered at compares it (apps.invocations.combined)."""
    return f"({_select_sql(using)})"


def read(row: int = ROW) -> int:
    """The epoch now (one query); creates the row if a flush or a fresh database lost it.
    `row`: TOOLS_ROW for the tools epoch."""
    model = apps.get_model("tenants", "AuthzEpoch")
    value = _read_value(row=row)
    if value is None:
        try:
            with transaction.atomic():
                value = model.objects.create(pk=row, value=_new_value()).value
        except IntegrityError:  # another process created it first
            value = model.objects.filter(pk=row).values_list("value", flat=True).get()
    return value


def bump_tools(keys: Iterable[Any] | None = None) -> None:
    """Give the tools epoch a new value, in the caller's transaction (a tool's row was
    written: apps/tools/rows.py; `keys`: the ids of the tools written, None if not
    known). The authorization epoch is bumped by the same write."""
    bump_row(TOOLS_ROW, keys)


# The rows whose changes are logged (EpochChange), and how many changes each keeps: a
# process whose value is older than the oldest kept reloads everything, as it would
# without the log.
LOGGED = frozenset({TOOLS_ROW, POLICIES_ROW, GRANTS_ROW})
KEEP_CHANGES = 500
MAX_KEYS = 1_000  # a write of more rows than this logs "not known": a reload is as cheap


def bump_row(row: int, keys: Iterable[Any] | None = None) -> None:
    """Give the tools or policies epoch a new value, in the caller's transaction, and
    log which rows the write changed (`keys`; None: not known, so every process reloads
    all of them)."""
    model = apps.get_model("tenants", "AuthzEpoch")
    value = _new_value()
    if not model.objects.filter(pk=row).update(value=value):
        read(row)  # a value no change leads to: whoever kept an older one reloads all
        return
    if row not in LOGGED:
        return
    if keys is not None:
        keys = sorted(set(keys))
        if len(keys) > MAX_KEYS:
            keys = None
    log = apps.get_model("tenants", "EpochChange").objects
    change = log.create(row=row, value=value, keys=keys)
    if change.pk % 64 == 0:  # now and then, forget the oldest
        log.filter(row=row, id__lte=change.pk - KEEP_CHANGES).delete()


def changes_since(row: int, value: int | None, now: int) -> set[Any] | None:
    """The keys of the rows changed under epoch `row` from its `value` to `now` (read
    before this), or None where that is not known: `value` is not in the log (too old, a
    flushed or restored database), a change did not say which rows, or `now` is not
    reached. Changes after `now` are included: what is reloaded for them is newer than
    `now`, which is safe (see the module's docstring)."""
    if value is None:
        return None
    log = apps.get_model("tenants", "EpochChange").objects.filter(row=row)
    start = log.filter(value=value).order_by("id").values("id")[:1]
    found = list(
        log.filter(id__gte=Subquery(start))
        .order_by("id")
        .values_list("value", "keys")[: KEEP_CHANGES + 1]
    )
    if not found or found[0][0] != value or len(found) > KEEP_CHANGES:
        return None
    keys: set[Any] = set()
    reached = value == now
    for changed_to, changed in found[1:]:
        if changed is None:
            return None
        keys.update(changed)
        reached = reached or changed_to == now
    return keys if reached else None


def bump(sender: Any = None, **_signal_kwargs: Any) -> None:
    """Give the epoch a new value, in the caller's transaction (a signal receiver too);
    for a write of `sender` (a model), the rows below it that model's writes change too."""
    model = apps.get_model("tenants", "AuthzEpoch")
    if not model.objects.filter(pk=ROW).update(value=_new_value()):
        read()  # no row yet: creating it gives a value no cache was filled at
    if sender is not None and sender in _grant_senders:
        # An object permission's write names its object (the grants epoch's log: only
        # that object's grants are read again); any other (a group, a membership, a
        # global permission) is not known.
        instance = _signal_kwargs.get("instance")
        objects = _signal_kwargs.get("objects")
        if sender in _object_permissions and instance is not None:
            objects = [str(instance.object_pk)]
        bump_row(GRANTS_ROW, objects if sender in _object_permissions else None)
    holder = _pinned.get()
    if holder is not None:
        holder[0] = None  # this scope's later questions see its own edit


# The epoch as read in the current request (EpochMiddleware) or call (pinned()): a
# holder, filled by the first read and emptied by a bump in the same scope.
_pinned: ContextVar[list[int | None] | None] = ContextVar("toolhub_epoch", default=None)


@contextmanager
def pinned(known: int | None = None) -> Iterator[None]:
    """Within this block the epoch is read at most once (unless the block itself bumps
    it): one request, or one call's checks. Nested blocks share the outer one's read.

    `known`: a value the caller read before (a worker's previous statement answered it),
    used instead of a read. The answers may then be older than the epoch now, so what the
    block decides must be written only where the epoch is still `known`
    (`value_sql()`), and decided again otherwise."""
    if _pinned.get() is not None:
        yield
        return
    token = _pinned.set([known])
    try:
        yield
    finally:
        _pinned.reset(token)


def current() -> int:
    holder = _pinned.get()
    if holder is None:
        return read()
    value = holder[0]
    if value is None:
        value = holder[0] = read()
    return value


class EpochCache:
    """Answers computed at one epoch, shared by every thread of the process."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._epoch: int | None = None
        self._entries: dict[Any, Any] = {}

    def get(self, key: Any, load: Callable[[], T], keep: Callable[[T], bool] | None = None) -> T:
        """The answer cached for `key`, else `load()`'s, kept unless `keep` says it may
        still change without an edit (a run's allowlist before the run starts)."""
        epoch = current()  # before loading: see the module docstring
        with self._lock:
            if self._epoch == epoch and key in self._entries:
                return self._entries[key]
        value = load()
        if keep is not None and not keep(value):
            return value
        with self._lock:
            if self._epoch != epoch:
                self._epoch, self._entries = epoch, {}
            if len(self._entries) >= MAX_ENTRIES:
                self._entries = {}
            self._entries[key] = value
        return value

    def clear(self) -> None:
        with self._lock:
            self._epoch, self._entries = None, {}


class EpochQuerySet(models.QuerySet[_M]):
    """A queryset whose bulk writes bump the epoch: `update()`, `bulk_create()` and
    `bulk_update()` send no signals. (A bulk `delete()` needs nothing here: with a
    post_delete receiver connected, Django deletes row by row and signals each.)"""

    def update(self, **kwargs: Any) -> int:
        if _ignored(self.model, kwargs):
            return super().update(**kwargs)
        with transaction.atomic(using=self.db):
            changed = super().update(**kwargs)
            if changed:
                bump(self.model)
        return changed

    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list[_M]:
        with transaction.atomic(using=self.db):
            made = super().bulk_create(objs, *args, **kwargs)
            if made:
                objects = None
                if self.model in _object_permissions:  # guardian's assign_perm() on many
                    objects = [str(obj.object_pk) for obj in made]  # type: ignore[attr-defined]
                bump(self.model, objects=objects)
        return made

    def bulk_update(self, objs: Any, fields: Any, *args: Any, **kwargs: Any) -> int:
        if _ignored(self.model, fields):
            return super().bulk_update(objs, fields, *args, **kwargs)
        with transaction.atomic(using=self.db):
            changed = super().bulk_update(objs, fields, *args, **kwargs)
            if changed:
                bump(self.model)
        return changed


class RowBumpingQuerySet(EpochQuerySet[_M]):
    """An EpochQuerySet whose bulk writes also bump the epoch row `bumps` names, logging
    the rows they wrote by `change_key` (the field that names a change: a rule's policy)."""

    bumps: int
    change_key = "pk"

    def update(self, **kwargs: Any) -> int:
        with transaction.atomic(using=self.db):
            keys = list(self.values_list(self.change_key, flat=True)[: MAX_KEYS + 1])
            changed = super().update(**kwargs)
            if changed:
                bump_row(self.bumps, keys)
        return changed

    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list[_M]:
        with transaction.atomic(using=self.db):
            made = super().bulk_create(objs, *args, **kwargs)
            if made:
                bump_row(self.bumps, self._keys_of(made))
        return made

    def bulk_update(self, objs: Any, fields: Any, *args: Any, **kwargs: Any) -> int:
        objs = list(objs)
        with transaction.atomic(using=self.db):
            changed = super().bulk_update(objs, fields, *args, **kwargs)
            if changed:
                bump_row(self.bumps, self._keys_of(objs))
        return changed

    def _keys_of(self, objs: list[_M]) -> list[Any] | None:
        keys = [getattr(obj, self.change_key) for obj in objs]
        return None if any(key is None for key in keys) else keys


# Every model whose rows can change an answer the caches give. Strings, so this module
# imports no other app; resolved when the apps are ready.
_SENDERS = (
    "tenants.Tenant",
    "tenants.ApiKey",
    "tenants.Membership",
    "auth.User",
    "auth.Group",
    "auth.Permission",
    "tools.Tool",
    "policies.Policy",
    "policies.PolicyRule",
    "guardian.UserObjectPermission",
    "guardian.GroupObjectPermission",
    "connections.Grant",
    "connections.Connection",
)
_M2M = (
    ("auth.User", "groups"),
    ("auth.User", "user_permissions"),
    ("auth.Group", "permissions"),
    ("policies.Policy", "tools"),
)
# Of those, the models whose writes change who holds a permission, and so the grants
# epoch too: object permissions, permissions, groups (a deleted group takes its members
# and permissions with it, without an m2m signal), users, and the m2m tables below.
_GRANT_SENDERS = (
    "guardian.UserObjectPermission",
    "guardian.GroupObjectPermission",
    "auth.Permission",
    "auth.Group",
    "auth.User",
)
_GRANT_M2M = (
    ("auth.User", "groups"),
    ("auth.User", "user_permissions"),
    ("auth.Group", "permissions"),
)
_grant_senders: set[type[models.Model]] = set()  # the above, models and through models
# Of those, the object permissions: their writes name the objects whose grants changed.
_OBJECT_PERMISSIONS = ("guardian.UserObjectPermission", "guardian.GroupObjectPermission")
_object_permissions: set[type[models.Model]] = set()

# Writes that change nothing a cache holds, by save or in bulk: a login's timestamp, a
# key's last use (ApiKey.touch). (A connection's secret is not among them: the broker
# caches connection rows, ciphertext included, under the epoch, so a rotated secret is
# sent on the next call.)
_IGNORED_UPDATES = {
    "auth.User": frozenset({"last_login"}),
    "tenants.ApiKey": frozenset({"last_used_at"}),
}


def _ignored(model: type[models.Model], fields: Any) -> bool:
    ignored = _IGNORED_UPDATES.get(model._meta.label)
    return bool(ignored and fields and set(fields) <= ignored)


def _on_save(sender: type[models.Model], update_fields: Any = None, **kwargs: Any) -> None:
    if not _ignored(sender, update_fields):
        bump(sender, instance=kwargs.get("instance"))


def _bulk_writes_bump(model: type[models.Model]) -> None:
    """Make the bulk writes of `model`'s default manager bump the epoch. Our own models
    declare an EpochQuerySet; the others (auth's users, groups and permissions,
    guardian's object permissions: `assign_perm()` on a list or queryset is a
    `bulk_create()`) get one mixed into their manager's queryset class, which is theirs
    alone. A model on Django's plain Manager, shared by every model, must declare one."""
    manager = model._default_manager
    if isinstance(manager.get_queryset(), EpochQuerySet):
        return
    manager_class: Any = type(manager)
    if manager_class in (models.Manager, models.manager.BaseManager):
        raise ImproperlyConfigured(
            f"{model._meta.label}: its edits change the authorization epoch, so its bulk "
            "writes must too; give it an EpochQuerySet manager."
        )
    base = manager_class._queryset_class
    manager_class._queryset_class = type(f"Epoch{base.__name__}", (EpochQuerySet, base), {})
    if not isinstance(manager.get_queryset(), EpochQuerySet):
        raise ImproperlyConfigured(f"{model._meta.label}: its manager builds its own querysets.")


def connect() -> None:
    """Called from TenantsConfig.ready(): hook the epoch to every edit that matters."""
    for label in _SENDERS:
        model = apps.get_model(label)
        _bulk_writes_bump(model)
        post_save.connect(_on_save, sender=model, dispatch_uid=f"epoch-save-{label}")
        post_delete.connect(bump, sender=model, dispatch_uid=f"epoch-delete-{label}")
    for label, field in _M2M:
        through = getattr(apps.get_model(label), field).through
        m2m_changed.connect(_on_m2m, sender=through, dispatch_uid=f"epoch-m2m-{label}.{field}")
    _grant_senders.update(apps.get_model(label) for label in _GRANT_SENDERS)
    _grant_senders.update(getattr(apps.get_model(label), f).through for label, f in _GRANT_M2M)
    _object_permissions.update(apps.get_model(label) for label in _OBJECT_PERMISSIONS)


def _on_m2m(sender: Any, action: str, **kwargs: Any) -> None:
    if action in ("post_add", "post_remove", "post_clear"):
        bump(sender)


class EpochMiddleware:
    """Reads the epoch at most once per request, however many caches the request asks."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        with pinned():
            return self.get_response(request)
