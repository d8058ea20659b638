"""The runner: the one path every tool call takes (TOOLS_VIA_TOOLRUNNER).

REST, wire-format batches and MCP call `invoke`; an approved call comes back
through `resume`, which re-runs the checks and continues at step 8; a held call
that will never run (rejected, expired, cancelled) ends through `end_held`.
It reads as the numbered pipeline of DESIGN.md, one small step per function:

  1 lookup_tool          unavailable
  2 check_run            policy_denied (outside the run's allowlist: runs.py)
    check_policy         policy_denied, rate_limited
  3 check_permission     authz_denied
  4 check_connection     policy_denied, authz_denied
  5 validate_args        invalid_json, validation
    apply_rules          policy_denied (CEL conditions need the validated args)
  6 find_replay          idempotency ledger hit -> the recorded call
  7 hold_for_approval    pending_approval
  8 record_start         tool_call_start
  9 (9a read_cache       a read-only tool's cached result answers; nothing runs)
    take_slot (9b)       rate_limited (a concurrency limit), unavailable (lingering threads),
                         cancelled (while it waited for a slot); only when the tool runs
    bind_capabilities
 10 execute              execution, timeout, cancelled, unavailable (a remote server down)
    scrub_secrets        execution (the secrets the call sent out of the output, step 10b)
 11 validate_output      output_invalid, result_too_large
    reported_failure     execution (the result says the tool failed: MCP's isError)
 12 redact_result        redaction_failed
 13 record_result        tool_call_result, with the call's signed receipt

A step that refuses raises `Refusal`; the call then ends as a recorded
`ok: false` result. Nothing a tool does can turn into an HTTP 500.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import random
import time
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import (
    IntegrityError,
    OperationalError,
    close_old_connections,
    connections,
    transaction,
)
from django.utils import timezone
from pydantic import BaseModel, ValidationError

from apps.approvals.models import ApprovalRequest
from apps.connections import broker, grants
from apps.connections.permissions import can_use_connection
from apps.connections.scrubbing import Scrubber
from apps.invocations import (
    combined,
    concurrency,
    events,
    leases,
    ledger,
    ratelimit,
    result_cache,
    runs,
    signals,
    statements,
)
from apps.invocations.capabilities import bind
from apps.invocations.hooks import HookCall, Stage
from apps.invocations.hooks import pipeline as hook_pipeline
from apps.invocations.models import ErrorCode, IdempotencyEntry, InvocationRecord, Status
from apps.invocations.requests import (
    MAX_ARGS_BYTES,
    MAX_RESULT_BYTES,
    InvocationRequest,
    ProgressSink,
    progress_sink,
)
from apps.policies import policy
from apps.receipts import keys as receipt_keys
from apps.receipts import signing as receipts
from apps.receipts.body import Facts
from apps.tenants import callers, epoch
from apps.tenants.callers import Caller
from apps.tools import sources
from apps.tools.call_settings import MAX_BACKOFF_MS
from apps.tools.capabilities import Capabilities
from apps.tools.contracts import (
    Retries,
    ToolCancelled,
    ToolContext,
    ToolError,
    ToolOutput,
    ToolParams,
    ToolRateLimited,
    ToolResultTooLarge,
    ToolTimedOut,
    ToolUnavailable,
)
from apps.tools.models import Effect, Tool
from apps.tools.permissions import can_execute
from apps.tools.redaction import redact, shape_of
from apps.tools.registry import RegisteredTool, registry
from toolhub.web import json_input

logger = logging.getLogger(__name__)

_tool_threads = ThreadPoolExecutor(
    max_workers=settings.TOOLHUB_TOOL_THREADS, thread_name_prefix="toolhub-tool"
)


class Refusal(Exception):
    """A step's verdict that the call ends here, with a code and a safe message."""

    def __init__(
        self, code: ErrorCode, safe_message: str, retry_after_ms: int | None = None
    ) -> None:
        super().__init__(safe_message)
        self.code = code
        self.safe_message = safe_message
        # rate_limited, lingering threads' unavailable, and unavailable and timeout when
        # the tool gave a hint (ToolError)
        self.retry_after_ms = retry_after_ms
        # Raised by the tool (ToolRateLimited), not by a step of the runner: a tool's
        # rate_limited is retried as unavailable is (a concurrency limit's is not).
        self.by_tool = False


@dataclass
class Call:
    """Everything the steps learn about one call, as they learn it."""

    caller: Caller
    request: InvocationRequest
    tool_call_id: str
    run_id: str
    received_at: datetime
    raw_args: dict[str, Any] | None = None
    args_problem: Refusal | None = None
    tool: Tool | None = None
    registered: RegisteredTool | None = None
    evaluator: policy.Evaluator | None = None
    decision: policy.Decision | None = None
    connection_id: str = ""
    params: ToolParams | None = None
    # The validated args as JSON values, dumped once (step 5); the request hash and the
    # rules (step 5b) read them, never change them.
    args_json: dict[str, Any] | None = field(default=None, repr=False)
    request_hash: str = ""
    record: InvocationRecord | None = None
    context: ToolContext | None = field(default=None, repr=False)
    started_at: datetime | None = None  # set when a quick call starts before its record
    dry_run: bool = False  # simulate(): checks only peek, never take a rate-limit slot
    # Called once if the tool is still running after QUICK_S (a worker hands the rest of
    # its batch to other workers rather than hold it behind a slow call).
    on_linger: Callable[[], None] | None = field(default=None, repr=False)
    # The scrubber of the secret the bound http capability sends (step 10b scrubs that
    # one, even if the secret is rotated while the tool runs).
    scrubber: Scrubber | None = field(default=None, repr=False)
    # A worker's: the end of this call is written with the next call's start (Closing).
    closing: Closing | None = field(default=None, repr=False)
    # Its tool_call_start is committed but not yet pushed (_run_holding_start).
    start_held: bool = False
    # The key that signs its receipt, chosen with its checks (at their epoch, no query).
    signer: receipt_keys.Signer | None = field(default=None, repr=False)
    approval: ApprovalRequest | None = field(default=None, repr=False)  # a held call's
    # The authorization epoch its checks were answered at (check_call): the result
    # cache's keys carry it, so an edit since then makes a miss.
    checked_epoch: int | None = None
    cache_hit: bool = False  # answered from the result cache (step 9a)
    # What the hooks did (apps/invocations/hooks), in order: the record keeps it.
    hook_trace: list[dict[str, str]] = field(default_factory=list)
    args_changed_by: str = ""  # the last hook that changed the arguments
    hooked_result: Any = field(default=None, repr=False)  # the after_result hooks' result
    # Step 6: the call's idempotency key by its tool's strategy (None: it has none), and
    # the ledger's entry for it when that entry's call no longer holds it (failed,
    # expired, invalidated): this call takes it over when it is recorded.
    key: ledger.Key | None = None
    previous: IdempotencyEntry | None = field(default=None, repr=False)
    # Step 10's attempts that ended unavailable or timeout and were tried again.
    retries: list[dict[str, Any]] = field(default_factory=list)
    tool_handed: bool = False  # step 10 handed the tool the call (it may have run)

    @classmethod
    def receive(cls, caller: Caller, request: InvocationRequest) -> Call:
        call = cls(
            caller=caller,
            request=request,
            # TOOLCALLID_STABLE: the caller's id, or one minted here, from start to result.
            tool_call_id=request.tool_call_id or f"call_{uuid.uuid4().hex}",
            run_id=request.run_id or f"run_{uuid.uuid4().hex}",
            received_at=timezone.now(),
        )
        call.raw_args, call.args_problem = _parse_arguments(request)
        return call

    @property
    def tool_ref(self) -> str:
        return self.request.tool_id

    @property
    def timeout_s(self) -> float:
        """The tool's timeout, cut to the policy's runtime budget."""
        assert self.tool is not None and self.decision is not None
        budget = self.decision.budgets.max_runtime_ms
        return min(self.tool.timeout_ms, budget or self.tool.timeout_ms) / 1000

    @property
    def patience_s(self) -> float:
        """How long the call may take with all its attempts: what a retry of it waits."""
        assert self.tool is not None
        retries = self.tool.retries
        waits = sum(_backoff_ms(retries, n, jittered=False) for n in range(1, retries.attempts + 1))
        return self.timeout_s * (1 + retries.attempts) + waits * (1 + retries.jitter) / 1000

    @property
    def max_result_bytes(self) -> int:
        assert self.decision is not None
        return min(MAX_RESULT_BYTES, self.decision.budgets.max_result_bytes or MAX_RESULT_BYTES)

    def redacted_args(self) -> Any:
        if self.params is None or self.registered is None:
            return None  # unvalidated args are never stored, only their shape
        return redact(self.params.model_dump(mode="json"), self.registered.args_tree)


def _parse_arguments(request: InvocationRequest) -> tuple[dict[str, Any] | None, Refusal | None]:
    if request.arguments is None:
        return (request.args or {}), None
    try:
        parsed = json_input.loads(request.arguments)
    except json_input.JsonInputError as exc:
        message = f"The tool arguments are refused. {exc}" if exc.limit else None
        return None, Refusal(
            ErrorCode.INVALID_JSON, message or "The tool arguments are not valid JSON."
        )
    if not isinstance(parsed, dict):
        return None, Refusal(ErrorCode.VALIDATION, "The tool arguments must be a JSON object.")
    return parsed, None


# ---------------------------------------------------------------- entry point


def check_call(call: Call, known_epoch: int | None = None) -> int:
    """Steps 1-6, the checks every call passes before it may run (or be held), and
    that an approved call passes again before it runs; a failure raises Refusal. Answers
    the authorization epoch the checks were answered at: `known_epoch` if given (see
    epoch.pinned), else the one read now."""
    with epoch.pinned(known_epoch):  # steps 1-4 ask caches: one epoch for all of them
        if not call.dry_run:
            call.signer = receipt_keys.signer()
        lookup_tool(call)
        run_hooks(call, Stage.BEFORE_AUTHORIZATION)  # may only refuse, or change the args
        check_run(call)
        check_policy(call)
        check_permission(call)
        check_connection(call)
        checked_at = epoch.current()
    _validate_hooked(call)
    apply_rules(call)
    changed_by = call.args_changed_by
    run_hooks(call, Stage.AFTER_VALIDATION)
    if call.args_changed_by != changed_by:  # new args: validated and ruled on again
        _validate_hooked(call)
        apply_rules(call)
    call.checked_epoch = checked_at
    return checked_at


def _validate_hooked(call: Call) -> None:
    """validate_args, naming the hook when a hook set the arguments."""
    try:
        validate_args(call)
    except Refusal as refusal:
        if not call.args_changed_by:
            raise
        raise Refusal(
            refusal.code,
            f"The arguments the hook {call.args_changed_by} set are refused. "
            + refusal.safe_message,
        ) from None


@dataclass(frozen=True)
class Verdict:
    """One check of a dry run: passed (ok), refused (with the code), or not reached."""

    check: str
    ok: bool | None  # None: not reached, because an earlier check it depends on failed
    message: str
    code: ErrorCode | None = None


@dataclass
class Simulation:
    """What `invoke` would do with a request, and why, check by check."""

    decision: str  # "allow" | "deny" | "require_approval"
    verdicts: list[Verdict]
    refusal: Refusal | None = None
    policy_rule: str = ""
    args_valid: bool = False
    validation_errors: list[dict[str, str]] = field(default_factory=list)
    connection_ok: bool | None = None  # None: the tool takes no connection

    @property
    def reasons(self) -> list[str]:
        return [f"{v.check}: {v.message}" for v in self.verdicts]


def _simulated_checks() -> list[tuple[str, Any, tuple[str, ...]]]:
    """Each check a dry run makes (check_call's), and the checks it needs passed first."""
    return [
        ("lookup_tool", lookup_tool, ()),
        ("check_run", check_run, ("lookup_tool",)),
        ("check_policy", check_policy, ("lookup_tool",)),
        ("check_permission", check_permission, ("lookup_tool",)),
        ("check_connection", check_connection, ("lookup_tool",)),
        ("validate_args", validate_args, ("lookup_tool",)),
        ("apply_rules", apply_rules, ("check_policy", "validate_args")),
    ]


def simulate(caller: Caller, request: InvocationRequest) -> Simulation:
    """A dry run of steps 1-7: every check `check_call` makes, without running, holding,
    recording, emitting or taking a rate-limit slot (NOTHING_RECORDED_ON_DRY_RUN).

    Unlike `invoke` it does not stop at the first refusal: each check whose inputs exist
    reports its own verdict, so one answer shows everything that needs fixing. The
    decision is still the first refusal in pipeline order, the one `invoke` would give.
    """
    call = Call.receive(caller, request)
    call.dry_run = True
    verdicts: dict[str, Verdict] = {}
    first: Refusal | None = None
    for name, check, needs in _simulated_checks():
        if any(not verdicts[n].ok for n in needs):
            verdicts[name] = Verdict(name, None, "not reached: " + ", ".join(needs) + " must pass")
            continue
        try:
            check(call)
        except Refusal as refusal:
            verdicts[name] = Verdict(name, False, refusal.safe_message, refusal.code)
            first = first or refusal
            continue
        verdicts[name] = Verdict(name, True, _passed(name, call))
    simulation = Simulation(
        decision="deny" if first else "allow",
        verdicts=list(verdicts.values()),
        refusal=first,
        policy_rule=call.decision.rule if call.decision is not None else "",
        args_valid=verdicts["validate_args"].ok is True,
        connection_ok=(
            None
            if call.tool is None or not call.tool.requires_connection
            else verdicts["check_connection"].ok is True
        ),
    )
    if verdicts["validate_args"].ok is False:
        simulation.validation_errors = _validation_errors(call)
    if first is None:
        _simulate_hold(call, simulation)
    return simulation


def _passed(name: str, call: Call) -> str:
    assert call.tool is not None
    if name == "lookup_tool":
        return f"{call.tool.id} exists and is enabled."
    if name in ("check_policy", "apply_rules"):
        assert call.decision is not None
        when = "with these arguments" if name == "apply_rules" else "before its rules"
        return f"{call.decision.reason} ({call.decision.rule}, {when})"
    if name == "check_run":
        if not call.request.run_id:
            return "No run named: no run allowlist applies."
        return f"The run {call.run_id} may call {call.tool.id}."
    if name == "check_permission":
        return f"{call.caller.principal} holds execute_tool on {call.tool.id}."
    if name == "check_connection":
        if not call.tool.requires_connection:
            return f"{call.tool.id} takes no connection."
        return "The connection is granted and usable."
    return "The arguments match the tool's schema."


def _simulate_hold(call: Call, simulation: Simulation) -> None:
    """Step 6 and 7 as questions: would this replay an earlier call, would it be held?"""
    assert call.tool is not None and call.decision is not None
    if _replays(call):
        simulation.verdicts.append(
            Verdict(
                "find_replay",
                True,
                "This idempotencyKey was used before: the call would answer with that "
                "call's outcome (or a validation error if it differs) and run nothing.",
            )
        )
    if call.decision.requires_approval or call.tool.requires_confirmation:
        simulation.decision = "require_approval"
        why = (
            call.decision.reason
            if call.decision.requires_approval
            else f"{call.tool.id} asks for confirmation of every call."
        )
        simulation.verdicts.append(Verdict("hold_for_approval", True, f"Held: {why}"))
    else:
        simulation.verdicts.append(Verdict("hold_for_approval", True, "Not held: it would run."))


def _replays(call: Call) -> bool:
    """Whether step 6 would answer with an earlier call (a dry run reads, never claims)."""
    assert call.tool is not None and call.args_json is not None
    caller = call.caller
    key = ledger.key_for(
        call.tool,
        caller.principal,
        call.request.run_id or "",
        call.request.idempotency_key,
        call.args_json,
        call.connection_id,
    )
    entry = ledger.find(caller.tenant, key) if key is not None else None
    return entry is not None and ledger.holds(entry)


def _validation_errors(call: Call) -> list[dict[str, str]]:
    """The schema errors field by field (never their values), for forms and the API."""
    if call.args_problem is not None or call.registered is None:
        problem = call.args_problem.safe_message if call.args_problem else "invalid"
        return [{"field": "arguments", "message": problem}]
    try:
        call.registered.contract.params.model_validate_json(json.dumps(call.raw_args), strict=True)
    except ValidationError as exc:
        return [
            {
                "field": ".".join(str(part) for part in error["loc"]) or "arguments",
                "message": error["msg"],
            }
            for error in exc.errors(include_input=False, include_url=False)
        ]
    return [{"field": "arguments", "message": "The arguments are too large."}]


def invoke(caller: Caller, request: InvocationRequest) -> InvocationRecord:
    """Run one tool call through the whole pipeline and return its record."""
    call = Call.receive(caller, request)
    try:
        check_call(call)
        replay = find_replay(call)
        if replay is not None:
            return replay
        held = hold_for_approval(call)
        if held is not None:
            return held
        if records_late(call):
            call.started_at = timezone.now()
            return run_started(call)
        if connections["default"].in_atomic_block:  # its commits come after this call
            winner = record_start(call)
            return winner if winner is not None else run_started(call)
        return _run_holding_start(call)
    except Refusal as refusal:
        run_error_hooks(call, refusal)
        return record_refusal(call, refusal)


def _run_holding_start(call: Call) -> InvocationRecord:
    """Steps 8-13 with the push of tool_call_start held (events.holding) until its result's
    push, which takes it along in one message, or until the tool outlasts QUICK_S
    (execute). Released whatever ends the call."""
    tenant_id = call.caller.tenant.pk
    try:
        with events.holding(tenant_id, call.run_id):
            winner = record_start(call)
        if winner is not None:
            return winner
        call.start_held = True
        return run_started(call)
    finally:
        events.release(tenant_id, call.run_id)


QUICK_S = 0.05  # how long a read-only call may run before its start must be recorded


def records_late(call: Call) -> bool:
    """A read-only call without an idempotency key is recorded once, at its end, when it
    ends within QUICK_S: the record, its tool_call_start and its tool_call_result in one
    transaction instead of two (issue 13). Step 10 records the start as soon as the tool
    takes longer, with the time it really started. Nothing is lost by waiting: a read-only
    tool changes nothing, and its result leaves the process only after the record is
    written. A key must be claimed (the record's insert) before anything runs."""
    assert call.tool is not None
    return call.tool.effect == Effect.READ_ONLY and call.key is None


class Closing:
    """A worker's calls, one after another, each ended in the next one's transaction.

    A call run by resume() with a Closing does not write its end (the record's closing
    UPDATE and its tool_call_result) in a transaction of its own: it is written in the
    transaction that records the next call's start, or by flush() when the batch ends, so
    a queued call costs one transaction instead of two (issue 13, goal 6). The result is
    released (pushed) only after that commit, as every result is; it waits for the next
    call's re-checks, well under a millisecond. A worker that dies in between leaves the
    record `executing`, as one dying while the tool runs does (settle_interrupted)."""

    def __init__(self) -> None:
        self._ends: list[InvocationRecord] = []
        # The authorization epoch the last start's statement saw (PostgreSQL): the next
        # call is checked at it, with no read of its own (apps.invocations.combined).
        self.epoch: int | None = None

    def add(self, record: InvocationRecord) -> None:
        self._ends.append(record)

    def pending(self) -> list[InvocationRecord]:
        return list(self._ends)

    def write(self) -> None:
        """Write the ends noted so far, in the caller's transaction; they are done once it
        commits (on a rollback they stay, and the next write or flush writes them)."""
        ends = list(self._ends)
        for record in ends:
            _write_end(record)
        if ends:
            transaction.on_commit(lambda: self.done(ends))

    def done(self, ends: list[InvocationRecord]) -> None:
        """These ends are written (a statement that committed, or is part of the caller's
        transaction): their leases are no longer renewed."""
        self._ends = [end for end in self._ends if all(end is not other for other in ends)]
        for end in ends:
            leases.keeper.forget(end.pk)

    def flush(self) -> None:
        """Write what is left in a transaction of its own: on PostgreSQL one statement
        (apps.invocations.combined, as a start's), else the statements one by one."""
        ends = list(self._ends)
        if not ends:
            return
        if combined.available() and _write_ends_combined(ends):
            self.done(ends)
            return
        with transaction.atomic(), events.gathered():
            self.write()


def resume(
    approval: ApprovalRequest,
    claim: Callable[[], bool] | None = None,
    on_linger: Callable[[], None] | None = None,
    closing: Closing | None = None,
) -> InvocationRecord | None:
    """Run an approved call: same checks again (the world may have changed while it
    waited), the approved args bound by hash, then steps 8-13 on its record.

    `claim` (the worker's approved -> executing) runs in the transaction that records the
    start, or the refusal: one transaction fewer per call, and a claimed call has always
    started. When it fails (another worker has the call, or it was cancelled) nothing is
    written and None is returned. `on_linger` is called if the tool runs past QUICK_S.
    With `closing`, the ends of earlier calls are written in the transaction that starts
    this one (with their events, in one insert), and this call's end is left to the next
    one (Closing).

    On PostgreSQL, with a Closing and a Guarded claim, that transaction is one statement
    (apps.invocations.combined) and the checks use the epoch the previous one saw."""
    # On PostgreSQL, the start is one statement (apps.invocations.combined), and the
    # checks are answered at the epoch the previous one saw; an edit since then makes
    # the claim miss, and the call is checked again at the new epoch (an edit holds on
    # the next call). After EPOCH_ATTEMPTS such misses the statements go one by one.
    one_statement = (
        closing is not None and isinstance(claim, statements.Guarded) and combined.available()
    )
    attempts = 0
    ends: list[InvocationRecord] | None = None  # None: the closing's, not written yet
    while True:
        attempts += 1
        one_statement = one_statement and attempts <= EPOCH_ATTEMPTS
        known = closing.epoch if one_statement and closing is not None else None
        refused: Refusal | None = None
        with epoch.pinned(known):  # the requester's rows and the checks, at one epoch
            _join_requester(approval)
            call = _call_for(approval, args=approval.args)
            call.on_linger = on_linger
            try:
                checked_at = check_call(call, known)
                if call.request_hash != approval.bound_hash:
                    raise Refusal(ErrorCode.POLICY_DENIED, _differs(call))
            except Refusal as refusal:
                refused = refusal
        if refused is not None:
            if known is not None and closing is not None and epoch.read() != known:
                closing.epoch = None  # refused at an older epoch: check again at today's
                continue
            with transaction.atomic(), events.gathered():
                if closing is not None:
                    closing.write()
                return record_refusal(call, refused) if claim is None or claim() else None
        if not one_statement:
            break
        assert closing is not None and isinstance(claim, statements.Guarded)
        started = _start_combined(call, claim, closing, checked_at, ends)
        if started is None:  # a row only Django's own update can write
            one_statement, closing.epoch = False, None
            continue
        closing.epoch = started.epoch
        if started.claimed:
            call.closing = closing
            return run_started(call)
        ends = []  # written by that statement
        if started.epoch == checked_at:
            return None  # lost: another worker has the call, or it was cancelled
    with transaction.atomic(), events.gathered():
        if closing is not None:
            closing.write()
        if claim is not None and not claim():
            return None
        record_start(call)
    call.closing = closing
    return run_started(call)


def _differs(call: Call) -> str:
    if call.args_changed_by:
        return (
            f"The hook {call.args_changed_by} changed the arguments after approval: "
            "the call differs from what was approved."
        )
    return "The call differs from what was approved."


# How many times a call whose claim missed because of an edit (the epoch moved) is checked
# again and started in one statement, before its start goes statement by statement.
EPOCH_ATTEMPTS = 3


def runs_inline(tool_id: str) -> bool:
    """Whether the tool never waits (ToolContract.runs_inline). Only in-code contracts
    can say so: an MCP server's tools are never looked up (that would be a query)."""
    registered = registry.get(tool_id)
    return registered is not None and registered.contract.runs_inline


def resume_together(
    approvals: list[ApprovalRequest], claims: list[statements.Guarded], closing: Closing
) -> list[InvocationRecord | None] | None:
    """resume() for several approved calls of tools that never wait (runs_inline), on
    PostgreSQL: each is checked again as resume() checks it, all at one epoch, then
    their claims, their records' starts, their tool_call_start events and the earlier
    calls' ends are one statement (combined.write_many), and the claimed ones run one
    after the other, their ends left to the closing. None of them can hold the others (an
    inline tool answers within microseconds), so starting them together changes no start
    time anyone could tell apart; a tool that can wait is never started this way.

    Answers each call's record, or None where its claim missed (another worker has it,
    or it was cancelled). Answers None, with nothing written, when they must go one by
    one through resume(): a check refused one (resume records the refusal), a row only
    Django's own update can write, or the epoch moved EPOCH_ATTEMPTS times."""
    assert len(approvals) == len(claims)
    started: combined.Started | None = None
    calls: list[Call] = []
    for _ in range(EPOCH_ATTEMPTS):
        calls = []
        with epoch.pinned(closing.epoch):  # every call's checks at one epoch
            for approval in approvals:
                _join_requester(approval)
                call = _call_for(approval, args=approval.args)
                try:
                    check_call(call)
                except Refusal:
                    return None
                if call.request_hash != approval.bound_hash:
                    return None
                calls.append(call)
            checked_at = epoch.current()
        started = _start_together(calls, claims, closing, checked_at)
        if started is None:
            closing.epoch = None
            return None
        closing.epoch = started.epoch
        if started.epoch == checked_at:
            break  # a claim that missed now was lost, not outdated
    else:
        return None
    assert started is not None
    records: list[InvocationRecord | None] = []
    failure: BaseException | None = None
    for call, applied in zip(calls, started.applied, strict=True):
        if not applied:
            records.append(None)
            continue
        call.closing = closing
        try:  # a claimed call has started: the others run even if one breaks
            records.append(run_started(call))
        except Exception as error:
            failure = failure or error
            records.append(None)
    if failure is not None:
        raise failure
    return records


def _start_together(
    calls: list[Call], claims: list[statements.Guarded], closing: Closing, checked_at: int
) -> combined.Started | None:
    """_start_combined for several calls: one statement (combined.write_many)."""
    now = timezone.now()
    before: list[dict[str, Any]] = []
    for call in calls:
        assert call.record is not None
        before.append({name: getattr(call.record, name) for name in STARTING_FIELDS})
        _mark_started(call, now)
    ends = closing.pending()
    pending = _end_events(ends)
    pending += [
        combined.Pending(
            call.caller.tenant, call.run_id, _start_event(call, now), needs_claim=True, claim=n
        )
        for n, call in enumerate(calls)
    ]
    started = None
    try:
        started = combined.write_many(
            calls[0].record._state.db or "default",  # type: ignore[union-attr]
            [(end, CLOSING_FIELDS) for end in ends],
            [
                combined.Claim(claim, [(call.record, STARTING_FIELDS)])
                for call, claim in zip(calls, claims, strict=True)
            ],
            pending,
            checked_at,
        )
    finally:
        for n, (call, was) in enumerate(zip(calls, before, strict=True)):
            if started is None or not started.applied[n]:  # not started: as it was
                for name, value in was.items():
                    setattr(call.record, name, value)
            else:
                leases.keeper.hold(call.record.pk)  # type: ignore[union-attr]
    if started is not None:
        closing.done(ends)
        for end in ends:
            transaction.on_commit(partial(_log, end))
    return started


def _start_combined(
    call: Call,
    claim: statements.Guarded,
    closing: Closing,
    checked_at: int,
    ends: list[InvocationRecord] | None,
) -> combined.Started | None:
    """record_start for a held call, with the claim and the earlier calls' ends (`ends`,
    or the closing's), as one statement (apps.invocations.combined, PostgreSQL); None if
    it cannot be sent so."""
    assert call.record is not None
    now = timezone.now()
    record = call.record
    before = {name: getattr(record, name) for name in STARTING_FIELDS}
    _mark_started(call, now)
    if ends is None:
        ends = closing.pending()
    pending = _end_events(ends)
    pending.append(
        combined.Pending(call.caller.tenant, call.run_id, _start_event(call, now), needs_claim=True)
    )
    started = None
    try:
        started = combined.write(
            [(end, CLOSING_FIELDS) for end in ends],
            claim,
            [(record, STARTING_FIELDS)],
            pending,
            checked_at,
        )
    finally:
        if started is None or not started.claimed:  # not started: the record as it was
            for name, value in before.items():
                setattr(record, name, value)
        else:
            leases.keeper.hold(record.pk)
    if started is not None:
        closing.done(ends)
        for end in ends:
            transaction.on_commit(partial(_log, end))
    return started


def _end_events(ends: list[InvocationRecord]) -> list[combined.Pending]:
    """The closed records' tool_call_result events, for one statement (combined)."""
    return [
        combined.Pending(end.tenant, end.run_id, _result_event(end), needs_claim=False, end=end)
        for end in ends
    ]


def _write_ends_combined(ends: list[InvocationRecord]) -> bool:
    """The ends alone, with their events, as one statement; False if it cannot be sent so
    (nothing was written)."""
    written = combined.write(
        [(end, CLOSING_FIELDS) for end in ends], None, [], _end_events(ends), None
    )
    if written is None:
        return False
    for end in ends:
        transaction.on_commit(partial(_log, end))
    return True


def end_held(approval: ApprovalRequest, code: ErrorCode, safe_message: str) -> InvocationRecord:
    """A held call that will not run: its record ends with `code`, events included."""
    call = _call_for(approval, args=approval.args)
    call.tool, call.registered = approval.tool, sources.get_tool(approval.tool_id)
    return record_refusal(call, Refusal(code, safe_message))


def run_started(call: Call) -> InvocationRecord:
    """Steps 9-13 for a call whose start is recorded."""
    assert call.tool is not None
    slot: concurrency.Slot | None = None
    try:
        answered = run_hooks(call, Stage.BEFORE_EXECUTION)
        cache_key = "" if answered is not None else _cache_key(call)
        if cache_key:
            hit, cached = result_cache.get(call.caller.tenant.slug, call.tool.id, cache_key)
            if hit:  # already through the after_result hooks and redaction
                call.cache_hit = True
                return record_result(call, cached)
        if answered is not None:  # a hook answered in the tool's place
            result = _validate_hook_output(call, answered.hook, answered.answer)
        else:
            output = scrub_secrets(call, execute_attempts(call))
            result = validate_output(call, output)
        result = after_result(call, result)
        failure = reported_failure(call, result)
        if failure is not None:
            refusal = Refusal(ErrorCode.EXECUTION, failure)
            return _finish(call, ok=False, result=redact_result(call, result), refusal=refusal)
        redacted = redact_result(call, result)
        if cache_key:
            result_cache.put(call.tool.cache_ttl_s, cache_key, redacted)
        return record_result(call, redacted)
    except Refusal as refusal:
        refusal = _scrubbed(call, refusal)
        run_error_hooks(call, refusal)
        return record_refusal(call, refusal)
    finally:
        if slot is not None and not slot.handed:  # not run on a thread (inline, or refused)
            slot.release()
        if call.record is not None and call.record.ended_at is None:  # broke off: unrenewed,
            leases.keeper.forget(call.record.pk)  # its lease runs out and it is settled


def _cache_key(call: Call) -> str:
    """9a. The result cache's key for this call, "" when its tool's results are not
    cached (apps/invocations/result_cache.py). Asked only here, after every check and
    the approval gate: a cached answer passes exactly what a run would have passed."""
    if not result_cache.cacheable(call.tool) or call.checked_epoch is None:
        return ""
    assert call.tool is not None
    return result_cache.key(
        tool=call.tool,
        tenant_id=call.caller.tenant.pk,
        principal=call.caller.principal,
        run_id=call.run_id,
        request_hash=call.request_hash,
        epoch=call.checked_epoch,
        hooks=hook_pipeline.fingerprint(),
    )


# ---------------------------------------------------------------- hooks


def run_hooks(call: Call, stage: Stage) -> hook_pipeline.Ran | None:
    """The hooks of `stage` that apply to this call, in priority order
    (apps/invocations/hooks). Each one's action becomes the call's: new arguments are
    taken (before_authorization, after_validation), an abort or a failure is a Refusal
    naming the hook, an answer (before_execution) is returned. None: no hook answered."""
    if not settings.TOOLHUB_HOOKS or call.dry_run:
        return None
    arguments = call.raw_args if stage == Stage.BEFORE_AUTHORIZATION else call.args_json
    for registered in _hooks_for(call, stage, arguments):
        view = _hook_view(call, stage, arguments)
        ran = hook_pipeline.run_one(registered, view, _hook_limit(call))
        _take(call, ran)
        if ran.outcome == "respond":
            return ran
        arguments = view.arguments  # the next hook sees this one's arguments
    return None


def _hooks_for(
    call: Call, stage: Stage, arguments: dict[str, Any] | None
) -> list[hook_pipeline.Registered]:
    try:
        return hook_pipeline.for_stage(stage, _hook_view(call, stage, arguments))
    except Exception as exc:  # the system check reports the details at start-up
        logger.error("hooks could not be loaded: %s", exc)
        raise Refusal(
            ErrorCode.EXECUTION,
            "The deployment's hooks could not be loaded (manage.py check names the problem); "
            "the tool was not run.",
        ) from None


def _hook_view(
    call: Call, stage: Stage, arguments: dict[str, Any] | None, refusal: Refusal | None = None
) -> HookCall:
    assert call.tool is not None
    return HookCall(
        stage=stage,
        tool_id=call.tool.id,
        effect=call.tool.effect,
        source=call.tool.source,
        tenant=call.caller.tenant.slug,
        principal=call.caller.principal,
        run_id=call.run_id,
        tool_call_id=call.tool_call_id,
        arguments=copy.deepcopy(arguments),
        result=copy.deepcopy(call.hooked_result) if stage == Stage.AFTER_RESULT else None,
        error_code=str(refusal.code) if refusal is not None else "",
        safe_message=refusal.safe_message if refusal is not None else "",
    )


def _hook_limit(call: Call) -> float:
    """A hook's deadline: TOOLHUB_HOOK_TIMEOUT_MS, cut to the time the call has left."""
    assert call.tool is not None
    left = (
        call.context.time_left()
        if call.context is not None
        else call.timeout_s
        if call.decision is not None
        else call.tool.timeout_ms / 1000
    )
    return max(0.0, min(settings.TOOLHUB_HOOK_TIMEOUT_MS / 1000, left))


_NOT_RUN = {
    Stage.BEFORE_AUTHORIZATION: "the tool was not run",
    Stage.AFTER_VALIDATION: "the tool was not run",
    Stage.BEFORE_EXECUTION: "the tool was not run",
    Stage.AFTER_RESULT: "the tool's result was not returned",
    Stage.ON_ERROR: "the call's error stands",
}
_ARGS_STAGES = (Stage.BEFORE_AUTHORIZATION, Stage.AFTER_VALIDATION)


def _take(call: Call, ran: hook_pipeline.Ran) -> None:
    """Make one hook's action the call's, and note it in the trace; raise the Refusal
    it leads to."""
    name, stage, view = ran.hook, ran.stage, ran.call

    def trace(did: str) -> None:
        call.hook_trace.append({"hook": name, "stage": str(stage), "did": did})

    if ran.outcome == "timed_out":
        trace(f"did not finish within {ran.limit_s:g} s")
        raise Refusal(
            ErrorCode.TIMEOUT,
            f"The hook {name} did not finish within {ran.limit_s:g} s; {_NOT_RUN[stage]}.",
        )
    if ran.outcome == "raised":
        trace(f"raised {ran.error}")
        raise Refusal(
            ErrorCode.EXECUTION, f"The hook {name} failed ({ran.error}); {_NOT_RUN[stage]}."
        )
    if ran.outcome == "abort":
        assert ran.abort is not None
        try:
            code = ErrorCode(ran.abort.code)
        except ValueError:
            trace(f"aborted with {str(ran.abort.code)[:40]!r}, not an error code")
            raise Refusal(
                ErrorCode.EXECUTION,
                f"The hook {name} aborted with {str(ran.abort.code)[:40]!r}, which is not an "
                f"error code; {_NOT_RUN[stage]}.",
            ) from None
        trace(f"aborted: {code}")
        raise Refusal(code, f"{str(ran.abort.message)[:800]} (refused by the hook {name})")
    if ran.outcome == "respond":
        if stage != Stage.BEFORE_EXECUTION:
            trace("tried to answer")
            raise Refusal(
                ErrorCode.EXECUTION,
                f"The hook {name} tried to answer at {stage}; only before_execution hooks, "
                f"after the checks and the approval gate, may answer; {_NOT_RUN[stage]}.",
            )
        trace("answered in the tool's place")
        return
    if stage == Stage.AFTER_RESULT and view.result != ran.before:
        trace("changed the result")
        call.hooked_result = _validate_hook_output(call, name, view.result)
        return
    if view.arguments == ran.before:
        trace("passed")
        return
    if stage not in _ARGS_STAGES:
        trace("changed the arguments after the checks")
        raise Refusal(
            ErrorCode.POLICY_DENIED,
            f"The hook {name} changed the arguments at {stage}, after the checks and the "
            "approval gate saw them; the call is refused.",
        )
    if not isinstance(view.arguments, dict):
        trace("set arguments that are not an object")
        raise Refusal(
            ErrorCode.VALIDATION, f"The hook {name} set arguments that are not a JSON object."
        )
    trace("changed the arguments")
    call.raw_args, call.args_problem, call.args_changed_by = view.arguments, None, name


def _validate_hook_output(call: Call, hook: str, output: Any) -> dict[str, Any]:
    """validate_output for a result a hook gave, naming the hook when it is refused."""
    try:
        return validate_output(call, output)
    except Refusal as refusal:
        if refusal.code != ErrorCode.OUTPUT_INVALID:
            raise
        raise Refusal(
            ErrorCode.OUTPUT_INVALID,
            f"The hook {hook} gave a result that does not match the tool's declared output.",
        ) from None


def after_result(call: Call, result: dict[str, Any]) -> dict[str, Any]:
    """11a. The after_result hooks, each seeing the last one's (validated) result."""
    call.hooked_result = result
    run_hooks(call, Stage.AFTER_RESULT)
    return call.hooked_result


def run_error_hooks(call: Call, refusal: Refusal) -> None:
    """The on_error hooks see the error; they cannot change it, and their own failure
    is noted in the trace, never raised."""
    if not settings.TOOLHUB_HOOKS or call.dry_run or call.tool is None:
        return
    try:
        arguments = call.args_json if call.args_json is not None else call.raw_args
        view = _hook_view(call, Stage.ON_ERROR, arguments, refusal)
        for registered in hook_pipeline.for_stage(Stage.ON_ERROR, view):
            view = _hook_view(call, Stage.ON_ERROR, arguments, refusal)
            ran = hook_pipeline.run_one(registered, view, _hook_limit(call))
            did = {"ok": "saw the error", "timed_out": "did not finish"}.get(
                ran.outcome, f"{ran.outcome} {ran.error}".strip()
            )
            call.hook_trace.append({"hook": ran.hook, "stage": str(Stage.ON_ERROR), "did": did})
    except Exception:
        logger.exception("on_error hooks failed for %s", call.tool_ref)


def _join_requester(approval: ApprovalRequest) -> None:
    """The approval's tenant and requesting user, as of the epoch in force: a worker's
    batch read does not join them (callers.requester)."""
    tenant, user = callers.requester(approval.tenant_id, approval.requested_by_id)
    model = type(approval)
    model.tenant.field.set_cached_value(approval, tenant)
    model.requested_by.field.set_cached_value(approval, user)


def _call_for(approval: ApprovalRequest, args: dict[str, Any]) -> Call:
    caller = Caller(
        tenant=approval.tenant, principal=approval.principal, user=approval.requested_by
    )
    request = InvocationRequest(
        tool_id=approval.tool_id,
        args=args,
        tool_call_id=approval.tool_call_id,
        run_id=approval.run_id,
        connection_id=approval.connection_id or None,
    )
    call = Call.receive(caller, request)
    call.approval = approval
    call.record = approval.invocation
    call.hook_trace = list(call.record.hooks or [])  # what the hooks did when it was held
    # The record's tenant is the approval's: closing the record costs no query for it.
    InvocationRecord.tenant.field.set_cached_value(call.record, approval.tenant)
    return call


# ---------------------------------------------------------------- steps 1-7


def lookup_tool(call: Call) -> None:
    """1. The tool must exist, be enabled by staff and still be provided."""
    tool = Tool.objects.current(call.tool_ref)
    registered = sources.get_tool(call.tool_ref)
    if tool is None:
        raise Refusal(
            ErrorCode.UNAVAILABLE,
            f"There is no tool {call.tool_ref[:140]!r}. "
            "GET /api/v1/tools/ lists the tools this caller may use.",
        )
    if registered is None or not tool.available:
        # Tool ids are global and not secret (docs/security.md): it may say which case.
        if not tool.enabled:
            raise Refusal(ErrorCode.UNAVAILABLE, f"The tool {tool.id} is disabled.")
        raise Refusal(
            ErrorCode.UNAVAILABLE,
            f"The tool {tool.id} is not provided now: its code or MCP server does not offer it.",
        )
    call.tool, call.registered = tool, registered
    if not tool.enabled:
        raise Refusal(ErrorCode.UNAVAILABLE, f"The tool {tool.id} is disabled.")


def check_run(call: Call) -> None:
    """2. A run started with an allowlist calls only those tools (per-run narrowing).

    A run id minted for this call (none was sent) was started by nobody: not narrowed."""
    assert call.tool is not None
    if not call.request.run_id:
        return
    allowed = runs.allowlist(call.caller.tenant, call.run_id)
    if allowed is not None and call.tool.id not in allowed:
        raise Refusal(ErrorCode.POLICY_DENIED, runs.refusal(call.run_id, allowed, call.tool.id))


def check_policy(call: Call) -> None:
    """2. DENY_BY_DEFAULT: a policy in force for the caller must allow the tool; budgets apply."""
    assert call.tool is not None
    caller = call.caller
    call.evaluator = policy.evaluator_for(caller.tenant, caller.principal, caller.user)
    call.decision = call.evaluator.decide(call.tool)
    if not call.decision.allowed:
        raise Refusal(ErrorCode.POLICY_DENIED, call.decision.reason)
    limit = call.decision.budgets.calls_per_minute
    if limit is None or call.record is not None or _claimed_key(call):
        return  # an approved call was counted when it was requested; a replay runs nothing
    take = ratelimit.peek if call.dry_run else ratelimit.admit
    admission = take(caller.tenant, caller.principal, limit)
    if not admission.admitted:
        wait_s = admission.retry_after_ms / 1000
        raise Refusal(
            ErrorCode.RATE_LIMITED,
            f"Rate limit reached: {limit} calls per minute. Retry in {wait_s:.1f} s.",
            retry_after_ms=admission.retry_after_ms,
        )


def _claimed_key(call: Call) -> bool:
    """The caller's idempotency key belongs to a call that still holds it: this request is
    a retry that runs nothing (step 6). Asked before the arguments are validated, so only
    a caller's key (which wins over a derived one) is known here: a derived key's retry
    is counted."""
    if call.tool is None or call.request.idempotency_key is None:
        return False
    caller = call.caller
    key = ledger.key_for(
        call.tool, caller.principal, call.request.run_id or "", call.request.idempotency_key, {}, ""
    )
    entry = ledger.find(caller.tenant, key) if key is not None else None
    return entry is not None and ledger.holds(entry)


def check_permission(call: Call) -> None:
    """3. The actor needs `execute_tool` on the tool (django-guardian)."""
    assert call.tool is not None
    if not can_execute(call.caller.user, call.tool):
        raise Refusal(
            ErrorCode.AUTHZ_DENIED, f"{call.caller.principal} may not execute {call.tool.id}."
        )


def check_connection(call: Call) -> None:
    """4. GRANT_INTERSECTION_REQUIRED: the connection must lie in grant ∩ request.

    Checked before any secret is decrypted. A connection of another tenant, a
    forged id and an ungranted one get the same answer, so ids cannot be probed.
    """
    assert call.tool is not None
    if not call.tool.requires_connection:
        return  # a connectionId sent to a tool that takes none is not passed on
    connection_id = call.request.connection_id
    if not connection_id:
        raise Refusal(
            ErrorCode.POLICY_DENIED,
            f"{call.tool.id} needs a connection; none was given. GET /api/v1/connections/ "
            "lists the connections this caller may use: send one's id as connectionId "
            '(over /mcp/: params._meta["toolhub/connectionId"]).',
        )
    caller = call.caller
    # A run id minted for this call (none was sent) is named by no grant yet: only the
    # caller's standing grants apply, and no cache entry is made per minted id.
    run_id = call.run_id if call.request.run_id else ""
    requested = _as_uuid(connection_id)
    # Cached under the epoch, expiry compared with the clock now (connections/grants.py).
    if requested is None or not grants.may_use(caller.tenant, caller.principal, run_id, requested):
        raise Refusal(ErrorCode.POLICY_DENIED, "That connection is not granted to this caller.")
    if not can_use_connection(caller.user, requested):
        raise Refusal(ErrorCode.AUTHZ_DENIED, f"{caller.principal} may not use that connection.")
    call.connection_id = str(requested)


def _as_uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def validate_args(call: Call) -> None:
    """5. Arguments must be JSON, at most 8 KB, and match the schema exactly."""
    assert call.registered is not None and call.tool is not None
    if call.args_problem is not None:
        raise call.args_problem
    encoded = _COMPACT.encode(call.raw_args)
    size = len(encoded.encode())
    if size > MAX_ARGS_BYTES:
        raise Refusal(
            ErrorCode.VALIDATION, f"The arguments are {size} bytes; the limit is {MAX_ARGS_BYTES}."
        )
    try:
        call.params = call.registered.contract.params.model_validate_json(encoded, strict=True)
    except ValidationError as exc:
        raise Refusal(ErrorCode.VALIDATION, explain_validation(exc)) from None
    call.args_json = call.params.model_dump(mode="json")
    call.request_hash = request_hash(call.tool.id, call.args_json, call.connection_id)


# Made once: json.dumps with any option builds a new encoder per call (issue 13). They
# write exactly what json.dumps(..., same options) writes: stored hashes stay valid.
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_CANONICAL = json.JSONEncoder(sort_keys=True)


def request_hash(tool_id: str, args: dict[str, Any], connection_id: str) -> str:
    """What an idempotency key and an approval are bound to: tool, args, connection."""
    canonical = _CANONICAL.encode([tool_id, args, connection_id or ""])
    return hashlib.sha256(canonical.encode()).hexdigest()


def explain_validation(exc: ValidationError) -> str:
    """Which fields are wrong and why, without echoing their values."""
    problems = []
    for error in exc.errors(include_input=False, include_url=False)[:5]:
        where = ".".join(str(part) for part in error["loc"]) or "arguments"
        problems.append(f"{where}: {error['msg']}")
    more = f" (and {exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
    return "Invalid arguments: " + "; ".join(problems) + more


def apply_rules(call: Call) -> None:
    """5b. Policy rules (CEL over the validated args): deny, or require approval."""
    assert call.evaluator is not None and call.tool is not None and call.args_json is not None
    call.decision = call.evaluator.decide(call.tool, args=call.args_json, run_id=call.run_id)
    if not call.decision.allowed:
        raise Refusal(ErrorCode.POLICY_DENIED, call.decision.reason)


class KeyTaken(Exception):
    """Another call took over the free key first (ledger.claim's compare-and-set missed)."""


def _claim_key(call: Call) -> None:
    """Give the call's key to its record, in the transaction that writes the record."""
    assert call.record is not None
    if call.key is None:
        return
    caller = call.caller
    if not ledger.claim(
        caller.tenant, call.key, call.record, caller.principal, call.run_id, call.previous
    ):
        raise KeyTaken


def _idempotency_winner(call: Call) -> InvocationRecord:
    """A concurrent call claimed the same key first: replay it, if it is the same call.
    Should the winner have ended already and failed, this call answers with that outcome,
    as any retry that waited for it does."""
    assert call.key is not None
    entry = ledger.find(call.caller.tenant, call.key)
    if entry is None:  # its call was pruned between the two reads: answered as busy
        raise Refusal(
            ErrorCode.UNAVAILABLE, "A concurrent call used this idempotencyKey; try again."
        )
    return _same_call(call, entry.record)


def _same_call(call: Call, earlier: InvocationRecord) -> InvocationRecord:
    """An idempotency key replays only the call it was first used for."""
    if earlier.request_hash != call.request_hash:
        raise Refusal(
            ErrorCode.VALIDATION,
            "This idempotencyKey was already used for a different call "
            "(tool, arguments or connection).",
        )
    return _outcome_of(call, earlier)


REPLAY_MARGIN_S = 3.0  # the first attempt's own bookkeeping after its deadline
REPLAY_POLL_S = (0.02, 0.25)  # first and longest pause between two looks at the record


def _outcome_of(call: Call, earlier: InvocationRecord) -> InvocationRecord:
    """IDEMPOTENT_RETRY: a retry answers with the first attempt's outcome.

    A running (or approved and queued) first attempt may be in another process, so the
    record is the one thing both can see: poll it until it ends, for at most the tool's
    timeout (times its attempts, with their waits) plus a margin, and only while its
    process renews its lease on time (apps/invocations/leases.py). A call whose owner is
    known dead is settled here and answered at once (the settled record). A held call is
    answered at once (202, same approval). If it is still unfinished then (its process
    stopped renewing, or the queue is slow), the record is returned as it is, with the
    time left on its lease as its retry hint (retryAfterMs, not saved), and the view
    answers 409.
    """
    deadline = time.monotonic() + call.patience_s + REPLAY_MARGIN_S
    pause, longest = REPLAY_POLL_S
    record = earlier
    while record.status in (Status.RUNNING, Status.QUEUED) and time.monotonic() < deadline:
        if leases.owner_dead(record):  # settled here, at once: its state and retry hint
            settled = settle_lapsed(record, owner_dead=True)
            if settled is None:
                record.refresh_from_db()
                continue
            return settled
        if not leases.fresh(record):
            break
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, longest)
        record.refresh_from_db()
    if leases.running(record) and record.lease_expires_at is not None:
        record.retry_after_ms = leases.hint_ms(record)
    return record


def find_replay(call: Call) -> InvocationRecord | None:
    """6. The idempotency ledger (apps/invocations/ledger.py): the call's key by its
    tool's strategy; a key whose call still holds it (unfinished, or succeeded and
    remembered) returns that call's record. A key left free (failed, expired,
    invalidated) is taken over when this call is recorded."""
    assert call.tool is not None and call.args_json is not None
    caller = call.caller
    call.key = ledger.key_for(
        call.tool,
        caller.principal,
        call.request.run_id or "",
        call.request.idempotency_key,
        call.args_json,
        call.connection_id,
    )
    if call.key is None:
        return None
    entry = ledger.find(caller.tenant, call.key)
    if entry is None:
        return None
    if leases.expired(entry.record):  # its process died: settled now (or just was)
        settle_lapsed(entry.record)
        entry = ledger.find(caller.tenant, call.key)  # failed: its key is free
        if entry is None:
            return None
    if ledger.holds(entry):
        return _same_call(call, entry.record)
    call.previous = entry
    return None


def hold_for_approval(call: Call) -> InvocationRecord | None:
    """7. The approval gate: a call that needs a human is recorded as pending_approval
    with an ApprovalRequest bound to its exact tool, args and connection."""
    assert call.tool is not None and call.decision is not None and call.params is not None
    tool, decision = call.tool, call.decision
    if not (tool.requires_confirmation or decision.requires_approval):
        return None
    terms = decision.approval
    reason = (
        decision.reason
        if decision.requires_approval
        else f"{tool.id} asks for confirmation of every call."
    )
    args = call.params.model_dump(mode="json")
    try:
        with transaction.atomic():
            call.record = InvocationRecord(
                **_record_fields(call),
                idempotency_key=call.key.key if call.key else None,
                idempotency_strategy=call.key.strategy if call.key else None,
                status=Status.PENDING_APPROVAL,
            )
            ledger.link_retry(call.record, call.previous)
            call.record.save(force_insert=True)
            _claim_key(call)
            approval = ApprovalRequest.objects.create(
                tenant=call.caller.tenant,
                invocation=call.record,
                tool=tool,
                principal=call.caller.principal,
                requested_by=call.caller.user,
                run_id=call.run_id,
                tool_call_id=call.tool_call_id,
                connection_id=call.connection_id,
                args=args,
                original_args=args,
                bound_hash=call.request_hash,
                hold_reason=reason[:300],
                policy_rule=decision.rule if decision.requires_approval else "",
                approvals_required=(
                    terms.high_consequence_quorum if tool.consequence_level == "high" else 1
                ),
                four_eyes=terms.four_eyes,
                expires_at=timezone.now() + timedelta(minutes=terms.timeout_minutes),
            )
            events.emit(
                call.caller.tenant,
                call.run_id,
                "approval_required",
                tool_call_id=call.tool_call_id,
                tool_id=tool.id,
                approvalId=str(approval.pk),
                args=call.record.args,
                effect=tool.effect,
                consequenceLevel=tool.consequence_level,
                reason=approval.hold_reason,
                expiresAt=approval.expires_at.isoformat().replace("+00:00", "Z"),
                invocationId=str(call.record.pk),
            )
    except (IntegrityError, KeyTaken):
        call.record = None
        return _idempotency_winner(call)
    transaction.on_commit(lambda: signals.call_held.send(sender=ApprovalRequest, approval=approval))
    return call.record


# ---------------------------------------------------------------- steps 8-13


# What the start of a held call, now approved, sets on its record.
STARTING_FIELDS = (
    "status",
    "started_at",
    "args",
    "request_hash",
    "lease_expires_at",
    "tool_pending",
    "lease_owner",
)


def record_start(call: Call) -> InvocationRecord | None:
    """8. Write the record (claiming the idempotency key) and emit tool_call_start.

    Returns the winning record when a concurrent call claimed the same key first.
    """
    assert call.tool is not None
    now = call.started_at or timezone.now()  # a quick call that outran QUICK_S: its start
    if call.record is not None:  # a held call, now approved (perhaps with edited args)
        _mark_started(call, now)
        # A running record always has its start event. Inside resume's transaction (the
        # claim's) no savepoint of its own: a failure rolls the claim back with it.
        with transaction.atomic(savepoint=False):
            statements.update(call.record, STARTING_FIELDS)
            _emit_start(call, now)
        leases.keeper.hold(call.record.pk)  # renewed once started; forgotten when it ends
        return None
    call.record = InvocationRecord(
        **_record_fields(call),
        idempotency_key=call.key.key if call.key else None,
        idempotency_strategy=call.key.strategy if call.key else None,
        status=Status.RUNNING,
        started_at=now,
        lease_expires_at=leases.expires(),
        tool_pending=_tool_pending(call),
        lease_owner=leases.owner(),
    )
    ledger.link_retry(call.record, call.previous)
    _no_approval(call.record)
    leases.keeper.hold(call.record.pk)  # renewed once written; forgotten when it ends
    if call.key is None:
        with _savepoint_if_nested():
            written = _written_together(call.record, [_start_event(call, now)], insert=True)
        if not written:
            with transaction.atomic():
                statements.insert([call.record])
                _emit_start(call, now)
        return None
    try:
        # A key claimed meanwhile fails it (IntegrityError, KeyTaken): the record and its
        # event with it. Statements one by one: the claim is part of the transaction.
        with transaction.atomic():
            statements.insert([call.record])
            _claim_key(call)
            _emit_start(call, now)
    except (IntegrityError, KeyTaken):
        leases.keeper.forget(call.record.pk)
        call.record = None
        return _idempotency_winner(call)
    return None


def _tool_pending(call: Call) -> bool | None:
    """True when the call may wait before its tool runs (for a concurrency slot): should
    its process die meanwhile, the call is known never to have run (settle_lapsed). None
    once the tool has it, or when nothing stands between the start and the tool."""
    assert call.tool is not None
    if call.tool_handed:
        return None
    tool_limit, tenant_limit = concurrency.limits(call.tool, call.caller.tenant)
    return True if tool_limit is not None or tenant_limit is not None else None


def _tool_begins(call: Call) -> None:
    """Step 10 hands the tool the call: a record that said it had not is told first, in
    a statement of its own (a call of a limited tool only), so that from now on a dead
    process's call counts as one that may have run."""
    call.tool_handed = True
    record = call.record
    if record is None or not record.tool_pending:
        return
    record.tool_pending = None
    handed = InvocationRecord.objects.filter(
        pk=record.pk, status=Status.RUNNING, ended_at__isnull=True
    ).update(tool_pending=None)
    if not handed:  # settled meanwhile as never run (its process paused past its lease):
        raise Refusal(  # not handed to its tool now, nor retried (its end is not written)
            ErrorCode.CANCELLED, "The call was settled before its tool ran: it did not run."
        )


def _savepoint_if_nested() -> AbstractContextManager[Any]:
    """Inside a caller's transaction a savepoint, so that a failed statement (a claimed
    key) leaves that transaction usable; outside one nothing: a statement in autocommit
    is its own transaction, and BEGIN and COMMIT would be two more round trips."""
    if connections["default"].in_atomic_block:
        return transaction.atomic()
    return nullcontext()


def _mark_started(call: Call, now: datetime) -> None:
    """A held call's record as its start writes it (STARTING_FIELDS)."""
    assert call.record is not None
    call.record.status = Status.RUNNING
    call.record.started_at = now
    call.record.args = call.redacted_args()
    call.record.request_hash = call.request_hash
    call.record.lease_expires_at = leases.expires()
    call.record.tool_pending = _tool_pending(call)
    call.record.lease_owner = leases.owner()


def take_slot(call: Call) -> concurrency.Slot | None:
    """9b. Concurrency: a tool whose timed-out calls still hold too many of this process's
    threads takes no more; a tool or tenant with a concurrency limit gives the call a slot,
    held until its thread ends (apps/invocations/concurrency.py). Waits for one up to
    TOOLHUB_CONCURRENCY_WAIT_S, then refuses with a retry hint. None: no limit applies."""
    assert call.tool is not None
    if call.registered is not None and not call.registered.contract.runs_inline:
        stuck = concurrency.lingering.too_many(call.tool.pk)
        if stuck is not None:
            concurrency.counts.note("refused", call.caller.tenant.slug, call.tool.pk)
            raise Refusal(
                ErrorCode.UNAVAILABLE,
                f"{stuck} earlier call(s) of {call.tool.pk} outlived their deadline and still "
                f"hold threads here; retry in {concurrency.UNKNOWN_END_MS / 1000:g} s.",
                retry_after_ms=concurrency.UNKNOWN_END_MS,
            )
    try:
        return concurrency.acquire(
            call.tool, call.caller.tenant, call.timeout_s, partial(_cancelled_waiting, call)
        )
    except concurrency.Full as full:
        raise Refusal(ErrorCode.RATE_LIMITED, str(full), full.retry_after_ms) from None
    except concurrency.WaitCancelled:
        raise Refusal(
            ErrorCode.CANCELLED, "The call was cancelled while it waited for a slot."
        ) from None


def _cancelled_waiting(call: Call) -> bool:
    """Between two tries for a slot: give the connection back, ask for a cancellation."""
    _release_connection()
    return call.record is not None and _cancel_requested(call.record.pk)


def bind_capabilities(call: Call, attempt: int = 1) -> Capabilities:
    """9c. Build the context (references only) and the capabilities the tool declared;
    again for each of the runner's retries (a fresh deadline, a fresh cancel flag)."""
    assert call.registered is not None
    call.context = ToolContext(
        tenant=call.caller.tenant.slug,
        principal=call.caller.principal,
        run_id=call.run_id,
        tool_call_id=call.tool_call_id,
        connection_id=call.connection_id or None,
        deadline=time.monotonic() + call.timeout_s,
        idempotency_id=(
            call.key.key if call.key else call.record.idempotency_key if call.record else None
        ),
        attempt=attempt,
    )
    try:
        return bind(call.registered.contract.capabilities, call.caller.tenant, call.context)
    except ToolError as exc:
        raise Refusal(ErrorCode.EXECUTION, exc.safe_message[:1000]) from None
    except Exception as exc:
        # e.g. a secret no configured key decrypts: the operator needs the log, the
        # model only needs to know the call could not be prepared.
        logger.error("capabilities for %s failed: %s", call.tool_ref, type(exc).__name__)
        raise Refusal(ErrorCode.EXECUTION, "The tool's resources could not be prepared.") from None


# The codes the runner tries again (Retries): the tool could not be reached, or did not
# answer in time. Anything else would fail the same way again.
RETRIED = (ErrorCode.UNAVAILABLE, ErrorCode.TIMEOUT)
# A tool's retryAfterMs hint is kept within [0, MAX_RETRY_AFTER_MS]; the runner waits
# for it itself only up to MAX_RETRY_WAIT_MS, else the call ends with the hint for the
# caller (a request is not held for a minute).
MAX_RETRY_AFTER_MS = 3_600_000
MAX_RETRY_WAIT_MS = 5_000


def execute_attempts(call: Call) -> Any:
    """9-10 with the tool's retries: an attempt that ends `unavailable` or `timeout` is
    tried again after a backoff (or the tool's retryAfterMs hint), each retry recorded on
    the call (`retries`) and emitted as `tool_call_retry`. Each attempt gets the call's
    whole timeout and fresh capabilities; the last attempt's outcome is the call's."""
    attempt = 1
    while True:
        began = time.monotonic()
        try:
            slot = take_slot(call)  # 9b, per attempt: a retry waits for a slot too
            capabilities = bind_capabilities(call, attempt)
            call.scrubber = broker.scrubber_of(capabilities.http)
            return execute(call, capabilities, slot)
        except Refusal as refusal:
            wait_ms = _retry_wait(call, refusal, attempt)
            if wait_ms is None:
                raise
            _note_retry(call, refusal, attempt, wait_ms, began)
            if _cancelled_while_waiting(call, wait_ms):
                raise Refusal(
                    ErrorCode.CANCELLED, "The call was cancelled while it waited to retry."
                ) from None
            attempt += 1


def _retry_wait(call: Call, refusal: Refusal, attempt: int) -> int | None:
    """How long to wait before trying again, or None: not retried."""
    assert call.tool is not None
    retries = call.tool.retries
    retried = refusal.code in RETRIED or (
        refusal.code == ErrorCode.RATE_LIMITED and refusal.by_tool
    )
    if not retried or attempt > retries.attempts:
        return None
    # EXACTLY_ONCE: an external side effect's attempt that timed out may have happened.
    # Only a call with an idempotency key, which every attempt passes on
    # (ctx.idempotency_id) for the upstream to deduplicate, is tried again.
    keyless = call.context is None or call.context.idempotency_id is None
    if call.tool.effect == Effect.EXTERNAL_SIDE_EFFECT and keyless:
        return None
    wait_ms = _backoff_ms(retries, attempt)
    hint = refusal.retry_after_ms
    if hint is not None:
        if hint > MAX_RETRY_WAIT_MS:
            return None  # the caller is told when to try again (retryAfterMs)
        wait_ms = max(wait_ms, hint)
    return wait_ms


def _backoff_ms(retries: Retries, n: int, *, jittered: bool = True) -> int:
    """The n-th retry's wait: the backoff doubled each time, spread by the jitter."""
    wait = retries.backoff_ms * 2 ** (n - 1)
    if jittered and retries.jitter:
        wait *= 1 + random.uniform(-retries.jitter, retries.jitter)  # noqa: S311
    return int(min(max(wait, 0), MAX_BACKOFF_MS))


def _hint(exc: ToolError) -> int | None:
    """A tool's retryAfterMs within [0, MAX_RETRY_AFTER_MS]; None if absent or nonsense."""
    hint = exc.retry_after_ms
    if isinstance(hint, bool) or not isinstance(hint, int | float) or hint != hint:
        return None
    return int(min(max(hint, 0), MAX_RETRY_AFTER_MS))


def _note_retry(call: Call, refusal: Refusal, attempt: int, wait_ms: int, began: float) -> None:
    """Record the failed attempt on the call and emit tool_call_retry. A quick call is
    recorded first (a start precedes its retries), a held start is pushed."""
    if call.record is None:
        record_start(call)
    if call.start_held:
        call.start_held = False
        events.release(call.caller.tenant.pk, call.run_id)
    assert call.record is not None
    tried: dict[str, Any] = {
        "attempt": attempt,
        "errorCode": str(refusal.code),
        "safeMessage": refusal.safe_message,
        "durationMs": int((time.monotonic() - began) * 1000),
        "waitMs": wait_ms,
    }
    if refusal.retry_after_ms is not None:
        tried["retryAfterMs"] = refusal.retry_after_ms
    call.retries.append(tried)
    call.record.retries = list(call.retries)
    events.emit(
        call.caller.tenant,
        call.run_id,
        "tool_call_retry",
        tool_call_id=call.tool_call_id,
        tool_id=call.tool_ref[:200],
        invocationId=str(call.record.pk),
        **tried,
    )
    logger.info(
        "tool call %s attempt %d ended %s; retrying in %d ms",
        call.tool_call_id,
        attempt,
        refusal.code,
        wait_ms,
    )


def _cancelled_while_waiting(call: Call, wait_ms: int) -> bool:
    """Wait before the next attempt, polling for a cancellation request meanwhile."""
    assert call.record is not None
    end = time.monotonic() + wait_ms / 1000
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, CANCEL_POLL_S))
        if _cancel_requested(call.record.pk):
            return True
    return False


def execute(call: Call, capabilities: Capabilities, slot: concurrency.Slot | None = None) -> Any:
    """10. Run the tool on a worker thread under its deadline.

    Python cannot stop a thread: on timeout or cancellation the context is marked
    cancelled (cooperative tools stop; the broker's HTTP client cuts its request) and the
    caller gets its answer now; the thread keeps its concurrency slot, and counts as
    lingering, until it ends. A tool that runs inline (ToolContract.runs_inline: it never
    waits) runs on this thread instead.
    """
    assert call.registered is not None and call.context is not None
    future: Future[Any] | None = None
    _tool_begins(call)
    try:
        if call.registered.contract.runs_inline:
            return _run_inline(call, capabilities)
        future = _tool_threads.submit(
            _run_tool,
            call.registered.contract.execute,
            call.params,
            call.context,
            capabilities,
            progress_sink.get(),  # the caller's, if it receives progress (requests.py)
            slot,
        )
        if slot is not None:
            slot.release_when_done(future)
        if call.record is None or call.on_linger is not None or call.start_held:
            # A quick call (records_late) records its start if it lingers; a worker's call
            # lets the worker hand its other calls on; a held start is pushed.
            quick = min(QUICK_S, max(0.0, call.context.time_left()))
            if not _done_within(future, quick):
                if call.record is None:
                    record_start(call)
                if call.start_held:
                    call.start_held = False
                    events.release(call.caller.tenant.pk, call.run_id)
                if call.on_linger is not None:
                    _linger(call.on_linger)
                _release_connection()
        return _wait(call, future)
    except (FutureTimeout, ToolTimedOut) as exc:
        _give_up(call, future)
        raise Refusal(
            ErrorCode.TIMEOUT,
            f"The tool did not finish within {call.timeout_s:g} s.",
            retry_after_ms=_hint(exc) if isinstance(exc, ToolTimedOut) else None,
        ) from None
    except Refusal:
        raise  # _wait's cancellation (POST .../cancel/): not a tool failure
    except ToolCancelled:
        raise Refusal(ErrorCode.CANCELLED, "The call was cancelled while it ran.") from None
    except ToolUnavailable as exc:
        raise Refusal(
            ErrorCode.UNAVAILABLE, exc.safe_message[:1000], retry_after_ms=_hint(exc)
        ) from None
    except ToolRateLimited as exc:
        refused = Refusal(ErrorCode.RATE_LIMITED, exc.safe_message[:1000], _hint(exc))
        refused.by_tool = True  # the tool's provider said it (retried like unavailable)
        raise refused from None
    except ToolResultTooLarge as exc:
        raise Refusal(ErrorCode.RESULT_TOO_LARGE, exc.safe_message[:1000]) from None
    except ToolError as exc:
        raise Refusal(ErrorCode.EXECUTION, exc.safe_message[:1000]) from None
    except Exception as exc:
        # The exception text may quote arguments or internals: log its type, not its words.
        logger.warning(
            "tool %s raised %s (call %s)", call.tool_ref, type(exc).__name__, call.tool_call_id
        )
        # Where it failed (frames only: the exception's message may hold values).
        logger.debug("tool failure at:\n%s", "".join(traceback.format_tb(exc.__traceback__)))
        raise Refusal(ErrorCode.EXECUTION, "The tool failed unexpectedly.") from None


def _give_up(call: Call, future: Future[Any] | None) -> None:
    """The call ends without its tool: a thread not started yet never starts; one that
    runs is told (its context cancelled) and counted as lingering until it ends."""
    assert call.context is not None and call.tool is not None
    if future is not None and not future.cancel():
        concurrency.lingering.outlived(call.tool.pk, future)
    call.context.cancel()


def _run_inline(call: Call, capabilities: Capabilities) -> Any:
    """A tool that never waits, on the calling thread: no hand-over to a tool thread and
    back, about a tenth of a queued call's CPU (issue 13). Its deadline holds as on a
    thread: an answer that comes after it is a timeout, never a result."""
    assert call.registered is not None and call.context is not None
    output = call.registered.contract.execute(call.params, call.context, capabilities)
    if call.context.time_left() <= 0:
        raise FutureTimeout
    return output


def _done_within(future: Future[Any], timeout: float) -> bool:
    """Whether the tool finished within `timeout`, its outcome left in the future. Waits
    on the future's own condition: concurrent.futures.wait() builds a set, a waiter and an
    event for each call, a measurable part of a queued call's time (issue 13)."""
    try:
        future.exception(timeout=timeout)
    except FutureTimeout:
        return False
    return True


def _linger(on_linger: Callable[[], None]) -> None:
    """The caller's business, not the tool's: its failure must not fail the call."""
    try:
        on_linger()
    except Exception:
        logger.exception("on_linger failed while a tool ran")


CANCEL_POLL_S = 0.25


def _wait(call: Call, future: Future[Any]) -> Any:
    """The tool's result, polling for a cancellation request (POST .../cancel/) meanwhile."""
    assert call.context is not None
    while True:
        remaining = call.context.time_left()
        if remaining <= 0 and not future.done():
            raise FutureTimeout
        try:
            return future.result(timeout=max(0.0, min(remaining, CANCEL_POLL_S)))
        except FutureTimeout:
            assert call.record is not None  # a quick call is recorded once it lingers
            if _cancel_requested(call.record.pk):
                _give_up(call, future)
                raise Refusal(ErrorCode.CANCELLED, "The call was cancelled while it ran.") from None
            _release_connection()


def _cancel_requested(record_pk: Any) -> bool:
    """A poll that gets no connection (every pooled one in use, a blip) says no and the
    next one asks again: the tool's result must not be lost to a cancellation check.
    Inside a caller's transaction the error stands (the transaction is broken)."""
    try:
        return InvocationRecord.objects.filter(pk=record_pk, cancel_requested=True).exists()
    except OperationalError:
        if connections["default"].in_atomic_block:
            raise
        logger.warning("cancellation poll skipped: no database connection")
        return False


def _release_connection() -> None:
    """With the pool on, a call waiting on its tool gives its connection back between
    polls: otherwise 50 concurrent slow calls would hold 50 pooled connections doing
    nothing. Each poll then checks one out again, a cheap step. Inside an atomic block
    (a caller's transaction) the connection stays."""
    db = connections["default"]
    if getattr(db, "pool", None) is not None and not db.in_atomic_block:
        db.close()


def _run_tool(
    execute_fn: Any,
    params: Any,
    ctx: ToolContext,
    caps: Capabilities,
    progress: ProgressSink | None = None,
    slot: concurrency.Slot | None = None,
) -> Any:
    reporting = progress_sink.set(progress)
    try:
        return execute_fn(params, ctx, caps)
    finally:
        progress_sink.reset(reporting)
        if slot is not None:
            slot.release()  # when the thread really ends, not when its call did
        close_old_connections()


def scrub_secrets(call: Call, output: Any) -> Any:
    """10b. SECRETS_NEVER_ECHOED: a target that echoes the request would hand the model
    the credential the broker attached. The connections app replaces the connection's
    secrets (and their usual encodings) in every string, keys included, before anything
    validates, stores or emits the output; so for an MCP server's credential, noted as
    sent by the MCP source (broker.note_sent). A call that sent no secret skips this."""
    scrubber = _scrubber(call)
    if scrubber is None:
        return output
    dumped = output.model_dump(mode="json") if isinstance(output, BaseModel) else output
    scrubbed = scrubber.scrub(dumped)
    return output if scrubbed == dumped else scrubbed


def _scrubber(call: Call) -> Scrubber | None:
    """The scrubber of the secrets the call sent: the bound http capability's, and an MCP
    credential noted as sent. Re-reading either here would scrub a secret rotated while
    the tool ran, not the one it sent. Only a call that bound no http capability (its
    binding failed) reads the connection's current secret. None: the call sent none."""
    try:
        bound = call.scrubber
        if bound is None and call.connection_id:
            bound = broker.secret_scrubber(call.caller.tenant, call.connection_id)
        sent = broker.sent_scrubber(call.context)
        return sent if bound is None else bound if sent is None else bound | sent
    except Exception as exc:  # fail closed: output we cannot check does not leave
        logger.error("secret scrubber for %s failed: %s", call.tool_ref, type(exc).__name__)
        raise Refusal(
            ErrorCode.EXECUTION, "The tool's output could not be checked for secrets."
        ) from None


def _scrubbed(call: Call, refusal: Refusal) -> Refusal:
    """A tool's error message may quote the target (a redirect's URL, an error page)."""
    if refusal.code != ErrorCode.EXECUTION:
        return refusal  # the other codes' messages are the runner's own words
    try:
        scrubber = _scrubber(call)
    except Refusal as unchecked:
        return unchecked
    return (
        refusal if scrubber is None else Refusal(refusal.code, scrubber.text(refusal.safe_message))
    )


def validate_output(call: Call, output: Any) -> dict[str, Any]:
    """11. The result must match the declared output and fit in 32 KB."""
    assert call.registered is not None
    model = call.registered.contract.result
    try:
        validated = output if isinstance(output, model) else model.model_validate(output)
    except ValidationError:
        raise Refusal(
            ErrorCode.OUTPUT_INVALID,
            "The tool returned a result that does not match its declared output.",
        ) from None
    data: dict[str, Any] = (
        validated.model_dump(mode="json") if isinstance(validated, BaseModel) else {}
    )
    size = (
        validated.counted_bytes(data)
        if isinstance(validated, ToolOutput)
        else len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode())
    )
    if size > call.max_result_bytes:
        raise Refusal(
            ErrorCode.RESULT_TOO_LARGE,
            f"The result is {size} bytes; the limit is {call.max_result_bytes}.",
        )
    return data


def reported_failure(call: Call, result: dict[str, Any]) -> str | None:
    """11b. A result in which the tool itself says it failed (an MCP server's `isError`,
    its result model's `reported_failure`): the call is `execution`, with that message,
    and its record keeps the redacted result (the REST record shows the message only)."""
    assert call.registered is not None
    reported = getattr(call.registered.contract.result, "reported_failure", None)
    message = reported(result) if callable(reported) else None
    return str(message)[:1000] if message else None


def redact_result(call: Call, result: dict[str, Any]) -> Any:
    """12. REDACTION_REQUIRED: only allowlisted fields leave the runner."""
    if call.registered is None or call.registered.contract.redaction is None:
        raise Refusal(ErrorCode.REDACTION_FAILED, "The tool has no redaction allowlist.")
    try:
        return redact(result, call.registered.result_tree)
    except Exception:
        raise Refusal(ErrorCode.REDACTION_FAILED, "The result could not be redacted.") from None


def record_result(call: Call, result: Any) -> InvocationRecord:
    """13. Store the redacted result and emit tool_call_result."""
    return _finish(call, ok=True, result=result)


def record_refusal(call: Call, refusal: Refusal) -> InvocationRecord:
    """Any step's refusal: recorded like a result, start and result events included."""
    with transaction.atomic():  # the record and both its events, or none of them
        if call.record is None:  # the record, its start and its result written at once
            started_at = call.started_at or call.received_at
            record = _unsaved_record(call, started_at)
            return _close_record(
                record, ok=False, refusal=refusal, start=call, at=started_at, call=call
            )
        if call.record.started_at is None:  # a held call that ends without running
            call.record.started_at = timezone.now()
            _emit_start(call, call.record.started_at)
        return _finish(call, ok=False, refusal=refusal)


# ---------------------------------------------------------------- records and events


def _no_approval(record: InvocationRecord) -> None:
    """A record the runner just created without holding it has no ApprovalRequest: say so
    to the ORM, so the response's `approvalId` costs no query (issue 13)."""
    InvocationRecord.approval.related.set_cached_value(record, None)


def _record_fields(call: Call) -> dict[str, Any]:
    return {
        "tenant": call.caller.tenant,
        "tool": call.tool,
        "tool_ref": call.tool_ref[:200],
        "tool_call_id": call.tool_call_id,
        "run_id": call.run_id,
        "principal": call.caller.principal,
        "connection_id": call.connection_id,
        "request_hash": call.request_hash,
        "args": call.redacted_args(),
        "args_shape": shape_of(call.raw_args) if call.raw_args is not None else None,
        "policy_rule": call.decision.rule if call.decision else "",
        "cache_hit": call.cache_hit or None,
        "hooks": call.hook_trace or None,
    }


def _unsaved_record(call: Call, started_at: datetime) -> InvocationRecord:
    """The record of a call that ends before it was written (refused before step 8, or a
    quick call): built here, written once by _close_record with its start event."""
    call.record = InvocationRecord(  # no idempotency key: only step 8 claims one
        **_record_fields(call), status=Status.RUNNING, started_at=started_at
    )
    _no_approval(call.record)
    return call.record


def _finish(
    call: Call, *, ok: bool, result: Any = None, refusal: Refusal | None = None
) -> InvocationRecord:
    if call.record is not None:
        call.record.cache_hit = call.cache_hit or None
        call.record.hooks = call.hook_trace or None
        return _close_record(
            call.record, ok=ok, result=result, refusal=refusal, closing=call.closing, call=call
        )
    assert call.started_at is not None  # a quick call that ended within QUICK_S
    record = _unsaved_record(call, call.started_at)
    return _close_record(
        record, ok=ok, result=result, refusal=refusal, start=call, at=call.started_at, call=call
    )


def abandon(record: InvocationRecord, safe_message: str) -> InvocationRecord:
    """End a started call whose process died mid-run (found by the sweeper)."""
    return _close_record(record, ok=False, refusal=Refusal(ErrorCode.EXECUTION, safe_message))


def settle_orphan(record: InvocationRecord, *, never_ran: bool) -> InvocationRecord:
    """End a call whose lease ran out (apps/invocations/leases.py), with its result event:
    one that never reached its tool is offered for a retry (`unavailable`, retry now);
    one that may have run fails `execution`, never run again from here."""
    if never_ran:
        refusal = Refusal(ErrorCode.UNAVAILABLE, leases.NEVER_RAN, retry_after_ms=0)
    else:
        refusal = Refusal(ErrorCode.EXECUTION, leases.MAY_HAVE_RUN)
    return _close_record(record, ok=False, refusal=refusal)


def settle_lapsed(record: InvocationRecord, *, owner_dead: bool = False) -> InvocationRecord | None:
    """End a call whose lease ran out, or whose owner is known dead (`owner_dead`: its
    liveness lock was free, leases.owner_dead), with its result event: `unavailable` if it
    never reached its tool, else `execution`. Locked and read again first: a call that
    ended, or whose lease was renewed (or taken by another owner), meanwhile is left alone
    (None)."""
    from apps.approvals.models import ApprovalRequest, ApprovalStatus

    with transaction.atomic():
        now = timezone.now()
        lapsed = (
            {"lease_owner": record.lease_owner} if owner_dead else {"lease_expires_at__lte": now}
        )
        current = (
            InvocationRecord.objects.select_for_update(of=("self",))
            .select_related("tenant", "tool")
            .filter(pk=record.pk, ended_at__isnull=True, status=Status.RUNNING, **lapsed)
            .first()
        )
        if current is None:
            return None
        # A worker's approved call that never reached its tool: queued again by the
        # approvals app (signals.call_lapsed; the runner does not import its tasks).
        if any(taken for _, taken in signals.call_lapsed.send(sender=None, record=current)):
            current.refresh_from_db()
            return current
        settled = settle_orphan(current, never_ran=bool(current.tool_pending))
        ApprovalRequest.objects.filter(
            invocation_id=current.pk, status=ApprovalStatus.EXECUTING
        ).update(status=ApprovalStatus.FAILED)
    leases.logger.warning(
        "settled call %s (%s) whose process %s: %s",
        current.pk,
        current.tool_ref,
        "died (its liveness lock was free)" if owner_dead else "stopped renewing its lease",
        settled.error_code,
    )
    return settled


def settle_lapsed_calls(limit: int = 500) -> int:
    """The sweeper's lease pass: settle every running call whose lease ran out, and every
    one whose renewal is overdue and whose owner is known dead (leases.owner_dead, one
    look per owner), before its lease runs out. Reads the unfinished calls only
    (invocations_unfinished_idx), a handful whatever the history. Unordered: ordered
    newest first (the model's ordering), SQLite would walk the whole history by
    invocations_newest_idx instead."""
    now = timezone.now()
    overdue = now + timedelta(seconds=leases.lease_s() - leases.overdue_s())
    candidates = (
        InvocationRecord.objects.filter(
            ended_at__isnull=True, status=Status.RUNNING, lease_expires_at__lte=overdue
        )
        .order_by()
        .only("pk", "lease_owner", "lease_expires_at", "status", "ended_at")[:limit]
    )
    dead: dict[str, bool] = {}
    settled = 0
    for record in candidates:
        if leases.expired(record, now):
            settled += settle_lapsed(record) is not None
            continue
        owner = record.lease_owner or ""
        if owner not in dead:
            dead[owner] = leases.owner_dead(record)
        if dead[owner]:
            settled += settle_lapsed(record, owner_dead=True) is not None
    return settled


# What _close_record sets, and the start of a held call that ends without running.
CLOSING_FIELDS = (
    "started_at",
    "ended_at",
    "duration_ms",
    "ok",
    "result",
    "status",
    "error_code",
    "safe_message",
    "retry_after_ms",
    "receipt",
    "cache_hit",
    "hooks",
    "retries",
)


def _close_record(
    record: InvocationRecord,
    *,
    ok: bool,
    result: Any = None,
    refusal: Refusal | None = None,
    start: Call | None = None,
    at: datetime | None = None,
    closing: Closing | None = None,
    call: Call | None = None,
) -> InvocationRecord:
    """Store the outcome and emit tool_call_result in one transaction: a final record
    always has its result event, whatever kills the process (EVERY_RESULT_EMITTED). With
    `closing` (a worker's call) that transaction is the worker's next one. The receipt is
    signed here and written with the end: no statement of its own."""
    assert record.started_at is not None
    if not record._state.adding and record.status == Status.RUNNING and record.lease_expires_at:
        leases.guard(record)  # its end applies only to a record still running (late end)
    record.ended_at = timezone.now()
    record.duration_ms = max(0, int((record.ended_at - record.started_at).total_seconds() * 1000))
    record.ok = ok
    record.result = result
    cancelled = refusal is not None and refusal.code == ErrorCode.CANCELLED
    record.status = Status.SUCCEEDED if ok else Status.CANCELLED if cancelled else Status.FAILED
    if refusal is not None:
        record.error_code = refusal.code
        record.safe_message = refusal.safe_message
        record.retry_after_ms = refusal.retry_after_ms
    record.receipt = _receipt(record, call)
    if closing is not None and not record._state.adding and start is None:
        closing.add(record)  # written with the worker's next start (its lease renewed till)
        return record
    leases.keeper.forget(record.pk)
    # A record written only now (`start` given) has its start event written with it.
    starting = [_start_event(start, at or record.started_at)] if start is not None else []
    batch = [*starting, _result_event(record)]
    adding = record._state.adding  # built by _unsaved_record: written only now
    if not _written_together(record, batch, insert=adding):
        with transaction.atomic(savepoint=False):  # inside record_refusal's: no savepoint
            if adding:
                statements.insert([record])
            elif not _update_end(record):  # settled meanwhile: nothing of this end is written
                batch = []
            if batch:
                events.emit_many(record.tenant, record.run_id, batch)
    _log(record)
    return record


def _receipt(record: InvocationRecord, call: Call | None) -> str:
    """The record's signed receipt (apps/receipts): what the call's checks learnt, or,
    for a record ended without its call (the sweeper's abandon), what the record says."""
    if call is None:
        return receipts.sign_call(record, Facts())
    approval = call.approval
    decision = call.decision.outcome if call.decision is not None else None
    facts = Facts(
        schema_hash=call.registered.schema_hash if call.registered is not None else None,
        args=call.args_json,
        decision=decision or ("require_approval" if approval is not None else None),
        policy_version=call.evaluator.version if call.evaluator is not None else None,
        approval=approval,
    )
    return receipts.sign_call(record, facts, call.signer)


def _written_together(record: InvocationRecord, batch: list[events.Event], *, insert: bool) -> bool:
    """On PostgreSQL: the record (inserted, or its end's columns updated) and its events
    as one statement (apps.invocations.combined), where a transaction of their own was
    five round trips (issue 13); inside a caller's transaction, as part of it. False,
    with nothing written, where the statements one by one must do it (SQLite, a row only
    Django can write, a worker's transaction that gathers its events: they are numbered
    in the order emitted)."""
    using = record._state.db or "default"
    if not combined.available(using) or events.gathering():
        return False
    end = None if insert else record  # a guarded end's event: only if the end applies
    pending = [
        combined.Pending(record.tenant, record.run_id, event, False, end=end) for event in batch
    ]
    if insert:
        return combined.record(using, [record], [], pending)
    return combined.record(using, [], [(record, CLOSING_FIELDS)], pending)


def _update_end(record: InvocationRecord) -> bool:
    """UPDATE the columns a call's end sets (issue 13: not every column); a leased call's
    only while its record is still running. False, nothing written, when it was settled
    meanwhile: what the end knew is logged, the record read again (leases.late_end)."""
    if not leases.guarded(record):
        statements.update(record, CLOSING_FIELDS)
        return True
    if statements.update(record, CLOSING_FIELDS, only_if={"status": Status.RUNNING}):
        return True
    leases.late_end(record)
    return False


def _write_end(record: InvocationRecord) -> None:
    """A closed record's end and result event, in the caller's transaction (Closing)."""
    if not _update_end(record):
        return
    events.emit_many(record.tenant, record.run_id, [_result_event(record)])
    transaction.on_commit(lambda: _log(record))


def emit_result(record: InvocationRecord) -> None:
    """tool_call_result from a final record: on closing it, or by the sweeper for a
    record closed without one (apps.approvals.tasks.repair_missing_results)."""
    events.emit_many(record.tenant, record.run_id, [_result_event(record)])


def _result_event(record: InvocationRecord) -> events.Event:
    outcome: dict[str, Any] = {
        "ok": record.ok,
        "durationMs": record.duration_ms,
        "invocationId": str(record.pk),
    }
    if record.ok:
        outcome["result"] = record.result
    else:
        outcome["errorCode"] = record.error_code
        outcome["safeMessage"] = record.safe_message
    if record.retry_after_ms is not None:
        outcome["retryAfterMs"] = record.retry_after_ms
    if record.receipt:
        outcome["receipt"] = record.receipt
    if record.cache_hit:
        outcome["cacheHit"] = True
    return events.Event("tool_call_result", record.tool_call_id, record.tool_ref, outcome)


def _log(record: InvocationRecord) -> None:
    """One line per call. Argument shapes by default: values only when an operator opts in
    (TOOLHUB_LOG_ARGUMENT_VALUES), and even then only the redacted ones. Nothing is
    encoded when the line would not be written (the benchmark runs at WARNING)."""
    if not logger.isEnabledFor(logging.INFO):
        return
    arguments = record.args if settings.TOOLHUB_LOG_ARGUMENT_VALUES else record.args_shape
    logger.info(
        "tool call %s tool=%s run=%s principal=%s status=%s error=%s duration_ms=%s args=%s",
        record.tool_call_id,
        record.tool_ref,
        record.run_id,
        record.principal,
        record.status,
        record.error_code or "-",
        record.duration_ms,
        json.dumps(arguments, separators=(",", ":")),
    )


def _emit_start(call: Call, at: datetime) -> None:
    assert call.record is not None
    events.emit_many(call.caller.tenant, call.run_id, [_start_event(call, at)])


def _start_event(call: Call, at: datetime) -> events.Event:
    assert call.record is not None
    fields = {"args": call.record.args, "invocationId": str(call.record.pk)}
    return events.Event("tool_call_start", call.tool_call_id, call.tool_ref[:200], fields, at)
