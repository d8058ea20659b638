"""GET /api/v1/tools/: the policy-filtered catalog, in toolhub, OpenAI and Anthropic shapes."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from apps.policies.models import Policy
from apps.tools.models import Tool
from apps.tools.registry import registry
from tests.conftest import CORE_TOOLS, allow

pytestmark = pytest.mark.django_db

TOOL_SPEC_KEYS = {
    "id",
    "name",
    "description",
    "inputSchema",
    "effect",
    "consequenceLevel",
    "requiresConfirmation",
    "requiresApproval",
    "requiresConnection",
    "timeoutMs",
    "tags",
    "dependsOn",
    "version",
    "schemaHash",
}


def listed(response) -> list[str]:
    assert response.status_code == 200, response.content
    tools = response.json()["tools"]
    return [
        tool["id"] if "id" in tool else tool.get("name") or tool["function"]["name"]
        for tool in tools
    ]


def test_the_catalog_lists_every_tool_the_policy_allows(agent):
    response = agent.tools()
    assert listed(response) == sorted(CORE_TOOLS)
    assert "notice" not in response.json()


def test_a_tool_spec_has_exactly_the_documented_keys(agent):
    for spec in agent.tools().json()["tools"]:
        assert set(spec) == TOOL_SPEC_KEYS, spec["id"]


def test_a_tool_spec_describes_the_tool_as_registered(agent):
    specs = {spec["id"]: spec for spec in agent.tools().json()["tools"]}
    clock = specs["core__get_current_time"]
    registered = registry.get("core__get_current_time")
    assert registered is not None
    assert clock == {
        "id": "core__get_current_time",
        "name": "get_current_time",
        "description": registered.contract.description,
        "inputSchema": registered.input_schema,
        "effect": "read_only",
        "consequenceLevel": "low",
        "requiresConfirmation": False,
        "requiresApproval": False,
        "requiresConnection": False,
        "timeoutMs": 15000,
        "tags": ["time"],
        "dependsOn": [],
        "version": "1",
        "schemaHash": registered.schema_hash,
    }
    assert specs["core__planning_setup_plan"]["effect"] == "state_change"


def test_the_toolhub_format_is_the_default_shape(agent):
    assert agent.tools(format="toolhub").json() == agent.tools().json()


def test_the_openai_format_has_exactly_type_and_function(agent):
    response = agent.tools(format="openai")
    tools = response.json()["tools"]
    assert [tool["function"]["name"] for tool in tools] == sorted(CORE_TOOLS)
    for tool in tools:
        assert set(tool) == {"type", "function"}
        assert tool["type"] == "function"
        assert set(tool["function"]) == {"name", "description", "parameters"}
    clock = next(t for t in tools if t["function"]["name"] == "core__get_current_time")
    registered = registry.get("core__get_current_time")
    assert registered is not None
    assert clock["function"]["parameters"] == registered.input_schema
    assert clock["function"]["description"] == registered.contract.description


def test_the_anthropic_format_has_exactly_name_description_and_input_schema(agent):
    tools = agent.tools(format="anthropic").json()["tools"]
    assert [tool["name"] for tool in tools] == sorted(CORE_TOOLS)
    for tool in tools:
        assert set(tool) == {"name", "description", "input_schema"}
    clock = next(t for t in tools if t["name"] == "core__get_current_time")
    registered = registry.get("core__get_current_time")
    assert registered is not None
    assert clock["input_schema"] == registered.input_schema


def test_the_body_has_only_tools_when_some_are_listed(agent):
    for wire_format in ("toolhub", "openai", "anthropic"):
        assert set(agent.tools(format=wire_format).json()) == {"tools"}


@pytest.mark.parametrize("wire_format", ["mcp", "OPENAI", "json", "xml"])
def test_an_unknown_format_is_a_400_naming_the_field(agent, wire_format):
    response = agent.tools(format=wire_format)
    assert response.status_code == 400
    body = response.json()
    assert [error["field"] for error in body["errors"]] == ["format"]


def test_a_disabled_tool_never_appears(agent):
    Tool.objects.filter(pk="core__planning_add_step").update(enabled=False)
    for wire_format in ("toolhub", "openai", "anthropic"):
        ids = listed(agent.tools(format=wire_format))
        assert "core__planning_add_step" not in ids
        assert "core__get_current_time" in ids


def test_a_tool_no_longer_provided_never_appears(agent):
    Tool.objects.filter(pk="core__planning_read_plan").update(available=False)
    assert "core__planning_read_plan" not in listed(agent.tools())


def test_tools_missing_from_the_policy_never_appear(bare_agent):
    allow(bare_agent.tenant, "core__get_current_time")
    assert listed(bare_agent.tools()) == ["core__get_current_time"]
    assert listed(bare_agent.tools(format="openai")) == ["core__get_current_time"]
    assert listed(bare_agent.tools(format="anthropic")) == ["core__get_current_time"]


def test_a_tenant_with_no_policy_gets_an_empty_list_and_a_notice(bare_agent):
    for wire_format in ("toolhub", "openai", "anthropic"):
        body = bare_agent.tools(format=wire_format).json()
        assert body["tools"] == []
        notice = body["notice"]
        assert "policy" in notice
        assert bare_agent.tenant.slug in notice


def test_another_tenants_policy_does_not_leak_into_the_catalog(bare_agent, stranger):
    allow(bare_agent.tenant, "core__get_current_time")
    assert len(listed(stranger.tools())) == len(CORE_TOOLS)
    assert listed(bare_agent.tools()) == ["core__get_current_time"]


def test_a_tenant_without_policy_sees_nothing_even_when_others_allow_everything(
    bare_agent, stranger, agent
):
    body = bare_agent.tools().json()
    assert body["tools"] == []
    assert "notice" in body


def test_a_disabled_policy_allows_nothing(agent):
    Policy.objects.filter(tenant=agent.tenant).update(enabled=False)
    body = agent.tools().json()
    assert body["tools"] == []
    assert "notice" in body


def test_two_policies_listing_the_same_tool_list_it_once(bare_agent):
    allow(bare_agent.tenant, "core__get_current_time", name="first")
    allow(bare_agent.tenant, "core__get_current_time", "core__planning_read_plan", name="second")
    assert listed(bare_agent.tools()) == ["core__get_current_time", "core__planning_read_plan"]


def test_a_disabled_policy_does_not_hide_what_an_enabled_one_allows(bare_agent):
    off = allow(bare_agent.tenant, "core__planning_read_plan", name="off")
    off.enabled = False
    off.save()
    allow(bare_agent.tenant, "core__get_current_time", name="on")
    assert listed(bare_agent.tools()) == ["core__get_current_time"]


def test_an_unauthenticated_request_is_a_401():
    response = APIClient().get("/api/v1/tools/")
    assert response.status_code == 401
    assert "Bearer" in response["WWW-Authenticate"]


def test_a_wrong_api_key_is_a_401(agent):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {agent.key}x")
    assert client.get("/api/v1/tools/").status_code == 401


def test_a_revoked_api_key_is_a_401(agent):
    agent.tenant.api_keys.get().revoke()
    assert agent.tools().status_code == 401


def test_a_tool_that_requires_confirmation_is_listed_as_requiring_approval(agent, test_tools):
    allow(agent.tenant, "test__confirm")
    specs = {spec["id"]: spec for spec in agent.tools().json()["tools"]}
    confirm = specs["test__confirm"]
    assert confirm["requiresConfirmation"] is True
    assert confirm["requiresApproval"] is True
    assert confirm["effect"] == "external_side_effect"
    assert specs["core__get_current_time"]["requiresApproval"] is False


def test_an_external_side_effect_alone_does_not_imply_approval(agent, test_tools):
    Tool.objects.filter(pk="test__echo").update(
        effect="external_side_effect", consequence_level="high"
    )
    allow(agent.tenant, "test__echo")
    specs = {spec["id"]: spec for spec in agent.tools().json()["tools"]}
    echo = specs["test__echo"]
    assert (echo["effect"], echo["consequenceLevel"]) == ("external_side_effect", "high")
    assert echo["requiresConfirmation"] is False
    assert echo["requiresApproval"] is False


@pytest.fixture
def dependent(agent):
    """A registered tool that calls core__get_current_time internally, allowed for agent."""
    from tests.tools.test_registry import make_contract

    contract = make_contract(name="zz_dependent", depends_on=("core__get_current_time",))
    registry.register(contract)
    Tool.objects.sync_registry(registry)
    allow(agent.tenant, contract.id)
    yield contract.id
    registry.unregister(contract.id)
    Tool.objects.sync_registry(registry)


def test_depends_on_is_shown_in_the_catalog_and_in_mcp_tools_list(agent, dependent):
    from apps.mcp.server.tools import mcp_tool
    from apps.policies.policy import catalog
    from apps.tenants.principals import existing_service_user

    specs = {spec["id"]: spec for spec in agent.tools().json()["tools"]}
    assert specs[dependent]["dependsOn"] == ["core__get_current_time"]
    assert specs["core__get_current_time"]["dependsOn"] == []
    user = existing_service_user(agent.tenant, agent.principal)
    allowed = dict(catalog(agent.tenant, agent.principal, user))
    tool = next(t for t in allowed if t.pk == dependent)
    assert mcp_tool(tool, allowed[tool])["_meta"]["toolhub/dependsOn"] == ["core__get_current_time"]
