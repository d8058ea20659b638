"""The registry refuses broken contracts at registration, and the catalog mirrors it."""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

from apps.tools.contracts import Redaction, ToolContract, ToolOutput, ToolParams
from apps.tools.models import Source, Tool
from apps.tools.registry import ToolRegistrationError, ToolRegistry, check_contract
from apps.tools.schema import FORBIDDEN_KEYWORDS


class Query(ToolParams):
    text: str = Field(max_length=100)


class Answer(ToolOutput):
    answer: str
    score: float


def answer(params: Query, ctx: Any, caps: Any) -> Answer:
    return Answer(answer=params.text, score=1.0)


def make_contract(**overrides: Any) -> ToolContract:
    fields: dict[str, Any] = {
        "name": "zz_probe",
        "description": "A probe tool used by the registry tests.",
        "params": Query,
        "result": Answer,
        "execute": answer,
        "effect": "read_only",
        "redaction": Redaction(result=("answer",), args=("text",)),
    }
    fields.update(overrides)
    return ToolContract(**fields)


def refusal(contract: ToolContract) -> str:
    with pytest.raises(ToolRegistrationError) as caught:
        ToolRegistry().register(contract)
    return str(caught.value)


def walk(node: Any) -> list[dict[str, Any]]:
    """Every dict inside a JSON-like value."""
    if isinstance(node, dict):
        return [node, *(d for value in node.values() for d in walk(value))]
    if isinstance(node, list):
        return [d for item in node for d in walk(item)]
    return []


# ---------------------------------------------------------------- names and descriptions


@pytest.mark.parametrize(
    "name",
    ["Get_Time", "get-time", "get time", "", "get.time", "héllo", "get__time\n"],
    ids=["uppercase", "hyphen", "space", "empty", "dot", "non-ascii", "newline"],
)
def test_a_name_outside_the_allowed_pattern_is_refused(name):
    message = refusal(make_contract(name=name))
    assert "name must match ^[a-z0-9_]+$ (lower case letters, digits and _" in message


def test_an_id_of_65_characters_is_refused_saying_so():
    name = "x" * (65 - len("core__"))
    message = refusal(make_contract(name=name))
    assert message == (
        f"tool core__{name}: the id is 65 characters; ids are at most 64, namespace included "
        "(^[a-z0-9_]{1,64}$, the OpenAI and Anthropic limit)"
    )


@pytest.mark.parametrize("name", ["a", "x" * 58, "get_current_time2"])
def test_a_name_inside_the_allowed_pattern_is_accepted(name):
    tool_id = ToolRegistry().register(make_contract(name=name)).id
    assert tool_id == f"core__{name}"
    assert re.fullmatch(r"[a-z0-9_]{1,64}", tool_id)


@pytest.mark.parametrize("description", ["", "   ", "d" * 201], ids=["empty", "blank", "201-chars"])
def test_a_description_outside_1_to_200_characters_is_refused(description):
    assert "description" in refusal(make_contract(description=description))


def test_a_description_of_exactly_200_characters_is_accepted():
    ToolRegistry().register(make_contract(description="d" * 200))


# ---------------------------------------------------------------- contract fields


def test_a_tool_without_a_redaction_allowlist_is_refused():
    assert "redaction" in refusal(make_contract(redaction=None))


def test_params_that_do_not_subclass_tool_params_are_refused():
    class LooseParams(BaseModel):  # extra keys would be silently ignored
        text: str

    assert "ToolParams" in refusal(make_contract(params=LooseParams))


def test_params_that_are_not_a_class_are_refused():
    assert "ToolParams" in refusal(make_contract(params={"text": "str"}))


def test_an_unknown_capability_is_refused():
    message = refusal(make_contract(capabilities=("clock", "filesystem")))
    assert "unknown capabilities" in message
    assert "filesystem" in message


def test_known_capabilities_are_accepted():
    ToolRegistry().register(make_contract(capabilities=("clock", "plans")))


@pytest.mark.parametrize(
    "capabilities", [("http",), ("plans",), ("mail",), ("clock", "http")], ids=str
)
def test_a_tool_that_runs_inline_may_not_declare_a_capability_that_waits(capabilities):
    message = refusal(make_contract(runs_inline=True, capabilities=capabilities))
    assert "runs inline, so it may not wait" in message
    assert next(name for name in capabilities if name != "clock") in message


def test_a_tool_that_runs_inline_may_not_require_a_connection():
    message = refusal(make_contract(runs_inline=True, requires_connection=True))
    assert "may not require a connection" in message


def test_a_tool_that_runs_inline_may_read_the_clock():
    ToolRegistry().register(make_contract(runs_inline=True, capabilities=("clock",)))
    ToolRegistry().register(make_contract(runs_inline=True))


@pytest.mark.parametrize("effect", ["destructive", "READ_ONLY", ""])
def test_an_unknown_effect_is_refused(effect):
    assert "effect" in refusal(make_contract(effect=effect))


@pytest.mark.parametrize("level", ["critical", "LOW", ""])
def test_an_unknown_consequence_level_is_refused(level):
    assert "consequence level" in refusal(make_contract(consequence_level=level))


@pytest.mark.parametrize("timeout_s", [0, -1, 601])
def test_a_timeout_outside_0_to_600_seconds_is_refused(timeout_s):
    assert "timeout" in refusal(make_contract(timeout_s=timeout_s))


@pytest.mark.parametrize("namespace", ["my_ns", "acme-crm", "Acme"])
def test_a_namespace_with_an_underscore_a_hyphen_or_upper_case_is_refused(namespace):
    assert "namespace must match ^[a-z0-9]{1,32}$" in refusal(make_contract(namespace=namespace))


def test_the_same_contract_twice_is_an_id_collision():
    registry = ToolRegistry()
    registry.register(make_contract())
    with pytest.raises(ToolRegistrationError, match="collision"):
        registry.register(make_contract())
    assert [tool.id for tool in registry.all()] == ["core__zz_probe"]


def test_a_colliding_contract_never_overwrites_the_first_one():
    registry = ToolRegistry()
    first = registry.register(make_contract())
    with pytest.raises(ToolRegistrationError, match="collision"):
        registry.register(make_contract(description="An impostor with the same id."))
    assert registry.get("core__zz_probe") is first


def test_ids_are_the_namespace_and_name_joined_by_a_double_underscore():
    registry = ToolRegistry()
    assert registry.register(make_contract()).id == "core__zz_probe"
    assert registry.register(make_contract(namespace="acmecrm")).id == "acmecrm__zz_probe"
    assert registry.get("core__zz_probe") is not None
    assert registry.get("zz_probe") is None


# ---------------------------------------------------------------- redaction paths


def test_a_result_redaction_path_naming_no_field_is_refused():
    message = refusal(make_contract(redaction=Redaction(result=("answer", "confidence"), args=())))
    assert "confidence" in message


def test_an_args_redaction_path_naming_no_field_is_refused():
    message = refusal(make_contract(redaction=Redaction(result=(), args=("txt",))))
    assert "txt" in message


def test_a_redaction_path_below_a_scalar_is_refused():
    assert "answer.length" in refusal(
        make_contract(redaction=Redaction(result=("answer.length",), args=()))
    )


def test_an_empty_redaction_path_segment_is_refused():
    refusal(make_contract(redaction=Redaction(result=("answer.",), args=())))


def test_redaction_paths_may_go_through_lists_of_objects():
    class Step(BaseModel):
        title: str
        done: bool

    class Plan(ToolOutput):
        steps: list[Step]

    ToolRegistry().register(
        make_contract(result=Plan, redaction=Redaction(result=("steps.title",), args=()))
    )


# ---------------------------------------------------------------- connectionId


def test_a_top_level_connection_id_argument_is_refused():
    class WithConnection(ToolParams):
        connectionId: str

    message = refusal(make_contract(params=WithConnection, redaction=Redaction(result=(), args=())))
    assert "connectionId" in message


def test_a_nested_connection_id_argument_is_refused():
    class Target(BaseModel):
        url: str
        connectionId: str

    class Nested(ToolParams):
        target: Target

    message = refusal(make_contract(params=Nested, redaction=Redaction(result=(), args=())))
    assert "connectionId" in message


def test_a_connection_id_inside_a_list_of_objects_is_refused():
    class Target(BaseModel):
        connectionId: str

    class Many(ToolParams):
        targets: list[Target]

    assert "connectionId" in refusal(
        make_contract(params=Many, redaction=Redaction(result=(), args=()))
    )


def test_a_result_may_mention_a_connection_id():
    class Out(ToolOutput):
        connectionId: str

    ToolRegistry().register(make_contract(result=Out, redaction=Redaction(result=(), args=())))


# ---------------------------------------------------------------- the schema subset


class UnionParams(ToolParams):
    value: int | str


class Cat(BaseModel):
    kind: Literal["cat"]
    meows: int


class Dog(BaseModel):
    kind: Literal["dog"]
    barks: int


class Discriminated(ToolParams):
    pet: Annotated[Cat | Dog, Field(discriminator="kind")]


class Pattern(ToolParams):
    counts: dict[Annotated[str, Field(pattern="^[a-z]+$")], int]


class TreeNode(BaseModel):
    label: str
    children: list[TreeNode] = []


class Recursive(ToolParams):
    root: TreeNode


def extra(keyword: str, value: Any) -> type[ToolParams]:
    class Extra(ToolParams):
        n: int = Field(json_schema_extra={keyword: value})

    return Extra


@pytest.mark.parametrize(
    ("params", "keyword"),
    [
        (UnionParams, "anyOf"),
        (Discriminated, "oneOf"),
        (extra("allOf", [{"minimum": 0}]), "allOf"),
        (extra("not", {"const": 3}), "not"),
        (extra("if", {"minimum": 10}), "if"),
        (Pattern, "patternProperties"),
    ],
    ids=[
        "anyOf-from-union",
        "oneOf-from-discriminated-union",
        "allOf",
        "not",
        "if",
        "patternProperties",
    ],
)
def test_input_schemas_outside_the_subset_are_refused(params, keyword):
    assert keyword in refusal(make_contract(params=params, redaction=Redaction(result=(), args=())))


def test_a_recursive_model_is_refused():
    message = refusal(make_contract(params=Recursive, redaction=Redaction(result=(), args=())))
    assert "recursive" in message


def test_an_output_schema_outside_the_subset_is_refused_too():
    class UnionOut(ToolOutput):
        value: int | str

    assert "anyOf" in refusal(
        make_contract(result=UnionOut, redaction=Redaction(result=(), args=()))
    )


def test_every_forbidden_keyword_is_refused_when_present():
    for keyword in sorted(FORBIDDEN_KEYWORDS - {"$ref", "$dynamicRef"}):
        message = refusal(
            make_contract(params=extra(keyword, {}), redaction=Redaction(result=(), args=()))
        )
        assert keyword in message, keyword


def test_an_external_reference_is_refused():
    message = refusal(
        make_contract(
            params=extra("$ref", "https://example.com/schema.json"),
            redaction=Redaction(result=(), args=()),
        )
    )
    assert "$ref" in message


def test_an_optional_field_compiles_to_a_plain_not_required_property():
    class Optional_(ToolParams):
        timezone: str | None = Field(default=None, max_length=64, description="IANA zone")
        count: int

    tool = ToolRegistry().register(
        make_contract(params=Optional_, redaction=Redaction(result=(), args=("timezone",)))
    )
    schema = tool.input_schema
    assert schema["properties"]["timezone"] == {
        "type": "string",
        "maxLength": 64,
        "description": "IANA zone",
    }
    assert schema["required"] == ["count"]
    assert schema["additionalProperties"] is False
    for node in walk(schema):
        assert "anyOf" not in node
        assert "title" not in node
        assert node.get("default", "absent") is not None


def test_nested_models_are_inlined_without_references():
    class Address(ToolParams):
        city: str
        zip_code: str | None = None

    class Person(ToolParams):
        home: Address
        previous: list[Address] = Field(default_factory=list)

    tool = ToolRegistry().register(
        make_contract(params=Person, redaction=Redaction(result=(), args=("home.city",)))
    )
    schema = tool.input_schema
    assert "$defs" not in schema
    for node in walk(schema):
        assert "$ref" not in node
    assert schema["properties"]["home"]["properties"]["city"] == {"type": "string"}
    assert schema["properties"]["previous"]["items"]["required"] == ["city"]


def test_the_schema_hash_changes_when_the_input_schema_changes():
    class Longer(ToolParams):
        text: str = Field(max_length=200)

    first = check_contract(make_contract())
    again = check_contract(make_contract())
    changed = check_contract(make_contract(params=Longer))
    assert first.schema_hash == again.schema_hash
    assert len(first.schema_hash) == 16
    assert changed.schema_hash != first.schema_hash


# ---------------------------------------------------------------- syncing into the catalog


def registry_of(*contracts: ToolContract) -> ToolRegistry:
    registry = ToolRegistry()
    for contract in contracts:
        registry.register(contract)
    return registry


@pytest.mark.django_db
def test_syncing_creates_a_row_with_every_contract_field():
    contract = make_contract(
        effect="external_side_effect",
        consequence_level="high",
        requires_confirmation=False,
        tags=("search", "web"),
        version="3",
        requires_connection=True,
    )
    registered = check_contract(contract)
    Tool.objects.sync_registry(registry_of(contract))

    tool = Tool.objects.get(pk="core__zz_probe")
    assert tool.name == "zz_probe"
    assert tool.description == contract.description
    assert tool.input_schema == registered.input_schema
    assert tool.output_schema == registered.output_schema
    assert tool.schema_hash == registered.schema_hash
    assert tool.effect == "external_side_effect"
    assert tool.consequence_level == "high"
    assert tool.requires_confirmation is False  # never inferred from the effect
    assert tool.requires_connection is True
    assert tool.timeout_ms == 15000
    assert tool.redaction_result == ["answer"]
    assert tool.redaction_args == ["text"]
    assert tool.tags == ["search", "web"]
    assert tool.version == "3"
    assert tool.source == Source.CORE
    assert tool.enabled is True
    assert tool.available is True


@pytest.mark.django_db
def test_requires_confirmation_is_stored_as_its_own_flag():
    Tool.objects.sync_registry(
        registry_of(
            make_contract(name="zz_confirm", effect="read_only", requires_confirmation=True),
            make_contract(name="zz_free", effect="external_side_effect"),
        )
    )
    assert Tool.objects.get(pk="core__zz_confirm").requires_confirmation is True
    assert Tool.objects.get(pk="core__zz_free").requires_confirmation is False


@pytest.mark.django_db
def test_a_custom_timeout_is_stored_in_milliseconds():
    Tool.objects.sync_registry(registry_of(make_contract(timeout_s=2.5)))
    assert Tool.objects.get(pk="core__zz_probe").timeout_ms == 2500


@pytest.mark.django_db
def test_resyncing_keeps_a_tool_that_staff_disabled_disabled():
    registry = registry_of(make_contract())
    Tool.objects.sync_registry(registry)
    Tool.objects.filter(pk="core__zz_probe").update(enabled=False)

    Tool.objects.sync_registry(registry)
    tool = Tool.objects.get(pk="core__zz_probe")
    assert tool.enabled is False
    assert tool.available is True


@pytest.mark.django_db
def test_resyncing_updates_a_changed_contract():
    Tool.objects.sync_registry(registry_of(make_contract()))
    Tool.objects.sync_registry(
        registry_of(make_contract(description="Now it does more.", version="2"))
    )
    tool = Tool.objects.get(pk="core__zz_probe")
    assert (tool.description, tool.version) == ("Now it does more.", "2")


@pytest.mark.django_db
def test_a_core_tool_no_longer_in_the_registry_becomes_unavailable():
    Tool.objects.sync_registry(registry_of(make_contract(), make_contract(name="zz_gone")))
    Tool.objects.sync_registry(registry_of(make_contract()))

    gone = Tool.objects.get(pk="core__zz_gone")
    assert gone.available is False
    assert Tool.objects.get(pk="core__zz_probe").available is True
    assert not Tool.objects.usable().filter(pk="core__zz_gone").exists()


@pytest.mark.django_db
def test_a_tool_that_comes_back_becomes_available_again():
    Tool.objects.sync_registry(registry_of(make_contract()))
    Tool.objects.sync_registry(registry_of())
    assert Tool.objects.get(pk="core__zz_probe").available is False
    Tool.objects.sync_registry(registry_of(make_contract()))
    assert Tool.objects.get(pk="core__zz_probe").available is True


@pytest.mark.django_db
def test_syncing_refuses_to_overwrite_an_mcp_tool_with_the_same_id():
    Tool.objects.create(
        id="core__zz_probe",
        name="zz_probe",
        description="Discovered on an MCP server.",
        input_schema={"type": "object"},
        schema_hash="0" * 16,
        effect="read_only",
        consequence_level="low",
        source=Source.MCP,
    )
    with pytest.raises(ToolRegistrationError, match="collision"):
        Tool.objects.sync_registry(registry_of(make_contract()))
    tool = Tool.objects.get(pk="core__zz_probe")
    assert tool.source == Source.MCP
    assert tool.description == "Discovered on an MCP server."


@pytest.mark.django_db
def test_syncing_does_not_touch_mcp_tools_missing_from_the_registry():
    Tool.objects.create(
        id="mcp__files__read",
        name="read",
        description="Discovered on an MCP server.",
        input_schema={"type": "object"},
        schema_hash="0" * 16,
        effect="read_only",
        consequence_level="low",
        source=Source.MCP,
    )
    Tool.objects.sync_registry(registry_of(make_contract()))
    assert Tool.objects.get(pk="mcp__files__read").available is True


# ---------------------------------------------------------------- built-in tools

BUILTIN_EFFECTS = {
    "core__get_current_time": "read_only",
    "core__planning_setup_plan": "state_change",
    "core__planning_add_step": "state_change",
    "core__planning_update_step": "state_change",
    "core__planning_read_plan": "read_only",
}


@pytest.mark.django_db
def test_the_built_in_tools_are_in_the_catalog_after_migrate():
    rows = {tool.id: tool for tool in Tool.objects.filter(pk__in=BUILTIN_EFFECTS)}
    assert set(rows) == set(BUILTIN_EFFECTS)
    for tool_id, effect in BUILTIN_EFFECTS.items():
        tool = rows[tool_id]
        assert tool.effect == effect, tool_id
        assert tool.source == Source.CORE
        assert tool.usable, tool_id
        assert tool.redaction_result, tool_id


def test_the_global_registry_holds_the_built_in_contracts():
    from apps.tools.registry import registry

    for tool_id, effect in BUILTIN_EFFECTS.items():
        registered = registry.get(tool_id)
        assert registered is not None, tool_id
        assert registered.contract.effect == effect
        assert registered.contract.redaction is not None


def test_contracts_are_immutable():
    contract = make_contract()
    with pytest.raises(dataclasses.FrozenInstanceError):
        contract.name = "other"


def test_a_nested_model_that_ignores_extra_keys_is_refused():
    class Loose(BaseModel):  # a plain BaseModel silently drops unknown keys
        city: str

    class Person(ToolParams):
        home: Loose

    with pytest.raises(ToolRegistrationError, match="additional properties"):
        ToolRegistry().register(
            make_contract(params=Person, redaction=Redaction(result=(), args=()))
        )


# ---------------------------------------------------------------- dependsOn (seed 001)


def test_depends_on_naming_a_tool_not_registered_is_refused_naming_it():
    registry = registry_of(make_contract(depends_on=("core__zz_missing",)))
    with pytest.raises(ToolRegistrationError) as caught:
        registry.check_dependencies()
    assert str(caught.value) == (
        "tool core__zz_probe: dependsOn names core__zz_missing, which is not registered"
    )


@pytest.mark.parametrize(
    ("depends_on", "reason"),
    [
        (("core__zz_probe",), "dependsOn names the tool itself"),
        (("Core__Other",), "dependsOn names 'Core__Other', which is no tool id"),
        (("core__a", "core__a"), "dependsOn names a tool twice"),
    ],
    ids=["itself", "not-an-id", "twice"],
)
def test_depends_on_must_name_other_tools_by_valid_ids(depends_on, reason):
    assert reason in refusal(make_contract(depends_on=depends_on))


@pytest.mark.django_db
def test_depends_on_may_name_a_tool_registered_after_it_and_is_stored():
    registry = ToolRegistry()
    registry.register(make_contract(depends_on=("core__zz_helper",)))
    registry.register(make_contract(name="zz_helper"))
    Tool.objects.sync_registry(registry)
    assert Tool.objects.get(pk="core__zz_probe").depends_on == ["core__zz_helper"]
    assert Tool.objects.get(pk="core__zz_helper").depends_on == []


@pytest.mark.django_db
def test_syncing_a_registry_with_a_missing_dependency_changes_nothing():
    with pytest.raises(ToolRegistrationError, match="core__zz_missing"):
        Tool.objects.sync_registry(registry_of(make_contract(depends_on=("core__zz_missing",))))
    assert not Tool.objects.filter(pk="core__zz_probe").exists()
