"""Argument templates from a tool's input schema (the demo chat fills them in)."""

from __future__ import annotations

import pytest

from apps.tools.schema import example_arguments
from apps.tools.sources import get_tool

pytestmark = pytest.mark.one_leg


def test_send_email_template_names_its_required_fields_with_the_right_types():
    tool = get_tool("core__send_email")
    assert tool is not None
    template = example_arguments(tool.input_schema)
    assert template["to"] == [""]  # a list of addresses, not one string
    assert template["subject"] == "" and template["body"] == ""


@pytest.mark.parametrize(
    "schema, expected",
    [
        ({"type": "object", "properties": {"n": {"type": "integer"}}}, {"n": 0}),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "string"}, "b": {"type": "boolean"}},
                "required": ["b"],
            },
            {"b": False},
        ),
        ({"type": "object", "properties": {"m": {"enum": ["GET", "POST"]}}}, {"m": "GET"}),
        ({"type": "object", "properties": {"t": {"type": "number", "default": 2.5}}}, {"t": 2.5}),
        (
            {
                "type": "object",
                "properties": {"o": {"anyOf": [{"type": "null"}, {"type": "string"}]}},
            },
            {"o": ""},
        ),
        (
            {"type": "object", "properties": {"x": {"type": ["null", "array"], "items": {}}}},
            {"x": []},
        ),
        ({"type": "object"}, {}),
        ({}, None),
        ("not a schema", None),
    ],
)
def test_templates_follow_the_schema(schema, expected):
    assert example_arguments(schema) == expected


def test_a_self_nesting_schema_stops():
    node: dict = {"type": "object", "properties": {}}
    node["properties"]["again"] = node
    template = example_arguments(node)
    depth = 0
    while isinstance(template, dict) and "again" in template:
        template, depth = template["again"], depth + 1
    assert depth <= 7
