"""--flush-cache on a real llama-server: `cache_prompt: false` in every timed request, so a prompt the warmup and
the run before sent is prefilled again (timings.cache_n 0), where without it the slot's cache serves most of it."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from orchestrator.cli import main
from tests.engines.test_llamacpp import children_gone, cpu_profiles, real  # noqa: F401 (fixture)

Capsys = pytest.CaptureFixture[str]


@real
@pytest.mark.slow
def test_a_real_llama_server_reuses_no_cached_prompt_under_flush_cache(
    cpu_profiles: tuple[Path, Path],  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    capsys: Capsys,
) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"prompt": "Write a short note to a colleague about the meeting moved to Thursday."}))
    args = ["bench", str(cpu_profiles[0]), "--dataset", str(one), "--runs", "1", "--warmup", "1"]
    args += ["--requests-per-stream", "2", "--max-tokens", "4", "--min-run-s", "0", "--json"]
    args += ["--db", str(tmp_path / "r.db"), "--flush-cache"]
    assert main(args) == 0
    (arm,) = json.loads(capsys.readouterr().out)["arms"]
    cache = arm["prefix_cache"]
    # Counted from the responses (every request said its cache_n), and none reused the slot's cached prompt.
    assert cache["source"] == "responses" and cache["prompt_tokens"] > 0 and cache["cached_tokens"] == 0
    children_gone(before)
