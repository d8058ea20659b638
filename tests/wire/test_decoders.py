"""The decoders alone: assembly by index, decode sessions, cut streams and stray deltas."""

from __future__ import annotations

import pytest

from apps.invocations.wire import CUT_MID_CALL, MalformedRequest, anthropic, openai
from tests.wire.conftest import load

pytestmark = pytest.mark.one_leg


def test_it_assembles_interleaved_openai_deltas_by_index():
    session = openai.decode_chunks(load("openai_parallel_stream")["request"]["chunks"])
    calls = session.result()
    assert [(c.tool_call_id, c.name, c.arguments) for c in calls] == [
        ("call_p0", "test__echo", '{"text": "a"}'),
        ("call_p1", "test__echo", '{"text": "bee"}'),
        ("call_p2", "test__confirm", "{}"),
    ]
    assert all(c.problem is None for c in calls)


def test_it_keeps_assembly_state_inside_one_decode_session():
    chunks = load("openai_parallel_stream")["request"]["chunks"]
    first = openai.decode_chunks(chunks)
    second = openai.decode_chunks(chunks)
    assert first.calls is not second.calls
    assert [c.arguments for c in second.result()] == [c.arguments for c in first.result()]


def test_it_marks_a_call_cut_by_the_end_of_an_openai_stream():
    calls = openai.decode_chunks(load("openai_stream_cut")["request"]["chunks"]).result()
    assert calls[0].problem is None
    assert calls[1].problem is CUT_MID_CALL


def test_it_treats_a_length_finish_as_a_cut_stream():
    chunks = load("openai_stream_cut")["request"]["chunks"]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    assert openai.decode_chunks(chunks).result()[1].problem is CUT_MID_CALL


def test_it_lets_the_runner_judge_bad_json_once_the_stream_finished():
    chunks = load("openai_stream_cut")["request"]["chunks"]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    assert openai.decode_chunks(chunks).result()[1].problem is None


def test_it_ignores_deltas_for_an_openai_index_never_opened():
    session = openai.decode_chunks(load("openai_stream_orphan")["request"]["chunks"])
    assert [c.tool_call_id for c in session.result()] == ["call_o0"]
    assert list(session.orphans) == [3]
    assert "lost" not in session.orphans[3].problem.safe_message


def test_it_reads_only_the_first_choice():
    chunk = {"choices": [{"index": 1, "delta": {"tool_calls": [{"index": 0, "id": "x"}]}}]}
    assert openai.decode_chunks([chunk]).result() == []


def test_it_refuses_a_delta_without_an_integer_index():
    chunk = {"choices": [{"index": 0, "delta": {"tool_calls": [{"id": "call_1"}]}}]}
    with pytest.raises(MalformedRequest) as exc:
        openai.decode_chunks([chunk])
    assert exc.value.field == "chunks.0.delta.tool_calls"


def test_it_refuses_a_complete_openai_call_without_an_id():
    with pytest.raises(MalformedRequest) as exc:
        openai.decode_tool_calls([{"type": "function", "function": {"name": "x"}}])
    assert exc.value.field == "toolCalls.0.id"


def test_it_assembles_anthropic_input_json_deltas_per_block():
    calls = anthropic.decode_events(load("anthropic_stream")["request"]["events"]).result()
    assert [(c.tool_call_id, c.name, c.arguments, c.problem) for c in calls] == [
        ("toolu_s1", "test__echo", '{"text": "x"}', None),
        ("toolu_s2", "test__confirm", "{}", None),
    ]


def test_it_marks_an_anthropic_block_never_stopped_as_cut():
    calls = anthropic.decode_events(load("anthropic_stream_cut")["request"]["events"]).result()
    assert [c.problem for c in calls] == [None, CUT_MID_CALL]


def test_it_ignores_events_for_an_anthropic_block_never_started():
    session = anthropic.decode_events(load("anthropic_stream_orphan")["request"]["events"])
    assert [c.tool_call_id for c in session.result()] == ["toolu_o0"]
    assert list(session.orphans) == [4]


def test_it_skips_anthropic_blocks_that_are_not_tool_use():
    calls = anthropic.decode_content(load("anthropic_multiple")["request"]["content"])
    assert [c.tool_call_id for c in calls] == ["toolu_m1", "toolu_m2", "toolu_m3"]
