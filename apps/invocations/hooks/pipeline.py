"""Loading the hooks of settings.TOOLHUB_HOOKS and running them for the runner.

An entry is a dotted path, or an object:

    {"hook": "apps.invocations.hooks.mask_pii.MaskPii",  # required
     "priority": 10,            # higher runs first (default 0; ties: the list's order)
     "tools": ["core__*"],      # filters (fnmatch patterns of tool ids), all optional:
     "effects": ["read_only"],  # the hook runs only for calls that match every one given
     "tenants": ["acme"],
     "sources": ["core", "mcp"],
     "options": {...}}          # keyword arguments of the hook's constructor

`problems()` says what is wrong with a list of entries (the system check, toolhub.E301,
runs it at start-up); `configured()` loads them once per value of the setting.

Each hook runs on a thread of its own pool under a deadline: the least of
TOOLHUB_HOOK_TIMEOUT_MS and the time the call has left. Python cannot stop a thread, so
a hook that never returns keeps its thread; the pool is bounded, and once every thread
is held the later hooks time out waiting, calls end with `timeout`, and nothing piles up.
"""

from __future__ import annotations

import contextvars
import copy
import fnmatch
import hashlib
import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import close_old_connections
from django.utils.module_loading import import_string

from apps.invocations.hooks import Abort, Hook, HookCall, Respond, Stage
from apps.tools.models import Effect, Source

logger = logging.getLogger(__name__)

KEYS = {"hook", "priority", "tools", "effects", "tenants", "sources", "options"}
HOOK_THREADS = 32

_hook_threads = ThreadPoolExecutor(max_workers=HOOK_THREADS, thread_name_prefix="toolhub-hook")


@dataclass(frozen=True)
class Registered:
    """One settings entry, loaded."""

    name: str  # the dotted path: how records and refusals name the hook
    hook: Hook
    priority: int
    order: int
    tools: tuple[str, ...]
    effects: frozenset[str]
    tenants: frozenset[str]
    sources: frozenset[str]

    def applies(self, call: HookCall) -> bool:
        return (
            (not self.tools or any(fnmatch.fnmatchcase(call.tool_id, p) for p in self.tools))
            and (not self.effects or call.effect in self.effects)
            and (not self.tenants or call.tenant in self.tenants)
            and (not self.sources or call.source in self.sources)
        )

    def method(self, stage: Stage) -> Callable[[HookCall], Any] | None:
        method = getattr(self.hook, stage.value, None)
        return method if callable(method) else None


def _entry(raw: Any) -> dict[str, Any]:
    return {"hook": raw} if isinstance(raw, str) else raw


def _string_list(entry: dict[str, Any], name: str, allowed: set[str] | None) -> list[str]:
    """The entry's list `name`, or the problems with it."""
    value = entry.get(name, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        return [f"{name!r} must be a list of strings"]
    if allowed is not None:
        unknown = sorted(set(value) - allowed)
        if unknown:
            return [f"{name!r} names {', '.join(unknown)}; expected some of {sorted(allowed)}"]
    return []


def _load(entry: dict[str, Any]) -> Hook:
    target = import_string(entry["hook"])
    if not (isinstance(target, type) and issubclass(target, Hook)):
        raise TypeError(f"{entry['hook']} is not a subclass of {Hook.__module__}.Hook")
    hook = target(**entry.get("options", {}))
    if not any(callable(getattr(hook, stage.value, None)) for stage in Stage):
        raise TypeError(f"{entry['hook']} defines no stage ({', '.join(Stage)})")
    return hook


def problems(entries: Any) -> list[str]:
    """Everything wrong with a TOOLHUB_HOOKS value, one sentence each; [] when it loads."""
    if not isinstance(entries, list):
        return ["TOOLHUB_HOOKS must be a list"]
    found: list[str] = []
    for index, raw in enumerate(entries):
        where = f"TOOLHUB_HOOKS[{index}]"
        if not isinstance(raw, str | dict):
            found.append(f"{where}: a dotted path or an object, not {type(raw).__name__}")
            continue
        entry = _entry(raw)
        unknown = sorted(set(entry) - KEYS)
        mine: list[str] = [f"unknown key {name!r}" for name in unknown]
        if not isinstance(entry.get("hook"), str):
            mine.append("'hook' must be the dotted path of a Hook class")
        if not isinstance(entry.get("priority", 0), int):
            mine.append("'priority' must be an integer")
        if not isinstance(entry.get("options", {}), dict):
            mine.append("'options' must be an object")
        mine += _string_list(entry, "tools", None)
        mine += _string_list(entry, "effects", set(Effect.values))
        mine += _string_list(entry, "tenants", None)
        mine += _string_list(entry, "sources", set(Source.values))
        if not mine:
            try:
                _load(entry)
            except ImportError as exc:
                mine.append(f"{entry['hook']!r} cannot be imported: {exc}")
            except Exception as exc:
                mine.append(f"{entry['hook']!r} cannot be loaded: {exc}")
        found += [f"{where}: {problem}" for problem in mine]
    return found


_lock = threading.Lock()
_loaded: tuple[str, tuple[Registered, ...]] = ("[]", ())


def configured() -> tuple[Registered, ...]:
    """The hooks of the setting's current value, loaded once per value."""
    entries = settings.TOOLHUB_HOOKS
    if not entries:
        return ()
    global _loaded
    text = json.dumps(entries, sort_keys=True, default=str)
    with _lock:
        if _loaded[0] == text:
            return _loaded[1]
    found = problems(entries)
    if found:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured("; ".join(found))
    loaded = []
    for order, raw in enumerate(entries):
        entry = _entry(raw)
        loaded.append(
            Registered(
                name=entry["hook"],
                hook=_load(entry),
                priority=entry.get("priority", 0),
                order=order,
                tools=tuple(entry.get("tools", ())),
                effects=frozenset(entry.get("effects", ())),
                tenants=frozenset(entry.get("tenants", ())),
                sources=frozenset(entry.get("sources", ())),
            )
        )
    ordered = tuple(sorted(loaded, key=lambda r: (-r.priority, r.order)))
    with _lock:
        _loaded = (text, ordered)
    return ordered


def fingerprint() -> str:
    """Names the hook configuration: a cached result is kept per configuration (what
    after_result hooks did to it is part of it)."""
    entries = settings.TOOLHUB_HOOKS
    if not entries:
        return ""
    text = json.dumps(entries, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Ran:
    """What one hook did: the runner turns it into the call's next step."""

    hook: str
    stage: Stage
    outcome: str  # "ok", "abort", "respond", "raised", "timed_out"
    call: HookCall
    before: Any  # the arguments (or the result) before the hook
    abort: Abort | None = None
    answer: Any = None
    error: str = ""
    limit_s: float = 0.0


def _invoke(method: Callable[[HookCall], Any], call: HookCall) -> tuple[str, Any]:
    try:
        method(call)
    except Abort as abort:
        return "abort", abort
    except Respond as respond:
        return "respond", respond.result
    except Exception as exc:
        logger.warning(
            "hook at %s raised %s (tool %s)", call.stage, type(exc).__name__, call.tool_id
        )
        return "raised", type(exc).__name__
    finally:
        close_old_connections()
    return "ok", None


def run_one(registered: Registered, call: HookCall, limit_s: float) -> Ran:
    """Run one hook's stage method on a hook thread, for at most `limit_s` seconds."""
    method = registered.method(call.stage)
    assert method is not None
    # A copy: a hook may change the arguments (or the result) in place.
    before = copy.deepcopy(call.result if call.stage == Stage.AFTER_RESULT else call.arguments)
    context = contextvars.copy_context()
    future = _hook_threads.submit(context.run, _invoke, method, call)
    try:
        outcome, payload = future.result(timeout=max(0.0, limit_s))
    except FutureTimeout:
        future.cancel()
        logger.warning("hook %s at %s ran past %.3g s", registered.name, call.stage, limit_s)
        return Ran(registered.name, call.stage, "timed_out", call, before, limit_s=limit_s)
    ran = Ran(registered.name, call.stage, outcome, call, before, limit_s=limit_s)
    if outcome == "abort":
        ran.abort = payload
    elif outcome == "respond":
        ran.answer = payload
    elif outcome == "raised":
        ran.error = payload
    return ran


def for_stage(stage: Stage, call: HookCall) -> list[Registered]:
    """The hooks that take part in `stage` for this call, in the order they run."""
    return [r for r in configured() if r.method(stage) is not None and r.applies(call)]
