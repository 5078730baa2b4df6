"""`orch profiles list|show|validate`."""

from __future__ import annotations

import shlex

import click
import yaml

from orchestrator import profile as profiles_mod
from orchestrator.cli.base import EXIT_USAGE, cli
from orchestrator.errors import ProfileError
from orchestrator.redaction import redact, redact_argv

# ---------------------------------------------------------------- profiles


@cli.group("profiles")
def profiles_group() -> None:
    """List, show and validate server profiles (./profiles, the user config dir, then the bundled set)."""


@profiles_group.command("list")
def profiles_list() -> None:
    """Every profile name visible from here, with where it comes from."""
    found = profiles_mod.available()
    if not found:
        click.echo("no profiles found in " + ", ".join(str(d) for d in profiles_mod.search_dirs()))
        return
    width = max(len(n) for n in found)
    for name, path in sorted(found.items()):
        try:
            desc = profiles_mod.load(str(path)).description
        except ProfileError as e:
            desc = f"INVALID: {e}"
        click.echo(f"{name.ljust(width)}  {desc}  [{path}]")


@profiles_group.command("show")
@click.argument("name")
@click.option("--sim", is_flag=True, help="Show the launch as `--sim` would run it (the simulator).")
@click.option("--python", "python", default="python3", show_default=True, help="Interpreter shown in the command.")
def profiles_show(name: str, sim: bool, python: str) -> None:
    """The resolved profile, the exact launch command line and its environment."""
    prof = profiles_mod.load(name)
    data = prof.to_dict()
    click.echo(f"# {prof.name} (from {prof.source}; extends chain: {' -> '.join(prof.chain)})")
    click.echo(yaml.safe_dump(data, sort_keys=False).rstrip())
    click.echo("\n# launch command" + (" (SIMULATOR)" if sim else ""))
    env = prof.env_dict() | (prof.sim_env() if sim else {})
    # Secret-looking values are shown as digests: this output ends up in terminals, tickets and chat.
    prefix = " ".join(f"{k}={shlex.quote(redact(k, v))}" for k, v in sorted(env.items()))
    argv = redact_argv(prof.launch_argv(python, simulate=sim))
    click.echo((prefix + " " if prefix else "") + shlex.join(argv))


@profiles_group.command("validate")
@click.argument("files", nargs=-1, required=True)
def profiles_validate(files: tuple[str, ...]) -> None:
    """Check profile files; prints one line per file and exits 2 (invalid input) if any is invalid."""
    bad = 0
    for f in files:
        try:
            prof = profiles_mod.validate_file(f)
            click.echo(f"ok      {f} ({prof.name})")
        except ProfileError as e:
            bad += 1
            click.echo(f"invalid {e}")
    if bad:
        raise SystemExit(EXIT_USAGE)
