"""vLLM (`vllm serve MODEL`), and orch's simulator of it (`python -m orchestrator.sim serve MODEL`).

Flag, endpoint and metric names checked against vllm-project/vllm's source (see orchestrator/sim/vllm_args.py for
the files and commits): `vllm` is the console script for vllm.entrypoints.cli.main:main, which runs as a module.
"""

from __future__ import annotations

import json
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
from orchestrator.fields import did_you_mean
from orchestrator.sim.vllm_args import SPEC_FIELDS as SPECULATIVE_CONFIG_KEYS

# speculative.algorithm is vLLM's `method`, spelt as vLLM spells it (lowercase).
NEEDS_DRAFT_MODEL = ("eagle", "eagle3", "draft_model")
# --speculative-config keys a profile field writes: speculative.engine_config may not write them a second time.
OWNED_CONFIG_KEYS: Mapping[str, str] = MappingProxyType(
    {
        "method": "algorithm",
        "model": "draft_model_path",
        "num_speculative_tokens": "num_steps",
        "prompt_lookup_min": "prompt_lookup_min",
        "prompt_lookup_max": "prompt_lookup_max",
    }
)


class VLLM(Engine):
    name = "vllm"
    title = "vLLM"
    # 200 once the engine core answers (the port refuses connections until then); 503 once the engine is dead. It
    # reads a flag, generates nothing: the health check of attached servers and before a repeat; readiness of a
    # launch is a real 1-token completion (ready_probe).
    health_path = "/health"
    env_overrides: Mapping[str, str] = MappingProxyType(
        {
            "VLLM_WORKER_MULTIPROC_METHOD": "vLLM's CLI sets it to spawn when unset",
            "OMP_NUM_THREADS": "vLLM sets it to 1 in its workers when unset",
            "PYTORCH_NVML_BASED_CUDA_CHECK": "vLLM sets it to 1 on import",
            "TORCHINDUCTOR_COMPILE_THREADS": "vLLM sets it to 1 on import",
            "CUDA_VISIBLE_DEVICES": "vLLM gives each data-parallel rank its slice",
        }
    )
    packages = ("vllm", "torch", "flashinfer", "triton", "transformers")
    version_package = "vllm"
    env_prefixes = ("VLLM_",)
    runtime_packages = ("torch",)
    # GPU memory is --gpu-memory-utilization in server_args (SGLang's mem_fraction_static means something else).
    fields = frozenset({"served_model_name", "tp_size", "trust_remote_code"})
    spec_algorithms = ("eagle3", "eagle", "mtp", "draft_model", "ngram")
    # draft_model_path is speculative_config.model, num_steps its num_speculative_tokens, prompt_lookup_min/max the
    # n-gram window; vLLM has no topk or separate verify width for a chain. engine_config: any other key of vLLM's
    # SpeculativeConfig, passed as it is.
    spec_fields = frozenset(
        {"draft_model_path", "num_steps", "prompt_lookup_min", "prompt_lookup_max", "engine_config"}
    )
    # Only mtp may leave num_speculative_tokens unset (vLLM reads n_predict from the model); MTP models have 1.
    default_spec_steps = 1
    managed_flags: Mapping[str, str] = MappingProxyType(
        {
            "--model": "model_path",
            "--tensor-parallel-size": "tp_size",
            "--tensor_parallel_size": "tp_size",
            "-tp": "tp_size",
            "--port": "port",
            "--host": "host",
            "--served-model-name": "served_model_name",
            "--served_model_name": "served_model_name",
            "--trust-remote-code": "trust_remote_code",
            "--trust_remote_code": "trust_remote_code",
            "--speculative-config": "speculative",
            "--speculative_config": "speculative",
            "-sc": "speculative",
        }
    )
    endpoints = ("completions", "chat")
    simulated = True
    # A dev route: mounted only with VLLM_SERVER_DEV_MODE=1 in the server's environment, else 404
    # (entrypoints/serve: register_vllm_dev_api_routers).
    cache_flush = CacheFlush(
        request=Probe("POST", "/reset_prefix_cache"),
        enable="vLLM serves POST /reset_prefix_cache only with VLLM_SERVER_DEV_MODE=1 in its environment: add "
        '`VLLM_SERVER_DEV_MODE: "1"` to the profile\'s env (for an attached server, start it so)',
        means="POST /reset_prefix_cache before each timed run",
        needs_env=("VLLM_SERVER_DEV_MODE", "1"),
    )
    # Real vLLM serves /server_info only with VLLM_SERVER_DEV_MODE=1 (the simulator always, with its knobs).
    info_paths = ("/server_info",)
    version_path = "/version"
    # Prompt tokens found in / looked up in its prefix cache.
    cache_counters = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")

    def ready_probe(self, profile: ServerProfile) -> Probe:
        # The model as served: --served-model-name, else the --model value as given (vLLM's default).
        model = profile.served_model_name or profile.model_path
        return Probe("POST", "/v1/completions", {"model": model, "prompt": [0], "max_tokens": 1, "temperature": 0})

    def check_speculative(self, spec: SpecSettings) -> tuple[str, str] | None:
        if spec.algorithm in NEEDS_DRAFT_MODEL and not spec.draft_model_path:
            return "draft_model_path", f"required for {spec.algorithm} (vLLM's speculative_config.model)"
        if spec.algorithm == "ngram" and spec.draft_model_path:
            return "draft_model_path", "ngram drafts from the prompt itself and takes no draft model"
        if spec.num_steps is None and spec.algorithm != "mtp":
            return "num_steps", (
                f"required for {spec.algorithm} (vLLM's num_speculative_tokens; only mtp reads it from the model)"
            )
        for bound in ("prompt_lookup_min", "prompt_lookup_max"):
            if getattr(spec, bound) is not None and spec.algorithm != "ngram":
                return bound, f"the n-gram window: only for ngram, not {spec.algorithm}"
        low, high = spec.prompt_lookup_min, spec.prompt_lookup_max
        if low is not None and high is not None and low > high:
            return "prompt_lookup_min", f"{low} is above prompt_lookup_max {high} (vLLM refuses min > max)"
        for key, _ in spec.engine_config:
            if key in OWNED_CONFIG_KEYS:
                return f"engine_config.{key}", f"set it with speculative.{OWNED_CONFIG_KEYS[key]}, not here"
            if key not in SPECULATIVE_CONFIG_KEYS:
                takes = sorted(set(SPECULATIVE_CONFIG_KEYS) - set(OWNED_CONFIG_KEYS))
                return f"engine_config.{key}", (
                    f"not a key of vLLM's speculative config{did_you_mean(key, takes)}; it takes: {', '.join(takes)}"
                )
        return None

    def spec_from_counters(self, deltas: Mapping[str, float]) -> SpecCounters | None:
        return spec_decode_counters(deltas, "vllm:", "vllm:spec_decode_*")

    def speculative_config(self, spec: SpecSettings) -> dict[str, Any]:
        config: dict[str, Any] = {"method": spec.algorithm}
        if spec.draft_model_path:
            config["model"] = spec.draft_model_path
        if spec.num_steps is not None:
            config["num_speculative_tokens"] = spec.num_steps
        if spec.prompt_lookup_min is not None:
            config["prompt_lookup_min"] = spec.prompt_lookup_min
        if spec.prompt_lookup_max is not None:
            config["prompt_lookup_max"] = spec.prompt_lookup_max
        for key, value in spec.engine_config:
            config[key] = list(value) if isinstance(value, tuple) else value
        return config

    def server_flags(self, profile: ServerProfile) -> list[str]:
        """`serve MODEL` and its flags: the arguments of the `vllm` program (and of the simulator)."""
        flags = ["serve", profile.model_path, "--tensor-parallel-size", str(profile.tp_size)]
        flags += ["--host", profile.host, "--port", str(profile.port)]
        if profile.served_model_name:
            flags += ["--served-model-name", profile.served_model_name]
        if profile.trust_remote_code:
            flags.append("--trust-remote-code")
        if profile.speculative is not None:
            # One argv element: never a shell string, so the JSON needs no quoting.
            flags += ["--speculative-config", json.dumps(self.speculative_config(profile.speculative))]
        return flags + list(profile.server_args)

    def launch_argv(self, profile: ServerProfile, python: str, *, simulate: bool) -> list[str]:
        # The `vllm` console script is vllm.entrypoints.cli.main:main; running the module needs no script on PATH.
        module = "orchestrator.sim" if simulate else "vllm.entrypoints.cli.main"
        return [python, "-m", module, *self.server_flags(profile)]
