"""OpenAI chat-completions tool calls: decoders into `WireCall`s, results into `tool` messages.

Complete calls are the assistant message's `tool_calls`. Streamed calls are
`chat.completion.chunk` objects whose `delta.tool_calls` fragments are
assembled by `index`, as the `openai` SDK does: the first fragment of an
index opens the call (it carries the `id`), later string fragments of `id`,
`function.name` and `function.arguments` are appended. Only choice 0 is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from apps.invocations.models import ErrorCode
from apps.invocations.wire import CUT_MID_CALL, MalformedRequest, Outcome, Problem, WireCall
from toolhub.web import json_input

FINISHED = frozenset({"tool_calls", "stop", "function_call", "content_filter"})
"""finish_reason values after which every call in the stream is complete (not `length`)."""


@dataclass(frozen=True)
class Orphan:
    """Fragments for a tool call index that no fragment opened: no id to answer to."""

    index: int
    problem: Problem

    def as_error(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "errorCode": self.problem.code,
            "safeMessage": self.problem.safe_message,
        }


def decode_tool_calls(tool_calls: list[Any]) -> list[WireCall]:
    """An assistant message's `tool_calls`, as the model returned them."""
    return [_decode_call(item, f"toolCalls.{n}") for n, item in enumerate(tool_calls)]


def _decode_call(item: Any, where: str) -> WireCall:
    if not isinstance(item, dict):
        raise MalformedRequest(where, "A tool call must be an object.")
    call_id = item.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise MalformedRequest(f"{where}.id", "A tool call needs its id (a non-empty string).")
    if item.get("type", "function") != "function":
        problem = Problem(ErrorCode.VALIDATION, "Only function tool calls can run here.")
        return WireCall(call_id, "", "", problem)
    function = item.get("function")
    if not isinstance(function, dict):
        problem = Problem(ErrorCode.VALIDATION, "The tool call has no function object.")
        return WireCall(call_id, "", "", problem)
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(name, str):
        return WireCall(call_id, "", "", Problem(ErrorCode.UNAVAILABLE, "The call names no tool."))
    if not isinstance(arguments, str):
        problem = Problem(ErrorCode.VALIDATION, "function.arguments must be a string of JSON text.")
        return WireCall(call_id, name, "", problem)
    return WireCall(call_id, name, arguments)


@dataclass
class _Assembly:
    """One index's fragments so far."""

    id: str
    name: str = ""
    arguments: str = ""
    type: str = "function"


@dataclass
class StreamDecoder:
    """One decode session: the assembly state of one streamed response, never shared."""

    calls: dict[int, _Assembly] = field(default_factory=dict)
    orphans: dict[int, Orphan] = field(default_factory=dict)
    finish_reason: str | None = None

    def feed(self, chunk: Any, where: str = "chunk") -> None:
        if not isinstance(chunk, dict):
            raise MalformedRequest(where, "A chunk must be a chat.completion.chunk object.")
        choices = chunk.get("choices", [])
        if not isinstance(choices, list):
            raise MalformedRequest(f"{where}.choices", "choices must be a list.")
        for choice in choices:
            if not isinstance(choice, dict):
                raise MalformedRequest(f"{where}.choices", "A choice must be an object.")
            if choice.get("index", 0) != 0:
                continue
            self._feed_choice(choice, where)

    def _feed_choice(self, choice: dict[str, Any], where: str) -> None:
        if isinstance(choice.get("finish_reason"), str):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta") or {}
        fragments = (delta.get("tool_calls") or []) if isinstance(delta, dict) else None
        if not isinstance(delta, dict) or not isinstance(fragments, list):
            raise MalformedRequest(f"{where}.delta", "delta.tool_calls must be a list.")
        for fragment in fragments:
            index = fragment.get("index") if isinstance(fragment, dict) else None
            if not isinstance(index, int) or isinstance(index, bool) or index < 0:
                raise MalformedRequest(
                    f"{where}.delta.tool_calls", "Each tool call delta needs an integer index."
                )
            self._feed_fragment(index, fragment)

    def _feed_fragment(self, index: int, fragment: dict[str, Any]) -> None:
        if index in self.orphans:
            return
        assembly = self.calls.get(index)
        function = fragment.get("function") or {}
        if not isinstance(function, dict):
            function = {}
        if assembly is None:
            call_id = fragment.get("id")
            if not isinstance(call_id, str) or not call_id:
                self.orphans[index] = Orphan(
                    index,
                    Problem(
                        ErrorCode.VALIDATION,
                        f"Deltas for tool call index {index} arrived, but no delta opened that "
                        "call with its id; they were ignored.",
                    ),
                )
                return
            assembly = self.calls[index] = _Assembly(id="")
        for key, value in (("id", fragment.get("id")), ("name", function.get("name"))):
            if isinstance(value, str):
                setattr(assembly, key, getattr(assembly, key) + value)
        if isinstance(function.get("arguments"), str):
            assembly.arguments += function["arguments"]
        if isinstance(fragment.get("type"), str):
            assembly.type = fragment["type"]

    @property
    def finished(self) -> bool:
        return self.finish_reason in FINISHED

    def result(self) -> list[WireCall]:
        """The assembled calls by index. If the stream did not finish, a call whose
        arguments are not complete JSON was cut inside and must not run."""
        calls = []
        for index in sorted(self.calls):
            assembly = self.calls[index]
            problem = None
            if assembly.type != "function":
                problem = Problem(ErrorCode.VALIDATION, "Only function tool calls can run here.")
            elif not self.finished and not _complete_json(assembly.arguments):
                problem = CUT_MID_CALL
            calls.append(WireCall(assembly.id, assembly.name, assembly.arguments, problem))
        return calls

    def assembled(self) -> list[dict[str, Any]]:
        """The calls as an assistant message's `tool_calls` (what the SDK accumulates)."""
        return [
            {
                "id": a.id,
                "type": a.type,
                "function": {"name": a.name, "arguments": a.arguments},
            }
            for _, a in sorted(self.calls.items())
        ]


def _complete_json(text: str) -> bool:
    try:
        json_input.loads(text)
    except json_input.JsonInputError:
        return False
    return True


def decode_chunks(chunks: list[Any]) -> StreamDecoder:
    """A fresh decode session fed every chunk, in order."""
    session = StreamDecoder()
    for n, chunk in enumerate(chunks):
        session.feed(chunk, f"chunks.{n}")
    return session


def tool_message(outcome: Outcome) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": outcome.tool_call_id, "content": outcome.content()}
