"""What a tool is, in code: a contract the registry checks and the runner executes.

Tool modules import only this module, the capability protocols and pydantic: no
settings, environment, ORM or network clients (TOOL_FILE_PURITY). Everything a
tool touches outside its arguments arrives as an injected capability.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

Effect = Literal["read_only", "state_change", "external_side_effect"]
ConsequenceLevel = Literal["low", "medium", "high"]
EFFECTS: tuple[Effect, ...] = ("read_only", "state_change", "external_side_effect")
CONSEQUENCE_LEVELS: tuple[ConsequenceLevel, ...] = ("low", "medium", "high")
DEFAULT_TIMEOUT_S = 15.0


class ToolParams(BaseModel):
    """Base for a tool's arguments: unknown keys are an error, never ignored."""

    model_config = ConfigDict(extra="forbid")
    # Set by a tool source whose arguments are declared in JSON Schema rather than by
    # pydantic fields (imported MCP tools, apps/mcp/schemas.py): the registry lists this
    # schema as declared instead of compiling the model, and the model validates with it.
    declared_schema: ClassVar[dict[str, Any] | None] = None


class ToolOutput(BaseModel):
    """Base for a tool's result payload."""

    model_config = ConfigDict(extra="forbid")

    def counted_bytes(self, dumped: dict[str, Any]) -> int:
        """What the result counts against its size limit (runner step 11): its JSON."""
        return len(json.dumps(dumped, separators=(",", ":"), ensure_ascii=False).encode())


class ToolError(Exception):
    """Raised by a tool for a failure whose message is safe to show the model.

    Any other exception becomes a generic `execution` error: its text may hold
    args or internals, so it is logged, never returned. `retry_after_ms` is the tool's
    hint (seed 004 `retryAfter`) of when trying again may work: the runner waits at least
    that long before its own retry (ToolUnavailable, ToolTimedOut) and hands the hint to
    the caller as `retryAfterMs`.
    """

    def __init__(self, safe_message: str, retry_after_ms: int | None = None) -> None:
        super().__init__(safe_message)
        self.safe_message = safe_message
        self.retry_after_ms = retry_after_ms


class ToolUnavailable(ToolError):
    """Raised by a tool whose provider cannot be reached (a remote server that is down):
    the call ends as `unavailable`, not as a tool failure."""


class ToolRateLimited(ToolError):
    """Raised by a tool whose provider refused the call for now (a remote server's HTTP
    429): the call ends as `rate_limited`, with the provider's hint as `retryAfterMs`."""


class ToolTimedOut(ToolError):
    """Raised by a tool whose provider did not answer within the call's deadline (a remote
    server's own wait, bounded by `ctx.time_left()`): the call ends as `timeout`, the same
    as when the runner's deadline passes first. The two race at the deadline; the outcome
    must not depend on which one wins."""


class ToolCancelled(ToolError):
    """Raised by a tool (or a capability) that saw its call cancelled before a step of
    I/O, or whose request was cut by the cancellation: the call ends as `cancelled`."""

    def __init__(self, safe_message: str = "The call was cancelled.") -> None:
        super().__init__(safe_message)


class ToolResultTooLarge(ToolError):
    """Raised by a tool whose provider answered with more than it may read (a remote
    server's answer past its size limit, cut while it was read): the call ends as
    `result_too_large`, like a result past the tool's own output limit."""


@dataclass(frozen=True)
class Redaction:
    """Allowlists of field paths ("steps.title") kept in records, events and results.

    Fields not listed are stripped. A path names a whole subtree; lists are
    traversed element by element.
    """

    result: tuple[str, ...]
    args: tuple[str, ...]


@dataclass(frozen=True)
class ToolContext:
    """References only (NO_SECRETS_IN_CONTEXT): ids, never credentials."""

    tenant: str
    principal: str
    run_id: str
    tool_call_id: str
    connection_id: str | None
    deadline: float
    # The call's idempotency key (the caller's, or derived by the tool's strategy), the
    # same on every attempt: a tool with an external side effect passes it upstream so
    # the upstream can deduplicate a retried attempt. None: the call has none.
    idempotency_id: str | None = None
    attempt: int = 1  # 1, then 2, 3... on the runner's retries
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    # Called once when the call is cancelled: a capability cuts its request (on_cancel).
    _on_cancel: list[Callable[[], None]] = field(default_factory=list, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def cancelled(self) -> bool:
        """True once the runner gave up on this call (deadline or cancellation)."""
        return self._cancel.is_set()

    def check_cancelled(self) -> None:
        """Before each step of I/O: a cancelled call goes no further."""
        if self._cancel.is_set():
            raise ToolCancelled()

    def cancel(self) -> None:
        """The runner's: mark the call cancelled and run the registered callbacks (on the
        runner's thread: they must only cut, never wait)."""
        with self._lock:
            if self._cancel.is_set():
                return
            self._cancel.set()
            callbacks, self._on_cancel[:] = list(self._on_cancel), []
        for callback in callbacks:
            # A capability's cut failing must not fail the runner: the thread ends anyway.
            with contextlib.suppress(Exception):
                callback()

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run `callback` when the call is cancelled (at once if it already is); answers
        the function that unregisters it (call it once the I/O it guards is over)."""
        with self._lock:
            if not self._cancel.is_set():
                self._on_cancel.append(callback)
                return partial(self._forget, callback)
        callback()
        return lambda: None

    def _forget(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if callback in self._on_cancel:
                self._on_cancel.remove(callback)

    def time_left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def wait_cancelled(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds, waking early when cancelled."""
        return self._cancel.wait(timeout)


Execute = Callable[[Any, ToolContext, Any], Any]

IdempotencyStrategy = Literal["auto", "params", "custom", "none"]
IdempotencyScope = Literal["tenant", "principal", "run"]
STRATEGIES: tuple[IdempotencyStrategy, ...] = ("auto", "params", "custom", "none")
SCOPES: tuple[IdempotencyScope, ...] = ("tenant", "principal", "run")
DEFAULT_KEY_TTL_S = 24 * 3600


@dataclass(frozen=True)
class Idempotency:
    """How a tool's calls are identified in the idempotency ledger (seed 002).

    - `custom`: the caller's `idempotencyKey` (no key sent: the call is not deduplicated);
    - `auto`: derived from the tool, the canonical arguments and the connection;
    - `params`: derived from the tool and the arguments named in `params` only (the same
      values with other arguments is a conflict, not a second execution);
    - `none`: never deduplicated (a key sent is ignored); not for external side effects.

    `scope` partitions keys: per tenant, per principal, or per principal and run.
    `ttl_s` is how long a successful call's key is remembered from its first use.
    """

    strategy: IdempotencyStrategy = "custom"
    params: tuple[str, ...] = ()
    scope: IdempotencyScope = "principal"
    ttl_s: int = DEFAULT_KEY_TTL_S


@dataclass(frozen=True)
class Retries:
    """The runner's own retries of an attempt that ended `unavailable` or `timeout`.

    `attempts` is how many times it tries again (0: never); the n-th retry waits
    `backoff_ms * 2**(n-1)`, spread by +-`jitter` (a fraction), and at least the tool's
    `retry_after_ms` hint."""

    attempts: int = 0
    backoff_ms: int = 200
    jitter: float = 0.2


def default_idempotency(effect: Effect) -> Idempotency:
    """The effect's default (apps/tools/call_settings.py, settings
    TOOLHUB_IDEMPOTENCY_DEFAULTS): as shipped, the caller's key (`custom`, scope
    `principal`, 24 h) for every effect; a deployment may derive keys per effect (e.g.
    `auto`, scope `run`, for external side effects). A caller's own key wins over a
    derived one."""
    from apps.tools import call_settings

    return call_settings.default_idempotency(effect)


def default_retries(effect: Effect) -> Retries:
    """No retries by default, for any effect: a retry multiplies the time a caller waits
    on a tool that is down, and only the tool knows whether its failures pass (a flaky
    upstream) or last. An external side effect that timed out may have happened: even
    when configured, the runner retries it only for a call with an idempotency key,
    which every attempt passes on (ctx.idempotency_id) for the upstream to deduplicate."""
    return Retries()


@dataclass(frozen=True)
class ToolContract:
    name: str
    description: str
    params: type[ToolParams]
    result: type[BaseModel]
    execute: Execute
    effect: Effect
    redaction: Redaction | None
    consequence_level: ConsequenceLevel = "low"
    requires_confirmation: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S
    tags: tuple[str, ...] = ()
    version: str = "1"
    requires_connection: bool = False
    capabilities: tuple[str, ...] = ()
    namespace: str = "core"
    # Seed 001's `dependsOn`: ids of the other tools this one calls internally. Shown in
    # the catalog; each must be registered too (ToolRegistry.check_dependencies).
    depends_on: tuple[str, ...] = ()
    # The tool computes its answer from its arguments (and the clock) and returns at once:
    # it never waits on anything. The runner then calls it on the calling thread, without
    # the hand-over to a tool thread and back (issue 13); its deadline is checked when it
    # returns. The registry refuses it with a capability that can wait (NEVER_WAIT).
    runs_inline: bool = False
    # The idempotency ledger's strategy and the runner's retries (None: the effect's
    # defaults, default_idempotency / default_retries). Staff may change both in the admin.
    idempotency: Idempotency | None = None
    retries: Retries | None = None

    @property
    def call_idempotency(self) -> Idempotency:
        return self.idempotency or default_idempotency(self.effect)

    @property
    def call_retries(self) -> Retries:
        return self.retries or default_retries(self.effect)

    @property
    def id(self) -> str:
        return f"{self.namespace}__{self.name}"
