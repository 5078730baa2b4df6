"""Arms measured on a server someone else runs (`--attach`, `attach:`): no launch, env read-back or teardown."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpx

from orchestrator import __version__, engines
from orchestrator.common.printable import visible
from orchestrator.config.profile import Profile
from orchestrator.config.workload import BenchConfig
from orchestrator.engines import Engine
from orchestrator.errors import InputError, ServerError
from orchestrator.hosts.base import Host
from orchestrator.launch import fingerprint, single
from orchestrator.launch.benchmark import Runner, runner_for
from orchestrator.ui.events import Events

MODELS_TIMEOUT_S = 5.0
NOT_FRESH = (
    "its state was not fresh: orch did not launch it, so its caches, uptime and any other clients' load are "
    "whatever they were, and each block's 'launch' of it is just another benchmark session on the same running "
    "server, not a restart"
)
NOT_VERIFIED = "its environment was not verified: orch cannot read an attached server's processes, env or host"


def _shown(text: str) -> str:
    """The value for an error message, without what could be a credential (user:password@, a query string)."""
    text = re.sub(r"(?s)//.*@", "//***@", text)  # up to the last @: a password may hold #, ? or /
    text = re.sub(r"(?s)[?#].*", "?***", text)
    return repr(text if len(text) <= 120 else text[:117] + "...")


def check_url(value: str, where: str = "--attach") -> str:
    """http://HOST:PORT, normalised; anything else is an InputError naming the value (without its secrets)."""
    text = str(value).strip()
    shown = _shown(text)
    expected = "expected http://HOST:PORT"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise InputError(f"{where}: {shown}: {expected} with a port from 1 to 65535") from None
    if "@" in parts.netloc:
        # Whatever reaches the store is exported and bundled: a credential in it would travel with every result.
        raise InputError(
            f"{where}: {shown}: a URL with user:password@ would store that credential with the results; orch "
            f"refuses it ({expected})"
        )
    if parts.scheme == "https":
        raise InputError(
            f"{where}: {shown}: https is not supported (orch's client speaks plain HTTP/1.1); reach the server over "
            f"http, e.g. through a port-forward ({expected})"
        )
    if parts.scheme != "http" or not parts.hostname:
        raise InputError(f"{where}: {shown}: {expected}")
    if parts.query or parts.fragment or text.endswith("?"):
        raise InputError(
            f"{where}: {shown}: a query string could carry a key and would be stored with the results; orch refuses "
            f"it ({expected})"
        )
    if parts.path not in ("", "/"):
        raise InputError(f"{where}: {shown}: {expected} without a path (orch adds the engine's own paths)")
    if port is None or port == 0:
        raise InputError(f"{where}: {shown}: the port is required ({expected})")
    host = parts.hostname
    if not re.fullmatch(r"[0-9a-f:.]+" if ":" in host else r"[a-z0-9.-]+", host):
        raise InputError(f"{where}: {shown}: {expected} (a host name of letters, digits, dots and dashes)")
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def url_of(profile: Profile) -> str | None:
    """The URL of the server an arm is attached to, or None for an arm orch launches itself."""
    value = profile.attach
    return None if value is None else check_url(value, f"{profile.source}: attach")


def with_url(profile: Profile, url: str | None) -> Profile:
    """The profile attached to url (checked); unchanged when url is None or already its own."""
    if url is None or url == profile.attach:
        return profile
    return dataclasses.replace(profile, attach=check_url(url))


def apply_options(profiles: Sequence[Profile], given: Sequence[str], names: Sequence[str]) -> list[Profile]:
    """`--attach ARM=URL` (or a bare URL when there is one arm) applied to the arms it names; a name that is no arm
    is an InputError listing the arms. ARM is the name as given on the command line, the profile's name, or its
    label in an A/A test (name#2)."""
    out = list(profiles)
    labels = [p.name if [q.name for q in profiles].count(p.name) == 1 else f"{p.name}#{i + 1}" for i, p in
              enumerate(profiles)]  # fmt: skip
    for value in given:
        arm, sep, url = value.partition("=")
        if not sep or "://" in arm:
            if len(profiles) != 1:
                raise InputError(
                    f"--attach {_shown(value)}: say which arm is attached, as ARM=URL (arms: {', '.join(labels)})"
                )
            out[0] = with_url(out[0], value)
            continue
        hits = [i for i, p in enumerate(profiles) if arm in (names[i], p.name, labels[i])]
        if not hits:
            raise InputError(
                f"--attach {arm}=...: {arm!r} is not an arm of this comparison (arms: {', '.join(labels)})"
            )
        for i in hits:
            out[i] = with_url(out[i], url)
    return out


def check_arms(profiles: Sequence[Profile], *, allow_mixed: bool, strict_env: bool, simulate: bool) -> None:
    """Refuse, before anything starts, what attached arms make meaningless (InputError, exit 2)."""
    attached = [p.name for p in profiles if url_of(p) is not None]
    if not attached:
        return
    launched = [p.name for p in profiles if url_of(p) is None]
    if launched and not allow_mixed:
        raise InputError(
            f"attached arm(s) {', '.join(attached)} and launched arm(s) {', '.join(launched)} in one comparison: an "
            "attached server's state is not fresh and its environment not verified, so a difference could come from "
            "how the servers were set up rather than from their configuration. Attach every arm or none, or pass "
            "--allow-mixed to compare them anyway (every report then carries a WARNING)"
        )
    if strict_env:
        raise InputError(
            f"--strict-env needs each arm's environment read back, and orch cannot read that of attached arm(s) "
            f"{', '.join(attached)}; drop --strict-env or launch them"
        )
    if simulate and not launched:
        raise InputError("--sim launches orch's simulator, but every arm is attached to a running server")


def marker(url: str) -> dict[str, Any]:
    """What is stored with an attached launch (fingerprint, env report, preflight) so every later view says so."""
    return {"url": url, "fresh": False, "env_verified": False, "note": f"{NOT_FRESH}; {NOT_VERIFIED}"}


def _models(base_url: str) -> list[str] | None:
    """The model ids GET /v1/models lists (None when it does not answer): all that a client can see of the model."""
    try:
        r = httpx.get(base_url + "/v1/models", timeout=MODELS_TIMEOUT_S)
        data = r.json().get("data") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    if not isinstance(data, list):
        return None
    return [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m]


def _version(base_url: str, info: dict[str, Any], engine: Engine) -> tuple[str | None, str | None]:
    """The version the server reports, and where, as its engine reads it: its info endpoint (SGLang's), else the
    engine's version path (vLLM's GET /version)."""
    version = engine.version_of(info) if info else None
    if version is not None:
        return version, "server_info"
    if engine.version_path is None:
        return None, None
    try:
        r = httpx.get(base_url + engine.version_path, timeout=MODELS_TIMEOUT_S)
        answer = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None, None
    version = engine.version_of(answer) if isinstance(answer, dict) else None
    return (version, f"GET {engine.version_path}") if version is not None else (None, None)


def collect_fingerprint(
    base_url: str, profile: Profile, mark: dict[str, Any], *, workload_digest: str, redaction_key: bytes | None
) -> dict[str, Any]:
    """Only what can be read from outside: the server's reported version and served models; no host, GPU or env
    facts (listed as unreadable, so a comparison takes their absence as no evidence either way)."""
    fp: dict[str, Any] = {
        "version": fingerprint.FINGERPRINT_VERSION,
        "collected_at": round(time.time(), 3),
        "error": None,
        "attached": mark,
    }
    why = "attached: orch cannot read the machine of a server it did not launch"
    unreadable = [{"field": "host", "why": why}, {"field": "gpus", "why": why}, {"field": "env", "why": NOT_VERIFIED}]
    try:
        info = fingerprint.fetch_server_info(base_url, profile.engine)
        version, source = _version(base_url, info, engines.get(profile.engine))
        software: dict[str, Any] = {
            "engine": f"{profile.engine} (attached)",
            "engine_version": version,
            "engine_version_source": source,
            "served_models": _models(base_url),
        }
        if info.get("orch_sim"):
            software["reports_orch_simulator"] = True
        if version is None:
            unreadable.append({"field": "software.engine_version", "why": "the server reports no version"})
        stored = profile.to_dict(redaction_key=redaction_key)
        fp.update(
            host=None,
            gpus=None,
            software=software,
            env={"processes": None, "workers": None, "inherited": None, "sim_knobs": None},
            profile=stored,
            profile_sha256=fingerprint.profile_digest(stored),
            argv=[],
            orch={"version": __version__, "git_sha": fingerprint.orch_git_sha()},
            **{fingerprint.WORKLOAD_KEY: workload_digest},
        )
    except Exception as e:  # a fingerprint is evidence, never a reason to fail a session
        fp["error"] = f"{type(e).__name__}: {e}"[:500]
        unreadable.append({"field": "fingerprint", "why": fp["error"]})
    fp["unreadable"] = unreadable
    return fp


@dataclass(kw_only=True)
class AttachedServer:
    """A server someone else runs, as an arm's session on it is measured: reached from --host's side (the client
    runs there by default; for --client local, through it). Its health check stood for readiness; it is neither
    read back nor torn down, and its marker stands in for the env report, preflight and teardown."""

    url: str  # as the profile or --attach gave it
    address: str
    port: int
    base_url: str  # as --host's side reaches it
    record: single.LaunchRecord
    teardown: dict[str, Any] | None = None
    ready_s: ClassVar[None] = None  # orch did not wait for it to start
    env_ok: ClassVar[None] = None  # orch cannot read its environment
    # No GPU probes: the GPUs --host can read are not known to be the server's. (Its /metrics counter deltas also
    # count any other client's traffic: part of what "not fresh" means.)
    probes_gpus: ClassVar[bool] = False

    @property
    def launch_id(self) -> str:
        return self.record.launch_id

    @property
    def mark(self) -> dict[str, Any]:
        return marker(self.url)

    @property
    def preflight(self) -> dict[str, Any]:
        return {"attached": self.mark}

    def env_record(self) -> dict[str, Any]:
        return {"processes": None, "ok": None, "mismatches": [], "inherited": {}, "attached": self.mark}

    def not_torn_down(self) -> dict[str, Any]:
        return {"attached": self.mark, "note": "not torn down: orch did not launch it"}

    def fingerprint(
        self, host: Host, profile: Profile, *, workload_digest: str, redaction_key: bytes | None
    ) -> dict[str, Any]:
        return collect_fingerprint(
            self.base_url, profile, self.mark, workload_digest=workload_digest, redaction_key=redaction_key
        )

    def notes(self, profile: Profile, fp: dict[str, Any]) -> list[str]:
        """What is said of the server once it is fingerprinted: that it serves another model than the profile's."""
        model = profile.served_model_name or profile.model_path
        served = (fp.get("software") or {}).get("served_models")
        if served and model not in served:
            # Each id as the server sent it, but one field: a newline in it would start a line of its own.
            listed = ", ".join(visible(str(m)) for m in served)
            return [f"NOTE: {self.url}/v1/models lists {listed}, not the profile's {model!r}"]
        return []

    def runner(self, host: Host, profile: Profile, bench: BenchConfig) -> Runner:
        engine = engines.get(profile.engine)
        return runner_for(host, self.address, self.port, self.base_url, bench, engine, probe_gpus=False)

    def recover(self, host: Host, profile: Profile, events: Events, err: str) -> bool:
        """After failed requests: whether the run may be repeated (the server is healthy; it is never restarted)."""
        events.line(f"{profile.name}: {err} (an attached server: checked, never restarted)")
        host.ensure_connected()
        problem = single.health_problem(self.base_url, profile, timeout_s=single.HEALTH_TIMEOUT_S)
        if problem is not None:
            events.line(f"{profile.name}: the attached server at {self.url}: {problem}; not repeating the run")
            return False
        return True


def reach(host: Host, url: str) -> tuple[str, int, str]:
    """The attached server's address and port, and its base URL as --host's side reaches it."""
    parts = urlsplit(url)
    address, port = str(parts.hostname), int(parts.port or 0)
    return address, port, host.url(port, address)


def check_health(base_url: str, url: str, profile: Profile) -> None:
    """An attached server's readiness: one health check, for orch neither starts nor waits for a server it did not
    launch (ServerError if it fails)."""
    problem = single.health_problem(base_url, profile, timeout_s=single.HEALTH_TIMEOUT_S)
    if problem is not None:
        raise ServerError(
            f"{profile.name}: the attached server at {url} is not ready ({problem}); orch neither starts nor waits "
            "for a server it did not launch: start it, or check the URL"
        )
