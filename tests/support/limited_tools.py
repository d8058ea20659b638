"""Tools for the concurrency-limit tests: each counts itself, so overlap is observed by
the tool, never inferred from timing. Registered by the tests' own fixture."""

from __future__ import annotations

import threading

from apps.tools.capabilities import Capabilities
from apps.tools.contracts import (
    Redaction,
    ToolContext,
    ToolContract,
    ToolError,
    ToolOutput,
    ToolParams,
)

HELD_S = 20  # the longest a test keeps a tool waiting for it


class NoParams(ToolParams):
    pass


class Done(ToolOutput):
    done: bool


class Gate:
    """Calls inside a tool right now, the most there ever were at once, and the test's
    hand on when they may leave."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.lock = threading.Lock()
        self.inside = 0
        self.most = 0
        self.entries = 0
        self.entered = threading.Semaphore(0)  # one release per call that came in
        self.opened = threading.Event()
        self.exited = threading.Semaphore(0)  # one release per call that went out

    def come_in(self) -> None:
        with self.lock:
            self.inside += 1
            self.entries += 1
            self.most = max(self.most, self.inside)
        self.entered.release()

    def go_out(self) -> None:
        with self.lock:
            self.inside -= 1
        self.exited.release()


GATE = Gate()
STUBBORN = Gate()


def gated(params: NoParams, ctx: ToolContext, caps: Capabilities) -> Done:
    """Stays inside until the test opens the gate (or the call is cancelled)."""
    GATE.come_in()
    try:
        while not GATE.opened.wait(0.05):
            if ctx.cancelled:
                raise ToolError("cancelled")
    finally:
        GATE.go_out()
    return Done(done=True)


def stubborn(params: NoParams, ctx: ToolContext, caps: Capabilities) -> Done:
    """Ignores its deadline and its cancellation: runs until the test lets it end."""
    STUBBORN.come_in()
    try:
        if not STUBBORN.opened.wait(HELD_S):
            raise ToolError("the test never let the stubborn tool end")
    finally:
        STUBBORN.go_out()
    return Done(done=True)


def noop(params: NoParams, ctx: ToolContext, caps: Capabilities) -> Done:
    return Done(done=True)


def _contract(name: str, execute: object, timeout_s: float = 15.0) -> ToolContract:
    return ToolContract(
        name=name,
        description=f"Test tool {name}.",
        params=NoParams,
        result=Done,
        execute=execute,  # type: ignore[arg-type]
        effect="read_only",
        redaction=Redaction(result=("done",), args=()),
        namespace="limits",
        timeout_s=timeout_s,
    )


CONTRACTS = [
    _contract("gated", gated),
    _contract("stubborn", stubborn, timeout_s=0.3),
    _contract("noop", noop),
]
GATED, STUBBORN_ID, NOOP = (contract.id for contract in CONTRACTS)
