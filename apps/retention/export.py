"""The export written before pruning: JSON Lines, one line a call, for a SIEM.

Each line is one JSON object (UTF-8, no newline inside), with stable field names:

    {"v": 1, "tenant": "<slug>", "prunedBefore": "<ISO 8601 Z>",
     "record": {...}, "events": [...], "approval": {...} | null}

`record` is the record as GET /api/v1/invocations/{id}/ shows it, `events` its run
events as streamed (oldest first), `approval` the approval as GET
/api/v1/approvals/{id}/ shows it plus `votes` ([{user, decision, reason, createdAt}]).

To a path, the lines go to a temporary file beside it, flushed to disk before anything
is deleted and renamed to the path at the end, so a reader never sees half an export.
A path that is not a regular file (`-` for standard output, a pipe, a device) is
written directly. A write that fails (no permission, disk full) deletes nothing of
its pass; lines of passes already pruned are kept and renamed into place.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

from apps.approvals.api.serializers import ApprovalSerializer
from apps.approvals.models import ApprovalRequest
from apps.invocations.models import InvocationRecord, RunEvent
from apps.retention.pruning import Chunk, RetentionError
from apps.tenants.models import Tenant

VERSION = 1


class Exporter:
    """Writes a pass's lines with os.write, unbuffered: after a failed write nothing waits
    in a buffer to be written later, and the temporary file is cut back to the end of the
    last pass that was deleted."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.temporary: Path | None = None
        self.committed = 0  # bytes of passes whose records were deleted
        self.lines = 0
        if target == "-":
            sys.stdout.flush()
            self.fd = sys.stdout.fileno()
            return
        path = Path(target)
        try:
            if path.exists() and not path.is_file():
                self.fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                return
            self.fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
        except OSError as exc:
            raise RetentionError(
                f"Cannot write the export to {target}: {exc.strerror or exc}. Nothing was deleted."
            ) from exc
        self.temporary = Path(name)

    def write(self, tenant: Tenant, before: datetime, chunks: list[Chunk]) -> int:
        """Write every record of these chunks, on disk before returning; else raise."""
        written = 0
        try:
            for chunk in chunks:
                found = lines(tenant, before, chunk)
                _write_all(self.fd, "".join(line + "\n" for line in found).encode())
                written += len(found)
            if self.temporary is not None:
                os.fsync(self.fd)
        except OSError as exc:
            if self.temporary is not None:
                with contextlib.suppress(OSError):
                    os.ftruncate(self.fd, self.committed)
            deleted = (
                f"The {self.lines} records exported before were deleted"
                + (f" and are in {self.target}." if self.temporary is not None else ".")
                if self.lines
                else "Nothing was deleted."
            )
            raise RetentionError(
                f"Cannot write the export to {self.target}: {exc.strerror or exc}. "
                f"This pass deleted nothing. {deleted}"
            ) from exc
        if self.temporary is not None:
            self.committed = os.lseek(self.fd, 0, os.SEEK_CUR)
        self.lines += written
        return written

    def close(self) -> None:
        """Rename the temporary file into place (if anything was exported), else remove it."""
        if self.target == "-":
            return
        with contextlib.suppress(OSError):
            os.close(self.fd)
        if self.temporary is None:
            return
        if self.lines:
            os.replace(self.temporary, self.target)
        else:
            self.temporary.unlink(missing_ok=True)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def lines(tenant: Tenant, before: datetime, chunk: Chunk) -> list[str]:
    records = list(
        InvocationRecord.objects.filter(pk__in=chunk.record_ids)
        .select_related("approval", "approval__tool", "approval__decided_by")
        .order_by("created_at", "pk")
    )
    events: dict[tuple[str, str], list[Any]] = defaultdict(list)
    if chunk.through:
        for run_id, call, message in (
            RunEvent.objects.filter(tenant=tenant)
            .filter(chunk.prefixes(), tool_call_id__in={record.tool_call_id for record in records})
            .order_by("run_id", "seq")
            .values_list("run_id", "tool_call_id", "message")
        ):
            events[(run_id, call)].append(message)
    pruned_before = before.isoformat().replace("+00:00", "Z")
    return [
        json.dumps(
            {
                "v": VERSION,
                "tenant": tenant.slug,
                "prunedBefore": pruned_before,
                "record": record.as_api(),
                "events": events.get((record.run_id, record.tool_call_id), []),
                "approval": _approval(getattr(record, "approval", None)),
            },
            ensure_ascii=False,
            separators=(",", ":"),
            default=str,
        )
        for record in records
    ]


def _approval(approval: ApprovalRequest | None) -> dict[str, Any] | None:
    if approval is None:
        return None
    data = dict(ApprovalSerializer(approval).data)
    data["votes"] = [
        {
            "user": vote.user.get_username(),
            "decision": vote.decision,
            "reason": vote.reason,
            "createdAt": vote.created_at.isoformat().replace("+00:00", "Z"),
        }
        for vote in approval.votes.select_related("user")
    ]
    return data
