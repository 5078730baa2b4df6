"""Option sets shared by commands (host, benchmark, results database) and their parsers."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from orchestrator.cli.base import MAX_TPS, FiniteFloat, Seconds, units

if TYPE_CHECKING:
    from orchestrator.config.options import RunOptions
    from orchestrator.config.slo import SLO
    from orchestrator.results.store import Store

# The benchmark's option sets import what they describe (the client's endpoints, the statistics' orders) when they
# are built, i.e. by the modules of ab, bench and reproduce: `orch list` and `orch show` need db_option alone.

# ---------------------------------------------------------------- running servers


def parse_levels(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated integers such as 1,8,32") from None
    if not levels or any(n < 1 or n > 4096 for n in levels) or len(set(levels)) != len(levels):
        raise click.BadParameter(f"{value!r}: expected distinct integers from 1 to 4096")
    return levels


def parse_rates(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[float, ...]:
    """--rate R[,R...]: distinct request rates (per second), each a level."""
    from orchestrator.config import arrivals

    if value is None:
        return ()
    expected = (
        f"expected up to {arrivals.MAX_LEVELS} distinct comma-separated request rates per second above 0 and at most "
        f"{arrivals.MAX_RATE:g}, such as 1,2,4,8 or 0.5"
    )
    pieces = [v.strip() for v in value.split(",")]
    if any(not v for v in pieces) and len(pieces) > 1:
        raise click.BadParameter(f"{value!r} has an empty piece between commas; {expected}")
    try:
        rates = tuple(float(v) for v in pieces if v)
    except ValueError:
        raise click.BadParameter(f"{value!r}: {expected}") from None
    twice = sorted({f"{r:g}" for r in rates if rates.count(r) > 1})
    if twice:
        raise click.BadParameter(f"{value!r}: {', '.join(twice)} given twice; {expected}")
    if (
        not rates
        or len(rates) > arrivals.MAX_LEVELS
        or not all(math.isfinite(r) and 0 < r <= arrivals.MAX_RATE for r in rates)
    ):
        raise click.BadParameter(f"{value!r}: {expected}")
    return rates


def parse_sweep(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """--sweep auto[:N] → N rate levels."""
    if value is None:
        return None
    from orchestrator.config import sweep

    try:
        return sweep.parse(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def parse_arrivals(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from orchestrator.config import arrivals

    try:
        kind, cv = arrivals.parse(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    return f"gamma:{cv:g}" if kind == "gamma" else kind


def parse_effect(ctx: click.Context, param: click.Parameter, value: str) -> float:
    text = str(value).strip()
    try:
        effect = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected a percentage such as 2% or a fraction such as 0.02") from None
    if not 0 < effect < 0.5:
        raise click.BadParameter(f"{value!r}: expected more than 0% and less than 50%")
    return effect


HOST_HELP = (
    "local, a name from hosts.yaml (a host, a `scheduler: slurm` entry, or a group of hosts for multi-node profiles), "
    "slurm:PARTITION (an allocation there; slurm: for the cluster's default partition), or user@address[:port] "
    "(ssh_config aliases work)."
)


def host_options() -> list[Callable[..., Any]]:
    return [
        click.option(
            "--inventory",
            type=click.Path(dir_okay=False),
            default=None,
            help="Host inventory file [default: ./hosts.yaml, then the user config dir; or $ORCH_HOSTS].",
        ),
        click.option(
            "--accept-new-host-key",
            is_flag=True,
            help="Trust and remember an unknown SSH host key (like OpenSSH's accept-new). A changed key is "
            "always refused.",
        ),
    ]


def with_host_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--host and its inventory options for `orch status` and `orch down` (a group or multi-node host: every node)."""
    host = click.option("--host", "host_spec", default="local", show_default=True, help=HOST_HELP)
    for opt in reversed([host, *host_options()]):
        fn = opt(fn)
    return fn


def parse_blocks(ctx: click.Context, param: click.Parameter, value: str | int) -> int | str:
    text = str(value).strip().lower()
    if text == "auto":
        return "auto"
    try:
        blocks = int(text)
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected auto or a whole number of blocks from 1 to 1000") from None
    if not 1 <= blocks <= 1000:
        raise click.BadParameter(f"{value!r}: expected auto or a whole number of blocks from 1 to 1000")
    return blocks


def blocks_options(auto: bool) -> list[Callable[..., Any]]:
    """--blocks N for every command; `auto` (the default of `orch ab`) and --max-blocks where there is a verdict."""
    from orchestrator.stats import sequential

    if not auto:
        return [
            click.option(
                "--blocks",
                default=1,
                show_default=True,
                type=click.IntRange(1, 1000),
                help="Launches per arm: each block launches every arm once.",
            )
        ]
    return [
        click.option(
            "--blocks",
            default="auto",
            show_default=True,
            callback=parse_blocks,
            metavar="auto|N",
            help=f"Launches per arm: each block launches every arm once. auto: {sequential.DEFAULT_MIN_BLOCKS} blocks, "
            "then one more until every comparison is decided (faster, slower or no difference) or --max-blocks; "
            "group-sequential CIs keep the error rates honest (docs/statistics.md). N: exactly N blocks (1 gives "
            "no verdict).",
        ),
        click.option(
            "--max-blocks",
            default=sequential.DEFAULT_MAX_BLOCKS,
            show_default=True,
            type=click.IntRange(sequential.DEFAULT_MIN_BLOCKS, sequential.MAX_MAX_BLOCKS),
            help="With --blocks auto: the most blocks it may run.",
        ),
    ]


def bench_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options of `orch ab` (--blocks auto by default)."""
    return _bench_options(fn, auto=True)


def fixed_bench_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options of `orch bench` and `orch reproduce`: a fixed number of blocks (nothing to decide between arms)."""
    return _bench_options(fn, auto=False)


def _bench_options(fn: Callable[..., Any], *, auto: bool) -> Callable[..., Any]:
    from orchestrator import engines
    from orchestrator.client.request import ENDPOINT_NAMES
    from orchestrator.config.plan import MAX_OUTPUT_TOKENS_PER_LAUNCH, MAX_REQUESTS_PER_LAUNCH
    from orchestrator.config.workload import CLIENT_PLACES
    from orchestrator.stats import estimates

    options = [
        click.option(
            "--host",
            "host_spec",
            default="local",
            show_default=True,
            help=HOST_HELP,
        ),
        click.option(
            "--sim",
            is_flag=True,
            help=f"Run orch's simulator of the profile's engine ({' or '.join(engines.simulated())}: same flags and "
            "endpoints) instead of the real server.",
        ),
        click.option(
            "--runs",
            default=5,
            show_default=True,
            type=click.IntRange(1, 10000),
            help=f"Timed runs per level (concurrency or rate). A launch may send at most {MAX_REQUESTS_PER_LAUNCH:,} "
            f"requests and {MAX_OUTPUT_TOKENS_PER_LAUNCH:,} output tokens; the plan is printed before anything starts.",
        ),
        click.option("--warmup", default=2, show_default=True, type=click.IntRange(0, 1000), help="Warmup runs."),
        click.option(
            "--max-tokens",
            default=2048,
            show_default=True,
            type=click.IntRange(1, 1_000_000),
            help="Output tokens per timed run (ignore_eos, so every run yields exactly this many).",
        ),
        click.option(
            "--seed",
            default=0,
            show_default=True,
            type=int,
            help="Seed of the request sequence (identical for every arm).",
        ),
        click.option(
            "--concurrency",
            default="1",
            show_default=True,
            callback=parse_levels,
            help="Comma-separated concurrency levels, e.g. 1,8,32: streams kept busy during a run.",
        ),
        click.option(
            "--requests-per-stream",
            default=1,
            show_default=True,
            type=click.IntRange(1, 10000),
            help="A run at concurrency c sends c x this many requests. Default 1; for a dataset, enough that a run "
            "at the lowest level sends the whole dataset (up to 100 prompts), fewer send a seeded subset covering "
            "every category.",
        ),
        *open_loop_options(),
        click.option(
            "--endpoint",
            default=None,
            type=click.Choice(list(ENDPOINT_NAMES)),
            help=engines.endpoint_help(),
        ),
        click.option(
            "--prompts",
            "--dataset",
            "prompt_source",
            default="builtin",
            show_default=True,
            help="builtin (varied task mix), random (token ids, see --input-len), lookup-friendly (text to copy: "
            "code edits, repetition), lookup-hostile (counting: n-gram matches propose wrong continuations), "
            "humaneval (164 code prompts) and mt-bench (80 questions in 8 categories), shipped with orch, or a "
            "file: JSONL (prompt or messages; optional category, output_len), ShareGPT .json (first human turn) "
            "or .csv (prompt column; optional category, output_len). shared-prefix:GROUPSxPER_GROUP[:SYSTEM_LEN:"
            "QUESTION_LEN] generates GROUPS system prompts of random token ids, each followed by PER_GROUP questions "
            "(SGLang's generated-shared-prefix; lengths default to 2048 and 128 tokens; each group a category), "
            "from --seed. --dataset is the same option; results break down by category, or by prompt for a set of "
            "at most 20 prompts (docs/data.md).",
        ),
        click.option(
            "--turns",
            type=click.IntRange(2, 100),
            default=None,
            metavar="N",
            help="Multi-turn sessions: each conversation of the dataset (ShareGPT .json, JSONL with messages, or "
            "mt-bench) with at least N user turns is a session of its first N; turn k sends the whole conversation so "
            "far, the assistant messages being the server's own replies to earlier turns (not the dataset's). A "
            "stream runs one session's turns in order, then the next session: a run at concurrency c runs c x "
            "--requests-per-stream sessions (c x that x N requests). Closed loop only; reports add TTFT and prefix "
            "cache by turn (docs/data.md#multi-turn-sessions).",
        ),
        click.option(
            "--input-len",
            type=click.IntRange(1, 1_000_000),
            default=None,
            help="Prompt length in tokens for --prompts random [default: 128].",
        ),
        click.option(
            "--client",
            "client_place",
            default="host",
            show_default=True,
            type=click.Choice(list(CLIENT_PLACES)),
            help="Run the benchmark client on the host next to the server, or on this machine.",
        ),
        click.option(
            "--target-tps",
            type=FiniteFloat(min=0, max=MAX_TPS, min_open=True),
            default=None,
            help="With a speculative arm: also say what accept length reaching this tok/s would need.",
        ),
        *blocks_options(auto),
        click.option(
            "--order",
            default="random",
            show_default=True,
            type=click.Choice(list(estimates.ORDERS)),
            help="Launch order within blocks: seeded random (recorded), fixed, or abba (alternating).",
        ),
        click.option(
            "--order-seed",
            type=click.IntRange(0, 2**31 - 1),
            default=None,
            help="Seed of the random launch order [default: drawn, then recorded with the experiment].",
        ),
        click.option(
            "--min-effect",
            default="2%",
            show_default=True,
            callback=parse_effect,
            help="The smallest difference worth calling, e.g. 2% or 0.02: a CI inside ± this is 'no difference'.",
        ),
        click.option(
            "--min-run-s",
            default=1.0,
            show_default=True,
            type=Seconds(0, 86400),
            help="A timed run shorter than this is invalid and excluded from statistics" + units(0, 86400),
        ),
        click.option(
            "--stall-timeout",
            "stall_timeout",
            default=60.0,
            show_default=True,
            type=Seconds(0.5, 86400),
            help="A request with no new token for this long fails, and the run is not repeated against a server that "
            "is not healthy" + units(0.5, 86400),
        ),
        click.option(
            "--first-token-timeout",
            "first_token_timeout",
            default=180.0,
            show_default=True,
            type=Seconds(0.5, 86400),
            help="A request with no first token within this long fails" + units(0.5, 86400),
        ),
        click.option(
            "--ready-timeout",
            type=Seconds(1, 86400),
            default=None,
            help="How long to wait for readiness" + units(1, 86400)[:-1] + " [default: the profile's ready_timeout_s].",
        ),
        click.option(
            "--grace",
            default=10.0,
            show_default=True,
            type=Seconds(0, 600),
            help="Time between SIGTERM and SIGKILL at teardown" + units(0, 600),
        ),
        click.option("--strict-env", is_flag=True, help="Fail an arm whose workers did not get the profile's env."),
        click.option(
            "--db",
            type=DbPath(),
            default=None,
            help="SQLite results file [default: the user data dir].",
        ),
        click.option(
            "--workdir",
            default=None,
            help="Where logs go on the host [default: the host's workdir in hosts.yaml, else the user state dir on "
            "this machine and ~/.orch on SSH and Slurm hosts].",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout (progress → stderr)."),
        click.option(
            "--wait",
            "lock_wait",
            default=0.0,
            type=Seconds(0, 86400),
            help="How long to queue behind another orch session holding the host"
            + units(0, 86400)[:-1]
            + " [default: don't "
            "wait].",
        ),
        click.option(
            "--port",
            type=click.IntRange(1, 65535),
            default=None,
            help="Launch every server on this port instead of its profile's own (on a shared box: one nobody else "
            "uses). Recorded with the experiment: resuming or reproducing it uses it again unless given another. "
            "Refused (exit 2) on a privileged port (below 1024) of this machine unless root, on an attached arm's "
            "port, or where a multi-node profile's node ranks (port + i x port_stride) would pass 65535.",
        ),
        click.option(
            "--force",
            is_flag=True,
            help="Kill a foreign process holding the profile's port, if the host's policy is kill-with-force.",
        ),
        click.option(
            "--allow-node-mismatch",
            is_flag=True,
            help="For a multi-node launch (--host naming an inventory group, or a Slurm host with a profile of "
            "nnodes > 1): launch even if its nodes differ in GPU model, GPU driver or engine package versions "
            "(refused otherwise, exit 1); the experiment records the differences and its reports show them.",
        ),
        click.option(
            "--gpu-wait",
            default=120.0,
            show_default=True,
            type=Seconds(0, 3600),
            help="After teardown, how long to wait for GPU memory to return to idle" + units(0, 3600),
        ),
        *host_options(),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def parse_slo_option(ctx: click.Context, param: click.Parameter, value: str | None) -> SLO | None:
    from orchestrator.config.slo import parse_slo
    from orchestrator.errors import InputError

    if value is None:
        return None
    try:
        return parse_slo(value, where="")
    except InputError as e:
        raise click.BadParameter(str(e)) from None


def parse_metric_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from orchestrator.config.slo import parse_metric
    from orchestrator.errors import InputError

    if value is None:
        return None
    try:
        return parse_metric(value, where="")
    except InputError as e:
        raise click.BadParameter(str(e)) from None


def slo_help() -> str:
    """--slo's help, its quantities and percentiles from the registry (config/slo.QUANTITIES)."""
    from orchestrator.config.slo import PERCENTILES, QUANTITIES

    return (
        f"Service-level objectives, e.g. ttft_p99=500ms,tpot_p99=50ms,e2e_p99=10s (any of {', '.join(QUANTITIES)}, "
        f"each with an optional {'/'.join(f'_p{p}' for p in PERCENTILES)}; each limit a duration from 1ms to 1d with "
        "its unit: 500ms, 2s, 1m30s; never a bare number, which vLLM's --goodput reads as milliseconds and orch's "
        "other options as seconds). A request is good when it completed within every limit (as vLLM's --goodput "
        "counts); "
        "goodput = good requests (and their output tokens) per second of the run, reported per arm and level with the "
        "share of requests within the SLO, and whether each arm's pNN met its limit."
    )


def metric_help() -> str:
    """--metric's help, its latency percentiles and any metric registered beside the built-in ones from the registry
    (config/slo.METRICS)."""
    from orchestrator.config.slo import METRICS, PERCENTILES, QUANTITIES, STORED_PERCENTILES

    first, *rest = QUANTITIES
    latencies = ", ".join([f"{first}_p{PERCENTILES[0]}..p{PERCENTILES[-1]}", *(f"{q}_pNN" for q in rest)])
    latencies += f" with {'/'.join(f'p{p}' for p in PERCENTILES)}"
    for name, (_, stored) in STORED_PERCENTILES.items():
        latencies += f"; {name}_{'/'.join(f'p{p}' for p in stored)}"
    own = [f"{s.name} ({s.label})" for s in METRICS.values() if s.value is not None]
    return (
        "What the verdict (faster/slower, its CI, --fail-on slower, --blocks auto's stopping) is on: tok_s (per-stream "
        "tok/s, the default), aggregate_tok_s, goodput or goodput_tok_s (need --slo), "
        + (f"{', '.join(own)}, " if own else "")
        + f"or a latency percentile ({latencies}), where lower is better: the ratio is arm / baseline as always, and a "
        "ratio below 1 is faster."
    )


def judgement_options(*, default_metric: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--slo and --metric: of `orch ab` and `orch bench` (recorded with the experiment), and of `orch show` (judge a
    stored experiment on others; default_metric False: the experiment's own when not given)."""
    from orchestrator.config.slo import DEFAULT_METRIC

    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn = click.option(
            "--metric",
            default=DEFAULT_METRIC if default_metric else None,
            show_default=default_metric,
            callback=parse_metric_option,
            metavar="NAME",
            help=metric_help() if default_metric else metric_help() + " [default: the experiment's own]",
        )(fn)
        return click.option(
            "--slo",
            default=None,
            callback=parse_slo_option,
            metavar="OBJECTIVES",
            help=slo_help() if default_metric else slo_help() + " [default: the experiment's own]",
        )(fn)

    return add


def open_loop_options() -> list[Callable[..., Any]]:
    """--rate and the options of open-loop levels (docs/load.md#open-loop-arrivals)."""
    from orchestrator.config.limits import DURATION_S
    from orchestrator.config.workload import DEFAULT_DURATION_S

    return [
        click.option(
            "--rate",
            default=None,
            callback=parse_rates,
            metavar="R[,R...]",
            help="Open loop: comma-separated request rates per second, e.g. 1,2,4,8, each a level (instead of "
            "--concurrency, which it excludes). Requests are sent at scheduled times whatever the server does, and "
            "TTFT and end-to-end latency count from the scheduled time. Every arm and launch gets the same "
            "schedule (from --seed).",
        ),
        click.option(
            "--arrivals",
            default="poisson",
            show_default=True,
            callback=parse_arrivals,
            metavar="poisson|gamma:CV|constant",
            help="With --rate or --sweep: the gaps between requests. gamma:CV has that coefficient of variation "
            "(gamma:1 is Poisson, above 1 burstier, below steadier; vLLM's --burstiness is 1/CV^2); constant: exactly "
            "1/R apart.",
        ),
        click.option(
            "--duration",
            "duration",
            default=None,
            type=Seconds(*DURATION_S),
            help="With --rate or --sweep: how long each run's arrivals last at each rate"
            + units(*DURATION_S)[:-1]
            + f" [default: {DEFAULT_DURATION_S:g}s unless --requests is given].",
        ),
        click.option(
            "--requests",
            "requests_per_level",
            default=None,
            type=click.IntRange(1, 100_000),
            metavar="N",
            help="With --rate or --sweep: requests per run at each rate (instead of --duration).",
        ),
        click.option(
            "--max-concurrency",
            default=None,
            type=click.IntRange(1, 100_000),
            metavar="N",
            help="With --rate or --sweep: at most N requests in flight; the rest wait in the client, and their "
            "latency still counts from their scheduled time.",
        ),
        click.option(
            "--sweep",
            default=None,
            callback=parse_sweep,
            metavar="auto[:N]",
            help="Open loop at rates found for you (instead of --rate): a probe launch per arm measures its "
            "synchronous rate (concurrency 1) and its saturated rate (32 streams, or --max-concurrency if lower), "
            "then N rates [default: 5] from the lowest to the highest run as --rate levels, each stopping when the "
            "server is over-saturated; when no arm saturates above its synchronous rate (e.g. --max-concurrency 1) "
            "there is no range: one level, and the output says so. The probe is stored as an experiment of its own "
            "(docs/load.md#sweeps).",
        ),
        click.option(
            "--stop-oversaturated",
            is_flag=True,
            help="With --rate: a run stops sending once the server falls behind for good (the backlog grows with "
            "time), or the backlog waiting in the client does (held by --max-concurrency: client-limited); the "
            "requests sent are measured, the rest left out (always on with --sweep auto).",
        ),
        click.option(
            "--trace",
            default=None,
            metavar="FILE.jsonl",
            help="Replay a Mooncake-format trace as one open-loop level (instead of --rate): a JSON object per line "
            "with timestamp (ms from the start), input_length, output_length and hash_ids (each a block of 512 prompt "
            "tokens shared by the requests naming it). Every timed run sends each request at timestamp/--speed with "
            "token-id prompts that share their hash_ids' blocks, asking for output_length tokens (capped by "
            "--max-tokens); --requests N replays the first N. The level is named by its mean rate; the trace's sha256 "
            "is recorded (docs/data.md#trace-replay).",
        ),
        click.option(
            "--speed",
            default=1.0,
            type=float,
            metavar="X",
            help="With --trace: replay X times as fast (2: every gap halved) [default: 1].",
        ),
    ]


def verbosity_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """-q and -v of `orch ab` and `orch bench`."""
    fn = click.option(
        "-v",
        "--verbose",
        is_flag=True,
        help="Also print every request of every run (tokens, TTFT, end-to-end time, accept length, error).",
    )(fn)
    return click.option(
        "-q",
        "--quiet",
        is_flag=True,
        help="Print only the verdict (each comparison's line, warnings, --fail-on's decision) and errors; no progress.",
    )(fn)


def run_options(ctx: click.Context, command: str) -> RunOptions:
    """The run command's options as one typed object, built once here; `given`: the options not left at their
    defaults (what --resume and a bundle refuse, or take from the experiment when absent)."""
    from orchestrator.config.options import RunOptions

    default = (None, click.core.ParameterSource.DEFAULT)
    given = [name for name in ctx.params if ctx.get_parameter_source(name) not in default]
    return RunOptions.from_params(command, ctx.params, given)


def parse_tolerance(ctx: click.Context, param: click.Parameter, value: str) -> float:
    text = str(value).strip()
    try:
        tol = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected a percentage such as 3% or a fraction such as 0.03") from None
    if not 0 < tol < 0.5:
        raise click.BadParameter(f"{value!r}: expected more than 0% and less than 50% (3% is usual)")
    return tol


class DbPath(click.Path):
    """--db's file: an empty value is refused rather than read as "not given" (`--db "$UNSET_VAR"` would otherwise
    read and write the user's default store without a word)."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail(
                f"{value!r} is empty: expected the path of an SQLite results file (leave --db out for the default "
                "store in the user data dir)",
                param,
                ctx,
            )
        return super().convert(value, param, ctx)


def db_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--db", type=DbPath(), default=None, help="SQLite results file [default: the user data dir].")(
        fn
    )


def open_existing(db: str | None) -> Store:
    """store.open_existing, imported when a command runs (the store's import is not paid by `orch --help`)."""
    from orchestrator.results import store

    return store.open_existing(db)


def read_files(db: str | None, *inputs: str) -> tuple[str, ...]:
    """The files a command reads (its results database, with SQLite's journal files, and any input files): what an
    output option must never name (files.output_target's `reading`)."""
    from orchestrator.results.store import default_path

    store = str(Path(db) if db else default_path())
    return (store, *(store + suffix for suffix in ("-wal", "-shm", "-journal")), *inputs)


def check_outputs_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """orch ab --check-outputs (results/outputs): the lossless check of speculative arms against the baseline."""
    return click.option(
        "--check-outputs",
        "check_outputs",
        is_flag=True,
        help="Keep each timed request's generated output (greedy: temperature 0 is sent) and compare every arm's with "
        "the baseline's, prompt by prompt: the share identical and the first divergence (docs/data.md#the-lossless-"
        "check). Costs the client a little CPU per chunk.",
    )(fn)


def flush_cache_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """orch ab/bench --flush-cache (engines/base.CacheFlush): every timed run starts from an empty prefix cache."""
    from orchestrator import engines

    return click.option(
        "--flush-cache",
        "flush_cache",
        is_flag=True,
        help="Empty the server's prefix cache before every timed run (after the warmups), so no run finds prompts an "
        f"earlier run left ({engines.flush_help()}; a request that fails, a 404 included, stops the experiment). "
        "Recorded with the workload (docs/data.md#prefix-cache-attestation).",
    )(fn)


def cache_measured_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """orch ab --cache-measured (results/cache): a prefix-cache gap between arms is part of what is compared."""
    return click.option(
        "--cache-measured",
        "cache_measured",
        is_flag=True,
        help="The prefix cache is part of what is measured: arms whose cache hit rates differ by more than 5 "
        "points still get their verdicts (shown with the gap) instead of 'inconclusive: prefix-cache hit rates "
        "differ'. Recorded with the experiment.",
    )(fn)
