"""An imported tool's JSON Schema, compiled into the pydantic model the runner validates with.

Only the subset built-in tools may use is supported (apps/tools/schema.py): objects,
arrays, scalars, enums, bounds; local `$defs` references are inlined. Anything else
(oneOf, anyOf, patternProperties, a `connectionId` argument, an unknown type...)
raises SchemaError, and the tool is imported unusable with that reason shown.
Objects are closed: keys the schema does not declare are refused, whatever the
server says about additionalProperties.
"""

from __future__ import annotations

import keyword
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    create_model,
    model_serializer,
)

from apps.tools.contracts import ToolParams
from apps.tools.schema import FORBIDDEN_KEYWORDS, SchemaError, inline_refs

MAX_DEPTH = 8
SCALARS: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool}


class McpParams(ToolParams):
    """Imported arguments: validated by their JSON names; absent optional keys stay absent."""

    model_config = ConfigDict(
        extra="forbid", validate_by_alias=True, validate_by_name=False, serialize_by_alias=True
    )

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        return {key: value for key, value in data.items() if value is not None}


def compile_params(schema: Any, title: str) -> type[McpParams]:
    if not isinstance(schema, dict):
        raise SchemaError("the input schema is not a JSON object")
    defs = schema.get("$defs", {})
    try:
        inlined = inline_refs(schema, defs if isinstance(defs, dict) else {})
    except KeyError as exc:
        raise SchemaError(f"$ref names a definition {exc} that the schema does not have") from None
    except (TypeError, AttributeError):
        raise SchemaError("the schema's definitions are malformed") from None
    if inlined.get("type") != "object":
        raise SchemaError("an input schema must be a JSON object schema")
    model = _object_model(inlined, title, "$", 0)
    return model


def _object_model(node: dict[str, Any], title: str, path: str, depth: int) -> type[McpParams]:
    properties = node.get("properties", {})
    if not isinstance(properties, dict):
        raise SchemaError(f"{path}.properties is not an object")
    required = node.get("required", [])
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        raise SchemaError(f"{path}.required is not a list of names")
    fields: dict[str, Any] = {}
    for index, (name, sub) in enumerate(properties.items()):
        annotation = _annotation(sub, f"{path}.{name}", depth + 1)
        description = sub.get("description") if isinstance(sub, dict) else None
        field_name = name if name.isidentifier() and not keyword.iskeyword(name) else "_"
        field_name = f"p{index}_{field_name.strip('_')}"  # never a BaseModel attribute
        if name in required:
            fields[field_name] = (annotation, Field(alias=name, description=description))
        else:
            fields[field_name] = (
                annotation | None,
                Field(default=None, alias=name, description=description),
            )
    return create_model(title, __base__=McpParams, **fields)


def _annotation(node: Any, path: str, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise SchemaError(f"{path} is nested more than {MAX_DEPTH} levels deep")
    if not isinstance(node, dict):
        if node is True:
            return Any
        raise SchemaError(f"{path} is not a schema object")
    bad = FORBIDDEN_KEYWORDS.intersection(node)
    if bad:
        raise SchemaError(
            f"{path} uses {', '.join(sorted(bad))}, outside the supported schema subset"
        )
    if "enum" in node:
        values = node["enum"]
        if (
            not isinstance(values, list)
            or not values
            or not all(isinstance(value, str | int | float | bool) for value in values)
        ):
            raise SchemaError(f"{path}.enum must list strings, numbers or booleans")
        return Literal[tuple(values)]
    kind = node.get("type")
    if isinstance(kind, list):
        rest = [item for item in kind if item != "null"]
        if len(rest) != 1:
            raise SchemaError(f"{path} has several types {kind}, outside the supported subset")
        kind = rest[0]
    if kind is None:
        return Any  # any JSON value
    if kind in SCALARS:
        return Annotated[SCALARS[kind], _bounds(node, kind)]
    if kind == "array":
        items = node.get("items", True)
        bounds = Field(min_length=node.get("minItems"), max_length=node.get("maxItems"))
        return Annotated[list[_annotation(items, f"{path}[]", depth + 1)], bounds]  # type: ignore[misc]
    if kind == "object":
        if "properties" in node:
            return _object_model(node, f"Obj{abs(hash(path))}", path, depth)
        values = node.get("additionalProperties", True)
        return dict[str, _annotation(values, f"{path}.*", depth + 1)]  # type: ignore[misc]
    raise SchemaError(f"{path} has type {kind!r}, outside the supported subset")


def _bounds(node: dict[str, Any], kind: str) -> Any:
    if kind == "string":
        return Field(
            min_length=node.get("minLength"),
            max_length=node.get("maxLength"),
            pattern=node.get("pattern"),
        )
    if kind in ("integer", "number"):
        return Field(
            ge=node.get("minimum"),
            le=node.get("maximum"),
            gt=node.get("exclusiveMinimum"),
            lt=node.get("exclusiveMaximum"),
        )
    return Field()
