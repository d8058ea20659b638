"""/metrics is written by toolhub.ops.exposition, which must produce exactly what
prometheus_client's generate_latest produces for the same registry: the live registry
over real calls in many tenants, and a registry of every kind of family and awkward
value. A name generate_latest would escape goes back to generate_latest."""

from __future__ import annotations

import pytest
from django.test import Client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from apps.invocations.rollups import fold_all
from tests.conftest import allow, make_agent
from toolhub.ops import exposition
from toolhub.ops.metrics import registry

pytestmark = pytest.mark.one_leg


@pytest.mark.django_db
def test_the_live_registry_is_written_as_generate_latest_writes_it(django_user_model) -> None:
    for n in range(12):
        agent = make_agent(f"t{n:02}", f"agent:a{n}")
        allow(agent.tenant, "core__get_current_time")
        for _ in range(2):
            response = agent.client.post(
                "/api/v1/invocations/", {"toolId": "core__get_current_time"}, format="json"
            )
            assert response.status_code in (200, 201), response.content
        # a refused call: another status and error label set
        agent.client.post("/api/v1/invocations/", {"toolId": "core__nope"}, format="json")
    fold_all()
    ours = exposition.text(registry)
    assert ours == generate_latest(registry)
    assert ours.count(b'tenant="t11"') >= 15  # a histogram and a counter for the last tenant

    root = django_user_model.objects.create_superuser("root", "r@example.com", "pw")
    client = Client()
    client.force_login(root)
    served = client.get("/metrics")
    assert served.status_code == 200
    assert b"toolhub_tool_calls_total" in served.content


def test_every_kind_of_family_and_awkward_values_are_written_alike() -> None:
    own = CollectorRegistry()
    counter = Counter("jobs", "Jobs done.\nTwo lines \\ and a backslash.", ["queue"], registry=own)
    counter.labels('we"ird\\name\nline').inc(3)
    counter.labels("ünïcode ☃").inc(0.5)
    Gauge("depth", "Depth.", registry=own).set(1e21)
    histogram = Histogram("wait_seconds", "Waits.", ["b", "a"], registry=own)
    histogram.labels(b="2", a="1").observe(0.2)
    Info("build", "Build.", registry=own).info({"version": "1.2", "commit": "abc"})

    class Families:
        def collect(self):
            yield CounterMetricFamily("made", "Made.", value=7, created=1700000000.5)
            gauge = GaugeMetricFamily("odd", "Odd values.", labels=["k"])
            for k, v in (("inf", float("inf")), ("neg", float("-inf")), ("nan", float("nan"))):
                gauge.add_metric([k], v)
            gauge.add_metric(["stamped"], 2, timestamp=1700000000.25)
            yield gauge
            yield HistogramMetricFamily(
                "sizes", "Sizes.", buckets=[("1.0", 1), ("+Inf", 2)], sum_value=3.0
            )

    own.register(Families())
    ours = exposition.text(own)
    assert ours == generate_latest(own)
    assert b'queue="we\\"ird\\\\name\\nline"' in ours
    assert b"made_created" in ours and b"+Inf" in ours and b"NaN" in ours


def test_a_name_generate_latest_would_escape_is_left_to_it() -> None:
    own = CollectorRegistry()

    class Dotted:
        def collect(self):
            gauge = GaugeMetricFamily("with.dot", "A dotted name.", labels=["label.dot"])
            gauge.add_metric(["x"], 1)
            yield gauge

    own.register(Dotted())
    assert exposition.text(own) == generate_latest(own)
    assert b"with_dot" in exposition.text(own)
