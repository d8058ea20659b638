"""A logged value cannot forge a log line: the configured formatter escapes control characters."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import logging.config
import re
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from django.conf import settings

from tests.support.server import Server, daphne

FORGED = "2030-01-01 00:00:00,000 INFO apps.invocations.runner tool call FORGED status=succeeded"
# A record's line as the configured format writes it.
RECORD_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")


@pytest.fixture
def server(transactional_db: None) -> Iterator[Server]:
    with daphne() as base:
        yield base


def configured_logger() -> tuple[logging.Logger, io.StringIO]:
    """A logger whose handler uses settings.LOGGING's formatter, writing to a buffer."""
    config = {**settings.LOGGING, "handlers": {}, "root": {}}
    config["handlers"] = {
        "buffer": {"class": "logging.StreamHandler", "formatter": "plain", "stream": io.StringIO()}
    }
    config["loggers"] = {"edge.test": {"handlers": ["buffer"], "propagate": False}}
    logging.config.dictConfig(config)
    logger = logging.getLogger("edge.test")
    stream = logger.handlers[0].stream  # type: ignore[attr-defined]
    return logger, stream


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    yield configured_logger()
    logging.config.dictConfig(settings.LOGGING)


@pytest.mark.server
def test_it_logs_a_tool_id_with_newlines_on_one_line(server, agent):
    tool_id = f"evil\r\n{FORGED}\u2028{FORGED}\x1b[2J"
    request = urllib.request.Request(
        f"{server}/api/v1/invocations/",
        data=json.dumps({"toolId": tool_id}).encode(),
        headers={"Authorization": f"Bearer {agent.key}", "Content-Type": "application/json"},
    )
    # The status does not matter here, only what the server logged.
    with contextlib.suppress(urllib.error.HTTPError):
        urllib.request.urlopen(request, timeout=30).close()
    output = server.output()
    assert "tool=evil\\r\\n2030-01-01" in output  # it was logged, escaped
    for line in output.splitlines():
        assert "FORGED" not in line or not line.startswith("2030-01-01"), line
    assert "\x1b" not in output
    assert "\u2028" not in output


def test_it_escapes_every_field_and_argument(captured):
    logger, stream = captured
    logger.warning("tool=%s principal=%s", "a\nb", "c\x85d\u2029e\x00")
    assert stream.getvalue() == stream.getvalue().splitlines()[0] + "\n"
    assert "tool=a\\nb principal=c\\x85d\\u2029e\\x00" in stream.getvalue()


def test_it_keeps_a_traceback_readable_but_indents_it_under_its_record(captured):
    logger, stream = captured
    try:
        raise ValueError(f"bad value\n{FORGED}")
    except ValueError:
        logger.exception("failed for %s", "x")
    lines = stream.getvalue().splitlines()
    assert RECORD_START.match(lines[0])
    assert lines[1] == "  Traceback (most recent call last):"
    assert all(line.startswith("  ") for line in lines[1:])
    assert any(line == f"  {FORGED}" for line in lines)  # the message's own text, indented
