"""What clients send on the one-way streams: JSON is ignored; anything else closes with 4400."""

from __future__ import annotations

import pytest
from websockets.exceptions import ConnectionClosed

from tests.streams.conftest import logged_in, nothing_arrives, open_ws, operator
from tests.support.deep_json import DEEP_ARRAYS, DEEP_OBJECTS, OVER_DEPTH

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server, pytest.mark.one_leg]

NOT_JSON = [DEEP_ARRAYS, DEEP_OBJECTS, OVER_DEPTH, b"\x00binary", "{oops"]


def close_code_after(base: str, path: str, headers: dict[str, str], message: str | bytes) -> int:
    """Open a stream, send a JSON message (ignored), then `message`: the close code."""
    with open_ws(base, path, headers) as ws:
        ws.send('{"type": "ping"}')
        nothing_arrives(ws, 0.3)
        ws.send(message)
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=10)
        assert closed.value.rcvd is not None, "closed without a close frame"
        return closed.value.rcvd.code


def test_a_run_stream_closes_with_4400_on_a_message_that_is_not_json(server, acme):
    headers = {"Authorization": f"Bearer {acme.key}"}
    for message in NOT_JSON:
        assert close_code_after(server, "/ws/v1/runs/run-1/", headers, message) == 4400
    assert "Traceback" not in server.output()


def test_the_approvals_stream_closes_with_4400_on_a_message_that_is_not_json(server, acme):
    browser = logged_in(server, operator("opal", acme.tenant))
    for message in NOT_JSON:
        assert close_code_after(server, "/ws/v1/approvals/", browser.ws_headers, message) == 4400
    assert "Traceback" not in server.output()
