"""The benchmark client: stdlib-only asyncio HTTP/1.1 streaming, shipped to hosts with the agent so that the
client can run beside the server (no laptop network in the numbers). `runner.run` sends one run's requests (by
concurrency streams, or open loop at scheduled times: `openloop`, within the requests in flight the process can
hold: `headroom`) and returns `summary.summarize_run`'s dict.
"""

__all__ = [
    "cacheflush",
    "headroom",
    "metrics",
    "openloop",
    "request",
    "runner",
    "stream",
    "streamparse",
    "summary",
    "watchdog",
]
