"""What a receipt costs a call: building its body, hashing the arguments and the redacted
result, and the Ed25519 signature (apps/receipts), in this process, with no database.

    .venv/bin/python bench/receipts.py [--calls 2000] [--result-bytes 200,4000,32000]

For each result size it signs `--calls` receipts of one record the way the runner does
(receipts.signing.sign_call: body, canonical JSON, digests, JWS) and prints the per-call
median and p90, with the signature alone and a verification (what a client pays) beside
them. Writes bench/results/receipts-<date>.json (or --output). Nothing here asserts on
timings.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolhub.settings")
os.environ.setdefault("TOOLHUB_SECRET_KEY", os.urandom(32).hex())
os.environ.setdefault("TOOLHUB_VAR_DIR", tempfile.mkdtemp(prefix="toolhub-bench-receipts-"))
os.environ.setdefault("TOOLHUB_ENCRYPTION_KEY", base64.urlsafe_b64encode(os.urandom(32)).decode())
import django  # noqa: E402

django.setup()

from django.utils import timezone  # noqa: E402
from joserfc import jws  # noqa: E402
from joserfc.jwk import OKPKey  # noqa: E402

from apps.invocations.models import InvocationRecord, Status  # noqa: E402
from apps.receipts.body import Facts, canonical  # noqa: E402
from apps.receipts.keys import ALG, Signer  # noqa: E402
from apps.receipts.signing import sign_call  # noqa: E402
from apps.tenants.models import Tenant  # noqa: E402


def record_with(result_bytes: int) -> InvocationRecord:
    """An ended call's record, as the runner holds it when it signs; its result about
    `result_bytes` of JSON in 40-byte items."""
    now = timezone.now()
    items = [{"id": n, "name": f"item {n:05d}", "ok": True} for n in range(result_bytes // 40)]
    return InvocationRecord(
        id=uuid.uuid4(),
        tenant=Tenant(slug="bench", name="Bench"),
        tool_ref="core__planning_read_plan",
        tool_call_id=f"call_{uuid.uuid4().hex}",
        run_id=f"run_{uuid.uuid4().hex}",
        principal="agent:bench",
        status=Status.SUCCEEDED,
        ok=True,
        result={"items": items},
        policy_rule="policy:1:bench",
        started_at=now,
        ended_at=now,
    )


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_us": round(statistics.median(ordered) * 1e6, 1),
        "p90_us": round(ordered[int(len(ordered) * 0.9)] * 1e6, 1),
    }


def timed(action: Any, calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--result-bytes", default="200,4000,32000")
    parser.add_argument("--output", type=Path)
    options = parser.parse_args()

    key = OKPKey.generate_key("Ed25519")
    signer = Signer("bench", key)
    facts = Facts(
        schema_hash="0123456789abcdef",
        args={"plan_id": "p-1", "query": "x" * 200},
        decision="allow",
        policy_version="fedcba9876543210",
    )
    rows = []
    for size in (int(s) for s in options.result_bytes.split(",")):
        record = record_with(size)
        receipt = sign_call(record, facts, signer)
        payload = canonical({"v": 1, "receipt": "x" * 600})
        row = {
            "result_bytes": len(canonical(record.result)),
            "receipt_bytes": len(receipt),
            "sign_call": percentiles(
                timed(lambda r=record: sign_call(r, facts, signer), options.calls)
            ),
            "signature_only": percentiles(timed(lambda p=payload: signer.sign(p), options.calls)),
            "verify": percentiles(
                timed(
                    lambda r=receipt: jws.deserialize_compact(r, key, algorithms=[ALG]),
                    options.calls,
                )
            ),
        }
        rows.append(row)
        sys.stdout.write(json.dumps(row) + "\n")
    output = options.output or (
        ROOT / "bench" / "results" / f"receipts-{datetime.now(UTC):%Y-%m-%d}.json"
    )
    output.write_text(json.dumps({"calls": options.calls, "rows": rows}, indent=2) + "\n")
    sys.stdout.write(f"wrote {output}\n")


if __name__ == "__main__":
    main()
