"""Allowlist redaction (REDACTION_REQUIRED): whatever is not listed is dropped."""

from __future__ import annotations

from typing import Any

# name -> subtree to descend into, or None to keep the whole value below it.
PathTree = dict[str, "PathTree | None"]


class RedactionError(ValueError):
    pass


def build_tree(paths: tuple[str, ...] | list[str]) -> PathTree:
    tree: PathTree = {}
    for path in paths:
        parts = path.split(".")
        if not path or any(not part for part in parts):
            raise RedactionError(f"bad redaction path {path!r}")
        node: PathTree | None = tree
        for part in parts[:-1]:
            assert node is not None
            if part in node and node[part] is None:
                node = None  # an ancestor already keeps the whole subtree
                break
            node = node.setdefault(part, {})
        if node is not None:
            node[parts[-1]] = None
    return tree


def redact(value: Any, tree: PathTree | None) -> Any:
    """Keep only the allowlisted fields of `value` (lists are traversed)."""
    if tree is None:
        return value
    if isinstance(value, list):
        return [redact(item, tree) for item in value]
    if isinstance(value, dict):
        return {key: redact(item, tree[key]) for key, item in value.items() if key in tree}
    return None  # a scalar where the allowlist expected an object: keep nothing


def check_paths(paths: tuple[str, ...], schema: dict[str, Any], what: str) -> None:
    """Every allowlisted path must name a field the schema declares."""
    for path in paths:
        node = schema
        for part in path.split("."):
            while node.get("type") == "array" and isinstance(node.get("items"), dict):
                node = node["items"]
            properties = node.get("properties")
            if not isinstance(properties, dict) or part not in properties:
                raise RedactionError(f"{what} redaction path {path!r} names no field of the schema")
            node = properties[part]


def shape_of(value: Any, depth: int = 0) -> Any:
    """The structure of a value without its content, for logs and refused calls."""
    if depth > 4:
        return "…"
    if isinstance(value, dict):
        return {str(key)[:64]: shape_of(item, depth + 1) for key, item in list(value.items())[:50]}
    if isinstance(value, list):
        return [shape_of(value[0], depth + 1), f"x{len(value)}"] if value else []
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if value is None:
        return "null"
    return f"string[{len(value)}]" if isinstance(value, str) else type(value).__name__
