"""While the database is down, the API answers 503 with Retry-After and a JSON body,
and the log has one line for the outage rather than a traceback per request."""

from __future__ import annotations

import json
import os
import tempfile
import urllib.error
import urllib.request

import pytest

from tests.support.server import daphne

pytestmark = pytest.mark.server


def test_it_answers_503_with_retry_after_while_the_database_is_down():
    nowhere = tempfile.mkdtemp(prefix="toolhub-no-pg-")
    env = {"DATABASE_URL": f"postgresql://postgres@{nowhere.replace('/', '%2F')}/toolhub"}
    try:
        with daphne(env) as server:
            answers = []
            for path in ("/api/v1/invocations/", "/api/v1/tools/", "/api/v1/invocations/"):
                request = urllib.request.Request(
                    f"{server}{path}", headers={"Authorization": "Bearer th_0123abcd_" + "x" * 43}
                )
                with pytest.raises(urllib.error.HTTPError) as caught:
                    urllib.request.urlopen(request, timeout=10)
                error = caught.value
                answers.append((error.code, error.headers["Retry-After"], json.loads(error.read())))
            log = server.output()
    finally:
        os.rmdir(nowhere)
    for status, retry_after, body in answers:
        assert (status, retry_after) == (503, "5"), answers
        assert body["retryAfterSeconds"] == 5 and "retry" in body["detail"], body
    assert log.count("database unavailable") == 1, log
    assert "Traceback" not in log and "Internal Server Error" not in log, log
