"""Anthropic Messages tool use: decoders into `WireCall`s, results into `tool_result` blocks.

Complete calls are the assistant message's `tool_use` content blocks (other
block types are not calls and are skipped). Streamed calls are the Messages
stream events: `content_block_start` opens a `tool_use` block, its
`input_json_delta` fragments are appended, `content_block_stop` closes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from apps.invocations.models import ErrorCode
from apps.invocations.wire import CUT_MID_CALL, MalformedRequest, Outcome, Problem, WireCall


def decode_content(content: list[Any]) -> list[WireCall]:
    """An assistant message's content blocks; only `tool_use` blocks are calls."""
    calls = []
    for n, block in enumerate(content):
        where = f"content.{n}"
        if not isinstance(block, dict):
            raise MalformedRequest(where, "A content block must be an object.")
        if block.get("type") != "tool_use":
            continue
        calls.append(_decode_block(block, where))
    return calls


def _decode_block(block: dict[str, Any], where: str) -> WireCall:
    call_id = block.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise MalformedRequest(f"{where}.id", "A tool_use block needs its id (a non-empty string).")
    name = block.get("name")
    if not isinstance(name, str):
        return WireCall(call_id, "", "", Problem(ErrorCode.UNAVAILABLE, "The call names no tool."))
    # Re-encoded so that the runner makes the one decision on what is not an object.
    return WireCall(call_id, name, json.dumps(block.get("input", {})))


@dataclass
class _Block:
    id: str
    name: str
    partial_json: str = ""
    stopped: bool = False


@dataclass
class StreamDecoder:
    """One decode session: the assembly state of one streamed message, never shared."""

    blocks: dict[int, _Block] = field(default_factory=dict)
    other_blocks: set[int] = field(default_factory=set)
    orphans: dict[int, Problem] = field(default_factory=dict)

    def feed(self, event: Any, where: str = "event") -> None:
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise MalformedRequest(where, "An event must be an object with a type.")
        kind = event["type"]
        if kind not in ("content_block_start", "content_block_delta", "content_block_stop"):
            return
        index = event.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise MalformedRequest(f"{where}.index", f"A {kind} event needs an integer index.")
        if kind == "content_block_start":
            self._start(index, event.get("content_block"), where)
        elif index in self.other_blocks:
            return
        elif index not in self.blocks:
            self.orphans.setdefault(
                index,
                Problem(
                    ErrorCode.VALIDATION,
                    f"Events for content block {index} arrived, but no content_block_start "
                    "opened it; they were ignored.",
                ),
            )
        elif kind == "content_block_stop":
            self.blocks[index].stopped = True
        else:
            delta = event.get("delta")
            if isinstance(delta, dict) and delta.get("type") == "input_json_delta":
                partial = delta.get("partial_json")
                if isinstance(partial, str):
                    self.blocks[index].partial_json += partial

    def _start(self, index: int, block: Any, where: str) -> None:
        if not isinstance(block, dict):
            raise MalformedRequest(f"{where}.content_block", "content_block must be an object.")
        if block.get("type") != "tool_use":
            self.other_blocks.add(index)
            return
        call_id, name = block.get("id"), block.get("name")
        if not isinstance(call_id, str) or not call_id:
            raise MalformedRequest(f"{where}.content_block.id", "A tool_use block needs its id.")
        self.blocks[index] = _Block(call_id, name if isinstance(name, str) else "")

    def result(self) -> list[WireCall]:
        """The tool_use blocks by index; one never stopped was cut inside and must not run.
        No input fragments at all means `{}`, as the SDK's accumulation has it."""
        return [
            WireCall(
                block.id,
                block.name,
                block.partial_json or "{}",
                None if block.stopped else CUT_MID_CALL,
            )
            for _, block in sorted(self.blocks.items())
        ]


def decode_events(events: list[Any]) -> StreamDecoder:
    """A fresh decode session fed every event, in order."""
    session = StreamDecoder()
    for n, event in enumerate(events):
        session.feed(event, f"events.{n}")
    return session


def tool_result(outcome: Outcome) -> dict[str, Any]:
    return {
        "type": "tool_result",
        "tool_use_id": outcome.tool_call_id,
        "content": outcome.content(),
        "is_error": outcome.is_error,
    }


def orphan_notice(problem: Problem) -> dict[str, Any]:
    """A problem with no call to answer, told to the model as a text block after the results."""
    return {"type": "text", "text": f"toolhub ({problem.code}): {problem.safe_message}"}
