"""Hooks that exist only for tests (tests/invocations/test_hooks.py): each misbehaves or
acts in one way on demand. Listed by dotted path in TOOLHUB_HOOKS overrides."""

from __future__ import annotations

import itertools
import threading
from typing import Any

from apps.invocations.hooks import Hook, HookCall

# Set to let Loops finish; tests set it when they are done with it.
RELEASE = threading.Event()
SEEN: list[dict[str, Any]] = []  # what Watches saw, in order
_stamps = itertools.count(1)


class Explodes(Hook):
    def before_execution(self, call: HookCall) -> None:
        raise RuntimeError("internal detail: password=hunter2")


class ExplodesAfter(Hook):
    def after_result(self, call: HookCall) -> None:
        raise KeyError("internal")


class Loops(Hook):
    """Never returns by itself (until the test sets RELEASE)."""

    def before_authorization(self, call: HookCall) -> None:
        while not RELEASE.wait(0.01):
            pass


class AnswersWrongly(Hook):
    def before_execution(self, call: HookCall) -> None:
        call.respond({"token": 5, "executions": "many"})


class SpoilsResult(Hook):
    def after_result(self, call: HookCall) -> None:
        call.result = {"waited": "not a number"}


class Answers(Hook):
    def before_execution(self, call: HookCall) -> None:
        call.respond({"token": "from-hook", "executions": 0})


class AnswersEarly(Hook):
    def before_authorization(self, call: HookCall) -> None:
        call.respond({"token": "too-early", "executions": 0})


class Shouts(Hook):
    """Upper-cases `text` after validation (in place)."""

    def after_validation(self, call: HookCall) -> None:
        assert call.arguments is not None
        call.arguments["text"] = str(call.arguments["text"]).upper()


class Breaks(Hook):
    def before_authorization(self, call: HookCall) -> None:
        call.arguments = {"text": 5}


class ChangesLate(Hook):
    def before_execution(self, call: HookCall) -> None:
        call.arguments = {"text": "something else"}


class Exclaims(Hook):
    """Ends `text` with one "!": the same arguments however often it runs."""

    def after_validation(self, call: HookCall) -> None:
        assert call.arguments is not None
        call.arguments["text"] = str(call.arguments["text"]).rstrip("!") + "!"


class Stamps(Hook):
    """Adds a new stamp each time: different arguments at every run."""

    def after_validation(self, call: HookCall) -> None:
        assert call.arguments is not None
        call.arguments["text"] = f"{call.arguments['text']} #{next(_stamps)}"


class Aborts(Hook):
    def __init__(self, code: str = "policy_denied") -> None:
        self.code = code

    def after_validation(self, call: HookCall) -> None:
        call.abort(self.code, "Amounts over 100 need a purchase order.")


class Watches(Hook):
    def on_error(self, call: HookCall) -> None:
        SEEN.append({"tool": call.tool_id, "code": call.error_code, "stage": call.stage})


class Names(Hook):
    """Appends its name to `text`, to show the order hooks run in."""

    def __init__(self, name: str = "") -> None:
        self.name = name

    def after_validation(self, call: HookCall) -> None:
        assert call.arguments is not None
        call.arguments["text"] = f"{call.arguments['text']}-{self.name}"


class NoStage(Hook):
    pass
