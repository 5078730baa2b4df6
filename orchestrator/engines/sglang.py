"""SGLang (`python -m sglang.launch_server`), and orch's simulator of it (`python -m orchestrator.sim`)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from orchestrator.engines.base import Engine

if TYPE_CHECKING:
    from orchestrator.profile import Profile


class SGLang(Engine):
    name = "sglang"
    # /health and /health_generate share one handler in 0.5.x; /model_info and /v1/models answer during warmup
    # and so are not readiness signals.
    health_path = "/health_generate"
    env_overrides: Mapping[str, str] = MappingProxyType(
        {
            "CUDA_DEVICE_MAX_CONNECTIONS": "SGLang forces it to 8 before spawning workers",
            "NCCL_CUMEM_ENABLE": "SGLang sets it to 0 when unset",
            "NCCL_NVLS_ENABLE": "SGLang sets it to 0 when unset",
            "CUDA_VISIBLE_DEVICES": "SGLang rewrites it per worker",
        }
    )
    packages = ("sglang", "torch", "flashinfer", "sgl_kernel", "triton")
    version_package = "sglang"

    def server_flags(self, profile: Profile) -> list[str]:
        flags = ["--model-path", profile.model_path, "--tp-size", str(profile.tp_size)]
        flags += ["--host", profile.host, "--port", str(profile.port)]
        if profile.served_model_name:
            flags += ["--served-model-name", profile.served_model_name]
        if profile.trust_remote_code:
            flags.append("--trust-remote-code")
        if profile.mem_fraction_static is not None:
            flags += ["--mem-fraction-static", repr(profile.mem_fraction_static)]
        spec = profile.speculative
        if spec is not None:
            flags += ["--speculative-algorithm", spec.algorithm]
            if spec.draft_model_path:
                flags += ["--speculative-draft-model-path", spec.draft_model_path]
            for flag, value in (
                ("--speculative-num-steps", spec.num_steps),
                ("--speculative-eagle-topk", spec.eagle_topk),
                ("--speculative-num-draft-tokens", spec.num_draft_tokens),
            ):
                if value is not None:
                    flags += [flag, str(value)]
        return flags + list(profile.server_args)

    def launch_argv(self, profile: Profile, python: str, *, simulate: bool) -> list[str]:
        module = "orchestrator.sim" if simulate else "sglang.launch_server"
        return [python, "-m", module, *self.server_flags(profile)]
