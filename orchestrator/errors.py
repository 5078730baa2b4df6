"""The error hierarchy: every failure a user can cause or meet is an OrchError with a readable message."""

from __future__ import annotations


class OrchError(Exception):
    """Base class; the CLI prints `Error: <message>` and exits non-zero."""


class InputError(OrchError):
    """Invalid user input (a profile, the host inventory, a prompt file): the CLI exits 2, like a usage error."""


class ProfileError(InputError):
    """A profile (or profile file) is missing, malformed or invalid."""


class HostError(OrchError):
    """Something about the host: a foreign port owner, a failed host-side call, an unreachable host."""


class AllocationEnded(HostError):
    """Slurm ended the allocation a host runs in (its time limit, scancel, a node failure): every process of the job
    is gone with it, so there is nothing left on the node to tear down."""

    # Keyword defaults keep it constructible from its message alone, as pickle and copy rebuild exceptions.
    def __init__(self, message: str, *, job_id: str = "", state: str = "") -> None:
        super().__init__(message)
        self.job_id = job_id
        self.state = state


class HostBusy(HostError):
    """Another live orch session holds the host's lock. Its message says how to queue behind it in the terms of the
    command that met it (`--wait SECONDS`; a nightly suite's `wait:`), which a caller may change (waiting_by)."""

    # Keyword defaults keep it constructible from its message alone, as pickle and copy rebuild exceptions.
    def __init__(self, busy: str, *, how_to_wait: str = "", after: str = "") -> None:
        super().__init__(" ".join(part for part in (busy, how_to_wait, after) if part))
        self.busy, self.how_to_wait, self.after = busy, how_to_wait, after

    def waiting_by(self, how_to_wait: str) -> HostBusy:
        """The same refusal, telling how to queue in another command's terms."""
        return HostBusy(self.busy, how_to_wait=how_to_wait, after=self.after)


class InventoryError(HostError, InputError):
    """The host inventory file (hosts.yaml) is missing, malformed or invalid; still a HostError for old callers."""


class ServerError(OrchError):
    """The inference server failed to launch, become ready, or stay alive."""


class BenchError(OrchError):
    """A benchmark request failed or returned something that cannot be measured."""


class PromptFileError(BenchError, InputError):
    """A prompt file (--prompts FILE.jsonl) is missing, malformed or empty; still a BenchError for old callers."""


class StoreError(OrchError):
    """The results database cannot be opened, migrated or written."""


class ExperimentRefError(StoreError, InputError):
    """An experiment reference (an id prefix, an empty id) that names no single experiment: the user's input to fix
    (exit 2), not a broken store; still a StoreError for old callers."""


class BundleError(InputError):
    """A result bundle file is not JSON, truncated, not a bundle, of a newer version, tampered with or incomplete."""


class UntrustedBundle(InputError):
    """A bundle would make this machine run what its own profiles would not, and nothing said to run it: no terminal
    to ask on, no --trust-bundle, no signature by an allowed signer (exit 2; nothing was started)."""


class BundleDeclined(OrchError):
    """Asked at the terminal whether to run what a bundle would run, the user said no (exit 1; nothing was started)."""


def was_interrupted(e: BaseException) -> bool:
    """Whether e is, or was raised while handling, a Ctrl-C (or orch's SIGTERM or SIGHUP, which raise the same): a
    teardown that fails after an interrupt must not turn the interrupt into a failure."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return True
        seen.add(id(cur))
        cur = cur.__context__
    return False
