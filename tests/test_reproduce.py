"""`orch reproduce`: a colleague's claim (or result bundle) re-run from fresh state and judged, end to end."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from tests.faults.support import FAST, assert_nothing_left, assert_plain, run

SimProfiles = Callable[..., dict[str, Path]]
QUICK = ("--runs", "2", "--max-tokens", "48", *FAST)


def test_the_seeds_claim_is_not_reproduced(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    """ "EAGLE-3 gives 94 tok/s": measured from fresh state beside the baseline, it is ~60. Exit 3."""
    sim_profiles()
    out = run("reproduce", "eagle3", "--sim", "--claim", "94", "--blocks", "2", *QUICK, "--db", str(tmp_path / "r.db"),
              cwd=tmp_path)  # fmt: skip
    assert out.rc == 3, out.text
    assert "NOT REPRODUCED" in out.out and "claimed 94.0 tok/s, measured" in out.out
    assert "baseline measured" in out.out and "SIMULATED" in out.out
    assert_plain(out.text)
    assert_nothing_left()


def test_a_claim_in_the_profile_and_an_undecidable_one(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    paths = sim_profiles()
    data = yaml.safe_load(paths["eagle3"].read_text())
    paths["eagle3"].write_text(yaml.safe_dump({**data, "expect": {"tok_s": 60, "vs": "baseline"}}))
    # One block: one launch per arm cannot give an interval, so nothing can be decided. Exit 4, and it says so.
    out = run("reproduce", "eagle3", "--sim", "--blocks", "1", *QUICK, "--db", str(tmp_path / "r.db"), cwd=tmp_path)
    assert out.rc == 4, out.text
    assert "INCONCLUSIVE" in out.out and "claimed 60.0 tok/s" in out.out
    none = run("reproduce", "baseline", "--sim", cwd=tmp_path)
    assert none.rc == 2 and "nothing to judge" in none.err, none.text
