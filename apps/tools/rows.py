"""The usable tools' rows, kept in each process under the tools epoch (issue 45).

With 10,000 tools, loading their rows (JSON columns and all) took over a second, and the
catalog did it again after every authorization change: a policy, a grant, a key edited.
A tool's row changes only when the tool is written, and every write of one (a save, a
delete, the bulk writes of ToolQuerySet) gives the tools epoch (apps/tenants/epoch.py,
TOOLS_ROW) a new value in its own transaction, and stamps `updated_at`. So:

- while the tools epoch is the one the rows were read at, they are used as they are
  (one small query: the epoch);
- when it changed, the epoch's log (EpochChange) says which tools were written since
  the value the rows were read at: only those rows are loaded again (one query; a
  tool edited among 10,000 costs no read of the others);
- where the log cannot say (a value older than it keeps, a bulk write of more than
  epoch.MAX_KEYS tools, a tool that became usable, whose place in the database's order
  is not known here), the ids and `updated_at` of the usable tools are read (the stamp
  as the database's text: compared, never parsed, so reading 10,000 of them costs a few
  milliseconds), and only the rows whose stamp differs (or that are new) are loaded
  again.

Who may see which tool is not decided here: the catalog intersects these rows with the
policies' decisions (policies epoch) and the caller's executable tools (grants epoch,
apps/tools/grants.py).
The rows are shared by every thread and caller: read them, never change them.
"""

from __future__ import annotations

import threading
from itertools import batched

from django.db.models import TextField
from django.db.models.functions import Cast

from apps.tenants import epoch
from apps.tools.models import Tool

BATCH = 500  # ids per query when rows are loaded again


class Rows(dict[str, Tool]):
    """The usable tools' rows by id, in the database's id order. Loaded again from the
    epoch's log, they name the rows they were patched from (`base`) and the ids written
    since (`changed`), so that what was made of `base` can be patched too (the catalog,
    apps/policies/policy.py). Only one step back: a base forgets its own."""

    base: Rows | None = None
    changed: frozenset[str] = frozenset()


_lock = threading.Lock()
_at: int | None = None  # the tools epoch the rows were read at
_rows: Rows = Rows()  # usable tools by id, in the database's id order
_stamps: dict[str, str] = {}  # their `updated_at` as the database's text, by id


def usable() -> Rows:
    """The enabled and available tools' rows by id, in id order, as of the tools epoch."""
    global _at, _rows, _stamps
    at = epoch.read(epoch.TOOLS_ROW)  # before the rows: see apps/tenants/epoch.py
    with _lock:
        if _at == at:
            return _rows
        known_at, known, known_stamps = _at, _rows, _stamps
    patched = None
    if known:
        changed = epoch.changes_since(epoch.TOOLS_ROW, known_at, at)
        if changed is not None:
            patched = _patched(known, known_stamps, changed)
    rows, stamps = patched if patched is not None else _reread(known, known_stamps)
    with _lock:
        _at, _rows, _stamps = at, rows, stamps
    return rows


def _patched(
    known: Rows, known_stamps: dict[str, str], changed: set[str]
) -> tuple[Rows, dict[str, str]] | None:
    """The rows with those of the `changed` tools (the tools epoch's log) loaded again:
    one query, not 10,000 stamps. None where a tool became usable that was not (its place
    in the database's order is not known here: everything is read again)."""
    loaded: dict[str, Tool] = {}
    loaded_stamps: dict[str, str] = {}
    for ids in batched(sorted(changed), BATCH):
        for tool in Tool.objects.usable().filter(pk__in=ids).annotate(stamp=_STAMP):
            loaded[tool.pk], loaded_stamps[tool.pk] = tool, tool.stamp  # type: ignore[attr-defined]
    if any(pk not in known for pk in loaded):
        return None
    if not loaded and not any(pk in known for pk in changed):
        return known, known_stamps  # none of them usable, before or now: the same object
    rows, stamps = Rows(known), dict(known_stamps)
    for pk in changed:
        if pk in loaded:
            rows[pk], stamps[pk] = loaded[pk], loaded_stamps[pk]
        elif pk in rows:
            del rows[pk], stamps[pk]
    known.base = None  # one step back only: rows long gone are not kept alive
    rows.base, rows.changed = known, frozenset(pk for pk in changed if pk in known)
    return rows, stamps


def _reread(known: Rows, known_stamps: dict[str, str]) -> tuple[Rows, dict[str, str]]:
    """Every usable tool's stamp, and the rows whose stamp changed loaded again."""
    stamps = dict(
        Tool.objects.usable().order_by("pk").annotate(stamp=_STAMP).values_list("pk", "stamp")
    )
    if stamps == known_stamps:
        return known, known_stamps  # a write of no usable tool: the same object
    stale = [pk for pk, stamp in stamps.items() if known_stamps.get(pk) != stamp]
    loaded: dict[str, Tool] = {}
    for ids in batched(stale, BATCH):
        # usable() again: a tool disabled since the stamps were read is left out now.
        loaded.update((tool.pk, tool) for tool in Tool.objects.usable().filter(pk__in=ids))
    rows = Rows()
    for pk in stamps:
        row = loaded.get(pk) or (known.get(pk) if known_stamps.get(pk) == stamps[pk] else None)
        if row is not None:
            rows[pk] = row
    return rows, {pk: stamps[pk] for pk in rows}


_STAMP = Cast("updated_at", TextField())


def clear() -> None:
    global _at, _rows, _stamps
    with _lock:
        _at, _rows, _stamps = None, Rows(), {}


def tool_written(instance: Tool, **_signal_kwargs: object) -> None:
    """post_save of a Tool (connected in ToolsConfig.ready)."""
    epoch.bump_tools([instance.pk])


def tool_deleted(instance: Tool, **_signal_kwargs: object) -> None:
    """post_delete of a Tool: its listings in policies went with it (no m2m signal), so
    the policies epoch changes too, for policies not known here (all are read again)."""
    epoch.bump_tools([instance.pk])
    epoch.bump_row(epoch.POLICIES_ROW)
