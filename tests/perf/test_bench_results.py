"""bench/results/ holds what a reader needs: every result the docs name exists, and each
bench and configuration keeps its newest result only (bench/prune_results.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.one_leg

ROOT = Path(__file__).resolve().parents[2]


def prune_results():  # bench/ is scripts, not a package
    spec = importlib.util.spec_from_file_location("prune_results", ROOT / "bench/prune_results.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_result_the_docs_name_exists():
    module = prune_results()
    named = module.named_in_docs()
    assert named, "the docs name no results: the pattern no longer finds them"
    missing = sorted(name for name in named if not (module.RESULTS / name).exists())
    assert missing == [], f"docs name results that are not in bench/results/: {missing}"


def test_nothing_is_left_to_prune():
    stale = [path.name for path in prune_results().to_prune()]
    assert stale == [], f"run `python bench/prune_results.py --delete`: {stale}"


def test_brace_alternatives_expand_to_every_name():
    expand = prune_results().expand
    assert expand("calls-2026-11-28-r24-{plain,pin}-{postgres,sqlite}.json") == [
        "calls-2026-11-28-r24-plain-postgres.json",
        "calls-2026-11-28-r24-plain-sqlite.json",
        "calls-2026-11-28-r24-pin-postgres.json",
        "calls-2026-11-28-r24-pin-sqlite.json",
    ]
