"""Imported schemas are JSON Schema, validated as such; what cannot be used says why."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from pydantic import ValidationError

from apps.invocations.runner import explain_validation
from apps.mcp import schemas
from apps.mcp.discovery import assign_ids, hashed_id, normalise, tool_id_for
from apps.mcp.models import McpServer
from apps.mcp.schemas import McpParams, compile_params
from apps.tools.schema import MAX_DECLARED_BYTES, MAX_DECLARED_DEPTH, SchemaError

pytestmark = pytest.mark.one_leg

OPTIONAL = {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
ORDER = {
    "type": "object",
    "properties": {
        "customer": {"type": "string", "minLength": 1},
        "note": OPTIONAL,
        "when": {"type": "string", "format": "date-time"},
        "kind": {"const": "order"},
        "speed": {"enum": ["slow", "fast"], "default": "slow"},
        "at": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "string"}]},
        "labels": {
            "type": "object",
            "patternProperties": {"^x-": {"type": "integer"}},
            "additionalProperties": False,
        },
        "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
        "size": {"oneOf": [{"type": "integer"}, {"$ref": "#/definitions/Named"}]},
        "item": {"$ref": "#/$defs/Item"},
        "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
    },
    "required": ["customer"],
    "$defs": {
        "Item": {
            "type": "object",
            "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-\\d+$"}},
            "required": ["sku"],
        }
    },
    "definitions": {"Named": {"enum": ["small", "large"]}},
}


def problems(model: type[McpParams], arguments: Any) -> dict[str, str]:
    with pytest.raises(ValidationError) as caught:
        model.model_validate_json(json.dumps(arguments), strict=True)
    return {
        ".".join(str(part) for part in error["loc"]): error["msg"]
        for error in caught.value.errors(include_input=False, include_url=False)
    }


def test_json_schema_keywords_validate_as_json_schema_says():
    model = compile_params(ORDER, "order")
    valid = {
        "customer": "ada",
        "note": None,
        "when": "2024-01-15T14:30:25",  # not RFC 3339: format is an annotation
        "kind": "order",
        "speed": "fast",
        "at": [1.5, "north", True],
        "labels": {"x-a": 1},
        "counts": {"apples": 3},
        "size": "small",
        "item": {"sku": "ABC-1", "extra": "nested objects stay open"},
        "items": [{"sku": "XYZ-22"}],
    }
    params = model.model_validate_json(json.dumps(valid), strict=True)
    assert params.model_dump(mode="json") == valid


def test_arguments_are_kept_exactly_as_sent_explicit_nulls_included():
    model = compile_params(ORDER, "order")
    for sent in (
        {"customer": "ada"},
        {"customer": "ada", "note": None},
        {"customer": "a", "at": []},
    ):
        params = model.model_validate_json(json.dumps(sent), strict=True)
        assert params.model_dump(mode="json") == sent
        assert json.dumps(params.model_dump(mode="json")) == json.dumps(sent)  # key order too
    dumped = params.model_dump(mode="json")
    dumped["at"].append(1)  # a caller's change to a dump is not the params'
    assert params.model_dump(mode="json") == {"customer": "a", "at": []}


def test_failing_values_are_reported_at_their_path_without_the_value():
    model = compile_params(ORDER, "order")
    secret = "s3cret-value"
    found = problems(
        model,
        {
            "note": 7,
            "kind": secret,
            "at": [secret, 1],
            "labels": {"x-a": secret, "other": 1},
            "size": 1.5,
            "items": [{"sku": secret}],
            "counts": {"apples": secret},
            "typo": True,
        },
    )
    assert found == {
        "customer": "is required",
        "note": "the value is not valid under any of the schemas listed in the 'anyOf' keyword "
        '(the value is not of type "string"; the value is not of type "null")',
        "kind": '"order" was expected',
        "at.0": 'the value is not of type "number"',
        "at.1": 'the value is not of type "string"',
        "labels.x-a": 'the value is not of type "integer"',
        "labels.other": "is not an argument the schema declares (additionalProperties is false)",
        "size": "the value is not valid under any of the schemas listed in the 'oneOf' keyword "
        '(the value is not of type "integer"; the value is not one of "small" or "large")',
        "items.0.sku": r'the value does not match "^[A-Z]{3}-\d+$"',
        "counts.apples": 'the value is not of type "integer"',
        "typo": "is not an argument the schema declares (additionalProperties is false)",
    }
    assert secret not in json.dumps(found)


def test_the_runner_explains_them_field_by_field():
    model = compile_params(ORDER, "order")
    with pytest.raises(ValidationError) as caught:
        model.model_validate_json('{"customer": "", "kind": "x"}', strict=True)
    assert explain_validation(caught.value) == (
        'Invalid arguments: customer: the value is shorter than 1 character; kind: "order" '
        "was expected"
    )


def test_a_root_that_says_nothing_of_other_keys_is_closed():
    closed = compile_params({"type": "object", "properties": {"a": {}}}, "t")
    assert closed.declared_schema == {
        "type": "object",
        "properties": {"a": {}},
        "additionalProperties": False,
    }
    assert problems(closed, {"b": 1}) == {
        "b": "is not an argument the schema declares (additionalProperties is false)"
    }
    for open_schema in (
        {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "integer"}},
        {"type": "object", "properties": {"a": {}}, "patternProperties": {"^b": {}}},
        {"type": "object", "properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}]},
    ):
        model = compile_params(open_schema, "t")
        assert model.declared_schema == open_schema
        assert model.model_validate({"a": 1, "b": 2}).model_dump() == {"a": 1, "b": 2}


def test_the_empty_schema_takes_any_object():
    model = compile_params({}, "t")
    assert model.declared_schema == {"type": "object"}
    sent = {"anything": [1, None, {"deep": True}]}
    assert model.model_validate(sent).model_dump(mode="json") == sent
    assert problems(model, [1]) == {"": "the arguments must be a JSON object"}


def test_a_type_list_with_object_at_the_root_becomes_object():
    model = compile_params({"type": ["object", "null"], "properties": {}}, "t")
    assert model.declared_schema is not None and model.declared_schema["type"] == "object"


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"type": "object", "properties": {"v": {"$ref": "#/$defs/Missing"}}}, "/$defs/Missing"),
        (
            {"type": "object", "properties": {"v": {"type": "string", "pattern": "(a"}}},
            '$.properties.v.pattern: "(a" is not a "regex"',
        ),
        (
            {"type": "object", "patternProperties": {"(a": {}}},
            '$.patternProperties.(a: "(a" is not a "regex"',
        ),
        ({"type": "array"}, 'type is "array": tool arguments are a JSON object'),
        ("not a schema", "not a JSON object"),
        (True, "not a JSON object"),
        ({"type": "object", "properties": {"v": {"type": "strng"}}}, "$.properties.v.type"),
        ({"type": "object", "properties": ["v"]}, '$.properties: ["v"] is not of type "object"'),
        ({"type": "object", "required": "v"}, '$.required: "v" is not of type "array"'),
        ({"$schema": "https://schemas.example/meta", "type": "object"}, "Unknown meta-schema"),
        (
            {"type": "object", "properties": {"v": {"$ref": "https://schemas.example/v.json"}}},
            '$.properties.v.$ref is "https://schemas.example/v.json": only references inside',
        ),
        ({"type": "object", "properties": {"v": {"$ref": "v.json#/x"}}}, "never fetches"),
        ({"$ref": "file:///etc/passwd"}, "never fetches"),
    ],
)
def test_a_schema_that_cannot_be_used_is_refused_with_the_reason(schema, reason):
    with pytest.raises(SchemaError) as caught:
        compile_params(schema, "t")
    assert reason in str(caught.value)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"connectionId": {"type": "string"}}},
        {"type": "object", "required": ["connectionId"]},
        {
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/A"}},
            "$defs": {"A": {"type": "object", "properties": {"connectionId": {}}}},
        },
        {"type": "object", "properties": {"a": {"anyOf": [{"properties": {"connectionId": {}}}]}}},
    ],
)
def test_a_connection_id_argument_stays_refused_wherever_it_is_declared(schema):
    with pytest.raises(SchemaError, match="CONNECTION_ID_VIA_CONTEXT"):
        compile_params(schema, "t")


def test_property_names_are_not_taken_for_keywords():
    schema = {
        "type": "object",
        "properties": {"enum": {"properties": {"connectionId": {}}}, "$ref": {"type": "string"}},
    }
    with pytest.raises(SchemaError, match=r"\$\.properties\.enum\.properties declares"):
        compile_params(schema, "t")
    del schema["properties"]["enum"]
    assert compile_params(schema, "t").model_validate({"$ref": "x"}).model_dump() == {"$ref": "x"}


def test_a_schema_is_bounded_in_depth_and_size():
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(MAX_DECLARED_DEPTH):
        deep = {"type": "array", "items": deep}
    with pytest.raises(SchemaError, match="nested more than"):
        compile_params({"type": "object", "properties": {"v": deep}}, "t")
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(4000)}}
    with pytest.raises(SchemaError, match=f"the limit is {MAX_DECLARED_BYTES}"):
        compile_params(wide, "t")


def test_a_remote_reference_is_never_fetched_even_past_the_check():
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            body = b'{"type": "string"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v.json"
        schema = {"type": "object", "properties": {"v": {"$ref": url}}}
        with pytest.raises(SchemaError, match="never fetches"):
            compile_params(schema, "t")
        with pytest.raises(SchemaError, match="Retrieval is disabled"):
            schemas.compiled(schema)  # the validator itself is offline too
    finally:
        server.shutdown()
        server.server_close()
    assert hits == []


def test_a_schema_is_compiled_once_however_many_tools_declare_it():
    schema = {"type": "object", "properties": {"once": {"type": "integer"}}}
    first, second = compile_params(schema, "a"), compile_params(dict(schema), "b")
    assert first is not second
    assert first._validator is second._validator


def test_names_are_normalised_into_the_id_alphabet():
    server = McpServer(name="srv")
    assert normalise("Get-Time.v2") == "get_time_v2"
    assert tool_id_for(server, "Get-Time.v2") == "mcp__srv__get_time_v2"
    assert tool_id_for(server, "x" * 60) is None  # longer than 64 with the prefix
    assert tool_id_for(server, "!!") is None  # nothing left but underscores


def test_every_remote_name_is_mapped_to_a_valid_id_deterministically_and_without_collision():
    server = McpServer(name="srv")
    names = ["get_time", "Get-Time", "GET TIME", "x" * 65, "y" * 200, "!!", "ok", "Only-One"]
    ids = assign_ids(server, names)
    assert ids == assign_ids(server, list(reversed(names)))  # order does not matter
    assert len(set(ids.values())) == len(names)
    for tool_id in ids.values():
        assert re.fullmatch(r"[a-z0-9_]{1,64}", tool_id), tool_id
    assert ids["get_time"] == "mcp__srv__get_time"  # already in the alphabet: kept
    assert ids["ok"] == "mcp__srv__ok"
    assert ids["Only-One"] == "mcp__srv__only_one"  # no rival: normalised only
    assert ids["Get-Time"] == hashed_id(server, "Get-Time")  # rivals of get_time
    assert re.fullmatch(r"mcp__srv__get_time_[0-9a-f]{8}", ids["Get-Time"])
    assert ids["GET TIME"] != ids["Get-Time"]
    assert len(ids["x" * 65]) == 64 and ids["x" * 65].startswith("mcp__srv__xxx")
    assert re.fullmatch(r"mcp__srv__tool_[0-9a-f]{8}", ids["!!"])
