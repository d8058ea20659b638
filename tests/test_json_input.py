"""toolhub.web.json_input: the one reader of JSON from outside, with its depth and size limits."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest

from tests.support.deep_json import TOO_DEEP, deep_texts, nested_object
from toolhub.web.json_input import MAX_DEPTH, JsonInputError, _nested_deeper, loads

pytestmark = pytest.mark.one_leg


@deep_texts
def test_it_refuses_json_nested_deeper_than_the_limit_as_a_value_error(text):
    with pytest.raises(JsonInputError, match=TOO_DEEP) as refused:
        loads(text)
    assert isinstance(refused.value, ValueError)
    assert refused.value.limit is True
    with pytest.raises(JsonInputError, match=TOO_DEEP):
        loads(text.encode())


def test_it_reads_json_nested_exactly_to_the_limit():
    assert loads("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    assert loads(nested_object(MAX_DEPTH))["a"]["a"]["a"] is not None
    with pytest.raises(JsonInputError, match=TOO_DEEP):
        loads(nested_object(MAX_DEPTH + 1))


def test_brackets_inside_strings_do_not_count_as_nesting():
    text = json.dumps({"a": "[" * 500 + "{" * 500, "b": ['"\\[' * 200], "c": "\\" * 3})
    assert loads(text) == json.loads(text)


def depth_by_hand(text: str) -> int:
    """The deepest nesting of brackets outside strings, one character at a time."""
    depth = deepest = 0
    inside = escaped = False
    for char in text:
        if inside:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                inside = False
        elif char == '"':
            inside = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def random_value(rng: random.Random, levels: int) -> Any:
    """Lists, objects and strings full of brackets, quotes and backslashes."""

    def text() -> str:
        return "".join(rng.choice('[]{}"\\a,:é') for _ in range(rng.randint(0, 6)))

    kind = rng.random() if levels else 1.0
    if kind < 0.35:
        return [random_value(rng, levels - 1) for _ in range(rng.randint(0, 3))]
    if kind < 0.7:
        return {text(): random_value(rng, levels - 1) for _ in range(rng.randint(0, 3))}
    return text()


def test_the_depth_scan_agrees_with_reading_one_character_at_a_time():
    """Whole documents and cut ones (a string left open), as many levels as the limits."""
    rng = random.Random(7)
    for _ in range(3000):
        text = json.dumps(random_value(rng, rng.randint(0, 10)), ensure_ascii=rng.random() < 0.5)
        if rng.random() < 0.3:
            text = text[: rng.randint(0, len(text))]
        deepest = depth_by_hand(text)
        for limit in (0, 1, 2, 4, 8):
            assert _nested_deeper(text, limit) == (deepest > limit), (limit, text)


def test_a_caller_may_ask_for_another_depth():
    assert loads("[[[1]]]", max_depth=3) == [[[1]]]
    with pytest.raises(JsonInputError, match="deeper than 2 levels"):
        loads("[[[1]]]", max_depth=2)


def test_it_reads_what_json_loads_reads():
    for text in ('{"a": [1, 2.5, true, null, "é\\n"]}', "[]", '"x"', "  42 ", '{"[": "]"}'):
        assert loads(text) == json.loads(text)
        assert loads(text.encode()) == json.loads(text.encode())
    assert loads('["é"]'.encode("utf-16")) == ["é"]


def test_text_that_is_not_json_says_where_without_quoting_it():
    with pytest.raises(JsonInputError) as refused:
        loads('{"token": "sk-live-123",}')
    message = str(refused.value)
    assert message.startswith("Not valid JSON: ") and "(line 1, column 24)" in message
    assert "sk-live-123" not in message
    assert refused.value.limit is False


def test_nan_and_infinity_are_not_json():
    for text in ('{"a": NaN}', "[Infinity]", "-Infinity"):
        with pytest.raises(JsonInputError, match="is not a JSON value"):
            loads(text)


def test_bytes_that_are_not_text_are_refused():
    with pytest.raises(JsonInputError, match="not UTF-8 text"):
        loads(b'["\xff"]')


def test_it_refuses_text_larger_than_the_limit(settings):
    assert loads("[1]", max_bytes=3) == [1]
    with pytest.raises(JsonInputError, match="larger than 3 bytes") as refused:
        loads("[10]", max_bytes=3)
    assert refused.value.limit is True
    with pytest.raises(JsonInputError, match="larger than 3 bytes"):
        loads('"é"', max_bytes=3)  # three characters, four bytes in UTF-8
    settings.TOOLHUB_MAX_REQUEST_BYTES = 1024
    with pytest.raises(JsonInputError, match="larger than 1024 bytes"):
        loads(b"[" + b"1," * 600 + b"1]")


def test_a_megabyte_of_brackets_or_of_an_open_string_is_judged_in_linear_time():
    """No step per character in Python, and no rescan from each quote of a string that
    never ends (which a regular expression searching for strings would do)."""
    started = time.perf_counter()
    for text, refusal in (
        ("[" * 1_000_000, TOO_DEEP),
        ("x" * 1_000_000 + "[" * 100, TOO_DEEP),
        ("[" * 10 + '"' + "x" * 1_000_000 + "[" * 100, "Unterminated string"),
    ):
        with pytest.raises(JsonInputError, match=refusal):
            loads(text, max_bytes=10_000_000)
    assert time.perf_counter() - started < 2.0


def test_a_string_left_open_after_deep_brackets_is_still_too_deep():
    with pytest.raises(JsonInputError, match=TOO_DEEP):
        loads("[" * 100 + '"never closed')
    with pytest.raises(JsonInputError, match="Unterminated string"):
        loads('"' + "[" * 100)
