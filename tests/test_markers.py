"""The markers that make `make test-fast` fast: registered, applied, and a test that starts a resource without its
marker fails (tests/markers.py)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests import markers
from tests.conftest import REPO

# What starts each resource, as a name a test module uses: a module that uses one must mention its marker. The
# runtime check (markers.require) finds the test; this one also holds where the resource is missing and tests skip.
STARTERS = {
    "ssh": {"SSHD", "sshd_fixture"},
    "slurm": {"slurmcluster", "needs_cluster"},
    "browser": {"needs_chromium"},
    "llamacpp": {"HAVE_LLAMA"},
    "vllm": {"HAVE_VLLM"},
}


def registered() -> dict[str, str]:
    text = (REPO / "pyproject.toml").read_text()
    block = text.split("\nmarkers = [\n", 1)[1].split("\n]\n", 1)[0]
    return dict(re.findall(r'^\s+"(\w+): ([^"]+)",$', block, re.M))


def test_the_markers_are_registered_and_make_test_fast_leaves_them_all_out() -> None:
    assert set(registered()) == {*markers.RESOURCES, "slow"}
    makefile = (REPO / "Makefile").read_text()
    fast = re.search(r"^FAST := (.+)$", makefile, re.M)
    assert fast is not None
    assert sorted(re.findall(r"not (\w+)", fast.group(1))) == sorted(registered())


def _names(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
    }


@pytest.mark.parametrize("marker", sorted(STARTERS))
def test_every_test_module_that_starts_a_resource_carries_its_marker(marker: str) -> None:
    unmarked = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        if path.name == Path(__file__).name:
            continue
        tree = ast.parse(path.read_text())
        # A module that only imports a starter to re-export a fixture still uses it: names, not imports, count.
        uses = _names(tree) & STARTERS[marker]
        if uses and marker not in _names(tree):
            unmarked.append(f"{path.relative_to(REPO)} uses {sorted(uses)}")
    assert not unmarked, f"add pytest.mark.{marker} to these tests: {unmarked}"


@dataclass
class FakeItem:
    """What markers.require asks of a pytest item."""

    nodeid: str
    marks: set[str] = field(default_factory=set)

    def get_closest_marker(self, name: str) -> Any:
        return name if name in self.marks else None


def test_starting_a_resource_without_its_marker_fails_the_test_by_name() -> None:
    saved = list(markers.current)
    try:
        markers.current[:] = [FakeItem("tests/test_x.py::test_y", {"ssh"})]
        markers.require("ssh")  # marked: nothing to say
        with pytest.raises(pytest.fail.Exception, match=r"test_x.py::test_y starts a private .*Slurm.* `slurm`"):
            markers.require("slurm")
        markers.current[:] = []
        markers.require("slurm")  # outside a test (a benchmark script starting sshd): no test to ask
    finally:
        markers.current[:] = saved
