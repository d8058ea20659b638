"""Tool sources: where the runner finds the contract behind a catalog id.

Sources plug in the way Django's backends do: a small interface and a list in
settings (`TOOLHUB_TOOL_SOURCES`), asked in order. The runner knows only this
module, never a source's internals: the built-in registry is one source, the
MCP servers of apps/mcp another.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

from django.conf import settings
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from apps.tools.registry import RegisteredTool, registry


class ToolSource(Protocol):
    """One kind of tool provider.

    `get` answers a checked contract for an id it provides, or None. It may read the
    database (the catalog row says whether a tool is usable; the runner checks that
    separately) and must not block on the network: execution happens later, inside
    the contract's `execute`, under the runner's deadline.
    """

    def get(self, tool_id: str) -> RegisteredTool | None: ...


class BuiltinSource:
    """The in-code contracts of TOOLHUB_TOOL_MODULES (apps/tools/registry.py)."""

    def get(self, tool_id: str) -> RegisteredTool | None:
        return registry.get(tool_id)


@functools.cache
def configured() -> tuple[ToolSource, ...]:
    """The sources named in settings, instantiated once per process."""
    return tuple(import_string(path)() for path in settings.TOOLHUB_TOOL_SOURCES)


def get_tool(tool_id: str) -> RegisteredTool | None:
    """The first source that provides `tool_id` wins; ids are unique across sources
    (the catalog's primary key, and collisions are refused on sync)."""
    for source in configured():
        found = source.get(tool_id)
        if found is not None:
            return found
    return None


def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting == "TOOLHUB_TOOL_SOURCES":
        configured.cache_clear()


setting_changed.connect(_reset)
