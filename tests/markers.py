"""The resource markers kept true: a test that starts sshd, Slurm, Chromium, llama-server or vLLM carries its marker."""

from __future__ import annotations

from typing import Any

# What each marker stands for, as pyproject.toml registers it: `pytest -m "not ssh and ..."` must never start one.
RESOURCES = {
    "ssh": "a real OpenSSH server on 127.0.0.1 (tests/sshd.py)",
    "slurm": "a private one-node Slurm cluster (tests/slurmcluster.py)",
    "browser": "headless Chromium",
    "llamacpp": "a real llama-server (the [llamacpp] extra)",
    "vllm": "a real vLLM (its CPU build, make vllm)",
}

# The test being set up or run (conftest.py's pytest_runtest_setup sets it): a module-scoped fixture starts its
# server inside the first test's setup, so that test is the one asked. None outside pytest (benchmarks/ start SSHD).
current: list[Any] = []


def require(marker: str) -> None:
    """Fail the current test, naming the marker it lacks, when it starts the marker's resource without it."""
    if current and current[-1].get_closest_marker(marker) is None:
        import pytest

        pytest.fail(
            f"{current[-1].nodeid} starts {RESOURCES[marker]} but is not marked `{marker}`: add "
            f"`pytestmark = pytest.mark.{marker}` to its module (or @pytest.mark.{marker} to the test), so that "
            f'`pytest -m "not {marker}"` leaves it out',
            pytrace=False,
        )
