"""The resume policy: what `--resume` may change, what it takes from the experiment, and what it refuses."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from orchestrator.config import workload
from orchestrator.config.design import bench_config_from
from orchestrator.config.options import OptionError, RunOptions
from orchestrator.config.profile import Profile
from orchestrator.config.slo import stored_judgement
from orchestrator.config.workload import BenchConfig
from orchestrator.errors import OrchError
from orchestrator.hosts.base import HostConfig
from orchestrator.hosts.inventory import lookup
from orchestrator.launch import ports

# What a resumed experiment takes from its stored record (option name → its flag): giving any of these with --resume
# is refused, and a bundle refuses them all but --blocks. (--sim is allowed where the experiment was simulated.)
FIXED_OPTIONS = {
    "sim": "--sim",
    "runs": "--runs",
    "warmup": "--warmup",
    "max_tokens": "--max-tokens",
    "seed": "--seed",
    "concurrency": "--concurrency",
    "requests_per_stream": "--requests-per-stream",
    "endpoint": "--endpoint",
    "prompt_source": "--prompts/--dataset",
    "input_len": "--input-len",
    "turns": "--turns",
    "client_place": "--client",
    "min_run_s": "--min-run-s",
    "blocks": "--blocks",
    "max_blocks": "--max-blocks",
    "order": "--order",
    "order_seed": "--order-seed",
    "strict_env": "--strict-env",
    "attach": "--attach",
    "allow_mixed": "--allow-mixed",
    # What the verdicts are on: --blocks auto's looks decided when to stop by them, so a resume keeps them.
    "slo": "--slo",
    "metric": "--metric",
    # open loop: the levels and their schedules (the schedules are part of the request sequence and its digest)
    "rate": "--rate",
    "arrivals": "--arrivals",
    "duration": "--duration",
    "requests_per_level": "--requests",
    "max_concurrency": "--max-concurrency",
    "sweep": "--sweep",
    "stop_oversaturated": "--stop-oversaturated",
    # trace replay: the trace (recorded by path and sha256) is the schedule, prompts and output lengths
    "trace": "--trace",
    "speed": "--speed",
    # Kept outputs in some launches and not in others would leave the lossless check with holes.
    "check_outputs": "--check-outputs",
    # An emptied cache before every run changes what the requests measure; whether a cache gap holds back verdicts
    # is the experiment's own judgement.
    "flush_cache": "--flush-cache",
    "cache_measured": "--cache-measured",
}

# How long to wait for a hung server is not part of what is measured: a resume may change it (option → BenchConfig).
CHANGEABLE_TIMEOUTS = {"stall_timeout": "stall_timeout_s", "first_token_timeout": "first_token_timeout_s"}


def fixed_given(options: RunOptions, simulated: bool, *, but: Sequence[str] = ()) -> list[str]:
    """The flags given that the experiment (or bundle) fixes."""
    return [
        flag
        for name, flag in FIXED_OPTIONS.items()
        if name not in but and options.gave(name) and not (name == "sim" and simulated)
    ]


def refuse_fixed(exp: dict[str, Any], options: RunOptions) -> None:
    passed = fixed_given(options, bool(exp["simulated"]))
    if passed:
        raise OptionError(
            f"--resume continues experiment {exp['id']} with its own settings; drop {', '.join(passed)} (or start a "
            "new experiment)"
        )


def check_arms(exp_id: str, arms: list[str], profiles: Sequence[Profile]) -> None:
    """Profiles given with --resume must be the experiment's own, in its order."""
    if [p.name for p in profiles] != arms:
        raise OptionError(
            f"experiment {exp_id} compares {' '.join(arms)}; give no profiles with --resume (or exactly those)"
        )


def same_slurm_partition(before: str, after: str, inventory: str | None) -> bool:
    """Both --host values allocate nodes from one pool, as Slurm hosts of one partition (so a resume may move from
    one to the other)."""
    try:
        a, b = lookup(before, inventory)[0], lookup(after, inventory)[0]
    except OrchError:
        return False
    if not (isinstance(a, HostConfig) and isinstance(b, HostConfig)):
        return False
    return a.allocation_pool is not None and a.allocation_pool == b.allocation_pool


def resumed_host(exp: dict[str, Any], stored: dict[str, Any], options: RunOptions) -> str:
    """Where the experiment resumes: where it ran, or another Slurm host of the same partition."""
    host_spec: str = stored.get("host_spec", exp["host"])
    if options.gave("host_spec") and options.host_spec != host_spec:
        if not same_slurm_partition(host_spec, options.host_spec, options.inventory):
            raise OptionError(
                f"experiment {exp['id']} ran on {host_spec!r}; it must be resumed there, not on {options.host_spec!r} "
                "(a Slurm experiment may resume on another Slurm host of the same partition, e.g. an inventory "
                "entry with a longer time_limit_min)"
            )
        host_spec = options.host_spec  # a new allocation lands on whatever nodes Slurm gives: the partition is the host
    return host_spec


def resumed_port(exp: dict[str, Any], stored: dict[str, Any], options: RunOptions) -> int | None:
    """The port the experiment was given stays its port, unless this session gives another (a port moves no number)."""
    return options.port if options.gave("port") else ports.recorded(stored, f"experiment {exp['id']}")


def resumed_bench(stored_bench: BenchConfig, options: RunOptions) -> BenchConfig:
    """The experiment's workload, with the timeouts this session gives."""
    changes = {name: getattr(options, option) for option, name in CHANGEABLE_TIMEOUTS.items() if options.gave(option)}
    return dataclasses.replace(stored_bench, **changes)


def resumed_options(exp: dict[str, Any], stored: dict[str, Any], options: RunOptions) -> RunOptions:
    """The rest of what the experiment fixes: its workdir (its logs, and the launches' log paths stored with it, live
    there), the env check and attached-arm rules it ran under; --min-effect and --target-tps judge, so a resume may
    give others."""
    if options.gave("workdir") and stored.get("workdir") and options.workdir != stored["workdir"]:
        raise OptionError(f"experiment {exp['id']} used --workdir {stored['workdir']}; resume it with that one")
    slo, metric = stored_judgement(stored, f"experiment {exp['id']}")
    return options.replace(
        slo=slo,
        metric=metric,
        sim=bool(exp["simulated"]),
        strict_env=bool(stored.get("strict_env")),
        allow_mixed=bool(stored.get("allow_mixed")),
        cache_measured=bool(stored.get("cache_measured")),
        workdir=stored.get("workdir") or options.workdir,
        min_effect=(
            float(stored["min_effect"])
            if not options.gave("min_effect") and "min_effect" in stored
            else options.min_effect
        ),
        target_tps=(
            float(stored["target_tps"])
            if not options.gave("target_tps") and stored.get("target_tps") is not None
            else options.target_tps
        ),
    )


def resumed_sweep(exp: dict[str, Any], stored: dict[str, Any], options: RunOptions) -> tuple[RunOptions, BenchConfig]:
    """A sweep resumed from its probe: the options and workload it was started with (stored with the probe), so that
    its rate levels run as they would have; --min-effect and --target-tps as for any resume."""
    asked = stored.get("sweep_probe")
    if not isinstance(asked, dict):
        raise OrchError(
            f"experiment {exp['id']} is the probe of a --sweep auto run stored by an older orch, without the sweep's "
            "settings: resuming it would finish the probe and never run its rate levels; start the sweep again "
            "(orch ab ... --sweep auto)"
        )
    where = f"experiment {exp['id']}'s sweep"
    slo, metric = stored_judgement(asked, where)
    bench = resumed_bench(bench_config_from(asked["bench"]), options)
    return (
        options.replace(
            sweep=int(asked["levels"]),
            arrivals=str(asked["arrivals"]),
            duration=asked.get("duration_s"),
            requests_per_level=asked.get("requests_per_level"),
            max_concurrency=asked.get("max_concurrency"),
            blocks=asked["blocks"],
            max_blocks=asked.get("max_blocks"),
            order=str(asked["order"]),
            order_seed=asked.get("order_seed"),
            slo=slo,
            metric=metric,
            min_effect=options.min_effect if options.gave("min_effect") else float(asked["min_effect"]),
            target_tps=options.target_tps if options.gave("target_tps") else asked.get("target_tps"),
            cache_measured=bool(asked.get("cache_measured")),
        ),
        bench,
    )


def comparable_profile(profile: Profile, redaction_key: bytes | None = None) -> dict[str, Any]:
    """What must not change between the sessions of one resumed experiment (where the file lives may)."""
    d = profile.to_dict(redaction_key=redaction_key)
    for key in ("source", "description"):
        d.pop(key, None)
    return d


def requests_digest(bench: BenchConfig) -> str:
    """A fingerprint of every request the workload sends (an edited prompts file changes it)."""
    return workload.requests_digest(bench)


def check_not_running(exp: dict[str, Any]) -> None:
    """A running experiment belongs to the orch that runs it: a second session resuming it (from another namespace,
    which the host lock does not exclude) would run its launches again. The store has marked it interrupted already
    if its owner ran on this machine and is gone; a running one is refused, naming its owner. One without a recorded
    owner (an older orch's, which cannot be running on this store now) may still be resumed."""
    try:
        owner = json.loads(exp.get("owner_json") or "null")
    except ValueError:
        owner = None
    if exp["status"] != "running" or not isinstance(owner, dict):
        return
    import socket

    pid, host = owner.get("pid"), owner.get("host")
    here = socket.gethostname()
    if host == here:
        raise OrchError(
            f"experiment {exp['id']} is running: orch PID {pid} on this machine ({host}) owns it, and a second "
            f"session would run its launches again; wait for it to end, or stop it (Ctrl-C where it runs, or "
            f"`kill -INT {pid}`), then resume it"
        )
    raise OrchError(
        f"experiment {exp['id']} is running: orch PID {pid} on {host} owns it, and from {here} orch cannot tell "
        f"whether that process still runs; resume it on {host} (where orch marks it interrupted if its owner is "
        "gone), or once it has ended"
    )


def check_resumable(
    exp: dict[str, Any],
    profiles: Sequence[Profile],
    bench: BenchConfig | None = None,
    *,
    redaction_key: bytes | None = None,
) -> None:
    """Refuse to resume what cannot be continued as the same experiment, or what another session runs."""
    if exp["status"] == "complete":
        raise OrchError(f"experiment {exp['id']} is already complete (`orch show {exp['id']}` prints it)")
    check_not_running(exp)
    if exp["kind"] != "ab" or not exp.get("design_json"):
        raise OrchError(f"experiment {exp['id']} was stored by an older orch without a design; it cannot be resumed")
    config = json.loads(exp["config_json"])
    stored = config.get("profiles") or []
    if len(stored) != len(profiles):
        raise OrchError(f"experiment {exp['id']} has {len(stored)} arms, not {len(profiles)}")
    for want, prof in zip(stored, profiles, strict=True):
        now = comparable_profile(prof, redaction_key)
        # Where a server listens moves no number: a resume may give another --port (its own one is taken now).
        changed = sorted(k for k in set(want) | set(now) if k != "port" and want.get(k) != now.get(k))
        if changed:
            raise OrchError(
                f"profile {prof.name!r} changed since experiment {exp['id']} started (fields: {', '.join(changed)}); "
                "a resumed experiment must run the same configuration: restore the profile or start a new experiment"
            )
    if bench is not None and config.get("requests_sha256") not in (None, requests_digest(bench)):
        raise OrchError(
            f"the requests of experiment {exp['id']} changed since it started (was the prompts file "
            f"{bench.prompts!r} edited?"
            + (" or does this orch draw its arrival schedules differently?" if bench.open_loop else "")
            + "); a resumed experiment must send the same requests"
        )


def check_same_machine(exp_id: str, before: dict[str, Any], after: dict[str, Any]) -> None:
    """A resume must run where the experiment started: launches on two machines are not one experiment."""

    def gpu_ids(facts: dict[str, Any]) -> list[Any]:
        return [g.get("uuid") for g in facts.get("gpus") or []]

    if gpu_ids(before):
        # GPU UUIDs identify the machine even where hostnames do not (a container gets a new one per run).
        if gpu_ids(before) != gpu_ids(after):
            now = gpu_ids(after) or f"none readable ({after.get('gpu_error') or 'nvidia-smi gave no GPUs'})"
            raise OrchError(
                f"experiment {exp_id} ran on GPUs {gpu_ids(before)}; this host has {now}. "
                "A resumed experiment must run on the same GPUs"
            )
    elif before.get("hostname") and before.get("hostname") != after.get("hostname"):
        raise OrchError(
            f"experiment {exp_id} ran on machine {before['hostname']!r}; this host is {after.get('hostname')!r}. "
            "A resumed experiment must run on the same machine"
        )
