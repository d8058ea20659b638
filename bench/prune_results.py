"""Keep bench/results/ to what a reader needs: the newest result of each bench and
configuration (database, layer), and every result the docs name. The rest is history,
which git keeps.

    python bench/prune_results.py          # list what would go
    python bench/prune_results.py --delete # remove it (then commit)

A result's bench is its name up to the date (`calls`, `fanout`, `queue-throughput`...),
its configuration the database or layer named after the date (`sqlite`, `postgres`,
`postgresql`, `redis`; none for benches that run one configuration). Newest is by the date
in the name, then by the time git last committed the file.
"""

from __future__ import annotations

import argparse
import itertools
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NAME = re.compile(r"^(?P<bench>[a-z_-]+?)-(?P<date>\d{4}-\d{2}-\d{2})(?P<rest>.*)\.json$")
CONFIGURATIONS = ("postgresql", "postgres", "sqlite", "redis", "inmemory")
# A file name in the docs, possibly with {a,b} alternatives: calls-...-{plain,pin}.json
MENTION = re.compile(r"[A-Za-z0-9_.{},-]+\.json")


def expand(pattern: str) -> list[str]:
    """`a-{1,2}-{x,y}.json` -> the four names it stands for."""
    parts = re.split(r"\{([^{}]*)\}", pattern)
    choices = [[part] if i % 2 == 0 else part.split(",") for i, part in enumerate(parts)]
    return ["".join(combination) for combination in itertools.product(*choices)]


def named_in_docs() -> set[str]:
    """Every results file name the docs mention (whether or not it exists)."""
    names: set[str] = set()
    for doc in DOCS:
        for mention in MENTION.findall(doc.read_text()):
            for name in expand(mention.rsplit("/", 1)[-1]):
                if NAME.match(name):
                    names.add(name)
    return names


def group(name: str) -> tuple[str, str] | None:
    match = NAME.match(name)
    if match is None:
        return None
    tokens = re.split(r"[-_]", match["rest"])
    configuration = next((c for c in CONFIGURATIONS if c in tokens), "")
    if configuration == "postgres":
        configuration = "postgresql"
    return match["bench"], configuration


def committed_at(path: Path) -> int:
    out = subprocess.run(  # noqa: S603
        ["git", "log", "-1", "--format=%ct", "--", str(path.relative_to(ROOT))],  # noqa: S607
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return int(out) if out else 2**62  # not committed yet: the newest


def to_prune() -> list[Path]:
    keep = named_in_docs()
    newest: dict[tuple[str, str], tuple[tuple[str, int], Path]] = {}
    for path in sorted(RESULTS.glob("*.json")):
        key = group(path.name)
        if key is None:
            keep.add(path.name)  # not a dated result: not ours to judge
            continue
        match = NAME.match(path.name)
        assert match is not None
        rank = (match["date"], committed_at(path))
        if key not in newest or rank > newest[key][0]:
            newest[key] = (rank, path)
    keep |= {path.name for _, path in newest.values()}
    return [path for path in sorted(RESULTS.glob("*.json")) if path.name not in keep]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delete", action="store_true", help="remove them (default: list)")
    options = parser.parse_args()
    prunable = to_prune()
    for path in prunable:
        sys.stdout.write(f"{path.relative_to(ROOT)}\n")
        if options.delete:
            path.unlink()
    kept = len(list(RESULTS.glob("*.json")))
    sys.stderr.write(
        f"{len(prunable)} result(s) {'removed' if options.delete else 'to remove'}; "
        f"{kept} in bench/results/\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
