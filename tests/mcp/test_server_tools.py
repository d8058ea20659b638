"""The MCP shape of the catalog: annotations from the effect, and cursor pages."""

from __future__ import annotations

import pytest

from apps.mcp.server import tools
from apps.policies.policy import Catalog, Decision
from apps.tools.models import Tool

ALLOWED = Decision("allow", "policy:1:test", "Allowed.")


def tool(tool_id: str, effect: str = "read_only", consequence: str = "low") -> Tool:
    return Tool(
        id=tool_id,
        name=tool_id.title(),
        description="d",
        input_schema={"type": "object"},
        effect=effect,
        consequence_level=consequence,
    )


@pytest.mark.parametrize(
    ("effect", "consequence", "read_only", "destructive", "open_world"),
    [
        ("read_only", "high", True, False, False),
        ("state_change", "low", False, False, False),
        ("state_change", "medium", False, True, False),
        ("external_side_effect", "low", False, False, True),
        ("external_side_effect", "high", False, True, True),
    ],
)
def test_it_derives_the_hints_from_effect_and_consequence(
    effect, consequence, read_only, destructive, open_world
):
    hints = tools.hints(tool("a", effect, consequence))
    assert hints["readOnlyHint"] is read_only
    assert hints["destructiveHint"] is destructive
    assert hints["openWorldHint"] is open_world
    assert hints["idempotentHint"] is read_only
    assert hints["title"] == "A"


@pytest.mark.parametrize("kind", [list, Catalog])
def test_pages_continue_after_the_last_id_even_when_the_catalog_changes_between_pages(kind):
    catalog = kind([(tool(i), ALLOWED) for i in ("a", "b", "c", "d", "e")])
    first, cursor = tools.page(catalog, None, 2)
    assert [t["name"] for t in first] == ["a", "b"] and cursor is not None
    shrunk = kind([entry for entry in catalog if entry[0].id != "a"])  # "a" removed meanwhile
    second, cursor = tools.page(shrunk, cursor, 2)
    assert [t["name"] for t in second] == ["c", "d"]
    last, cursor = tools.page(shrunk, cursor, 2)
    assert [t["name"] for t in last] == ["e"] and cursor is None


@pytest.mark.parametrize("cursor", ["not base64!", "bm9wZQ==", ""])
def test_it_refuses_a_cursor_it_did_not_hand_out(cursor):
    with pytest.raises(tools.BadCursor):
        tools.page([(tool("a"), ALLOWED)], cursor, 2)


def test_an_imported_tool_shows_its_servers_title_and_hints_and_the_specs_defaults():
    imported = tool("mcp__s__t", "external_side_effect", "medium")
    declared = {"title": "Look around", "readOnlyHint": True, "openWorldHint": False}
    entry = tools.mcp_tool(imported, ALLOWED, declared)
    assert entry["title"] == "Look around"
    assert entry["annotations"] == {
        "title": "Look around",
        "readOnlyHint": True,
        "destructiveHint": True,
        "idempotentHint": False,
        "openWorldHint": False,
    }
    assert entry["_meta"]["toolhub/effect"] == "external_side_effect"
    bare = tools.mcp_tool(imported, ALLOWED, {})
    assert bare["title"] == "Mcp__S__T"
    assert bare["annotations"]["openWorldHint"] is True


def test_a_built_in_tool_keeps_the_hints_of_its_effect():
    entry = tools.mcp_tool(tool("a", "read_only"), ALLOWED)
    assert entry["annotations"] == tools.hints(tool("a", "read_only"))


def test_a_catalog_in_the_databases_collation_order_pages_as_a_list_does():
    """A catalog is in the database's id order, which a collation may make differ from
    Python's (underscores ignored): a cursor page is still "the ids after this one"."""
    ids = ["a_c", "ab", "a_d", "b", "b_a"]  # not ascending as Python compares them
    catalog = Catalog([(tool(i), ALLOWED) for i in ids])
    assert not catalog.in_id_order
    for after in ids:
        cursor = tools._encode(after)
        assert tools.page(catalog, cursor, 2) == tools.page(list(catalog), cursor, 2)
    ordered = Catalog([(tool(i), ALLOWED) for i in sorted(ids)])
    assert ordered.in_id_order
    for after in ids:
        cursor = tools._encode(after)
        assert tools.page(ordered, cursor, 2) == tools.page(list(ordered), cursor, 2)
