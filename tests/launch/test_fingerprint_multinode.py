"""Launches of one multi-node profile fingerprint alike: the rendezvous port each draws is no environment change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.launch import fingerprint
from orchestrator.results.load import stored_launches
from orchestrator.results.store import Store
from tests.conftest import WriteProfile

# The two sshd on 127.0.0.1 and the inventory group of both (fixtures), the profiles and the fast workload.
from tests.launch.test_multinode import FAST, _nothing_left, _profiles, nodes, pair  # noqa: F401
from tests.launch.test_multinode import pytestmark as _needs_sshd

pytestmark = _needs_sshd


def test_launches_of_one_multi_node_profile_have_equal_fingerprints(
    pair: str,  # noqa: F811
    write_profile: WriteProfile,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each launch draws its own rendezvous port (--dist-init-addr): that must not read as a change of environment,
    neither between the launches of one experiment (`--fail-on env`) nor between two experiments (`orch compare`,
    and a nightly history, which compares the same environment fields)."""
    _profiles(write_profile)
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "r.db"
    bench = ["bench", "baseline", "--host", pair, "--sim", *FAST, "--fail-on", "env", "--db", str(db)]
    for blocks in ("2", "1"):
        code = main([*bench, "--blocks", blocks])
        out, err = capsys.readouterr()
        assert code == 0, out + err  # not 3: the launches' fingerprints do not differ
    store = Store(db)
    ids = [e["id"] for e in store.experiments()]
    fps = [launch.fingerprint for i in ids for launch in stored_launches(store, i)[0]]
    addrs = {fp["argv"][fp["argv"].index("--dist-init-addr") + 1] for fp in fps if fp}
    assert len(fps) == 3 and len(addrs) > 1  # stored as launched: a port of its own per launch
    assert all(fingerprint.diff(fps[0], fp) == [] for fp in fps[1:])
    assert len({json.dumps(fingerprint.environment(fp), sort_keys=True) for fp in fps}) == 1
    code = main(["compare", ids[0], ids[1], "--db", str(db), "--json"])
    out, err = capsys.readouterr()
    # Any verdict (a loaded CI machine moved the simulator's tok/s by 3.1 % once): what is checked is that the
    # rendezvous port each launch drew is no cause.
    assert code in (0, 3, 4), out + err
    assert json.loads(out)["causes"] == [], out
    _nothing_left()
