"""Migration tools 0003: ids outside `^[a-z0-9_]{1,64}$` get valid ones, and whatever names
a tool follows it, run from the state before it on rows made then."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from guardian.models import UserObjectPermission

from apps.invocations.models import InvocationRecord
from apps.policies.models import Policy, PolicyRule
from apps.tools.models import Tool

pytestmark = pytest.mark.django_db(transaction=True)

HYPHENS = "acme-crm__Look-Up"
LONG = "core__" + "x" * 70
FINE = "core__fine"


@pytest.fixture
def before() -> Iterator[Any]:
    """The apps as of tools 0002 (before 0003); the test's end migrates everything forward again."""
    executor = MigrationExecutor(connection)
    target = [("tools", "0002_result_cache")]
    executor.migrate(target)
    leaves = [n for n in executor.loader.graph.leaf_nodes() if n[0] not in ("tools",)]
    yield executor.loader.project_state(target + leaves).apps
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


def forward() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def test_invalid_ids_are_renamed_and_everything_naming_them_follows(before):
    old = before
    OldTool = old.get_model("tools", "Tool")
    for tool_id in (HYPHENS, LONG, FINE):
        OldTool.objects.create(
            id=tool_id,
            name=tool_id.split("__")[1][:64],
            description="d",
            input_schema={},
            schema_hash="h",
            effect="read_only",
            consequence_level="low",
        )
    tenant = old.get_model("tenants", "Tenant").objects.create(slug="acme", name="Acme")
    policy = old.get_model("policies", "Policy").objects.create(
        tenant=tenant, name="p", tool_patterns=f"{HYPHENS}\ncore__*"
    )
    policy.tools.add(OldTool.objects.get(pk=HYPHENS), OldTool.objects.get(pk=FINE))
    old.get_model("policies", "PolicyRule").objects.create(
        policy=policy, tool_pattern=LONG, condition="true", outcome="deny"
    )
    old.get_model("invocations", "InvocationRecord").objects.create(
        tenant=tenant,
        tool_id=HYPHENS,
        tool_ref=HYPHENS,
        tool_call_id="c1",
        run_id="r1",
        principal="agent:x",
        status="succeeded",
    )
    user = old.get_model("auth", "User").objects.create(username="ada")
    kind = old.get_model("contenttypes", "ContentType").objects.get(app_label="tools", model="tool")
    execute = old.get_model("auth", "Permission").objects.get(
        content_type=kind, codename="execute_tool"
    )
    old.get_model("guardian", "UserObjectPermission").objects.create(
        user=user, permission=execute, content_type=kind, object_pk=LONG
    )

    forward()

    digest = hashlib.sha256(LONG.encode()).hexdigest()[:8]
    renamed_long = "core__" + "x" * (64 - 9 - 6) + "_" + digest
    ids = set(Tool.objects.values_list("pk", flat=True))
    assert {"acmecrm__look_up", FINE, renamed_long} <= ids
    assert not ids & {HYPHENS, LONG}
    assert len(renamed_long) == 64
    policy = Policy.objects.get()
    assert sorted(policy.tools.values_list("pk", flat=True)) == ["acmecrm__look_up", FINE]
    assert policy.tool_patterns == "acmecrm__look_up\ncore__*"
    assert PolicyRule.objects.get().tool_pattern == renamed_long
    record = InvocationRecord.objects.get()
    assert record.tool_id == "acmecrm__look_up"
    assert record.tool_ref == HYPHENS  # the id as it was requested, kept
    assert UserObjectPermission.objects.get().object_pk == renamed_long
