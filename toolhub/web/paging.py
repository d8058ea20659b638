"""Pages that never count a whole table.

Django's admin counts every row a changelist matches (`SELECT COUNT(*)`), which reads the
whole table: seconds at ten million records. `CappedCountPaginator` counts at most
`COUNT_CAP` rows (`SELECT COUNT(*) FROM (... LIMIT cap + 1)`), so its cost is bounded by
the cap, whatever the table's size; past the cap the list offers the first `COUNT_CAP`
rows in the admin's order (newest first for the history tables) and says so, and older
rows are reached by narrowing the list (filters, search, the date filter).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from django.core.paginator import Paginator

COUNT_CAP = 10_000


class CappedCountPaginator(Paginator):
    """A paginator whose `count` stops at `COUNT_CAP`; `capped` says whether it did."""

    cap = COUNT_CAP

    @cached_property
    def _bounded(self) -> int:
        objects: Any = self.object_list
        if not hasattr(objects, "query"):
            return min(len(objects), self.cap + 1)
        # Slicing makes Django count a subquery with LIMIT: the database stops at cap + 1.
        return int(objects.order_by()[: self.cap + 1].count())

    @cached_property
    def count(self) -> int:
        return min(self._bounded, self.cap)

    @property
    def capped(self) -> bool:
        return self._bounded > self.cap
