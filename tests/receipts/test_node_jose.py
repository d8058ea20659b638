"""docs/receipts.md's Node snippet, run: `jose` (panva/jose, pinned in tests/mcp/node)
verifies a real receipt against the published JWKS, and refuses a tampered one."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from toolhub_client import verify_receipt

from tests.conftest import Agent
from tests.mcp.test_server_node import node_harness
from tests.receipts.support import parts, published_keys, with_body

pytestmark = [pytest.mark.django_db, pytest.mark.one_leg]

# The snippet of docs/receipts.md, with the JWKS and the receipt read from stdin.
VERIFY = """
import { compactVerify, createLocalJWKSet } from "jose";

let input = "";
for await (const chunk of process.stdin) input += chunk;
const { receipt, jwks } = JSON.parse(input);
const { payload, protectedHeader } = await compactVerify(receipt, createLocalJWKSet(jwks), {
  algorithms: ["Ed25519"],
});
const body = JSON.parse(new TextDecoder().decode(payload));
const key = jwks.keys.find((k) => k.kid === protectedHeader.kid);
if (key.toolhub_retires_at && Date.parse(body.signedAt) >= Date.parse(key.toolhub_retires_at)) {
  throw new Error("signed after its key retired");
}
console.log(JSON.stringify(body));
"""


def node_verify(receipt: str, jwks: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["node", "--input-type=module", "-e", VERIFY],
        cwd=node_harness(),
        input=json.dumps({"receipt": receipt, "jwks": jwks}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_node_jose_verifies_a_real_receipt_and_refuses_a_tampered_one(agent: Agent):
    receipt = agent.invoke("core__get_current_time").json()["receipt"]
    jwks = published_keys()

    verified = node_verify(receipt, jwks)
    _, body, _ = parts(receipt)
    tampered = node_verify(with_body(receipt, {**body, "principal": "agent:someone-else"}), jwks)

    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout) == verify_receipt(receipt, jwks)
    assert tampered.returncode != 0
    assert "signature verification failed" in tampered.stderr
