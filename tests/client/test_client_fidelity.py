"""The client benchmark's common yardstick: one steady window for every client, rebuilt from its own timestamps."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import client_fidelity  # noqa: E402
import reference_clients as rc  # noqa: E402


def test_one_wave_window_runs_from_the_last_first_token_to_the_first_completion() -> None:
    # Two streams of 1 token per 10 ms; the second starts 5 ms late and finishes 5 ms late.
    a = [(0.01 * i, 1.0) for i in range(1, 101)]
    b = [(0.005 + 0.01 * i, 1.0) for i in range(1, 101)]
    s = rc.steady_rate([(0.0, a), (0.005, b)], concurrency=2)
    assert (s["window_start"], s["window_end"]) == (0.015, 1.0)
    assert s["tok_s"] == pytest.approx(200, rel=0.01)


def test_sequential_requests_window_ends_with_the_last_one() -> None:
    first = [(0.1 + 0.01 * i, 1.0) for i in range(10)]
    second = [(0.3 + 0.01 * i, 1.0) for i in range(10)]
    s = rc.steady_rate([(0.0, first), (0.25, second)], concurrency=1)
    assert (s["window_start"], s["window_end"]) == (0.1, pytest.approx(0.39))


def test_no_tokens_no_rate() -> None:
    assert math.isnan(rc.steady_rate([(0.0, [])], 1)["tok_s"])


def test_bench_serving_arrivals_are_rebuilt_from_ttft_itls_and_the_noted_sends() -> None:
    res = {
        "backend": "sglang",
        "ttfts": [0.5, 0.5],
        "itls": [[0.1, 0.1, 0.1], [0.05, 0.05, 0.1]],
        "output_lens": [5, 4],
    }
    marks = [
        ["send", "http://h/generate", 1.0, 0.1],  # the warmup request
        ["done", "http://h/generate", 1.2, 0.2],
        ["send", "http://h/generate", 10.0, 1.0],
        ["send", "http://h/generate", 10.5, 1.5],
        ["done", "http://h/generate", 11.0, 2.0],
        ["done", "http://h/generate", 11.5, 3.0],
    ]
    requests, cpu, wall = rc._bench_serving_arrivals(res, marks, "/generate", 2)
    assert (cpu, wall) == (2.0, 1.5)
    start, arrivals = requests[0]
    assert start == 10.0 and [k for _, k in arrivals] == [2.0, 1.0, 1.0, 1.0]  # the first chunk carried 2 tokens
    assert [round(t, 6) for t, _ in arrivals] == [10.5, 10.6, 10.7, 10.8]
    assert requests[1][0] == 10.5 and sum(k for _, k in requests[1][1]) == 4


def test_too_few_noted_requests_is_an_error_not_a_guess() -> None:
    with pytest.raises(RuntimeError, match="noted 0 requests"):
        rc._bench_serving_arrivals({"ttfts": [1.0]}, [], "/generate", 1)


def test_the_before_client_comes_from_the_named_commit() -> None:
    with client_fidelity.checkout("3e11be3") as tree:
        old = (tree / "orchestrator" / "client.py").read_text()
        assert "_COMPLETION_TOKENS" in old and not (tree / "orchestrator" / "streamparse.py").exists()
        # The runner imports the client from that tree, not from this checkout (nor from its working directory,
        # which `python -c` puts first on the path). That commit is from before the packages: orchestrator/client.py.
        out = subprocess.run(
            [sys.executable, "-c", "from orchestrator import client; print(client.__file__)"],
            cwd=tree,
            env={"PYTHONPATH": str(tree), "PATH": ""},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == str(tree / "orchestrator" / "client.py")


def test_per_core_is_compared_with_the_best_reference_at_the_highest_rate_both_passed() -> None:
    kinds = {"orch": "orch", "ref a": "reference", "ref b": "reference"}
    steps = [
        {"truth": 16000, "rows": [{"client": "orch", "per_core": 100}, {"client": "ref a", "per_core": 40}]},
        {
            "truth": 32000,
            "rows": [
                {"client": "orch", "per_core": 120},
                {"client": "ref a", "per_core": 50},
                {"client": "ref b", "per_core": 60},
            ],
        },
        {"truth": 48000, "rows": [{"client": "orch"}, {"client": "ref b", "per_core": 80}]},  # orch: machine limit
    ]
    assert client_fidelity.compare_to_references("orch", steps, kinds) == {
        "vs_best_reference": 2.0,
        "compared_at": 32000,
    }
    assert client_fidelity.compare_to_references("ref b", steps, kinds)["vs_best_reference"] == 1.0
    assert math.isnan(client_fidelity.compare_to_references("nobody", steps, kinds)["vs_best_reference"])
