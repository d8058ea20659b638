"""A tool that keeps a database connection busy, for the pool tests (tests/faults/test_pool.py).

Registered in the test process by the `hold_tool` fixture and in Daphne through
TOOLHUB_EXTRA_TOOL_MODULES=tests.faults.pool_tools.
"""

from __future__ import annotations

from django.db import connection, transaction
from pydantic import Field

from apps.tools.capabilities import Capabilities
from apps.tools.contracts import ToolContext, ToolParams
from tests.support.tools import Waited, _test_tool


class Hold(ToolParams):
    seconds: float = Field(ge=0, le=10)


def hold_connection(params: Hold, ctx: ToolContext, caps: Capabilities) -> Waited:
    """Holds one connection for `seconds`: a transaction keeps it out of the pool."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        ctx.wait_cancelled(params.seconds)
    return Waited(waited=int(params.seconds))


HOLD = "test__hold_connection"
CONTRACTS = [_test_tool("hold_connection", Hold, Waited, hold_connection, timeout_s=15)]
