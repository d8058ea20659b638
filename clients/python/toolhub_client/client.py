"""HTTP and WebSocket calls to toolhub, with the standard library and `websockets`."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from websockets.sync.client import connect

from toolhub_client.results import AnthropicBatch, Invocation, OpenAIBatch, ToolResult


class ToolhubError(Exception):
    """toolhub refused a request (4xx/5xx); `body` is its JSON answer, `retry_after` its
    Retry-After header in seconds (None without one)."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"toolhub answered {status}: {body}")
        self.status = status
        self.body = body
        self.retry_after: float | None = None


def _seconds(header: str | None) -> float | None:
    """A Retry-After header's delay in seconds (toolhub sends seconds; a date is ignored)."""
    try:
        return float(header) if header is not None else None
    except ValueError:
        return None


def _plain(value: Any) -> Any:
    """SDK objects (pydantic models) become the JSON they came from."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_none=True)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


# The answers worth trying again after the wait toolhub names (retryAfterMs).
RETRIED_CODES = ("rate_limited", "unavailable")


class Toolhub:
    """One tenant's agent: `base_url` like `http://127.0.0.1:8000`, an API key.

    Honours toolhub's hints of when to try again: a 429 or 503 answer's `Retry-After`, and
    an invocation that ended `rate_limited` or `unavailable` with `retryAfterMs`. It tries
    again at most `max_retries` times, and only when the hint is at most
    `max_retry_wait` seconds; `max_retries=0` turns this off."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout: float = 60,
        *,
        max_retries: int = 2,
        max_retry_wait: float = 30.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_retry_wait = max_retry_wait

    def _wait_for_hint(self, seconds: float | None, tried: int) -> bool:
        """Sleep for a hint and answer True, or False if it is not to be followed."""
        if seconds is None or tried >= self.max_retries or not 0 <= seconds <= self.max_retry_wait:
            return False
        time.sleep(seconds)
        return True

    # ------------------------------------------------------------ HTTP

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        tried = 0
        while True:
            try:
                return self._request_once(method, path, body)
            except ToolhubError as exc:
                if exc.status not in (429, 503) or not self._wait_for_hint(exc.retry_after, tried):
                    raise
                tried += 1

    def _request_once(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(  # noqa: S310 - the caller chooses the base URL
            f"{self.base_url}{path}",
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self.api_key}",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                detail = json.loads(raw)
            except ValueError:
                detail = raw.decode(errors="replace")
            error = ToolhubError(exc.code, detail)
            error.retry_after = _seconds(exc.headers.get("Retry-After"))
            raise error from None

    def invoke(
        self,
        tool_id: str,
        args: dict[str, Any] | None = None,
        *,
        run_id: str | None = None,
        tool_call_id: str | None = None,
        connection_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> Invocation:
        """`POST /api/v1/invocations/`: runs one call and answers its record. A call that
        ended `rate_limited` or `unavailable` with `retryAfterMs` is sent again after that
        wait (see the class), with the same `idempotency_key`: a failed call does not hold
        its key, so the retry runs, and toolhub links it to the failed one (`retryOf`)."""
        body: dict[str, Any] = {"toolId": tool_id, "args": args or {}}
        optional = {
            "runId": run_id,
            "toolCallId": tool_call_id,
            "connectionId": connection_id,
            "idempotencyKey": idempotency_key,
        }
        body.update((name, value) for name, value in optional.items() if value is not None)
        tried = 0
        while True:
            answer = self._request("POST", "/api/v1/invocations/", body)
            hint = answer.get("retryAfterMs")
            retried = answer.get("ok") is False and answer.get("errorCode") in RETRIED_CODES
            wait = hint / 1000 if retried and isinstance(hint, int) else None
            if not self._wait_for_hint(wait, tried):
                return Invocation.from_json(answer)
            tried += 1

    def tools(self, format: str = "toolhub", run_id: str | None = None) -> list[dict[str, Any]]:
        """The catalog this key may use, as `toolhub` ToolSpecs or `openai`/`anthropic` tools;
        with `run_id`, that run's (only the tools on its allowlist, if it has one)."""
        query = {"format": format, **({"runId": run_id} if run_id else {})}
        return list(self._request("GET", f"/api/v1/tools/?{urlencode(query)}")["tools"])

    def start_run(self, tools: list[str], run_id: str | None = None) -> str:
        """Starts a run that may call only `tools` (per-run narrowing); answers its id. The
        allowlist is fixed once set: another one for the same run raises (409)."""
        body: dict[str, Any] = {"tools": list(tools)}
        if run_id is not None:
            body["runId"] = run_id
        return str(self._request("POST", "/api/v1/runs/", body)["runId"])

    def invocation(self, invocation_id: str) -> Invocation:
        return Invocation.from_json(self._request("GET", f"/api/v1/invocations/{invocation_id}/"))

    def receipt(self, invocation_id: str) -> str:
        """An ended call's signed receipt (verify it with `verify_receipt`)."""
        answer = self._request("GET", f"/api/v1/invocations/{invocation_id}/receipt/")
        return str(answer["receipt"])

    def run_openai_tool_calls(
        self,
        tool_calls: list[Any] | None = None,
        *,
        chunks: list[Any] | None = None,
        run_id: str | None = None,
    ) -> OpenAIBatch:
        """Runs an assistant message's `tool_calls` (dicts or SDK objects), or the streamed
        `chunks` they came in; answers the `tool` messages to append, in order."""
        run_id = run_id or f"run_{uuid.uuid4().hex}"
        body: dict[str, Any] = {"runId": run_id}
        if chunks is not None:
            body["chunks"] = _plain(chunks)
        else:
            body["toolCalls"] = _plain(tool_calls or [])
        answer = self._request("POST", "/api/v1/wire/openai/tool-calls/", body)
        return OpenAIBatch(run_id, answer["messages"], answer.get("errors", []))

    def run_anthropic_tool_use(
        self,
        content: list[Any] | None = None,
        *,
        events: list[Any] | None = None,
        run_id: str | None = None,
    ) -> AnthropicBatch:
        """Runs an assistant message's content blocks (its tool_use ones), or the streamed
        `events`; answers the user message of tool_result blocks to send next."""
        run_id = run_id or f"run_{uuid.uuid4().hex}"
        body: dict[str, Any] = {"runId": run_id}
        if events is not None:
            body["events"] = _plain(events)
        else:
            body["content"] = _plain(content or [])
        answer = self._request("POST", "/api/v1/wire/anthropic/tool-use/", body)
        return AnthropicBatch(run_id, answer)

    # ------------------------------------------------------------ waiting for held calls

    def _stream_url(self, run_id: str) -> str:
        parts = urlsplit(self.base_url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        path = f"{parts.path}/ws/v1/runs/{run_id}/"
        return urlunsplit((scheme, parts.netloc, path, "after=0", ""))

    def wait_for(self, run_id: str, held: ToolResult, timeout: float = 600) -> ToolResult:
        """Blocks until the held call ends (approved and run, rejected, expired, cancelled)
        and returns its final answer. Listens on the run's WebSocket, which replays
        earlier events first, so a decision taken before the call is not missed."""
        assert held.held is not None, "this call was not held"
        invocation_id = held.held.invocation_id
        deadline = time.monotonic() + timeout
        with connect(
            self._stream_url(run_id),
            additional_headers={"Authorization": f"Bearer {self.api_key}"},
            open_timeout=self.timeout,
        ) as stream:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"call {held.tool_call_id} is still held")
                event = json.loads(stream.recv(timeout=remaining))
                if event.get("type") == "tool_call_result" and (
                    event.get("invocationId") == invocation_id
                    or event.get("toolCallId") == held.tool_call_id
                ):
                    break
        return self.invocation(invocation_id).tool_result()

    def settle_openai(self, batch: OpenAIBatch, timeout: float = 600) -> list[dict[str, Any]]:
        """The batch's tool messages once every held call has ended."""
        messages = []
        for message, result in zip(batch.messages, batch.results, strict=True):
            if result.held:
                final = self.wait_for(batch.run_id, result, timeout)
                message = {**message, "content": final.content}
            messages.append(message)
        return messages

    def settle_anthropic(self, batch: AnthropicBatch, timeout: float = 600) -> dict[str, Any]:
        """The batch's user message once every held call has ended."""
        blocks = []
        for block in batch.message["content"]:
            if block.get("type") == "tool_result":
                result = ToolResult.parse(block["tool_use_id"], block["content"], block["is_error"])
                if result.held:
                    final = self.wait_for(batch.run_id, result, timeout)
                    block = {**block, "content": final.content, "is_error": final.is_error}
            blocks.append(block)
        return {**batch.message, "content": blocks}
