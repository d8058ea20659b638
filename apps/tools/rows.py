"""The usable tools' rows, kept in each process under the tools epoch (issue 45).

With 10,000 tools, loading their rows (JSON columns and all) took over a second, and the
catalog did it again after every authorization change: a policy, a grant, a key edited.
A tool's row changes only when the tool is written, and every write of one (a save, a
delete, the bulk writes of ToolQuerySet) gives the tools epoch (apps/tenants/epoch.py,
TOOLS_ROW) a new value in its own transaction, and stamps `updated_at`. So:

- while the tools epoch is the one the rows were read at, they are used as they are
  (one small query: the epoch);
- when it changed, only the ids and `updated_at` of the usable tools are read (the
  stamp as the database's text: compared, never parsed, so reading 10,000 of them costs
  a few milliseconds), and only the rows whose stamp differs (or that are new) are loaded
  again: one tool edited among 10,000 loads one row.

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

_lock = threading.Lock()
_at: int | None = None  # the tools epoch the rows were read at
_rows: dict[str, Tool] = {}  # usable tools by id, in the database's id order
_stamps: dict[str, str] = {}  # their `updated_at` as the database's text, by id


def usable() -> dict[str, Tool]:
    """The enabled and available tools' rows by id, in id order, as of the tools epoch."""
    global _at, _rows, _stamps
    at = epoch.read(epoch.TOOLS_ROW)  # before the rows: see apps/tenants/epoch.py
    with _lock:
        if _at == at:
            return _rows
        known, known_stamps = _rows, _stamps
    stamps = dict(
        Tool.objects.usable()
        .order_by("pk")
        .annotate(stamp=Cast("updated_at", TextField()))
        .values_list("pk", "stamp")
    )
    if stamps == known_stamps:
        rows = known  # (a write of no usable tool: the same object, what is kept by it too)
    else:
        stale = [pk for pk, stamp in stamps.items() if known_stamps.get(pk) != stamp]
        loaded: dict[str, Tool] = {}
        for ids in batched(stale, BATCH):
            # usable() again: a tool disabled since the stamps were read is left out now.
            loaded.update((tool.pk, tool) for tool in Tool.objects.usable().filter(pk__in=ids))
        rows = {}
        for pk in stamps:
            row = loaded.get(pk) or (known.get(pk) if known_stamps.get(pk) == stamps[pk] else None)
            if row is not None:
                rows[pk] = row
        stamps = {pk: stamps[pk] for pk in rows}
    with _lock:
        _at, _rows, _stamps = at, rows, stamps
    return rows


def clear() -> None:
    global _at, _rows, _stamps
    with _lock:
        _at, _rows, _stamps = None, {}, {}


def tool_written(**_signal_kwargs: object) -> None:
    """post_save of a Tool (connected in ToolsConfig.ready)."""
    epoch.bump_tools()


def tool_deleted(**_signal_kwargs: object) -> None:
    """post_delete of a Tool: its listings in policies went with it (no m2m signal), so
    the policies epoch changes too."""
    epoch.bump_tools()
    epoch.bump_row(epoch.POLICIES_ROW)
