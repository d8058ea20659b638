"""JSON nested too deeply, for the tests of every entry point that reads JSON from outside.

`json.loads` raises RecursionError on the 20,000-deep texts; it parses the 200-deep
one, which toolhub.web.json_input refuses all the same (MAX_DEPTH is 64).
"""

from __future__ import annotations

from typing import Final

import pytest

from toolhub.web.json_input import MAX_DEPTH


def nested_object(depth: int) -> str:
    """An object `depth` levels deep: {"a": {"a": ... 1}}."""
    return '{"a":' * depth + "1" + "}" * depth


DEEP_ARRAYS: Final = "[" * 20_000 + "]" * 20_000
DEEP_OBJECTS: Final = nested_object(20_000)
# 200 levels, arrays and objects: [{"a": [{"a": ... 1}]}]
OVER_DEPTH: Final = '[{"a":' * 100 + "1" + "}]" * 100
TOO_DEEP: Final = f"The JSON is nested deeper than {MAX_DEPTH} levels."

# Runs a test with each text as `text`; the ids name them in the report.
deep_texts = pytest.mark.parametrize(
    "text", [DEEP_ARRAYS, DEEP_OBJECTS, OVER_DEPTH], ids=["20000-arrays", "20000-objects", "200"]
)


def logged_tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The log lines that carry a traceback: bad input must log none."""
    return [record.getMessage() for record in caplog.records if record.exc_info]
