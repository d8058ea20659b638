"""Capability interfaces injected into tools (TOOLS_IO_VIA_CAPABILITIES).

Only protocols live here; implementations are bound by the runner at execution
time (apps/invocations/capabilities.py), so tool modules stay free of I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...


class PlanStore(Protocol):
    """The current run's plan. Methods raise ToolError for rule violations."""

    def setup(self, objective: str, steps: list[str]) -> dict[str, Any]: ...
    def add_steps(self, steps: list[str]) -> dict[str, Any]: ...
    def update_step(
        self, step_id: int, title: str | None, status: str | None
    ) -> dict[str, Any]: ...
    def read(self) -> dict[str, Any]: ...


class Http(Protocol):
    """Requests through the call's connection; credentials are attached inside."""

    def request(
        self, method: str, url: str, headers: dict[str, str], body: str | None, timeout: float
    ) -> dict[str, Any]: ...


class Mailer(Protocol):
    def send(self, to: list[str], subject: str, body: str) -> int: ...


# Capabilities that answer from this process without waiting on anything: the only ones a
# tool that runs inline (ToolContract.runs_inline) may declare.
NEVER_WAIT = frozenset({"clock"})


@dataclass(frozen=True)
class Capabilities:
    """What the runner bound for one call; fields a tool did not declare are None."""

    clock: Clock | None = None
    plans: PlanStore | None = None
    http: Http | None = None
    mail: Mailer | None = None

    def require(self, name: str) -> Any:
        value = getattr(self, name)
        if value is None:
            raise RuntimeError(f"capability {name!r} was not bound; declare it in the contract")
        return value
