"""A dataset covered, not sampled: each run cycles a category-covering order, by default the whole dataset, the plan
says how much of it each launch sends, and a category no run sent is named in every format (issue 35, item 5)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.config.coverage import coverage, default_requests_per_stream
from orchestrator.config.datasets import categories_of
from orchestrator.config.prompts import covering_order
from orchestrator.config.workload import BenchConfig, request_items, requests_digest, run_categories
from tests.faults.support import FAST

Capsys = pytest.CaptureFixture[str]
CATEGORIES = ("code", "math", "writing")


def _data(path: Path, sizes: tuple[int, ...] = (8, 8, 8)) -> str:
    """A JSONL dataset: sizes[i] prompts of CATEGORIES[i], each category's prompts together, as files often are."""
    with path.open("w") as f:
        for category, size in zip(CATEGORIES, sizes, strict=True):
            for i in range(size):
                f.write(json.dumps({"prompt": f"{category} task {i}", "category": category}) + "\n")
    return str(path)


def test_the_covering_order_covers_every_category_first_and_the_whole_dataset_in_a_pass() -> None:
    cats = ["a"] * 20 + ["b"] * 2 + ["c"]
    for run in range(5):
        order = covering_order(cats, 40, seed=0, run=run)
        assert {cats[i] for i in order[:3]} == {"a", "b", "c"}  # any run of 3 or more requests covers all three
        assert sorted(order[: len(cats)]) == list(range(len(cats)))  # a pass sends every prompt once
        assert order[len(cats) :] == order[: 40 - len(cats)]  # then starts again
    assert covering_order(cats, 7, seed=3, run=1) == covering_order(cats, 7, seed=3, run=1)  # seeded: reproducible
    assert len({tuple(covering_order(cats, 7, seed=0, run=r)) for r in range(5)}) > 1  # each run its own subset
    assert covering_order([], 5, seed=0, run=0) == []


def test_each_run_covers_the_categories_in_closed_and_open_loop(tmp_path: Path) -> None:
    data = _data(tmp_path / "d.jsonl")
    # The issue's case, capped by the user at one request per stream, 3 streams: every run sends all 3 categories
    # (the old sequence took the first 3 of a shuffle: a category could be missing from a run, or from all).
    closed = BenchConfig(runs=4, warmup=2, concurrency=(3,), requests_per_stream=1, prompts=data, cover=True)
    assert all(sorted(cats) == list(CATEGORIES) for cats in run_categories(closed).values())
    # Open loop: whatever number of requests a run's schedule holds, it cycles the same kind of order.
    open_loop = BenchConfig(runs=3, warmup=1, rate=(5.0,), requests_per_level=4, prompts=data, cover=True)
    assert all(set(cats) == set(CATEGORIES) for cats in run_categories(open_loop).values())
    timed = [it for it in request_items(open_loop)[1:]]
    assert len(timed) == 12 and all("scheduled_s" in it for it in timed)
    # The same seed gives the same requests (a resume, a reproduction); a workload stored before `cover` existed
    # keeps its old sequence and digest.
    assert requests_digest(closed) == requests_digest(BenchConfig(**{**closed.__dict__}))
    old = BenchConfig(runs=4, warmup=2, concurrency=(3,), requests_per_stream=1, prompts=data)
    assert "cover" not in old.to_dict() and closed.to_dict()["cover"] is True
    assert requests_digest(old) != requests_digest(closed)
    assert coverage(old, categories_of(data)) is None


def test_the_plan_says_how_much_of_the_dataset_each_launch_sends(tmp_path: Path) -> None:
    data = _data(tmp_path / "data.jsonl")
    cats = categories_of(data)
    assert default_requests_per_stream(24, (1,)) == 24 and default_requests_per_stream(24, (5, 2)) == 12
    assert default_requests_per_stream(1000, (1,)) == 100  # a huge dataset: a subset, still covering
    whole = BenchConfig(runs=2, warmup=1, requests_per_stream=24, prompts=data, cover=True)
    found = coverage(whole, cats)
    assert (
        found is not None and found.line() == "dataset: each launch sends all 24 prompts of data.jsonl (3 categories)"
    )
    part = BenchConfig(runs=2, warmup=1, requests_per_stream=4, prompts=data, cover=True)
    found = coverage(part, cats)
    assert found is not None and found.unsent == {} and 4 <= found.sent <= 8
    assert (
        found.line()
        == f"dataset: each launch sends a seeded subset of {found.sent} of 24 prompts of data.jsonl "
        + ("covering all 3 categories")
    )
    short = BenchConfig(runs=1, warmup=0, requests_per_stream=2, prompts=data, cover=True)
    found = coverage(short, cats)
    assert found is not None and len(found.unsent) == 1
    ((name, n),) = found.unsent.items()
    assert f"covering 2 of 3 categories; not sent: {name} ({n} prompts)" in found.line()


def test_the_issues_dataset_is_sent_whole_by_default_and_an_unsent_category_is_named_everywhere(
    sim_profiles: Callable[..., dict[str, Path]], tmp_path: Path, capsys: Capsys
) -> None:
    """A 24-prompt JSONL in three categories with --runs 2 sent 2 prompts per launch; one category was never sent,
    and the report showed two categories as if that were all."""
    profiles = sim_profiles()
    data = _data(tmp_path / "data.jsonl")
    db = str(tmp_path / "r.db")
    common = ["--sim", "--dataset", data, "--runs", "2", "--max-tokens", "4", *FAST, "--db", db]
    assert main(["bench", str(profiles["baseline"]), *common, "--json"]) == 0
    captured = capsys.readouterr()
    said = captured.out + captured.err
    assert "dataset: each launch sends all 24 prompts of data.jsonl (3 categories)" in said
    doc = json.loads(captured.out)
    assert doc["categories_unsent"] == []
    (level,) = doc["by_category"]
    assert level["categories"] == list(CATEGORIES)
    assert {a["category"]: a["requests"] for a in level["arms"]} == {c: 16 for c in CATEGORIES}  # 8 a run, 2 runs
    # Capped by the user below the categories: the plan and every format name what was not sent.
    capped = ["--requests-per-stream", "1", "--runs", "1"]
    assert main(["bench", str(profiles["baseline"]), *common, *capped]) == 0
    text = capsys.readouterr()
    said = text.out + text.err
    assert (
        "dataset: each launch sends a seeded subset of 1 of 24 prompts of data.jsonl covering 1 of 3 categories" in said
    )
    assert "categories not sent: " in text.out and "(8 prompts)" in text.out
    assert main(["show", "last", "--db", db, "--json"]) == 0  # read back from the store
    unsent = json.loads(capsys.readouterr().out)["categories_unsent"]
    assert len(unsent) == 2 and {u["prompts"] for u in unsent} == {8}
    line = "categories not sent: " + ", ".join(f"{u['category']} (8 prompts)" for u in unsent)
    assert main(["export", "last", "--format", "md", "--db", db]) == 0
    assert line in capsys.readouterr().out
    html = tmp_path / "r.html"
    assert main(["export", "last", "--format", "html", "-o", str(html), "--db", db]) == 0
    assert 'id="categories-unsent"' in html.read_text() and line in html.read_text()
