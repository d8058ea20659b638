"""Calling a real server under test over HTTP with an API key (no test client)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def api(base: str, key: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """The status and decoded JSON body of one request; HTTP errors are answers, not raises."""
    request = urllib.request.Request(
        f"{base}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")
