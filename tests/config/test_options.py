"""RunOptions built once from a command's parameters, the resume policy's refusals, experiment.run without click."""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest

from orchestrator.cli.ab import ab_cmd, bench_cmd
from orchestrator.cli.options import run_options
from orchestrator.cli.reproduce import reproduce_cmd
from orchestrator.config.options import OptionError, RunOptions
from orchestrator.experiment import resume
from orchestrator.experiment import run as experiment
from orchestrator.ui.progress import PlainReporter


def _options(command: click.Command, name: str, args: list[str]) -> RunOptions:
    with command.make_context(name, args) as ctx:
        return run_options(ctx, name)


def test_ab_options_are_typed_and_say_what_was_given() -> None:
    opts = _options(
        ab_cmd, "ab", ["a", "b", "--runs", "3", "--concurrency", "1,8", "--sim", "--attach", "b=http://h:1"]
    )
    assert opts.command == "ab" and opts.profiles == ("a", "b") and opts.resume is None
    assert (opts.runs, opts.concurrency, opts.sim, opts.attach) == (3, (1, 8), True, ("b=http://h:1",))
    assert (opts.blocks, opts.max_blocks, opts.min_effect, opts.warmup) == ("auto", 8, 0.02, 2)  # click's defaults
    assert opts.given == {"profiles", "runs", "concurrency", "sim", "attach"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.runs = 4  # type: ignore[misc]


def test_bench_options_take_one_profile_and_one_attach_url() -> None:
    opts = _options(bench_cmd, "bench", ["p", "--attach", "http://h:1", "--blocks", "2"])
    assert (opts.profiles, opts.attach, opts.blocks, opts.max_blocks) == (("p",), ("http://h:1",), 2, None)
    assert opts.sequential_plan() is None


@pytest.mark.parametrize("command", [ab_cmd, bench_cmd, reproduce_cmd])
def test_every_run_option_has_a_field(command: click.Command) -> None:
    fields = {f.name for f in dataclasses.fields(RunOptions)}
    others = {"profile", "target", "claim_tps", "claim_ratio", "vs_name", "tolerance"}  # the command's own
    assert {p.name for p in command.params} - fields - others == set()


def test_the_resume_policy_names_the_flags_click_knows() -> None:
    # every name of the option (the user may have typed either of --prompts/--dataset)
    flags = {p.name: "/".join(p.opts) for p in ab_cmd.params}
    assert {name: flags[name] for name in resume.FIXED_OPTIONS} == resume.FIXED_OPTIONS


def test_invalid_combinations_are_refused_with_the_cli_messages() -> None:
    with pytest.raises(OptionError, match=r"^-q \(verdict only\) and -v \(every request\) exclude each other$"):
        _options(ab_cmd, "ab", ["a", "b", "-q", "-v"]).check_verbosity()
    with pytest.raises(OptionError, match=r"^--max-blocks applies to --blocks auto, not to --blocks 3$"):
        _options(ab_cmd, "ab", ["a", "b", "--blocks", "3", "--max-blocks", "6"]).sequential_plan()
    assert _options(ab_cmd, "ab", ["a", "b", "--max-blocks", "6"]).sequential_plan().max_blocks == 6  # type: ignore[union-attr]
    with pytest.raises(OptionError, match=r"an A/B needs at least two profiles \(use `orch bench` for one\)"):
        experiment.run(RunOptions(profiles=("a",)))


def test_the_cli_shows_an_option_error_as_a_usage_error() -> None:
    from orchestrator.cli import main

    assert main(["ab", "a", "b", "-q", "-v"]) == 2


def _exp(**config: Any) -> dict[str, Any]:
    return {"id": "e1", "host": "local", "simulated": 1, "config_json": json.dumps(config)}


def test_resume_refusals_keep_their_messages() -> None:
    given = RunOptions(resume="e1", runs=3, sim=True, given=frozenset({"runs", "sim", "resume"}))
    with pytest.raises(OptionError, match=r"^--resume continues experiment e1 with its own settings; drop --runs "):
        resume.refuse_fixed(_exp(), given)  # --sim is no change for a simulated experiment
    moved = RunOptions(workdir="/w2", given=frozenset({"workdir"}))
    with pytest.raises(OptionError, match=r"^experiment e1 used --workdir /w1; resume it with that one$"):
        resume.resumed_options(_exp(), {"workdir": "/w1"}, moved)
    with pytest.raises(OptionError, match=r"^experiment e1 ran on 'local'; it must be resumed there, not on 'b@h'"):
        resume.resumed_host(_exp(), {}, RunOptions(host_spec="b@h", given=frozenset({"host_spec"})))
    kept = resume.resumed_options(_exp(), {"workdir": "/w1", "min_effect": 0.05, "strict_env": True}, RunOptions())
    assert (kept.workdir, kept.min_effect, kept.strict_env, kept.sim) == ("/w1", 0.05, True, True)


def test_experiment_run_is_callable_without_click(sim_profiles: Callable[..., dict[str, Path]], tmp_path: Path) -> None:
    paths = sim_profiles()
    out = io.StringIO()
    opts = RunOptions(
        profiles=(str(paths["baseline"]), str(paths["eagle3"])),
        sim=True,
        blocks=1,
        runs=1,
        warmup=0,
        max_tokens=16,
        min_run_s=0,
        grace=2,
        gpu_wait=0,
        db=str(tmp_path / "r.db"),
        workdir=str(tmp_path / "work"),
    )
    outcome = experiment.run(opts, reporter=PlainReporter(out), warn=lambda line: None)
    assert [a.label for a in outcome.result.arms] == ["baseline", "eagle3"] and outcome.decision is None
    assert "results database:" in out.getvalue()
