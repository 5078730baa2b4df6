"""The docs' simulated nights, run once per test session for the tests that read them (the sample outputs of
docs/nightly.md and the history page): about four minutes of nights, so both tests carry the same xdist group
and `make test` runs with `--dist loadgroup`, which puts them on one worker."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

# The mark both tests of the docs' nights carry: one worker builds the nights once for both.
DOC_NIGHTS = pytest.mark.xdist_group("doc-nights")


@dataclass(frozen=True)
class DocHistory:
    """Where the nights' suite, profiles and nightly.db are, and what each sample night printed (by name)."""

    where: Path
    outputs: dict[str, str]


@pytest.fixture(scope="session")
def doc_history(tmp_path_factory: pytest.TempPathFactory) -> DocHistory:
    """Three nights of history instead of the suite's five keep it cheap. To regenerate the doc's samples, run with
    ORCH_DOC_SAMPLES=DIR: the suite's own min_history, each output written to DIR."""
    from tests.nightly.test_nightly_docs import doc_nights, doc_suite

    outputs: dict[str, str] = {}
    regenerate = os.environ.get("ORCH_DOC_SAMPLES")

    def keep(name: str, text: str) -> None:
        outputs.setdefault(name, text)
        if regenerate:
            Path(regenerate).mkdir(parents=True, exist_ok=True)
            Path(regenerate, name).write_text(text)

    where = tmp_path_factory.mktemp("doc-nights")
    doc_nights(where, doc_suite()["min_history"] if regenerate else 3, keep)
    return DocHistory(where, outputs)
