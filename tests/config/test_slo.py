"""--slo and --metric: the grammar, what each refusal names, and the stored form."""

from __future__ import annotations

import pytest

from orchestrator.cli import main
from orchestrator.config.slo import (
    METRICS,
    SLO,
    Objective,
    check_metric,
    parse_metric,
    parse_slo,
    stored_judgement,
)
from orchestrator.errors import InputError


def test_the_issue_s_example_parses_into_per_request_limits_in_seconds() -> None:
    slo = parse_slo("ttft_p99=500ms, tpot_p99=50ms,e2e_p99=10s")
    assert slo.objectives == (
        Objective("ttft", 99, 0.5),
        Objective("tpot", 99, 0.05),
        Objective("e2e", 99, 10.0),
    )
    assert slo.text == "ttft_p99=500ms,tpot_p99=50ms,e2e_p99=10s"
    assert slo.describe() == "TTFT p99 <= 500 ms, TPOT p99 <= 50 ms, E2E p99 <= 10 s"
    assert SLO.from_dict(slo.to_dict()) == slo


def test_any_subset_any_offered_percentile_or_none() -> None:
    assert parse_slo("tpot_p90=0.05s").objectives == (Objective("tpot", 90, 0.05),)
    assert parse_slo("E2E=2s").objectives == (Objective("e2e", None, 2.0),)
    assert parse_slo("ttft_p95=1.5ms").text == "ttft_p95=1.5ms"


def test_a_request_is_good_only_within_every_limit() -> None:
    slo = parse_slo("ttft_p99=100ms,tpot_p99=20ms")
    assert slo.meets({"ttft": 0.1, "tpot": 0.02, "e2e": 9.0})  # at the limit counts, as vLLM's <=
    assert not slo.meets({"ttft": 0.1001, "tpot": 0.01})
    assert not slo.meets({"ttft": 0.05, "tpot": 0.03})
    assert not slo.meets({"ttft": None, "tpot": 0.01})  # no first token: not good


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("ttft_p99=500", "'ttft_p99=500': expected a duration from 1ms to 1d: a number with units (500ms, 30s, "),
        ("ttfb_p99=1s", "unknown objective 'ttfb_p99'; valid: ttft, tpot, e2e"),
        ("ttft_p98=1s", "'ttft_p98': percentile p98 is not offered"),
        ("ttft_p50=200ms,ttft_p99=1s", "ttft is limited twice (ttft_p50 and ttft_p99)"),
        ("ttft_p99=0ms", "'ttft_p99=0ms': expected a duration from 1ms to 1d"),
        ("ttft_p99=-5ms", "'ttft_p99=-5ms': expected a duration from 1ms to 1d"),
        ("ttft_p99=5 minutes", "'ttft_p99=5 minutes': expected a duration from 1ms to 1d: a number with units"),
        ("ttft_p99", "'ttft_p99': expected OBJECTIVE=LIMIT"),
        ("ttft_p99=1s,,e2e=2s", "has an empty piece between commas"),
        ("  ", "empty"),
    ],
)
def test_a_bad_slo_names_the_piece_and_what_is_valid(text: str, names: str) -> None:
    with pytest.raises(InputError) as e:
        parse_slo(text)
    assert names in str(e.value)
    assert str(e.value).startswith("--slo: ")


def test_metrics_say_which_way_is_better_and_what_they_need() -> None:
    assert METRICS["tok_s"].higher_is_better and METRICS["goodput"].higher_is_better
    assert not METRICS["ttft_p99"].higher_is_better and METRICS["ttft_p99"].unit == "ms"
    assert METRICS["goodput"].needs_slo and not METRICS["e2e_p95"].needs_slo
    assert "itl_p95" not in METRICS  # orch keeps ITL percentiles 50/90/99 only
    assert parse_metric(" Goodput ") == "goodput"
    with pytest.raises(InputError, match=r"unknown metric 'speed'; valid: tok_s, aggregate_tok_s, goodput"):
        parse_metric("speed")
    with pytest.raises(InputError, match=r"--metric goodput counts requests within the SLO: give --slo too"):
        check_metric("goodput", None)
    check_metric("goodput", parse_slo("ttft=1s"))


def test_stored_judgement_reads_old_and_new_experiments_and_names_a_bad_one() -> None:
    assert stored_judgement({}, "x") == (None, "tok_s")  # stored before --slo and --metric
    slo, metric = stored_judgement({"slo": {"ttft_p99": 0.5}, "metric": "goodput"}, "x")
    assert slo == parse_slo("ttft_p99=500ms") and metric == "goodput"
    with pytest.raises(InputError, match=r"^x: slo: unknown objective 'latency'"):
        stored_judgement({"slo": {"latency": 1}}, "x")
    with pytest.raises(InputError, match=r"^x: metric goodput counts requests within the SLO"):
        stored_judgement({"metric": "goodput"}, "x")


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--slo", "ttft_p99=500"], "Invalid value for '--slo': 'ttft_p99=500': expected a duration from 1ms to 1d"),
        (["--slo", "ttft_p99=1s,speed=2s"], "Invalid value for '--slo': unknown objective 'speed'"),
        (["--metric", "speed"], "Invalid value for '--metric': unknown metric 'speed'; valid: tok_s"),
        (["--metric", "goodput"], "--metric goodput counts requests within the SLO: give --slo too"),
        (["--metric", "goodput", "--slo", "ttft=1s"], None),  # accepted: fails later, on the missing profiles
    ],
)
def test_the_cli_refuses_a_bad_slo_or_metric_with_exit_2_before_anything_runs(
    args: list[str], names: str | None, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    code = main(["ab", "no-such-a", "no-such-b", "--sim", "--db", f"{tmp_path}/r.db", *args])
    err = capsys.readouterr().err
    assert code == 2
    if names is None:
        assert "no-such-a" in err  # the profile lookup, after the options were accepted
    else:
        assert names in err


def test_bench_fail_on_slower_judges_tok_s_only(capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:
    args = ["bench", "baseline", "--sim", "--metric", "ttft_p99", "--fail-on", "slower", "--db", f"{tmp_path}/r.db"]
    assert main(args) == 2
    assert "--metric ttft_p99 has no expected value to judge against" in capsys.readouterr().err


def test_objectives_take_one_order_whatever_was_typed_or_stored() -> None:
    typed = parse_slo("e2e_p99=2s,ttft_p99=300ms")
    assert typed.text == "ttft_p99=300ms,e2e_p99=2000ms"
    # a bundle's JSON object may come back with its keys sorted: the same SLO, the same columns
    assert SLO.from_dict({"e2e_p99": 2.0, "ttft_p99": 0.3}) == typed == parse_slo("ttft_p99=300ms,e2e_p99=2s")


def test_a_negative_limit_says_what_a_limit_may_be() -> None:
    with pytest.raises(InputError, match=r"'ttft_p99=-1s': expected a duration from 1ms to 1d: a number with units"):
        parse_slo("ttft_p99=-1s")
