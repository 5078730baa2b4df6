"""orch's code as it was at an earlier commit, for the before/after benchmarks: taken from git, no worktree left."""

from __future__ import annotations

import subprocess
import tarfile
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ISSUE_14_BEFORE = "3e11be3"  # the last commit before issue 14 (performance); its figures are in docs/performance.md


def has_commit(ref: str) -> bool:
    done = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{ref}^{{commit}}"], capture_output=True)
    return done.returncode == 0


def before_ref(ref: str, *, smoke: bool) -> tuple[str, str]:
    """The ref to compare with, and a note when it is not the one asked for. A smoke run in a clone without the ref
    (CI's shallow clone) compares HEAD with itself, so every step still runs; a real run refuses instead, since its
    figures would be meaningless."""
    if has_commit(ref):
        return ref, ""
    if smoke:
        return (
            "HEAD",
            f"smoke: {ref} is not in this clone, so 'before' is HEAD (the same code): the figures mean nothing",
        )
    raise SystemExit(
        f"--before {ref}: no such commit in this clone (a shallow clone? `git fetch --unshallow` brings it)"
    )


def materialize(ref: str, into: Path) -> None:
    """The orchestrator package as it was at `ref`, extracted under `into`."""
    blob = subprocess.run(["git", "-C", str(REPO), "archive", ref, "orchestrator"], capture_output=True)
    if blob.returncode != 0:
        raise SystemExit(f"--before {ref}: git archive failed: {blob.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=BytesIO(blob.stdout)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.10.12+, 3.11.4+: refuse odd members outright
            tar.extraction_filter = tarfile.data_filter
        tar.extractall(into)
