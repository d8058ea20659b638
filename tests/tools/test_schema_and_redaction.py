"""The schema subset checker and the allowlist redaction, as plain functions."""

from __future__ import annotations

import pytest
from pydantic import Field

from apps.tools.contracts import ToolParams
from apps.tools.redaction import RedactionError, build_tree, check_paths, redact, shape_of
from apps.tools.schema import SchemaError, check_input_schema, check_output_schema, compile_model

# ---------------------------------------------------------------- build_tree / redact


def test_only_allowlisted_top_level_fields_are_kept():
    tree = build_tree(["name", "city"])
    value = {"name": "Ada", "city": "London", "password": "hunter2", "token": "t0k"}
    assert redact(value, tree) == {"name": "Ada", "city": "London"}


def test_an_empty_allowlist_keeps_nothing():
    assert redact({"a": 1, "b": {"c": 2}}, build_tree([])) == {}


def test_a_dotted_path_keeps_only_that_leaf_of_a_nested_object():
    tree = build_tree(["user.name"])
    value = {"user": {"name": "Ada", "email": "ada@example.com"}, "other": 1}
    assert redact(value, tree) == {"user": {"name": "Ada"}}


def test_a_path_to_an_object_keeps_its_whole_subtree():
    tree = build_tree(["user"])
    value = {"user": {"name": "Ada", "address": {"city": "London"}}, "secret": "x"}
    assert redact(value, tree) == {"user": {"name": "Ada", "address": {"city": "London"}}}


def test_a_whole_subtree_wins_over_a_narrower_path_in_either_order():
    value = {"user": {"name": "Ada", "email": "ada@example.com"}}
    assert redact(value, build_tree(["user", "user.name"])) == value
    assert redact(value, build_tree(["user.name", "user"])) == value


def test_lists_are_traversed_element_by_element():
    tree = build_tree(["steps.title", "steps.status"])
    value = {
        "steps": [
            {"title": "one", "status": "done", "internal": 1},
            {"title": "two", "status": "pending", "internal": 2},
        ],
        "owner": "x",
    }
    assert redact(value, tree) == {
        "steps": [{"title": "one", "status": "done"}, {"title": "two", "status": "pending"}]
    }


def test_a_top_level_list_is_traversed_too():
    tree = build_tree(["id"])
    assert redact([{"id": 1, "pw": "a"}, {"id": 2, "pw": "b"}], tree) == [{"id": 1}, {"id": 2}]


def test_a_scalar_where_an_object_is_expected_becomes_none():
    tree = build_tree(["user.name"])
    assert redact({"user": "ada:hunter2"}, tree) == {"user": None}
    assert redact({"user": ["ada", "hunter2"]}, tree) == {"user": [None, None]}


def test_a_missing_allowlisted_field_is_simply_absent():
    assert redact({"other": 1}, build_tree(["name"])) == {}


def test_redacting_leaves_the_input_unchanged():
    value = {"name": "Ada", "password": "hunter2"}
    redact(value, build_tree(["name"]))
    assert value == {"name": "Ada", "password": "hunter2"}


@pytest.mark.parametrize("path", ["", ".", "a.", ".a", "a..b"])
def test_malformed_paths_are_refused(path):
    with pytest.raises(RedactionError):
        build_tree([path])


# ---------------------------------------------------------------- check_paths

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "steps": {
            "type": "array",
            "items": {"type": "object", "properties": {"title": {"type": "string"}}},
        },
    },
}


def test_paths_naming_declared_fields_pass_including_through_arrays():
    check_paths(("name", "steps", "steps.title"), SCHEMA, "result")


@pytest.mark.parametrize("path", ["nom", "steps.name", "name.first"])
def test_paths_naming_no_declared_field_are_refused(path):
    with pytest.raises(RedactionError, match="names no field"):
        check_paths((path,), SCHEMA, "result")


# ---------------------------------------------------------------- shape_of


def test_shape_of_reveals_keys_and_types_but_no_values():
    value = {
        "password": "hunter2",
        "count": 42,
        "ratio": 0.5,
        "ok": True,
        "nothing": None,
        "items": ["alpha", "beta", "gamma"],
        "nested": {"token": "sk-live-abcdef"},
    }
    shape = shape_of(value)
    first, count = shape.pop("items")
    assert first == "string[5]"
    assert "3" in count  # the list's length, not its content
    assert shape == {
        "password": "string[7]",
        "count": "number",
        "ratio": "number",
        "ok": "boolean",
        "nothing": "null",
        "nested": {"token": "string[14]"},
    }
    text = repr(shape_of(value))
    for secret in ("hunter2", "42", "0.5", "alpha", "sk-live-abcdef"):
        assert secret not in text


def test_shape_of_an_empty_list_is_an_empty_list():
    assert shape_of({"a": []}) == {"a": []}


def test_shape_of_stops_at_a_bounded_depth():
    deep: dict = {"v": "secret-at-the-bottom"}
    for _ in range(10):
        deep = {"d": deep}
    assert "secret-at-the-bottom" not in repr(shape_of(deep))
    assert "…" in repr(shape_of(deep))


def test_shape_of_caps_the_number_of_keys_and_their_length():
    shape = shape_of({f"k{i}": i for i in range(200)} | {"x" * 500: 1})
    assert len(shape) == 50
    assert all(len(key) <= 64 for key in shape)


# ---------------------------------------------------------------- the schema subset


def test_an_input_schema_must_be_an_object():
    with pytest.raises(SchemaError, match="object"):
        check_input_schema({"type": "string"})


def test_an_input_schema_must_forbid_additional_properties():
    with pytest.raises(SchemaError, match="additional properties"):
        check_input_schema({"type": "object", "properties": {}})
    with pytest.raises(SchemaError, match="additional properties"):
        check_input_schema({"type": "object", "properties": {}, "additionalProperties": True})


def test_a_forbidden_keyword_deep_inside_array_items_is_found():
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "rows": {
                "type": "array",
                "items": {"type": "object", "properties": {"v": {"anyOf": [{}, {}]}}},
            }
        },
    }
    with pytest.raises(SchemaError, match=r"\$\.rows\.items\.v uses anyOf"):
        check_input_schema(schema)


def test_a_forbidden_keyword_inside_additional_properties_is_found():
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"m": {"type": "object", "additionalProperties": {"not": {}}}},
    }
    with pytest.raises(SchemaError, match="not"):
        check_input_schema(schema)


def test_a_connection_id_in_an_output_schema_is_allowed_but_composition_is_not():
    check_output_schema({"type": "object", "properties": {"connectionId": {"type": "string"}}})
    with pytest.raises(SchemaError):
        check_output_schema({"type": "object", "properties": {"x": {"oneOf": [{}, {}]}}})


def test_compiled_params_forbid_extra_keys_and_drop_pydantic_noise():
    class Params(ToolParams):
        query: str = Field(min_length=1, description="What to look for")
        limit: int | None = Field(default=None, ge=1, le=50)

    schema = compile_model(Params)
    assert schema == {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "query": {"type": "string", "minLength": 1, "description": "What to look for"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50},
        },
        "required": ["query"],
    }
    check_input_schema(schema)


def test_a_property_named_title_survives_the_noise_removal():
    class Params(ToolParams):
        title: str

    schema = compile_model(Params)
    assert schema["properties"] == {"title": {"type": "string"}}
    assert schema["required"] == ["title"]
