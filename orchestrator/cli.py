"""The `orch` command line: a thin click layer over the typed core functions."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shlex
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import click
import yaml

from orchestrator import __version__, ab, client, results, stats
from orchestrator import bundle as bundle_mod
from orchestrator import profile as profiles_mod
from orchestrator import reproduce as reproduce_mod
from orchestrator.ab import ABConfig
from orchestrator.bench import (
    CLIENT_PLACES,
    MAX_OUTPUT_TOKENS_PER_LAUNCH,
    MAX_REQUESTS_PER_LAUNCH,
    BenchConfig,
    RunResult,
    assumed_speed,
    plan,
    request_items,
    sim_speed,
)
from orchestrator.compare import claim_verdict
from orchestrator.connect import resolve_host
from orchestrator.errors import InputError, OrchError, ProfileError, StoreError
from orchestrator.hosts import Host, check_host, default_namespace, inventory_paths, load_inventory
from orchestrator.redaction import redact, redact_argv
from orchestrator.report import SIM_BANNER, ab_csv, ab_json, ab_markdown, ab_text, breakeven_lines, run_line
from orchestrator.report_compare import claim_json, claim_text, compare_json, compare_markdown, compare_text
from orchestrator.store import Store
from orchestrator.store import default_path as default_db_path

EXIT_INTERRUPTED = 130
MAX_TPS = 1e7  # tok/s options: far above any server, low enough that the arithmetic cannot overflow
EXIT_USAGE = 2  # click's code for usage errors; invalid input files (InputError) get it too


class FiniteFloat(click.FloatRange):
    """A float option within a range that also refuses nan and inf (every comparison with nan is false, so a
    plain FloatRange lets `--ready-timeout nan` through, and then readiness waits forever)."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.version_option(__version__, prog_name="orch")
def cli() -> None:
    """orch: honest A/B benchmarks of LLM inference servers.

    Every arm starts from a fresh, verified server launch; the environment each worker process
    really got is read back; every run is stored the moment it finishes.
    """


# ---------------------------------------------------------------- profiles


@cli.group("profiles")
def profiles_group() -> None:
    """List, show and validate server profiles (./profiles, the user config dir, then the bundled set)."""


@profiles_group.command("list")
def profiles_list() -> None:
    """Every profile name visible from here, with where it comes from."""
    found = profiles_mod.available()
    if not found:
        click.echo("no profiles found in " + ", ".join(str(d) for d in profiles_mod.search_dirs()))
        return
    width = max(len(n) for n in found)
    for name, path in sorted(found.items()):
        try:
            desc = profiles_mod.load(str(path)).description
        except ProfileError as e:
            desc = f"INVALID: {e}"
        click.echo(f"{name.ljust(width)}  {desc}  [{path}]")


@profiles_group.command("show")
@click.argument("name")
@click.option("--sim", is_flag=True, help="Show the launch as `--sim` would run it (the simulator).")
@click.option("--python", "python", default="python3", show_default=True, help="Interpreter shown in the command.")
def profiles_show(name: str, sim: bool, python: str) -> None:
    """The resolved profile, the exact launch command line and its environment."""
    prof = profiles_mod.load(name)
    data = prof.to_dict()
    click.echo(f"# {prof.name} (from {prof.source}; extends chain: {' -> '.join(prof.chain)})")
    click.echo(yaml.safe_dump(data, sort_keys=False).rstrip())
    click.echo("\n# launch command" + (" (SIMULATOR)" if sim else ""))
    env = prof.env_dict() | (prof.sim_env() if sim else {})
    # Secret-looking values are shown as digests: this output ends up in terminals, tickets and chat.
    prefix = " ".join(f"{k}={shlex.quote(redact(k, v))}" for k, v in sorted(env.items()))
    argv = redact_argv(prof.launch_argv(python, simulate=sim))
    click.echo((prefix + " " if prefix else "") + shlex.join(argv))


@profiles_group.command("validate")
@click.argument("files", nargs=-1, required=True)
def profiles_validate(files: tuple[str, ...]) -> None:
    """Check profile files; prints one line per file and exits 2 (invalid input) if any is invalid."""
    bad = 0
    for f in files:
        try:
            prof = profiles_mod.validate_file(f)
            click.echo(f"ok      {f} ({prof.name})")
        except ProfileError as e:
            bad += 1
            click.echo(f"invalid {e}")
    if bad:
        raise SystemExit(EXIT_USAGE)


# ---------------------------------------------------------------- running servers


def _parse_levels(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated integers such as 1,8,32") from None
    if not levels or any(n < 1 or n > 4096 for n in levels) or len(set(levels)) != len(levels):
        raise click.BadParameter(f"{value!r}: expected distinct integers from 1 to 4096")
    return levels


def _parse_effect(ctx: click.Context, param: click.Parameter, value: str) -> float:
    text = str(value).strip()
    try:
        effect = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected a percentage such as 2% or a fraction such as 0.02") from None
    if not 0 < effect < 0.5:
        raise click.BadParameter(f"{value!r}: expected more than 0% and less than 50%")
    return effect


def _host_options() -> list[Callable[..., Any]]:
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


def _with_host_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed([click.option("--host", "host_spec", default="local", show_default=True), *_host_options()]):
        fn = opt(fn)
    return fn


def _bench_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option(
            "--host",
            "host_spec",
            default="local",
            show_default=True,
            help="local, a name from hosts.yaml, or user@address[:port] (ssh_config aliases work).",
        ),
        click.option("--sim", is_flag=True, help="Run orch's SGLang simulator instead of sglang.launch_server."),
        click.option(
            "--runs",
            default=5,
            show_default=True,
            type=click.IntRange(1, 10000),
            help=f"Timed runs per concurrency level. A launch may send at most {MAX_REQUESTS_PER_LAUNCH:,} requests "
            f"and {MAX_OUTPUT_TOKENS_PER_LAUNCH:,} output tokens; the plan is printed before anything starts.",
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
            callback=_parse_levels,
            help="Comma-separated concurrency levels, e.g. 1,8,32: streams kept busy during a run.",
        ),
        click.option(
            "--requests-per-stream",
            default=1,
            show_default=True,
            type=click.IntRange(1, 10000),
            help="A run at concurrency c sends c x this many requests.",
        ),
        click.option(
            "--endpoint",
            default="generate",
            show_default=True,
            type=click.Choice(list(client.ENDPOINTS)),
            help="SGLang native /generate, or OpenAI /v1/completions or /v1/chat/completions.",
        ),
        click.option(
            "--prompts",
            "prompt_source",
            default="builtin",
            show_default=True,
            help="builtin (varied task mix), random (token ids, see --input-len), or a JSONL file.",
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
        click.option(
            "--blocks",
            default=1,
            show_default=True,
            type=click.IntRange(1, 1000),
            help="Launches per arm: each block launches every arm once. One block gives no verdict; use 3 or more.",
        ),
        click.option(
            "--order",
            default="random",
            show_default=True,
            type=click.Choice(list(stats.ORDERS)),
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
            callback=_parse_effect,
            help="The smallest difference worth calling, e.g. 2% or 0.02: a CI inside ± this is 'no difference'.",
        ),
        click.option(
            "--min-run-s",
            default=1.0,
            show_default=True,
            type=FiniteFloat(0, 86400),
            help="A timed run shorter than this is invalid and excluded from statistics.",
        ),
        click.option(
            "--stall-timeout",
            "stall_timeout",
            default=60.0,
            show_default=True,
            type=FiniteFloat(0.5, 86400),
            help="A request with no new token for this many seconds fails, and the run is not repeated against "
            "a server that is not healthy.",
        ),
        click.option(
            "--first-token-timeout",
            "first_token_timeout",
            default=180.0,
            show_default=True,
            type=FiniteFloat(0.5, 86400),
            help="A request with no first token within this many seconds fails.",
        ),
        click.option(
            "--ready-timeout",
            type=FiniteFloat(1, 86400),
            default=None,
            help="Seconds to wait for readiness [default: the profile's ready_timeout_s].",
        ),
        click.option(
            "--grace",
            default=10.0,
            show_default=True,
            type=FiniteFloat(0, 600),
            help="Seconds between SIGTERM and SIGKILL at teardown.",
        ),
        click.option("--strict-env", is_flag=True, help="Fail an arm whose workers did not get the profile's env."),
        click.option(
            "--db",
            type=click.Path(dir_okay=False),
            default=None,
            help="SQLite results file [default: the user data dir].",
        ),
        click.option("--workdir", default=None, help="Where logs go on the host [default: the user state dir]."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout (progress → stderr)."),
        click.option(
            "--wait",
            "lock_wait",
            default=0.0,
            type=FiniteFloat(0, 86400),
            help="Seconds to queue behind another orch session holding the host [default: don't wait].",
        ),
        click.option(
            "--force",
            is_flag=True,
            help="Kill a foreign process holding the profile's port, if the host's policy is kill-with-force.",
        ),
        click.option(
            "--gpu-wait",
            default=120.0,
            show_default=True,
            type=FiniteFloat(0, 3600),
            help="After teardown, seconds to wait for GPU memory to return to idle.",
        ),
        *_host_options(),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


# What a resumed experiment takes from its stored record: giving any of these with --resume is an error.
MEASUREMENT_OPTIONS = (
    "sim",
    "runs",
    "warmup",
    "max_tokens",
    "seed",
    "concurrency",
    "requests_per_stream",
    "endpoint",
    "prompt_source",
    "input_len",
    "client_place",
    "min_run_s",
    "blocks",
    "order",
    "order_seed",
    "strict_env",
)


def _given(name: str) -> bool:
    ctx = click.get_current_context()
    return ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)


def _run(profile_names: tuple[str, ...], resume: str | None = None, **kw: Any) -> None:
    store = Store(kw["db"]) if resume is None else _open_existing(kw["db"])
    try:
        result = _resume(store, resume, profile_names, kw) if resume is not None else _start(store, profile_names, kw)
    finally:
        store.close()
    _print_result(result, kw["as_json"])


def _print_result(result: results.ABResult, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(ab_json(result), indent=2))
    else:
        click.echo(ab_text(result))


def _start(store: Store, profile_names: tuple[str, ...], kw: dict[str, Any]) -> results.ABResult:
    profiles = [profiles_mod.load(n) for n in profile_names]
    profiles_mod.check_distinct_names(profiles)
    bench = BenchConfig(
        runs=kw["runs"],
        warmup=kw["warmup"],
        max_tokens=kw["max_tokens"],
        seed=kw["seed"],
        concurrency=kw["concurrency"],
        requests_per_stream=kw["requests_per_stream"],
        endpoint=kw["endpoint"],
        prompts=kw["prompt_source"],
        input_len=kw["input_len"],
        client=kw["client_place"],
        min_run_s=kw["min_run_s"],
        stall_timeout_s=kw["stall_timeout"],
        first_token_timeout_s=kw["first_token_timeout"],
    )
    # The plan is arithmetic on the options: an absurd one is refused before the request sequence is built.
    speeds = [sim_speed(p.env_dict() | p.sim_env(), p.server_flags()) for p in profiles] if kw["sim"] else []
    calibrated = bool(speeds) and all(s is not None for s in speeds)
    arms = [s for s in speeds if s is not None] if calibrated else [assumed_speed()] * len(profiles)
    work = plan(bench, arms, blocks=kw["blocks"], calibrated=calibrated)
    click.echo(work.line(), file=sys.stderr if kw["as_json"] else sys.stdout)
    refusal = work.refusal()
    if refusal:
        raise click.UsageError(refusal)
    request_items(bench)  # bad prompt files or options fail here, before any server starts
    return _execute(store, profiles, bench, kw["sim"], kw["strict_env"], kw["host_spec"], kw, None)


def _resume(store: Store, ref: str, profile_names: tuple[str, ...], kw: dict[str, Any]) -> results.ABResult:
    exp = store.find_experiment(ref)
    given = [name for name in MEASUREMENT_OPTIONS if _given(name) and not (name == "sim" and exp["simulated"])]
    if given:
        flag = {p.name: p.opts[0] for p in click.get_current_context().command.params}
        flags = ", ".join(flag[n] for n in given)
        raise click.UsageError(
            f"--resume continues experiment {exp['id']} with its own settings; drop {flags} (or start a new experiment)"
        )
    stored = json.loads(exp["config_json"])
    arms = json.loads(exp["arms_json"])
    if profile_names:
        profiles = [profiles_mod.load(n) for n in profile_names]
        if [p.name for p in profiles] != arms:
            raise click.UsageError(
                f"experiment {exp['id']} compares {' '.join(arms)}; give no profiles with --resume (or exactly those)"
            )
    else:
        # Where each arm's profile was loaded from, if that file is still there (profiles given by path included).
        sources = stored.get("profile_sources") or [None] * len(arms)
        profiles = [
            profiles_mod.load(src if src and Path(src).is_file() else name)
            for name, src in zip(arms, sources, strict=True)
        ]
    host_spec = stored.get("host_spec", exp["host"])
    if _given("host_spec") and kw["host_spec"] != host_spec:
        raise click.UsageError(
            f"experiment {exp['id']} ran on {host_spec!r}; it must be resumed there, not on {kw['host_spec']!r}"
        )
    bench = ab.bench_config_from(stored["bench"])
    # How long to wait for a hung server is not part of what is measured: a resume may change it.
    for option, name in (("stall_timeout", "stall_timeout_s"), ("first_token_timeout", "first_token_timeout_s")):
        if _given(option):
            bench = dataclasses.replace(bench, **{name: kw[option]})
    request_items(bench)  # run_ab checks the experiment can be resumed, under the host lock
    if _given("workdir") and stored.get("workdir") and kw["workdir"] != stored["workdir"]:
        # Its logs (and the launches' log paths stored with the experiment) live in the workdir.
        raise click.UsageError(f"experiment {exp['id']} used --workdir {stored['workdir']}; resume it with that one")
    if stored.get("workdir"):
        kw["workdir"] = stored["workdir"]
    if not _given("min_effect") and "min_effect" in stored:
        kw["min_effect"] = float(stored["min_effect"])
    if not _given("target_tps") and stored.get("target_tps") is not None:
        kw["target_tps"] = float(stored["target_tps"])
    return _execute(
        store, profiles, bench, bool(exp["simulated"]), bool(stored.get("strict_env")), host_spec, kw, exp["id"]
    )


def _ab_config(kw: dict[str, Any], bench: BenchConfig, sim: bool, strict_env: bool) -> ABConfig:
    return ABConfig(
        bench=bench,
        simulate=sim,
        namespace=default_namespace(),
        ready_timeout_s=kw["ready_timeout"],
        grace_s=kw["grace"],
        strict_env=strict_env,
        force=kw["force"],
        lock_wait_s=kw["lock_wait"],
        gpu_wait_s=kw["gpu_wait"],
        target_tps=kw["target_tps"],
        blocks=kw["blocks"],
        order=kw["order"],
        order_seed=kw["order_seed"],
        min_effect=kw["min_effect"],
    )


def _progress(kw: dict[str, Any]) -> tuple[Callable[[str], None], Callable[[str, RunResult], None]]:
    """Where progress goes (stderr under --json, so stdout holds only the document) and how a run is printed."""
    out = sys.stderr if kw["as_json"] else sys.stdout

    def event(msg: str) -> None:
        click.echo(msg, file=out)

    def on_run(name: str, run: RunResult) -> None:
        click.echo(run_line(run, kw["_bench"]), file=out)

    return event, on_run


def _host(kw: dict[str, Any], host_spec: str) -> Host:
    return resolve_host(
        host_spec, workdir=kw["workdir"], inventory=kw["inventory"], accept_new_host_key=kw["accept_new_host_key"]
    )


def _execute(
    store: Store,
    profiles: list[profiles_mod.Profile],
    bench: BenchConfig,
    sim: bool,
    strict_env: bool,
    host_spec: str,
    kw: dict[str, Any],
    resume: str | None,
    provenance: dict[str, Any] | None = None,
) -> results.ABResult:
    config = _ab_config(kw, bench, sim, strict_env)
    kw["_bench"] = bench
    event, on_run = _progress(kw)
    if sim:
        event(SIM_BANNER)
    event(f"results database: {store.path}")
    with _host(kw, host_spec) as host:
        where = {"host_spec": host_spec, "workdir": kw["workdir"], "namespace": config.namespace, **(provenance or {})}
        return ab.run_ab(host, profiles, config, store, on_event=event, on_run=on_run, resume=resume, provenance=where)


@cli.command("ab")
@click.argument("profiles", nargs=-1)
@click.option(
    "--resume",
    metavar="ID",
    default=None,
    help="Continue an interrupted or failed experiment (id, unique prefix, or 'last') with its own seed, order "
    "and settings; its completed launches stand.",
)
@_bench_options
def ab_cmd(profiles: tuple[str, ...], resume: str | None, **kw: Any) -> None:
    """Compare PROFILES (the first is the baseline), each launch from fresh, verified state.

    With --blocks N every arm is launched N times (each block launches every arm once, in a recorded order), and
    each arm gets a 95% confidence interval against the baseline and a verdict: faster, slower, no difference or
    inconclusive.

    Example: orch ab baseline eagle3-3step --sim --blocks 3   |   orch ab baseline eagle3-3step --host gpu-box
    """
    if resume is None and len(profiles) < 2:
        raise click.UsageError("an A/B needs at least two profiles (use `orch bench` for one)")
    _run(profiles, resume, **kw)


def _parse_tolerance(ctx: click.Context, param: click.Parameter, value: str) -> float:
    text = str(value).strip()
    try:
        tol = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected a percentage such as 3% or a fraction such as 0.03") from None
    if not 0 < tol < 0.5:
        raise click.BadParameter(f"{value!r}: expected more than 0% and less than 50% (3% is usual)")
    return tol


@cli.command("reproduce")
@click.argument("target", metavar="BUNDLE|PROFILE")
@click.option("--claim", "claim_tps", type=FiniteFloat(min=0, max=1e7, min_open=True), default=None,
              help="The claimed single-stream tok/s of the profile [default: its expect.tok_s].")  # fmt: skip
@click.option("--claim-ratio", type=FiniteFloat(min=0, max=1e3, min_open=True), default=None,
              help="The claimed ratio against --vs [default: its expect.ratio].")  # fmt: skip
@click.option("--vs", "vs_name", default=None, metavar="PROFILE",
              help="The baseline run beside it [default: expect.vs, else a profile named 'baseline'].")  # fmt: skip
@click.option("--tolerance", default="3%", show_default=True, callback=_parse_tolerance,
              help="How far a value may be from the recorded one and still count as reproduced.")  # fmt: skip
@_bench_options
def reproduce_cmd(
    target: str, claim_tps: float | None, claim_ratio: float | None, vs_name: str | None, tolerance: float, **kw: Any
) -> None:
    """Re-run a colleague's result from fresh state and judge it: REPRODUCED (exit 0), NOT REPRODUCED (exit 3, with
    the fingerprint differences most likely to explain it) or INCONCLUSIVE (exit 4, with how many blocks would
    decide).

    BUNDLE (`orch export ID --format bundle`): the same design, workload, order and seed again (--blocks may change
    the number of blocks); every arm's tok/s and every ratio is judged against the recorded one.

    PROFILE (a name or a file): its claim comes from --claim/--claim-ratio or its expect: block; it runs with its
    baseline beside it (3 blocks unless --blocks is given).

    Examples: orch reproduce result.orch.json --host gpu-box   |   orch reproduce eagle3-3step --sim --claim 94
    """
    if Path(target).is_file() and Path(target).suffix not in (".yaml", ".yml"):
        if claim_tps is not None or claim_ratio is not None or vs_name is not None:
            raise click.UsageError("--claim, --claim-ratio and --vs judge a profile's claim, not a result bundle")
        _reproduce_bundle(target, tolerance, kw)
    _reproduce_claim(target, claim_tps, claim_ratio, vs_name, tolerance, kw)


def _reproduce_bundle(path: str, tolerance: float, kw: dict[str, Any]) -> NoReturn:
    bundle = bundle_mod.read_bundle(path)
    simulated = bool(bundle["content"]["experiment"]["simulated"])
    given = [n for n in MEASUREMENT_OPTIONS if n != "blocks" and _given(n) and not (n == "sim" and simulated)]
    if given:
        flag = {p.name: p.opts[0] for p in click.get_current_context().command.params}
        raise click.UsageError(
            f"a bundle is re-run with its own settings; drop {', '.join(flag[n] for n in given)} "
            "(--blocks may change the number of blocks)"
        )
    store = Store(kw["db"])
    try:
        event, on_run = _progress(kw)
        kw["_bench"] = bundle_mod.bench_config(bundle["content"]["config"])
        if simulated:
            event(SIM_BANNER)
        event(f"reproducing {bundle['content']['experiment']['id']} from {path}; results database: {store.path}")
        with _host(kw, kw["host_spec"]) as host:
            base = _ab_config(kw, kw["_bench"], simulated, False)
            new, verdict = reproduce_mod.reproduce_bundle(
                host,
                bundle,
                store,
                base,
                workdir=store.path.parent / "reproduce",
                tolerance=tolerance,
                blocks=kw["blocks"] if _given("blocks") else None,
                on_event=event,
                on_run=on_run,
            )
    finally:
        store.close()
    if kw["as_json"]:
        click.echo(json.dumps({**ab_json(new), "reproduction": compare_json(verdict)}, indent=2))
    else:
        click.echo(ab_text(new))
        click.echo("")
        click.echo(compare_text(verdict))
    raise SystemExit(verdict.exit_code)


def _reproduce_claim(
    target: str,
    claim_tps: float | None,
    claim_ratio: float | None,
    vs_name: str | None,
    tolerance: float,
    kw: dict[str, Any],
) -> NoReturn:
    prof = profiles_mod.load(target)
    expect = prof.expect
    claimed_tps = claim_tps if claim_tps is not None else (expect.tok_s if expect else None)
    claimed_ratio = claim_ratio if claim_ratio is not None else (expect.ratio if expect else None)
    if claimed_tps is None and claimed_ratio is None:
        raise click.UsageError(
            f"nothing to judge in {prof.source}: give --claim TOK_S (and/or --claim-ratio R --vs BASELINE), or add "
            "an expect: block (tok_s, ratio, vs) to the profile"
        )
    vs = vs_name or (expect.vs if expect else None)
    if vs is None and prof.name != "baseline" and "baseline" in profiles_mod.available():
        vs = "baseline"
    if claimed_ratio is not None and vs is None:
        raise click.UsageError("a claimed ratio needs a baseline: give --vs PROFILE (or expect.vs in the profile)")
    if not _given("blocks"):
        kw["blocks"] = 3  # a verdict needs the launch-to-launch spread: one launch per arm cannot give one
    store = Store(kw["db"])
    try:
        result = _start(store, (vs, target) if vs else (target,), kw)
    finally:
        store.close()
    verdict = claim_verdict(result, result.arms[-1].label, claimed_tps=claimed_tps, claimed_ratio=claimed_ratio,
                            tolerance=tolerance)  # fmt: skip
    if kw["as_json"]:
        click.echo(json.dumps({**ab_json(result), "claim": claim_json(verdict)}, indent=2))
    else:
        click.echo(ab_text(result))
        click.echo("")
        click.echo(claim_text(verdict))
    raise SystemExit(verdict.exit_code)


@cli.command("bench")
@click.argument("profile")
@_bench_options
def bench_cmd(profile: str, **kw: Any) -> None:
    """Benchmark one profile from a fresh, verified launch (--blocks N: N launches, with the spread across them)."""
    _run((profile,), None, **kw)


# ---------------------------------------------------------------- stored experiments


def _db_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--db", type=click.Path(dir_okay=False), default=None, help="SQLite results file [default: the user data dir]."
    )(fn)


def _open_existing(db: str | None) -> Store:
    path = Path(db) if db else default_db_path()
    if not path.exists():
        raise StoreError(f"{path}: no results database here yet (run `orch ab` first, or pass --db)")
    return Store(path)


@cli.command("list")
@_db_option
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 100000))
def list_cmd(db: str | None, limit: int) -> None:
    """Stored experiments, newest first: id, when, status, host, arms, launches done of planned."""
    store = _open_existing(db)
    try:
        rows = store.experiments(limit)
    finally:
        store.close()
    if not rows:
        click.echo(f"no experiments in {store.path}")
        return
    table = [["id", "started", "status", "host", "arms", "launches", "blocks", ""]]
    for r in rows:
        design = json.loads(r["design_json"]) if r.get("design_json") else None
        arms = json.loads(r["arms_json"])
        planned = len(arms) * (design["blocks"] if design else 1)
        table.append(
            [
                r["id"],
                time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created_at"])),
                r["status"],
                r["host"],
                " vs ".join(arms),
                f"{r['launches_complete']}/{planned}",
                str(design["blocks"] if design else 1),
                "SIMULATED" if r["simulated"] else "",
            ]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _stored_result(ref: str, db: str | None, min_effect: float | None = None) -> results.ABResult:
    """ID, prefix or `last` from the store; a path that exists is a result bundle, read without importing it."""
    if Path(ref).exists():
        return bundle_mod.result_from_bundle(bundle_mod.read_bundle(ref), min_effect=min_effect)
    store = _open_existing(db)
    try:
        return results.load_result(store, ref, min_effect=min_effect)
    finally:
        store.close()


@cli.command("show")
@click.argument("experiment", metavar="ID|FILE")
@_db_option
@click.option("--json", "as_json", is_flag=True, help="The same JSON document as `orch ab --json`.")
@click.option(
    "--min-effect",
    default=None,
    callback=lambda c, p, v: None if v is None else _parse_effect(c, p, v),
    help="Judge against another minimum effect than the experiment's.",
)
def show_cmd(experiment: str, db: str | None, as_json: bool, min_effect: float | None) -> None:
    """An experiment's report from the store (ID: an id, a unique prefix, or 'last'); partial ones too.

    FILE: a result bundle (`orch export ID --format bundle`), shown without importing it."""
    result = _stored_result(experiment, db, min_effect)
    _require_launches(result)
    click.echo(json.dumps(ab_json(result), indent=2) if as_json else ab_text(result).lstrip("\n"))


@cli.command("export")
@click.argument("experiment", metavar="ID|FILE")
@_db_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "csv", "md", "bundle"]),
    default="json",
    show_default=True,
    help="json: the `ab --json` document; csv: one row per timed run; md: the report as Markdown; bundle: one "
    "self-contained file to re-run and judge the experiment elsewhere (`orch reproduce FILE`, `orch import`, "
    "`orch show FILE`).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Write to this file instead of stdout (a bundle: default <id>.orch.json in the current directory).",
)
def export_cmd(experiment: str, db: str | None, fmt: str, output: str | None) -> None:
    """Export a stored experiment (or a result bundle FILE) as JSON, CSV, Markdown or a result bundle."""
    if fmt == "bundle":
        _export_bundle(experiment, db, output)
        return
    result = _stored_result(experiment, db)
    _require_launches(result)
    text = {
        "json": lambda: json.dumps(ab_json(result), indent=2) + "\n",
        "csv": lambda: ab_csv(result),
        "md": lambda: ab_markdown(result),
    }[fmt]()
    if output is None:
        click.echo(text, nl=False)
        return
    tmp = Path(output).with_name(Path(output).name + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(output)  # never a half-written export
    except OSError as e:
        raise StoreError(f"{output}: cannot write the export: {e.strerror or e}") from e
    click.echo(f"wrote {output} ({fmt}, {len(result.launches)} launches)", err=True)


def _export_bundle(ref: str, db: str | None, output: str | None) -> None:
    if Path(ref).exists():
        bundle = bundle_mod.read_bundle(ref)  # checked, then written again as it is
    else:
        store = _open_existing(db)
        try:
            bundle = bundle_mod.make_bundle(store, ref)
        finally:
            store.close()
    content = bundle["content"]
    target = output or f"{content['experiment']['id']}.orch.json"
    bundle_mod.write_bundle(bundle, target)
    withheld = bundle_mod.WITHHELD in json.dumps(content)
    click.echo(
        f"wrote {target} (result bundle, {len(content['launches'])} launches"
        + ("; secret values withheld, the receiver provides their own" if withheld else "")
        + ")",
        err=True,
    )


@cli.command("import")
@click.argument("file", type=click.Path(dir_okay=False))
@_db_option
def import_cmd(file: str, db: str | None) -> None:
    """Put a result bundle (`orch export ID --format bundle`) into the local store under its own id."""
    bundle = bundle_mod.read_bundle(file)
    store = Store(db)
    try:
        exp_id = bundle_mod.import_bundle(store, bundle, source=str(Path(file).resolve()))
        path = store.path
    except bundle_mod.AlreadyImported as e:
        click.echo(str(e))
        return
    finally:
        store.close()
    launches = len(bundle["content"]["launches"])
    click.echo(f"imported experiment {exp_id} ({launches} launches) into {path}")
    click.echo(f"next: orch show {exp_id}    orch reproduce {file}    orch compare {exp_id} ID")


def _require_launches(result: results.ABResult) -> None:
    if not result.launches:
        note = "; ".join(result.notes)
        raise StoreError(
            f"experiment {result.experiment_id} has no completed launch yet" + (f" ({note})" if note else "")
        )


@cli.command("compare")
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@_db_option
@click.option("--tolerance", default="3%", show_default=True, callback=_parse_tolerance,
              help="How far B may be from A and still count as the same.")  # fmt: skip
@click.option("--format", "fmt", type=click.Choice(["text", "json", "md"]), default="text", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
def compare_cmd(a: str, b: str, db: str | None, tolerance: float, fmt: str, as_json: bool) -> None:
    """Two experiments side by side: B judged against A per arm (tok/s, TTFT, ITL, accept length, with CIs) and per
    ratio, and the fingerprint differences most likely to explain a difference, ranked.

    A and B: experiment ids (or unique prefixes, or `last`) or result bundle files. Exit 0 when B reproduces A,
    3 when it does not, 4 when that cannot be told from these launches.
    """
    verdict = reproduce_mod.compare_results(_stored_result(a, db), _stored_result(b, db), tolerance)
    fmt = "json" if as_json else fmt
    if fmt == "json":
        click.echo(json.dumps(compare_json(verdict), indent=2))
    elif fmt == "md":
        click.echo(compare_markdown(verdict), nl=False)
    else:
        click.echo(compare_text(verdict))
    raise SystemExit(verdict.exit_code)


@cli.command("down")
@_with_host_options
@click.option("--grace", default=10.0, show_default=True, type=FiniteFloat(0, 600))
@click.option(
    "--force",
    is_flag=True,
    help="Also stop the servers of an orch session that is still running on the host (it will fail).",
)
def down_cmd(host_spec: str, inventory: str | None, accept_new_host_key: bool, grace: float, force: bool) -> None:
    """Stop every server orch launched on the host (found by its launch marker; nothing else is touched).

    A live orch session's servers are left alone unless --force: down takes the host lock like a run does.
    """
    with resolve_host(host_spec, inventory=inventory, accept_new_host_key=accept_new_host_key) as host:
        if not force:
            ab.acquire_host_lock(host, host.lock_path, "orch down", 0.0, lambda _: None, purpose="orch down")
        try:
            result = host.call("down", namespace=default_namespace(), grace_s=grace, force=force)
        finally:
            if not force:
                host.call("unlock", path=host.lock_path)
    stopped, live = result["stopped"], result["live"]
    if not stopped and not live:
        click.echo(f"nothing launched by orch is running on {host_spec}")
    for item in stopped:
        click.echo(
            f"stopped {item['launch_id']}: {len(item['found'])} process(es)"
            + (f", {len(item['remaining'])} would not die" if item["remaining"] else "")
        )
    for item in live:
        click.echo(
            f"left {item['launch_id']} running: it belongs to a live orch session (process "
            f"{str(item['owner']).split(':')[0]} on the host); `orch down --force` stops it anyway"
        )
    if live:
        raise SystemExit(1)


@cli.command("status")
@_with_host_options
def status_cmd(host_spec: str, inventory: str | None, accept_new_host_key: bool) -> None:
    """What orch launched on the host and is still running, its ports, and GPU memory."""
    with resolve_host(host_spec, inventory=inventory, accept_new_host_key=accept_new_host_key) as host:
        state = host.call("status", namespace=default_namespace(), nvidia_smi=host.config.nvidia_smi)
    procs = state["processes"]
    if not procs:
        click.echo(f"nothing launched by orch is running on {host_spec}")
    for p in sorted(procs, key=lambda d: (d["launch_id"], d["pid"])):
        ports = f" ports {','.join(map(str, p['ports']))}" if p["ports"] else ""
        click.echo(f"{p['launch_id']}  PID {p['pid']} (pgid {p['pgid']}){ports}  {p['cmdline']}")
    for line in gpu_lines(state["gpus"]):
        click.echo(line)


def gpu_lines(gpus: dict[str, Any]) -> list[str]:
    if not gpus["available"]:
        return [f"GPUs: unknown ({gpus['error']})"]
    lines = [
        f"GPU {g['index']}: {g.get('name')}, {g.get('memory.used')} / {g.get('memory.total')} MiB used"
        for g in gpus["gpus"]
    ]
    lines += [
        f"  GPU process PID {a['pid']} on GPU {a.get('gpu_index')}: {a.get('used_memory')} MiB, {a.get('cmdline')}"
        + (f" (orch launch {a['launch_id']})" if a.get("launch_id") else " (not launched by orch)")
        for a in gpus["apps"]
    ]
    return lines


@cli.command("breakeven")
@click.option(
    "--baseline-tps",
    type=FiniteFloat(min=0, max=MAX_TPS, min_open=True),
    required=True,
    help="The baseline's single-stream tok/s (re-measured, not remembered).",
)
@click.option(
    "--cycle-ms",
    type=FiniteFloat(min=0, max=1e6, min_open=True),
    required=True,
    help="One speculative cycle: draft steps + verify, in ms.",
)
@click.option("--steps", type=click.IntRange(1, 64), required=True, help="Draft steps per cycle (k).")
@click.option(
    "--accept-length",
    type=FiniteFloat(min=0, max=65, min_open=True),
    default=None,
    help="A measured accept length, to compare with the break-even.",
)
@click.option(
    "--target-tps",
    type=FiniteFloat(min=0, max=MAX_TPS, min_open=True),
    default=None,
    help="Also say what a target tok/s would need.",
)
def breakeven_cmd(
    baseline_tps: float, cycle_ms: float, steps: int, accept_length: float | None, target_tps: float | None
) -> None:
    """Speculative decoding arithmetic: the accept length (and per-token acceptance) needed to break even.

    Example (the seed's): orch breakeven --baseline-tps 82.2 --cycle-ms 30 --steps 3 --target-tps 150
    """
    be = stats.breakeven(baseline_tps, cycle_ms, steps, measured_tau=accept_length, target_tps=target_tps)
    for line in breakeven_lines(be):
        click.echo(line)


@cli.group("hosts")
def hosts_group() -> None:
    """The host inventory (hosts.yaml) and host checks."""


@hosts_group.command("list")
@click.option("--inventory", type=click.Path(dir_okay=False), default=None)
def hosts_list(inventory: str | None) -> None:
    """Hosts in the inventory."""
    from orchestrator.ssh import effective_endpoint  # paramiko is slow to import; only this command needs it

    hosts = load_inventory(inventory)
    if not hosts:
        click.echo("no host inventory found in " + ", ".join(str(p) for p in inventory_paths(inventory)))
    for name, h in sorted(hosts.items()):
        if h.is_local:
            where = "this machine"
        else:
            # What orch will really connect to: ssh_config fills in what the inventory leaves unset.
            try:
                ep = effective_endpoint(h)
                alias = "" if ep.hostname == h.address else f" (ssh_config Host {h.address})"
                where = ep.display + alias
            except OrchError as e:
                where = f"{h.address} ({e})"
        click.echo(f"{name}  {where}  python={h.python or 'default'}  gpus={h.gpus}  [{h.source}]")


@hosts_group.command("check")
@click.argument("host_spec", metavar="HOST")
@click.option("--inventory", type=click.Path(dir_okay=False), default=None)
@click.option("--accept-new-host-key", is_flag=True)
def hosts_check(host_spec: str, inventory: str | None, accept_new_host_key: bool) -> None:
    """Connect and report what matters for a benchmark, one ok/warn/fail line each; exits 1 on any fail."""
    with resolve_host(host_spec, inventory=inventory, accept_new_host_key=accept_new_host_key) as host:
        report = check_host(host, default_namespace())
        calls = host.stats.calls
    for level, text in report:
        click.echo(f"{level:<4}  {text}")
    click.echo(f"({calls} host-side calls)")
    if any(level == "fail" for level, _ in report):
        raise SystemExit(1)


# ---------------------------------------------------------------- entry point


def _on_sigterm(signum: int, frame: FrameType | None) -> NoReturn:
    # Unwind like Ctrl-C so every `finally` tears its server down before orch exits.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    debug = os.environ.get("ORCH_DEBUG") == "1"
    # Retries and reconnects are logged as warnings; show them, briefly, unless debugging.
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="orch: %(message)s")
    try:
        cli.main(args=argv, prog_name="orch", standalone_mode=False)
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except click.exceptions.Exit as e:
        return int(e.exit_code)
    except (KeyboardInterrupt, click.exceptions.Abort) as e:
        # click turns Ctrl-C into Abort; by the time it reaches here every `finally` has torn its server down.
        if debug:
            traceback.print_exc()
        if isinstance(e, click.exceptions.Abort) and not isinstance(e.__cause__, KeyboardInterrupt):
            click.echo("Aborted.", err=True)
            return 1
        click.echo("Interrupted: servers started by this run were torn down; results so far are stored.", err=True)
        return EXIT_INTERRUPTED
    except OrchError as e:
        if debug:
            traceback.print_exc()
        click.echo(f"Error: {e}", err=True)
        return EXIT_USAGE if isinstance(e, InputError) else 1
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    except Exception as e:  # a bug in orch: still no traceback unless asked for
        if debug:
            raise
        click.echo(f"Error: unexpected {type(e).__name__}: {e} (set ORCH_DEBUG=1 for the traceback)", err=True)
        return 1
    return 0


def entry() -> None:
    """The console script: also treats SIGTERM (cron timeouts, kill) like Ctrl-C so servers are torn down."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    sys.exit(main())
