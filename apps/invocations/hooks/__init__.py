"""Hooks: code of the deployment that takes part in every tool call, as Django's
middleware takes part in every request (docs/hooks.md).

A hook is a class listed in settings.TOOLHUB_HOOKS. It defines a method for each stage
it takes part in; the runner calls it there, with a `HookCall` that shows the call and
lets the hook act on it:

- before_authorization  after the tool is looked up, before the policy: may change the
                        arguments (validated afterwards like the caller's) or abort.
- after_validation      after validation and the policy's rules: may change the
                        arguments (validated and checked by the rules again) or abort.
- before_execution      after every check and the approval gate, before the result
                        cache and the tool: may answer in the tool's place or abort.
- after_result          after output validation: may replace the result (validated
                        again) or abort; redaction and recording follow.
- on_error              when the call ends with an error: sees it, changes nothing.

No stage before the policy can let a call through (a hook may only refuse there), and
only before_execution, after the approval gate, may answer: hooks narrow what the checks
allow, never widen it. Arguments are fixed once the checks and the approval gate have
seen them: a change at a later stage is refused.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, NoReturn


class Stage(StrEnum):
    BEFORE_AUTHORIZATION = "before_authorization"
    AFTER_VALIDATION = "after_validation"
    BEFORE_EXECUTION = "before_execution"
    AFTER_RESULT = "after_result"
    ON_ERROR = "on_error"


class Hook:
    """Base class of hooks. The settings entry's `options` are passed as keyword
    arguments, once, when the hooks are loaded; a hook refuses options it does not know
    by raising TypeError or ValueError (the system check reports it)."""

    def __init__(self, **options: Any) -> None:
        if options:
            raise TypeError(f"unexpected options: {', '.join(sorted(options))}")


class Abort(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Respond(Exception):
    def __init__(self, result: Any) -> None:
        super().__init__("respond")
        self.result = result


class HookCall:
    """What a hook sees of a call, and how it acts on it.

    `arguments` is a copy: assign a new dict to change them (before_authorization and
    after_validation). `result` is the validated result at after_result: assign to
    replace it. `abort()` ends the call with an ErrorCode value and a message that is
    shown to the caller (with the hook's name); `respond()` answers in the tool's place
    (before_execution)."""

    def __init__(
        self,
        *,
        stage: Stage,
        tool_id: str,
        effect: str,
        source: str,
        tenant: str,
        principal: str,
        run_id: str,
        tool_call_id: str,
        arguments: dict[str, Any] | None,
        result: Any = None,
        error_code: str = "",
        safe_message: str = "",
    ) -> None:
        self.stage = stage
        self.tool_id = tool_id
        self.effect = effect
        self.source = source
        self.tenant = tenant
        self.principal = principal
        self.run_id = run_id
        self.tool_call_id = tool_call_id
        self.arguments = arguments
        self.result = result
        self.error_code = error_code
        self.safe_message = safe_message

    def abort(self, code: str, message: str) -> NoReturn:
        raise Abort(code, message)

    def respond(self, result: Any) -> NoReturn:
        raise Respond(result)
