"""An agent loop with the official `openai` SDK, toolhub running the tools.

The "model" is a scripted OpenAI-compatible chat-completions server that this
script starts on 127.0.0.1 (no network, no API key): on the first turn it asks
for several tools in parallel, once it has their results it answers in text.
When the catalog offers core__send_email (the demo's does), one of them is an
email, which the demo policy holds for approval: the script says so on stderr
and waits until an operator approves or rejects it in the console (/console/).
The loop is the ordinary one: call the model, hand its tool calls to toolhub's
wire endpoint untouched, append the `tool` messages, call the model again.

    python examples/agent_loop.py --key "$(cat var/demo_api_key)"  # on 127.0.0.1:$TOOLHUB_PORT
    python examples/agent_loop.py --toolhub http://127.0.0.1:8000 --key ...
    python examples/agent_loop.py ... --stream     # the model streams; toolhub assembles the deltas
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from openai import OpenAI
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessage
from toolhub_client import Toolhub, ToolhubError

MODEL = "scripted-model"
PROMPT = "What time is it in UTC and in Tokyo? Start a plan for the trip and tell Bob."
EMAIL_TOOL = "core__send_email"
EMAIL = {"to": ["bob@example.com"], "subject": "Trip to Tokyo", "body": "The plan is started."}


# ---------------------------------------------------------------- the scripted model


def next_turn(messages: list[dict[str, Any]], offered: set[str]) -> dict[str, Any]:
    """The script: tool calls first, then an answer built from the tool results.
    `offered` are the names of the tools the request offers."""
    results = [m for m in messages if m.get("role") == "tool"]
    if not results:
        calls = [
            _call("call_utc", "core__get_current_time", {"timezone": "UTC"}),
            _call("call_tokyo", "core__get_current_time", {"timezone": "Asia/Tokyo"}),
            _call("call_plan", "core__planning_setup_plan", {"objective": "Trip to Tokyo"}),
        ]
        if EMAIL_TOOL in offered:  # held for approval by the demo policy
            calls.append(_call("call_email", EMAIL_TOOL, EMAIL))
        return {"role": "assistant", "content": None, "tool_calls": calls}
    lines = []
    for result in results:
        data = json.loads(result["content"])
        if "iso" in data:
            lines.append(f"In {data['timezone']} it is {data['iso']}.")
        elif data.get("ok") is False:
            lines.append(f"A tool failed: {data['safeMessage']}")
        elif "recipients" in data:
            lines.append("Bob has been told.")
        else:
            lines.append("The plan is started.")
    return {"role": "assistant", "content": " ".join(lines)}


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    arguments = json.dumps(args)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def completion(message: dict[str, Any]) -> dict[str, Any]:
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


def chunks(message: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The message as a real stream sends it: ids and names first, arguments in pieces."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        base = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 0}
        return {**base, "model": MODEL, "choices": [choice]}

    yield chunk({"role": "assistant", "content": message.get("content") or ""})
    calls = message.get("tool_calls") or []
    for index, call in enumerate(calls):
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        opening = {"name": name, "arguments": ""}
        yield chunk(
            {
                "tool_calls": [
                    {"index": index, "id": call["id"], "type": "function", "function": opening}
                ]
            }
        )
        for start in range(0, len(arguments), 7):
            piece = {"arguments": arguments[start : start + 7]}
            yield chunk({"tool_calls": [{"index": index, "function": piece}]})
    yield chunk({}, "tool_calls" if calls else "stop")


class ScriptedModel(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        offered = {tool["function"]["name"] for tool in body.get("tools") or []}
        message = next_turn(body["messages"], offered)
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for piece in chunks(message):
                self.wfile.write(f"data: {json.dumps(piece)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            return
        data = json.dumps(completion(message)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def scripted_model() -> Iterator[str]:
    """The scripted model on a free port; yields its OpenAI base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedModel)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------- the agent loop


def ask(
    model: OpenAI, messages: list[Any], tools: list[Any], stream: bool
) -> tuple[ChatCompletionMessage, list[ChatCompletionChunk]]:
    """One model turn: its message, and the chunks it came in when streamed."""
    if not stream:
        reply = model.chat.completions.create(model=MODEL, messages=messages, tools=tools)
        return reply.choices[0].message, []
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    received = []
    for chunk in model.chat.completions.create(
        model=MODEL, messages=messages, tools=tools, stream=True
    ):
        state.handle_chunk(chunk)
        received.append(chunk)
    message = state.current_completion_snapshot.choices[0].message
    return ChatCompletionMessage.model_validate(message.model_dump()), received


def say_held(toolhub: Toolhub, message: ChatCompletionMessage, held: list[Any]) -> None:
    """Tells the person running the example what it is waiting for, and where to decide."""
    names = {
        call.id: call.function.name for call in message.tool_calls or [] if call.type == "function"
    }
    for result in held:
        print(  # noqa: T201 - on stderr: stdout is the transcript
            f"{result.tool_call_id} ({names.get(result.tool_call_id, '?')}) is held for approval "
            f"{result.held.approval_id}: approve or reject it in the console, "
            f"{toolhub.base_url}/console/ (operator / operator in the demo). Waiting...",
            file=sys.stderr,
            flush=True,
        )


def agent_loop(toolhub: Toolhub, model_url: str, stream: bool = False) -> list[dict[str, Any]]:
    """Runs the conversation to its final answer; returns every message."""
    model = OpenAI(base_url=model_url, api_key="not-needed", max_retries=0)
    tools = toolhub.tools(format="openai")
    messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]
    for _ in range(5):
        message, received = ask(model, messages, tools, stream)
        messages.append(message.model_dump(mode="json", exclude_none=True))
        if not message.tool_calls:
            return messages
        if stream:  # toolhub assembles the streamed deltas itself
            batch = toolhub.run_openai_tool_calls(chunks=received)
        else:
            batch = toolhub.run_openai_tool_calls(message.tool_calls)
        # A call held for approval: wait on the run's stream until a person decides.
        say_held(toolhub, message, batch.held)
        messages.extend(toolhub.settle_openai(batch))
    raise RuntimeError("the model kept asking for tools")


def default_url() -> str:
    """$TOOLHUB_URL, else 127.0.0.1 on $TOOLHUB_PORT (make run's port, 8000 when unset)."""
    port = os.environ.get("TOOLHUB_PORT") or "8000"
    return os.environ.get("TOOLHUB_URL") or f"http://127.0.0.1:{port}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--toolhub",
        default=default_url(),
        metavar="URL",
        help="toolhub's base URL, e.g. http://127.0.0.1:8000 (default: $TOOLHUB_URL, else "
        "http://127.0.0.1:$TOOLHUB_PORT, port 8000 when unset: where `make run` serves; "
        f"now {default_url()})",
    )
    parser.add_argument(
        "--key",
        default=os.environ.get("TOOLHUB_API_KEY"),
        help="an agent's API key (default: $TOOLHUB_API_KEY; the demo's is in var/demo_api_key)",
    )
    parser.add_argument("--stream", action="store_true", help="the model streams its answer")
    options = parser.parse_args()
    if not options.key:
        parser.error("give --key or set TOOLHUB_API_KEY (make run prints the demo key)")
    toolhub = Toolhub(options.toolhub, options.key)
    try:
        with scripted_model() as model_url:
            for message in agent_loop(toolhub, model_url, options.stream):
                print(json.dumps(message))  # noqa: T201 - the example's output is the transcript
    except ToolhubError as exc:
        sys.exit(f"agent_loop.py: toolhub at {toolhub.base_url} refused: {exc}")
    except OSError as exc:  # URLError, a refused connection, a WebSocket that cannot open
        reason = getattr(exc, "reason", None) or exc.strerror or exc
        sys.exit(
            f"agent_loop.py: cannot reach toolhub at {toolhub.base_url} ({reason}). "
            "Is it running (make run)? Give its address with --toolhub or TOOLHUB_PORT."
        )


if __name__ == "__main__":
    main()
