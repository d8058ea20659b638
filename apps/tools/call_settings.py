"""The rules a tool's idempotency strategy and retries must follow, wherever they are set:
a contract at registration (apps/tools/registry.py) and staff in the admin (ToolAdmin).

One function for both, so a setting the registry refuses cannot be saved by hand.
"""

from __future__ import annotations

from typing import Any

from apps.tools.contracts import SCOPES, STRATEGIES, Idempotency, Retries

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
