"""The OpenAI and Anthropic shapes of a schema: what both APIs accept at its root."""

from __future__ import annotations

import jsonschema_rs
import pytest

from apps.tools.registry import registry
from apps.tools.wire import ROOT_REFUSED, provider_schema

ITEM = {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}


def assert_accepted_root(schema: dict) -> None:
    assert schema["type"] == "object" and isinstance(schema["properties"], dict)
    assert not set(ROOT_REFUSED) & set(schema)
    jsonschema_rs.meta.validate(schema)


def test_a_plain_object_schema_is_given_as_it_is():
    for tool in registry.all():
        assert provider_schema(tool.input_schema) is tool.input_schema
    schema = {"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {}]}}}
    assert provider_schema(schema) is schema  # composition below the root is fine


def test_the_empty_schema_becomes_an_object_with_no_properties():
    assert provider_schema({"type": "object"}) == {"type": "object", "properties": {}}
    assert provider_schema({}) == {"type": "object", "properties": {}}


def test_a_root_all_of_gives_its_properties_and_required_names():
    schema = {
        "type": "object",
        "properties": {"id": {"type": "integer"}},
        "required": ["id"],
        "allOf": [{"$ref": "#/$defs/Item"}, {"properties": {"qty": {"type": "integer"}}}],
        "$defs": {"Item": ITEM},
    }
    shaped = provider_schema(schema)
    assert_accepted_root(shaped)
    assert shaped == {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "sku": {"type": "string"},
            "qty": {"type": "integer"},
        },
        "required": ["id", "sku"],
        "$defs": {"Item": ITEM},
    }


@pytest.mark.parametrize("keyword", ["anyOf", "oneOf"])
def test_root_alternatives_give_their_properties_but_none_is_required(keyword):
    schema = {
        keyword: [{"$ref": "#/definitions/Item"}, {"properties": {"name": {"type": "string"}}}],
        "definitions": {"Item": ITEM},
    }
    shaped = provider_schema(schema)
    assert_accepted_root(shaped)
    assert shaped["properties"] == {"sku": {"type": "string"}, "name": {"type": "string"}}
    assert "required" not in shaped


def test_a_root_reference_is_resolved_into_the_root():
    shaped = provider_schema({"$ref": "#/$defs/Item", "$defs": {"Item": ITEM}})
    assert_accepted_root(shaped)
    assert shaped["properties"] == ITEM["properties"] and shaped["required"] == ["sku"]


def test_other_root_keywords_are_left_out_and_malformed_branches_ignored():
    shaped = provider_schema(
        {
            "type": "object",
            "properties": {"a": {}},
            "not": {"required": ["b"]},
            "if": {"required": ["a"]},
            "then": {"required": ["c"]},
            "anyOf": ["not a schema", {"$ref": "#/$defs/Missing"}, {"properties": []}],
        }
    )
    assert_accepted_root(shaped)
    assert shaped == {"type": "object", "properties": {"a": {}}}
