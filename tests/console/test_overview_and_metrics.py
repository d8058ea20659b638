"""Issue 12 item 6: the overview's numbers (tenant-scoped) and GET /metrics (Prometheus)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from apps.approvals import decisions
from apps.invocations import stats
from apps.invocations.models import InvocationRecord
from apps.tenants.models import Tenant
from tests.approvals.support import CONFIRM, ECHO, hold
from toolhub.ops.metrics import open_streams

pytestmark = pytest.mark.django_db(transaction=True)

DENIED = "test__crash"  # registered, in no policy of either tenant
TOKEN = "metrics-token-0123456789abcdefghijklmnop"


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def superuser() -> User:
    return User.objects.create_superuser("root", "root@example.com", "pw-root-12345")


def scrape(client: Client | None = None, token: str = "") -> dict[str, list]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = (client or Client()).get("/metrics", headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return {
        family.name: family.samples
        for family in text_string_to_metric_families(response.content.decode())
    }


def value(samples: list, name: str, **labels: str) -> float:
    found = [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]
    assert len(found) == 1, (name, labels, samples)
    return found[0]


# ---------------------------------------------------------------- the overview's data


def test_the_overview_counts_calls_per_minute_by_status(caller, console):
    # The calls and the read must fall in one minute for "the last point" to hold: start
    # clear of a minute's end.
    now = timezone.now()
    second = now.second + now.microsecond / 1e6
    if second > 50:
        time.sleep(60.2 - second)
    caller.invoke(ECHO, args={"text": "a"})
    caller.invoke(ECHO, args={"text": "b"})
    hold(caller, CONFIRM)

    data = console.get("/console/overview/data/").json()

    series = {s["label"]: s["data"] for s in data["callsPerMinute"]}
    assert sum(series["succeeded"]) == 2
    assert sum(series["pending_approval"]) == 1
    assert len(data["minutes"]) == data["windowMinutes"] == 30
    assert all(len(points) == 30 for points in series.values())
    assert series["succeeded"][-1] == 2  # this minute is the last point


def test_the_overview_gives_p50_and_p99_latency_per_tool(caller, console):
    for ms in (10, 20, 30, 40, 1000):
        record = InvocationRecord.objects.get(
            pk=caller.invoke(ECHO, args={"text": "x"}).json()["invocationId"]
        )
        InvocationRecord.objects.filter(pk=record.pk).update(duration_ms=ms)

    data = console.get("/console/overview/data/").json()

    # From the histogram: the upper bound of the bucket holding the call of that rank.
    echo = next(row for row in data["latencyByTool"] if row["tool"] == ECHO)
    assert (echo["calls"], echo["p50Ms"], echo["p99Ms"]) == (5, 50, 1000)


def test_a_call_naming_no_tool_is_not_a_tool_in_the_latency_chart(caller, console):
    assert caller.invoke(ECHO, args={"text": "x"}).status_code == 200
    unknown = caller.invoke("no__such_tool", args={})
    assert unknown.json()["errorCode"] == "unavailable", unknown.content  # recorded

    data = console.get("/console/overview/data/").json()

    assert [row["tool"] for row in data["latencyByTool"]] == [ECHO]
    per_minute = sum(sum(series["data"]) for series in data["callsPerMinute"])
    assert per_minute == 2  # it still counts as a call


def test_nearest_rank_percentiles_are_real_durations():
    assert stats.percentile([5], 99) == 5
    assert stats.percentile(list(range(1, 101)), 50) == 50
    assert stats.percentile(list(range(1, 101)), 99) == 99


def test_the_overview_tracks_pending_approvals_over_time(caller, operator, console):
    hold(caller, CONFIRM)
    _, second = hold(caller, CONFIRM)
    decisions.decide(second.pk, operator, "reject", "no")

    data = console.get("/console/overview/data/").json()

    assert data["pendingNow"] == 1
    assert data["pendingOverTime"][-1] == 1
    assert data["pendingOverTime"][0] == 0


def test_pending_over_time_counts_an_approval_until_its_decision():
    tenant = Tenant.objects.create(slug="t", name="T")
    start = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=3)
    slots = [start + timedelta(minutes=i) for i in range(3)]
    assert stats.pending_over_time(Tenant.objects.filter(pk=tenant.pk), slots) == [0, 0, 0]


def test_the_overview_ranks_denied_tools_and_principals(caller, console):
    for _ in range(3):
        caller.invoke(DENIED, args={})
    caller.invoke(ECHO, args={"text": "fine"})

    data = console.get("/console/overview/data/").json()

    assert data["topDeniedTools"][0] == {"name": DENIED, "count": 3}
    assert data["topDeniedPrincipals"][0] == {"name": "agent:test", "count": 3}


def test_the_overview_shows_only_the_staff_members_tenants(caller, other, console):
    other.invoke(ECHO, args={"text": "theirs"})
    other.invoke(DENIED, args={})

    data = console.get("/console/overview/data/").json()

    assert data["callsPerMinute"] == []
    assert data["topDeniedPrincipals"] == []


def test_a_superuser_overview_covers_every_tenant(caller, other):
    caller.invoke(ECHO, args={"text": "a"})
    other.invoke(ECHO, args={"text": "b"})

    data = logged_in(superuser()).get("/console/overview/data/").json()

    assert sum(next(s for s in data["callsPerMinute"] if s["label"] == "succeeded")["data"]) == 2


def test_the_overview_needs_a_staff_login(caller):
    assert Client().get("/console/overview/data/").status_code == 302
    assert Client().get("/console/overview/").status_code == 302


def test_the_overview_page_loads_the_vendored_chart_library_not_a_cdn(console):
    page = console.get("/console/overview/").content.decode()

    assert '<script src="/static/vendor/chartjs/chart.umd.min.js">' in page
    assert "https://" not in page
    for canvas in ("calls", "latency", "pending", "denied-tools", "denied-principals"):
        assert f'id="chart-{canvas}"' in page


# ---------------------------------------------------------------- /metrics


def test_metrics_without_credentials_is_401(caller):
    response = Client().get("/metrics")

    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_refused_scrape_says_how_to_authenticate_without_naming_the_setting(caller):
    body = Client().get("/metrics").content.decode()

    assert "Authorization: Bearer <token>" in body
    assert "TOOLHUB_" not in body


@override_settings(TOOLHUB_METRICS_TOKEN=TOKEN)
def test_metrics_with_a_wrong_token_is_401(caller):
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}x").status_code == 401


def test_metrics_are_refused_to_staff_who_are_not_superusers(operator):
    assert logged_in(operator).get("/metrics").status_code == 401


def test_metrics_are_refused_to_an_api_key(caller):
    assert Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {caller.key}").status_code == 401


@override_settings(TOOLHUB_METRICS_TOKEN=TOKEN)
def test_metrics_count_calls_by_tool_and_status_from_the_database(caller, other):
    caller.invoke(ECHO, args={"text": "a"})
    caller.invoke(ECHO, args={"text": "b"})
    other.invoke(DENIED, args={})
    hold(caller, CONFIRM)

    families = scrape(token=TOKEN)

    calls = families["toolhub_tool_calls"]
    assert (
        value(calls, "toolhub_tool_calls_total", tenant="acme", tool=ECHO, status="succeeded") == 2
    )
    assert value(calls, "toolhub_tool_calls_total", tenant="globex", status="failed") == 1
    pending = families["toolhub_pending_approvals"]
    assert value(pending, "toolhub_pending_approvals", tenant="acme") == 1


@override_settings(TOOLHUB_METRICS_TOKEN=TOKEN)
def test_metrics_have_latency_histograms_per_tool(caller):
    for ms in (3, 40, 700):
        record_id = caller.invoke(ECHO, args={"text": "x"}).json()["invocationId"]
        InvocationRecord.objects.filter(pk=record_id).update(duration_ms=ms)

    samples = scrape(token=TOKEN)["toolhub_tool_call_duration_seconds"]

    name = "toolhub_tool_call_duration_seconds"
    assert value(samples, f"{name}_bucket", tool=ECHO, le="0.005") == 1
    assert value(samples, f"{name}_bucket", tool=ECHO, le="0.05") == 2
    assert value(samples, f"{name}_bucket", tool=ECHO, le="1.0") == 3
    assert value(samples, f"{name}_bucket", tool=ECHO, le="+Inf") == 3
    assert value(samples, f"{name}_count", tool=ECHO) == 3
    assert value(samples, f"{name}_sum", tool=ECHO) == pytest.approx(0.743)


def test_metrics_report_queue_depth_and_open_streams_to_a_superuser(caller, operator):
    _, approval = hold(caller, CONFIRM)
    decisions.decide(approval.pk, operator, "approve")  # queued for a worker
    open_streams.opened("runs")
    try:
        families = scrape(logged_in(superuser()))
    finally:
        open_streams.closed("runs")

    assert value(families["toolhub_queue_depth"], "toolhub_queue_depth", queue="default") >= 1
    streams = families["toolhub_open_streams"]
    assert value(streams, "toolhub_open_streams", kind="runs") >= 1
    assert value(streams, "toolhub_open_streams", kind="approvals") >= 0


def test_a_short_metrics_token_is_refused_at_start_up(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "TOOLHUB_METRICS_TOKEN": "short"}
    code = "import django; django.setup()"
    env["DJANGO_SETTINGS_MODULE"] = "toolhub.settings"
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert "TOOLHUB_METRICS_TOKEN must be at least 32 characters" in result.stderr


def test_metrics_count_the_channel_layers_drops_by_group_kind_from_redis(caller):
    """Over-capacity drops of the Redis layer, every process's (counted in Redis by the
    layer's script), by a label of four values whatever the groups; without Redis the
    family is absent; a Redis that does not answer leaves it out of the scrape."""
    from tests.support.redis import redis_server
    from toolhub.layers.redis_layer import RedisLayer

    with redis_server() as url, override_settings(TOOLHUB_METRICS_TOKEN=TOKEN):
        assert "toolhub_channel_layer_dropped" not in scrape(token=TOKEN)  # embedded

        async def overflow() -> None:
            layer = RedisLayer(hosts=[{"address": url, "socket_timeout": None}], capacity=1)
            for n in range(30):  # as many runs' groups: still one label value
                await layer.group_add(f"run.{n}", "stuck.reader")
            await layer.group_add("tenant.4", "stuck.reader")
            for n in range(30):
                await layer.group_send(f"run.{n}", {"type": "m"})  # the first fills it
            await layer.group_send("tenant.4", {"type": "m"})

        async_to_sync(overflow)()
        with override_settings(REDIS_URL=url):
            samples = scrape(token=TOKEN)["toolhub_channel_layer_dropped"]
        name = "toolhub_channel_layer_dropped_total"
        assert {s.labels["group"]: s.value for s in samples if s.name == name} == {
            "run": 29,
            "tenant": 1,
            "other": 0,
            "direct": 0,
        }
    with override_settings(REDIS_URL=url, TOOLHUB_METRICS_TOKEN=TOKEN):  # Redis gone
        families = scrape(token=TOKEN)
    assert "toolhub_channel_layer_dropped" not in families
    assert "toolhub_open_streams" in families
