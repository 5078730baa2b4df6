"""The client's headroom: how many requests it can hold in flight within its open-file limit and its memory."""

from __future__ import annotations

import os
from dataclasses import dataclass

# Descriptors kept for the rest of the process while requests hold the others: the watchdog's /proc reads, the
# store, logs, SSH channels, nvidia-smi's pipes, the /metrics scrape after the run. Each request takes one (its
# connection: Connection: close, never pooled), or RELAYED_FDS when orch relays it to a remote host in this same
# process (`--client local`: the relay's accepted socket, and an SSH channel's pipe or a Slurm relay step's pipes).
RESERVE_FDS = 64
RELAYED_FDS = 5
# A request in flight costs its task, guard, connection and parser (~11 KiB measured with ~1 KiB prompts), plus the
# arrival kept for each token it streams; the requests in flight may use at most MEMORY_SHARE of the memory available
# when the run starts.
REQUEST_BYTES = 16 * 1024
TOKEN_BYTES = 100
MEMORY_SHARE = 0.5


@dataclass(frozen=True, kw_only=True)
class Headroom:
    """The most requests this client can keep in flight at once, and what sets that number (in words)."""

    requests: int
    why: str


def room(
    *, nofile: int | None, open_now: int, available: int | None, max_tokens: int, descriptors_each: int = 1
) -> Headroom:
    """The headroom from the soft open-file limit (None: unlimited), the descriptors open now, the memory available
    (bytes; None: unknown), the most tokens a request may stream and the descriptors each request takes here. At
    least 1: a run always sends its first request."""
    limits: list[Headroom] = []
    if nofile is not None:
        n = max(1, (nofile - open_now - RESERVE_FDS) // max(1, descriptors_each))
        relayed = f" ({descriptors_each} descriptors each: relayed to the host by orch)" if descriptors_each > 1 else ""
        limits.append(
            Headroom(
                requests=n,
                why=f"the open-file limit (ulimit -n {nofile}), with {open_now} descriptors open and {RESERVE_FDS} "
                f"kept for the rest of orch, leaves {n} for connections{relayed}",
            )
        )
    if available is not None:
        each = REQUEST_BYTES + TOKEN_BYTES * max(1, max_tokens)
        n = max(1, int(available * MEMORY_SHARE) // each)
        limits.append(
            Headroom(
                requests=n,
                why=f"{available / 2**30:.1f} GiB of memory available holds about {n} requests of up to {max_tokens} "
                f"tokens in flight (at most {MEMORY_SHARE:.0%} of it, ~{each // 1024} KiB each)",
            )
        )
    if not limits:
        return Headroom(requests=2**31, why="no open-file or memory limit known")
    return min(limits, key=lambda h: h.requests)


def open_files() -> int:
    """Descriptors this process has open now (0 where the system cannot list them)."""
    for where in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(where))
        except OSError:
            continue
    return 0


def available_memory() -> int | None:
    """Bytes of memory available to new allocations (psutil's estimate), None where it cannot be read."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # psutil missing or unreadable /proc: no memory bound, the open-file one still holds
        return None


def headroom(max_tokens: int, descriptors_each: int = 1) -> Headroom:
    """This process's headroom now, for requests of up to `max_tokens` tokens taking `descriptors_each` here."""
    nofile: int | None = None
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        nofile = None if soft == resource.RLIM_INFINITY else int(soft)
    except (ImportError, OSError, ValueError):  # no rlimits here (not Unix): no open-file bound to keep
        nofile = None
    return room(
        nofile=nofile,
        open_now=open_files(),
        available=available_memory(),
        max_tokens=max_tokens,
        descriptors_each=descriptors_each,
    )


def raise_open_files(needed: int) -> None:
    """Raise this process's soft open-file limit toward `needed` descriptors (never above the hard limit, never
    lowering it): a closed-loop level of c streams needs c connections at once, and many systems start processes at
    a soft 1024 under a far higher hard limit. Nothing happens where limits cannot be read or set."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY or soft >= needed:
            return
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, OSError, ValueError):
        return


def closed_loop_room(concurrency: int, max_tokens: int, descriptors_each: int = 1) -> Headroom:
    """The headroom for c busy streams, after raising the soft open-file limit as far as c of them need (with the
    descriptors the rest of orch keeps): below c, the level would measure this client's limit, not the server."""
    raise_open_files(open_files() + concurrency * max(1, descriptors_each) + RESERVE_FDS)
    return headroom(max_tokens, descriptors_each)
