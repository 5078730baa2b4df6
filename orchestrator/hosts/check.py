"""`orch hosts check`: what matters about a host before benchmarking on it, one line per fact."""

from __future__ import annotations

from orchestrator import engines
from orchestrator.hosts.base import Host


def check_host(host: Host, namespace: str) -> list[tuple[str, str]]:
    """`orch hosts check`: one (ok|warn|fail, text) per fact that matters before benchmarking on this host."""
    cfg = host.config
    # Each engine's own package (its version is the engine's), and what the engines run on (torch).
    kinds = [engines.get(name) for name in engines.names()]
    wanted = {e.version_package: e for e in kinds if e.version_package}
    runtime = [p for p in engines.fact_packages() if p not in wanted]
    r = host.call("check", workdir=host.workdir, nvidia_smi=cfg.nvidia_smi, packages=[*wanted, *runtime])
    out: list[tuple[str, str]] = [("ok", f"connected to {host.name} ({getattr(host, 'display', 'this machine')})")]
    py = tuple(int(x) for x in r["python"].split(".")[:2])
    out.append(("ok" if py >= (3, 8) else "fail", f"python {r['python']} at {r['python_executable']}"))
    out.append(("ok", f"psutil {r['psutil']}"))
    found = r["packages"]
    for package, engine in wanted.items():
        if found.get(package):
            out.append(("ok", f"{package} {found[package]}"))
            continue
        runs = "can only run with --sim" if engine.simulated else "cannot run with it"
        out.append(
            (
                "warn",
                f"{package} is not installed for {r['python_executable']} ({engine.name} profiles {runs}, unless a "
                "profile's python: names another interpreter)",
            )
        )
    for package in runtime:
        out.append(
            ("ok", f"{package} {found[package]}") if found.get(package) else ("warn", f"{package} is not installed")
        )
    # An older agent does not send import_errors.
    for name, error in (r.get("import_errors") or {}).items():
        out.append(("warn", f"{name} is installed but `import {name}` fails with {r['python_executable']}: {error}"))
    gpus = r["gpus"]
    if not gpus["available"]:
        out.append(("fail" if cfg.gpus else "warn", f"GPUs: {gpus['error']}"))
    else:
        n = len(gpus["gpus"])
        if cfg.gpus is not None and n != cfg.gpus:
            out.append(("fail", f"{n} GPUs found, the inventory expects {cfg.gpus}"))
        else:
            out.append(("ok", f"{n} GPUs: {', '.join(sorted({str(g.get('name')) for g in gpus['gpus']}))}"))
        for g in gpus["gpus"]:
            used, total = g.get("memory.used"), g.get("memory.total")
            busy = isinstance(used, int | float) and used > cfg.gpu_idle_mib
            free = total - used if isinstance(total, int | float) and isinstance(used, int | float) else "?"
            out.append(("warn" if busy else "ok", f"GPU {g['index']}: {free} MiB free of {total} MiB"))
        for a in gpus["apps"]:
            owner = f"orch launch {a['launch_id']}" if a.get("launch_id") else "not launched by orch"
            out.append(
                ("warn", f"GPU process PID {a['pid']} ({a.get('cmdline')}, {a.get('used_memory')} MiB): {owner}")
            )
    free_gib = r["disk_free_bytes"] / 2**30
    out.append(("ok" if free_gib >= 1 else "warn", f"{free_gib:.1f} GiB free for the work dir {r['workdir']}"))
    if not r["setsid"]:
        out.append(("fail", "setsid is not installed (util-linux); orch cannot detach servers"))
    if r["kill_user_processes"]:
        out.append(
            (
                "warn",
                "systemd-logind KillUserProcesses=yes: servers may die when the SSH session ends "
                "(enable lingering: loginctl enable-linger USER)",
            )
        )
    running = host.call("find", namespace=namespace)
    launches = sorted({p["launch_id"] for p in running})
    if launches:
        out.append(("warn", f"orch launches still running: {', '.join(launches)} (orch down --host {host.name})"))
    else:
        out.append(("ok", "no orch launches running"))
    return out
