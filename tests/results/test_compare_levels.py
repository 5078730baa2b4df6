"""`orch compare` of experiments that measured no level alike (concurrency against rates, or other levels of one
kind): refused naming both sides' levels, exit 2, instead of "no arm with valid runs on both sides"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.results.compare import NoLevelInCommon, compare_levels
from tests.results.test_compare import SPEEDS, _at, _result
from tests.results.test_compare_map import store

CLOSED = "20261201-000000-cccccc"
OPEN = "20261201-000001-oooooo"
OTHER = "20261201-000002-dddddd"


def test_concurrency_against_rates_names_the_mismatch() -> None:
    closed = _at(_result(CLOSED, SPEEDS), concurrency=(1, 4))
    # Rate 4 equals concurrency 4 as a number: it is still no level in common.
    opened = _at(_result(OPEN, SPEEDS), rates=(2.0, 4.0))
    with pytest.raises(NoLevelInCommon) as e:
        compare_levels(closed, opened)
    assert str(e.value) == (
        f"A ({CLOSED}) measured concurrency 1, 4; B ({OPEN}) measured rates 2, 4 req/s: no level in common; "
        "compare experiments of the same kind of load (both --concurrency, or both --rate)"
    )


def test_levels_of_one_kind_that_do_not_meet_are_named_too() -> None:
    with pytest.raises(NoLevelInCommon, match=r"measured concurrency 1, 4; B .* measured concurrency 8: no level"):
        compare_levels(_at(_result(CLOSED, SPEEDS), concurrency=(1, 4)), _at(_result(OTHER, SPEEDS), concurrency=(8,)))
    # One level in common is no refusal: that level is judged, and A's other level is said as A's only, not judged
    # (it made the verdict inconclusive before: "no valid runs" at concurrency 1).
    some = compare_levels(
        _at(_result(CLOSED, SPEEDS), concurrency=(1, 4)), _at(_result(OTHER, SPEEDS), concurrency=(4,))
    )
    assert (some.concurrency, some.status, some.levels) == (4, "reproduced", ())
    assert [(x.side, x.level) for x in some.one_sided] == [("A", 1)]


@pytest.mark.parametrize(
    ("b_id", "b_levels", "said"),
    [
        (OPEN, {"rates": (2.0, 4.0)}, "measured rates 2, 4 req/s: no level in common; compare experiments of the same"),
        (OTHER, {"concurrency": (8,)}, "measured concurrency 8: no level in common; compare experiments measured at"),
    ],
    ids=["rates", "other-levels"],
)
def test_orch_compare_refuses_with_exit_2_and_both_sides_levels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], b_id: str, b_levels: dict[str, tuple[float, ...]], said: str
) -> None:
    db = tmp_path / "r.db"
    store(db, _at(_result(CLOSED, SPEEDS), concurrency=(1, 4)))
    store(db, _at(_result(b_id, SPEEDS), **b_levels))  # type: ignore[arg-type]
    assert main(["compare", CLOSED, b_id, "--db", str(db)]) == 2
    out, err = capsys.readouterr()
    assert f"Error: A ({CLOSED}) measured concurrency 1, 4; B ({b_id}) {said}" in err, err
    assert "no valid runs" not in out + err and "Traceback" not in err


A_RATES = "20261201-000003-rrrrrr"
B_RATES = "20261201-000004-ssssss"


def test_orch_compare_judges_the_rates_both_measured_and_names_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The reviewer's case through the store: 0.625 and 12.3 req/s in A, 0.634 and 12.3 in B. Was exit 4, "no valid
    # runs" at 0.625 and B's 0.634 never named; now 12.3 is judged (reproduced, exit 0) and both others are named.
    db = tmp_path / "r.db"
    store(db, _at(_result(A_RATES, SPEEDS), rates=(0.625, 12.3)))
    store(db, _at(_result(B_RATES, SPEEDS), rates=(0.634, 12.3)))
    assert main(["compare", A_RATES, B_RATES, "--db", str(db)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("REPRODUCED: all 3 values agree within ±3.0%, at 12.3 req/s, the one level both measured; "
                          "not judged, measured on one side only: A's 0.625 req/s, B's 0.634 req/s\n"), out  # fmt: skip
    assert "0.625 req/s: measured by A only, not judged (B measured rates 0.634, 12.3 req/s; B's nearest, 0.634 " in out
    assert "0.634 req/s: measured by B only, not judged (A measured rates 0.625, 12.3 req/s; A's nearest, 0.625 " in out
    assert "no valid runs" not in out and "would likely decide" not in out and err == ""
    assert main(["compare", A_RATES, B_RATES, "--db", str(db), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["status"], doc["exit_code"], doc["rate"]) == ("reproduced", 0, 12.3)
    assert [(x["measured_by"], x["rate"], x["nearest_rate"]) for x in doc["not_judged_levels"]] == [
        ("A", 0.625, 0.634),
        ("B", 0.634, 0.625),
    ]
    assert main(["compare", A_RATES, B_RATES, "--db", str(db), "--format", "md"]) == 0
    assert "- 0\\.634 req/s: measured by B only, not judged (A measured rates 0.625, 12.3" in capsys.readouterr().out
