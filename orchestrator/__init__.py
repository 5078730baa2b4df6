"""orch: honest A/B benchmarks of LLM inference servers (SGLang first)."""

__version__ = "0.1.0"
