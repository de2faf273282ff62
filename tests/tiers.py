"""The test tiers: which folder holds which kind of test, its per-test time limit, and the per-tier counts
printed at the end of every run (README.md, "Tests", lists the command that runs each tier).

| tier        | folder            | what it may do                                                   | limit |
|-------------|-------------------|------------------------------------------------------------------|-------|
| unit, plan  | tests/unit, plan  | run in this process only (tests/process_guard.py enforces it)    |  60 s |
| commands    | tests/commands    | start processes: the CLI as typed, fresh interpreters, programs  | 300 s |
| integration | tests/integration | train tiny models, in this process and on several processes      | 600 s |
| reliability | tests/reliability | kill, preempt, fill disks, feed hostile input                    | 600 s |
| floors      | tests/floors      | build a virtual environment of the lowest dependency versions    | 900 s |
| rehearsal   | tests/rehearsal   | the GPU lease (bench/gpu/lease.sh) rehearsed on the CPU, alone   | 3400 s |
| browser     | tests/browser     | `recipeforge ui` in Chromium (Playwright), run by .ci/ui         | 600 s |

The limits are for hangs (a launcher that never returns), several times the slowest test of each tier on
two busy cores; a test's own `@pytest.mark.timeout(...)` wins. `pytest --timeout=N` sets one for all.

With pytest-xdist (`-n 2 --dist loadgroup`, .ci/tests), the tests of a module that share a module-scoped
fixture (a tiny run trained once for them to read) form one group that runs on one worker; every other
test runs wherever a worker is free. The modules that took longest in a past run (tests/durations.json)
are handed out first, so that neither worker is left with a minutes-long test after the other has run out of
work. To refresh the file after a run with `--durations=0`:
`python tests/tiers.py durations < pytest-output.txt > tests/durations.json` (modules under 10 s are left out).
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
DURATIONS = TESTS / "durations.json"
LIMITS = {"unit": 60, "plan": 60, "commands": 300, "integration": 600, "reliability": 600, "floors": 900,
          "rehearsal": 3400, "browser": 600}
ORDER = ("unit", "plan", "commands", "integration", "reliability", "floors", "rehearsal", "browser")


def tier_of(path: str | Path) -> str:
    """The tier of a test file: its first folder below tests/ ("other" outside tests/)."""
    try:
        rel = Path(path).resolve().relative_to(TESTS)
    except ValueError:
        return "other"
    return rel.parts[0] if len(rel.parts) > 1 else "other"


def _shares_a_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a fixture set up once for several tests (module, class or package scope: a
    tiny run trained for the module's tests to read)."""
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(defs and defs[-1].scope in ("module", "class", "package")
                                    for defs in info.name2fixturedefs.values())


def _longest_first(items: list[pytest.Item]) -> None:
    """Reorder `items` in place: modules by their past duration, longest first; a module's tests stay
    together and in their order, modules without a past duration keep theirs, after the timed ones."""
    try:
        seconds: dict[str, float] = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return
    position = {}
    for i, item in enumerate(items):
        position.setdefault(_module_key(item), i)
    items.sort(key=lambda item: (-seconds.get(_module_key(item), 0.0), position[_module_key(item)]))


def _module_key(item: pytest.Item) -> str:
    try:
        return Path(item.path).resolve().relative_to(TESTS.parent).as_posix()
    except ValueError:
        return str(item.path)


def pytest_collection_modifyitems(config, items):
    # Where pytest-timeout or pytest-xdist is missing (the floors' environment runs a test file with pytest
    # alone), their marks are not added: --strict-markers would refuse them.
    limits = config.pluginmanager.hasplugin("timeout") and config.getoption("timeout", None) is None
    groups = config.pluginmanager.hasplugin("xdist")
    for item in items:
        tier = tier_of(item.path)
        if tier not in LIMITS:
            continue
        item.add_marker(getattr(pytest.mark, tier))
        if limits and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(LIMITS[tier]))
        if groups and _shares_a_fixture(item) and item.get_closest_marker("xdist_group") is None:
            # `-n 2 --dist loadgroup`: the tests of a module that share such a fixture run on one worker, so
            # it is set up once; every other test goes to whichever worker is free.
            item.add_marker(pytest.mark.xdist_group(Path(item.path).resolve().relative_to(TESTS).as_posix()))
    if groups and config.getoption("dist", "no") != "no":  # the same order on every worker (xdist checks it)
        _longest_first(items)


def _nodeid_tier(nodeid: str) -> str:
    parts = nodeid.split("::", 1)[0].split("/")
    if len(parts) > 2 and parts[0] == "tests":
        return parts[1]
    return "other"


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    """One line per tier: how many of its tests passed, failed, errored or were skipped."""
    worst: dict[str, str] = {}
    rank = {"passed": 0, "xpassed": 0, "xfailed": 0, "skipped": 1, "failed": 3, "error": 3}
    for category in rank:
        for report in terminalreporter.stats.get(category, []):
            nodeid = getattr(report, "nodeid", None)
            if not nodeid:
                continue
            if nodeid not in worst or rank[category] > rank[worst[nodeid]]:
                worst[nodeid] = category
    if not worst:
        return
    counts: dict[str, Counter] = defaultdict(Counter)
    for nodeid, category in worst.items():
        counts[_nodeid_tier(nodeid)][category] += 1
    terminalreporter.section("tests per tier")
    names = sorted(counts, key=lambda t: (ORDER.index(t) if t in ORDER else len(ORDER), t))
    for tier in names:
        c = counts[tier]
        shown = ", ".join(f"{c[k]} {k}" for k in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
                          if c[k])
        terminalreporter.write_line(f"{tier:<12} {sum(c.values()):>5} tests: {shown}")


def durations_from_pytest_output(text: str, floor_s: float = 10.0) -> dict[str, float]:
    """Seconds per test module from pytest's `--durations=0` lines (setup, call and teardown summed), for
    the modules that took at least `floor_s`, longest first."""
    total: dict[str, float] = defaultdict(float)
    for match in re.finditer(r"^([0-9.]+)s (?:setup|call|teardown)\s+(tests/[^:\s]+)::", text, re.MULTILINE):
        total[match.group(2)] += float(match.group(1))
    return {k: round(v, 1) for k, v in sorted(total.items(), key=lambda kv: -kv[1]) if v >= floor_s}


if __name__ == "__main__" and sys.argv[1:] == ["durations"]:
    print(json.dumps(durations_from_pytest_output(sys.stdin.read()), indent=1))
