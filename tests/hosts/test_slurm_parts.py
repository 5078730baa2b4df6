"""hosts/slurm_cli.py without a cluster: job names, requests, error messages from Slurm's own words, job states;
where a Slurm node of a group reports."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent import processes
from orchestrator.errors import HostError, InputError
from orchestrator.hosts import open_group, slurm_cli
from orchestrator.hosts.base import HostConfig
from orchestrator.hosts.inventory import HostGroup
from orchestrator.hosts.slurm_cli import AllocationRequest, JobState, Slurm, SlurmError, SlurmInputError
from orchestrator.ui.events import Lines


def test_a_job_name_carries_namespace_and_session_and_parses_back() -> None:
    name = slurm_cli.job_name("ns-1.a", label="nightly_2")
    host = socket.gethostname()
    assert name.startswith(f"orch:ns-1.a:{host}:{os.getpid()}:")
    parsed = slurm_cli.parse_name(name)
    assert parsed is not None
    assert (parsed.namespace, parsed.host, parsed.label) == ("ns-1.a", host, "nightly_2")
    assert processes.owner_state(parsed.owner) == "me"
    assert slurm_cli.parse_name(slurm_cli.job_name("ns", "h:1:2.5")) == slurm_cli.JobName("ns", "h", "1:2.5", None)
    for other in ("orch", "orch:ns:h:1", "orch:ns:h:x:2", "orch:ns:h:1:2:l:more", "orch::h:1:2", "interactive"):
        assert slurm_cli.parse_name(other) is None
    with pytest.raises(InputError, match="namespace 'a:b' is invalid"):
        slurm_cli.job_name("a:b")
    with pytest.raises(InputError, match="allocation label 'x y' is invalid"):
        slurm_cli.job_name("ns", label="x y")


def test_a_request_becomes_sallocs_arguments_and_refuses_nonsense() -> None:
    req = AllocationRequest(partition="gpu", nodes=2, time_limit_min=90, gres="gpu:h100:8", account="proj-1")
    assert req.salloc_args("N") == [
        "--no-shell",
        "-J",
        "N",
        "--time=90",
        "-N",
        "2",
        "--exclusive",
        "--gres=gpu:h100:8",
        "-p",
        "gpu",
        "-A",
        "proj-1",
    ]
    shared = AllocationRequest(exclusive=False).salloc_args("N")
    assert "--exclusive" not in shared and "-p" not in shared and not any(a.startswith("--gres") for a in shared)
    with pytest.raises(InputError, match="nodes: 0 is invalid"):
        AllocationRequest(nodes=0)
    with pytest.raises(InputError, match="time limit: 0 min is invalid: use 1 to 525600 minutes"):
        AllocationRequest(time_limit_min=0)
    with pytest.raises(InputError, match=r"partition: 'gpu; rm -rf /' is invalid"):
        AllocationRequest(partition="gpu; rm -rf /")


# What Slurm 22.05's clients print (seen on the test cluster), and what orch makes of it.
MUNGE_DOWN = (
    "salloc: error: If munged is up, restart with --num-threads=10\n"
    'salloc: error: Munge encode failed: Failed to access "/run/munge/munge.socket.2": No such file or directory\n'
    "salloc: error: Job submit/allocate failed: Protocol authentication error\n"
)


@pytest.mark.parametrize(
    ("stderr", "kind", "message"),
    [
        (
            "salloc: error: invalid partition specified: nope\n"
            "salloc: error: Job submit/allocate failed: Invalid partition name specified\n",
            SlurmInputError,
            "Slurm has no partition 'nope' (salloc: error: invalid partition specified: nope; ",
        ),
        (
            "salloc: error: Job submit/allocate failed: Requested node configuration is not available\n",
            SlurmInputError,
            "no node of the partition can ever satisfy 1 node(s) with GRES 'gpu:9' in partition 'nope'",
        ),
        ("salloc: error: Invalid generic resource (gres) specification\n", SlurmInputError, "refused GRES 'gpu:9'"),
        (MUNGE_DOWN, SlurmError, "Slurm could not authenticate `salloc` through munge"),
        (
            "squeue: error: fetch_config: DNS SRV lookup failed\n"
            "squeue: fatal: Could not establish a configuration source\n",
            SlurmError,
            "found no Slurm configuration",
        ),
        (
            "salloc: error: mpi/pmix_v4: init: (null) [0]: mpi_pmix.c:195: pmi/pmix: can not load PMIx library\n"
            "salloc: error: something new\n",
            SlurmError,
            "`salloc` failed (exit 1): salloc: error: something new",
        ),
    ],
)
def test_slurms_errors_become_clear_orch_errors(stderr: str, kind: type[SlurmError], message: str) -> None:
    err = slurm_cli.failure("salloc", 1, stderr, AllocationRequest(partition="nope", gres="gpu:9"))
    assert type(err) is kind and isinstance(err, HostError)
    assert message in str(err)
    assert isinstance(err, InputError) == (kind is SlurmInputError)  # exit 2 for a bad request


def test_no_slurm_on_path_and_a_missing_config_fail_before_running_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SlurmError, match="Slurm's `squeue` is not on PATH: run orch on a machine that can submit"):
        Slurm().argv("squeue")
    fake = tmp_path / "squeue"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    with pytest.raises(SlurmError, match=rf"SLURM_CONF={tmp_path}/none.conf does not exist"):
        Slurm(conf=str(tmp_path / "none.conf")).argv("squeue")
    assert Slurm(conf="/x.conf").env({"A": "1"}) == {"A": "1", "SLURM_CONF": "/x.conf"}


def test_a_job_state_says_what_happened() -> None:
    assert JobState("7", "PENDING", "Resources").describe() == "allocation 7 is PENDING, reason Resources"
    assert JobState("7", "RUNNING", "None").describe() == "allocation 7 is RUNNING"
    timeout = JobState("7", "TIMEOUT", "TimeLimit")
    assert not timeout.live and timeout.describe() == "allocation 7 was ended by Slurm at its time limit (TIMEOUT)"
    assert JobState("7", "WEIRD", "").describe() == "allocation 7 ended (WEIRD)"


def test_a_plan_longer_than_the_slurm_time_limit_is_warned_about_before_asking(tmp_path: Path) -> None:
    from orchestrator.config.plan import Plan
    from orchestrator.experiment.run import time_limit_warning

    def plan(seconds: float, calibrated: bool = True) -> Plan:
        return Plan(
            launches=2,
            runs_per_launch=3,
            requests_per_launch=3,
            output_tokens_per_launch=300,
            prompt_token_ids_per_launch=0,
            seconds=seconds,
            calibrated=calibrated,
        )

    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  h100: {scheduler: slurm, time_limit_min: 5}\n  box: {address: 10.0.0.1}\n")
    said = time_limit_warning(plan(301), "h100", str(inventory))
    assert said is not None and said.startswith("the plan takes about 5 min")
    assert f"the 5 min time limit orch asks Slurm for (time_limit_min of h100 in {inventory})" in said
    assert said.endswith("`orch ab --resume ID` continues in a new allocation")
    said = time_limit_warning(
        Plan(
            launches=1,
            runs_per_launch=3,
            requests_per_launch=3,
            output_tokens_per_launch=300,
            prompt_token_ids_per_launch=0,
            seconds=301,
            calibrated=True,
        ),
        "h100",
        str(inventory),
    )
    assert said is not None and said.endswith("so there would be no result: raise the time limit, or lower --runs")
    assert time_limit_warning(plan(300), "h100", str(inventory)) is None  # fits exactly
    assert time_limit_warning(plan(10_000), "box", str(inventory)) is None  # not Slurm: no limit
    said = time_limit_warning(plan(3601, calibrated=False), "slurm:gpu", str(inventory))
    assert said is not None and "at least 60 min" in said and "the default; set" in said
    assert time_limit_warning(plan(3601), "slurm:gpu", str(tmp_path / "missing.yaml")) is None  # said when opened


def test_a_slurm_experiment_may_resume_on_another_slurm_host_of_its_partition(tmp_path: Path) -> None:
    from orchestrator.experiment.resume import same_slurm_partition

    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(
        "hosts:\n  long: {scheduler: slurm, partition: gpu, time_limit_min: 600}\n"
        "  other: {scheduler: slurm, partition: cpu}\n  box: {address: 10.0.0.1}\n"
    )
    inv = str(inventory)
    assert same_slurm_partition("slurm:gpu", "long", inv)  # more time, same partition
    assert same_slurm_partition("long", "slurm:gpu", inv)
    assert not same_slurm_partition("slurm:gpu", "other", inv)  # another partition: other nodes, other GPUs
    assert not same_slurm_partition("slurm:gpu", "box", inv) and not same_slurm_partition("box", "local", inv)
    assert not same_slurm_partition("slurm:gpu", "long", str(tmp_path / "missing.yaml"))


def test_a_groups_slurm_node_logs_its_lines_and_its_phases_reach_the_view(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def queued(config: HostConfig, *, accept_new_host_key: bool, events: Any) -> Any:
        events.line(f"{config.name}: allocation 12 is queued")
        events.phase("slurm queue", job="12")
        raise HostError("not granted")

    monkeypatch.setattr("orchestrator.hosts.open_host", queued)
    lines: list[str] = []
    phases: list[tuple[str, dict[str, Any]]] = []
    view = Lines(lines.append, lambda name, **info: phases.append((name, info)))
    group = HostGroup(name="pair", nodes=("a", "b"))
    hosts = {n: HostConfig(name=n, scheduler="slurm") for n in group.nodes}
    with caplog.at_level(logging.WARNING, "orch.slurm"), pytest.raises(HostError, match="not granted"):
        open_group(group, hosts, workdir=None, accept_new_host_key=False, events=view)
    # The line is logged, as a group's node has always done; only the phase goes to the view.
    assert lines == [] and phases == [("slurm queue", {"job": "12"})]
    assert [r.getMessage() for r in caplog.records if r.name == "orch.slurm"] == ["a: allocation 12 is queued"]
