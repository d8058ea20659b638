"""The rules a tool's idempotency strategy and retries must follow, wherever they are set:
a contract at registration (apps/tools/registry.py) and staff in the admin (ToolAdmin).

One function for both, so a setting the registry refuses cannot be saved by hand.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from apps.tools.contracts import EFFECTS, SCOPES, STRATEGIES, Effect, Idempotency, Retries

MAX_KEY_TTL_S = 30 * 24 * 3600
MAX_RETRY_ATTEMPTS = 5
MAX_BACKOFF_MS = 60_000


class CallSettingsError(ValueError):
    """A strategy or retry setting that cannot work; the message says why."""


def check(
    effect: str, input_schema: dict[str, Any], idempotency: Idempotency, retries: Retries
) -> None:
    """Raise CallSettingsError for the first rule broken."""
    if idempotency.strategy not in STRATEGIES:
        raise CallSettingsError(f"idempotency strategy must be one of {', '.join(STRATEGIES)}")
    if idempotency.scope not in SCOPES:
        raise CallSettingsError(f"idempotency scope must be one of {', '.join(SCOPES)}")
    if not 1 <= idempotency.ttl_s <= MAX_KEY_TTL_S:
        raise CallSettingsError(f"idempotency TTL must be 1 to {MAX_KEY_TTL_S} seconds")
    if idempotency.strategy == "params":
        if not idempotency.params:
            raise CallSettingsError("strategy params needs the arguments that make the key")
        declared = set((input_schema or {}).get("properties") or {})
        unknown = [name for name in idempotency.params if name not in declared]
        if unknown:
            raise CallSettingsError(
                f"strategy params names arguments the tool does not take: {', '.join(unknown)}"
                f" (it takes: {', '.join(sorted(declared)) or 'none'})"
            )
    elif idempotency.params:
        raise CallSettingsError("idempotency arguments are used only by strategy params")
    if idempotency.strategy == "none" and effect == "external_side_effect":
        raise CallSettingsError(
            "strategy none is refused for an external side effect: a retried call would "
            "happen twice (exactly once needs a key)"
        )
    if not 0 <= retries.attempts <= MAX_RETRY_ATTEMPTS:
        raise CallSettingsError(f"retry attempts must be 0 to {MAX_RETRY_ATTEMPTS}")
    if not 0 <= retries.backoff_ms <= MAX_BACKOFF_MS:
        raise CallSettingsError(f"retry backoff must be 0 to {MAX_BACKOFF_MS} ms")
    if not 0 <= retries.jitter <= 1:
        raise CallSettingsError("retry jitter must be a fraction from 0 to 1")


# The idempotency a tool gets when its contract (or its source, for MCP tools) names none,
# per effect: settings.TOOLHUB_IDEMPOTENCY_DEFAULTS over these. Shipped: the caller's key
# for every effect. A key derived from the arguments (`auto`), even within one run, would
# swallow a repeated side effect that equal arguments do not make a duplicate: `git add`
# of the same path after editing it again, a status re-posted, a reminder sent twice. Only
# the tool's author (its contract) or the deployment (the setting, e.g. `{"external_side_
# effect": {"strategy": "auto", "scope": "run"}}`) knows that equal arguments mean the
# same operation.
SHIPPED_DEFAULTS: dict[str, dict[str, Any]] = {
    "read_only": {"strategy": "custom", "scope": "principal"},
    "state_change": {"strategy": "custom", "scope": "principal"},
    "external_side_effect": {"strategy": "custom", "scope": "principal"},
}
DEFAULT_KEYS = ("strategy", "scope", "ttl_s")


def defaults_problems(value: Any) -> list[str]:
    """Everything wrong with a TOOLHUB_IDEMPOTENCY_DEFAULTS value, one sentence each,
    naming the entry; [] when it is usable."""
    name = "TOOLHUB_IDEMPOTENCY_DEFAULTS"
    if not isinstance(value, dict):
        return [f"{name} must be an object of effect -> settings, not {type(value).__name__}"]
    found: list[str] = []
    for effect, entry in value.items():
        where = f"{name}[{effect!r}]"
        if effect not in EFFECTS:
            found.append(f"{where}: not an effect (one of {', '.join(EFFECTS)})")
            continue
        if not isinstance(entry, dict):
            found.append(f"{where}: must be an object of {', '.join(DEFAULT_KEYS)}")
            continue
        unknown = sorted(set(entry) - set(DEFAULT_KEYS))
        if unknown:
            found.append(
                f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(DEFAULT_KEYS)})"
            )
            continue
        if entry.get("strategy") == "params":
            found.append(f"{where}: strategy params names a tool's arguments: set it per tool")
            continue
        ttl = entry.get("ttl_s", DEFAULT_TTL)
        if not isinstance(ttl, int) or isinstance(ttl, bool):
            found.append(f"{where}: ttl_s must be a whole number of seconds")
            continue
        try:
            check(effect, {}, _idempotency(entry), Retries())
        except CallSettingsError as exc:
            found.append(f"{where}: {exc}")
    return found


DEFAULT_TTL = Idempotency().ttl_s


def _idempotency(entry: dict[str, Any]) -> Idempotency:
    return Idempotency(
        strategy=entry.get("strategy", "custom"),
        scope=entry.get("scope", "principal"),
        ttl_s=entry.get("ttl_s", DEFAULT_TTL),
    )


_lock = threading.Lock()
_defaults: tuple[str, dict[str, Idempotency]] = ("", {})


def idempotency_defaults() -> dict[str, Idempotency]:
    """The effective table: the setting's entries over the shipped ones, checked once per
    value of the setting (ImproperlyConfigured names every bad entry)."""
    global _defaults
    configured = getattr(settings, "TOOLHUB_IDEMPOTENCY_DEFAULTS", None) or {}
    text = json.dumps(configured, sort_keys=True, default=str)
    with _lock:
        if _defaults[0] == text:
            return _defaults[1]
    found = defaults_problems(configured)
    if found:
        raise ImproperlyConfigured("; ".join(found))
    table: dict[str, Idempotency] = {
        effect: _idempotency({**SHIPPED_DEFAULTS[effect], **configured.get(effect, {})})
        for effect in EFFECTS
    }
    with _lock:
        _defaults = (text, table)
    return table


def default_idempotency(effect: Effect | str) -> Idempotency:
    return idempotency_defaults()[effect]
