"""`orch compare` of experiments that measured no level alike (concurrency against rates, or other levels of one
kind): refused naming both sides' levels, exit 2, instead of "no arm with valid runs on both sides"."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.results.compare import NoLevelInCommon, compare_levels
from orchestrator.results.model import ABResult
from tests.results.test_compare import SPEEDS, _result
from tests.results.test_compare_map import store

CLOSED = "20261201-000000-cccccc"
OPEN = "20261201-000001-oooooo"
OTHER = "20261201-000002-dddddd"


def _at(result: ABResult, *, rates: tuple[float, ...] = (), concurrency: tuple[int, ...] = ()) -> ABResult:
    """The result with each launch's runs repeated at each level (rates: open loop, concurrency 0)."""
    launches = []
    for la in result.launches:
        runs = [
            dataclasses.replace(r, index=k * len(la.runs) + r.index, rate=rate, concurrency=0)
            for k, rate in enumerate(rates)
            for r in la.runs
        ]
        runs += [
            dataclasses.replace(r, index=k * len(la.runs) + r.index, concurrency=c)
            for k, c in enumerate(concurrency)
            for r in la.runs
        ]
        launches.append(dataclasses.replace(la, runs=tuple(runs)))
    return dataclasses.replace(result, launches=tuple(launches))


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
    # One level in common is no refusal: that level is judged (A's other level stays undecided, as before).
    some = compare_levels(
        _at(_result(CLOSED, SPEEDS), concurrency=(1, 4)), _at(_result(OTHER, SPEEDS), concurrency=(4,))
    )
    assert [(x.concurrency, x.status) for x in some.levels] == [(1, "inconclusive"), (4, "reproduced")]


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
