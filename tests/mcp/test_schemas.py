"""Imported schemas: the supported subset compiles; anything else is refused with a reason."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from apps.mcp.discovery import normalise, tool_id_for
from apps.mcp.models import McpServer
from apps.mcp.schemas import compile_params
from apps.tools.schema import SchemaError


def test_the_subset_compiles_to_a_closed_model_that_keeps_json_names():
    model = compile_params(
        {
            "type": "object",
            "properties": {
                "repo-path": {"type": "string", "minLength": 1},
                "count": {"type": "integer", "maximum": 3},
                "mode": {"enum": ["a", "b"]},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                "inner": {"$ref": "#/$defs/Inner"},
            },
            "required": ["repo-path"],
            "$defs": {"Inner": {"type": "object", "properties": {"x": {"type": "boolean"}}}},
        },
        "t",
    )
    params = model.model_validate_json('{"repo-path": "/r", "inner": {"x": true}}', strict=True)
    assert params.model_dump(mode="json") == {"repo-path": "/r", "inner": {"x": True}}
    for bad in (
        '{"repo-path": "/r", "extra": 1}',
        '{"repo-path": ""}',
        '{"count": 1}',
        '{"repo-path": "/r", "count": 4}',
        '{"repo-path": "/r", "mode": "c"}',
        '{"repo-path": "/r", "inner": {"y": 1}}',
        '{"repo-path": "/r", "count": "1"}',
    ):
        with pytest.raises(ValidationError):
            model.model_validate_json(bad, strict=True)


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"type": "object", "properties": {"v": {"anyOf": [{"type": "string"}]}}}, "anyOf"),
        ({"type": "object", "properties": {"v": {"type": "strng"}}}, "type 'strng'"),
        ({"type": "object", "properties": ["v"]}, "properties is not an object"),
        ({"type": "object", "required": "v"}, "required is not a list"),
        ({"type": "object", "properties": {"v": {"enum": []}}}, "enum must list"),
        ({"type": "object", "properties": {"v": {"$ref": "#/$defs/Missing"}}}, "Missing"),
        ({"type": "array"}, "JSON object schema"),
        ("not a schema", "not a JSON object"),
        ({"type": "object", "properties": {"v": {"type": ["string", "integer"]}}}, "several"),
    ],
)
def test_a_malformed_or_unsupported_schema_is_refused_with_the_reason(schema, reason):
    with pytest.raises(SchemaError, match=reason):
        compile_params(schema, "t")


def test_names_are_normalised_into_the_id_alphabet():
    server = McpServer(name="srv")
    assert normalise("Get-Time.v2") == "get_time_v2"
    assert tool_id_for(server, "Get-Time.v2") == "mcp__srv__get_time_v2"
    assert tool_id_for(server, "x" * 60) is None  # longer than 64 with the prefix
    assert tool_id_for(server, "!!") is None  # nothing left but underscores
