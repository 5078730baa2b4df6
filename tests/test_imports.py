"""The import graph points one way: no module reaches itself, counting imports inside functions (lazy ones) too.

The rules the graph is built by (read from the source with ast, nothing is imported):
- Every `import` and `from ... import` of an orchestrator module is an edge, at module level or inside a function,
  class or other block; only those under `if TYPE_CHECKING:` are left out (they never run).
- `from orchestrator.pkg import mod`, where mod is a submodule, is an edge to orchestrator.pkg.mod, not to the
  package: Python has initialised a submodule's package before any of its submodules can run, so a submodule that
  loads a sibling through it adds no order; what the package's __init__ imports is counted as the __init__'s own
  edges. `from orchestrator.pkg import name` of a name the __init__ defines (hosts' resolve_host) is an edge to the
  package, since it needs the __init__ to have finished: that is the import a half-initialised package breaks.
- `importlib.import_module(...)` (the command table in cli/lazy.py) is not seen: it names modules in strings.

Three contracts more, on the same graph (docs/architecture.md, "Layers"):
- No module imports a `_private` name of another module (`from m import _x`, or `m._x` of an imported module m).
- What ships to the host (SHIPPED below) imports only what ships with it, the stdlib and psutil.
- Each module sits in one layer of LAYERS and imports (at run time or under `if TYPE_CHECKING:`) only from its own
  layer or those below it; the exceptions are listed in UPWARD with why.
"""

from __future__ import annotations

import ast
import fnmatch
import sys
from collections.abc import Iterator
from pathlib import Path

from orchestrator.hosts.agentlink import SHIPPED_PACKAGES

PACKAGE = Path(__file__).resolve().parent.parent / "orchestrator"

# Edges a cycle may still use, each with why. Keep this empty: move the shared piece down instead.

# The layers, lowest first, as the code stands (fnmatch patterns of module names without the `orchestrator.`
# prefix; "" is the package's own __init__). The host side sits below the models because the run's config and
# result types (bench) drive the benchmark client that ships to the host.
PACKAGE_ORDER = (
    "common", "client", "agent", "sim",  # shipped to the host (SHIPPED_PACKAGES)
    "stats", "engines", "config", "results", "ui", "whatif", "report", "hosts", "launch", "experiment", "nightly",
)  # fmt: skip
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("", "errors", "files", "fields", "yamlfile")),
    *((name, (name, f"{name}.*")) for name in PACKAGE_ORDER),
    ("cli", ("cli", "cli.*", "__main__")),
)

# Imports that point up a layer, each with why; an entry that no longer exists fails the test (keep this empty).
UPWARD: dict[tuple[str, str], str] = {}

# What the host gets (hosts/agentlink.agent_files): the package's __init__ and every module of SHIPPED_PACKAGES.
SHIPPED = ("", *SHIPPED_PACKAGES, *(f"{p}.*" for p in SHIPPED_PACKAGES))
SHIPPED_THIRD_PARTY = {"psutil"}


def module_names(root: Path) -> dict[str, Path]:
    """Every module under root (a package directory), by its dotted name; a package by its own name."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node below node, except those under `if TYPE_CHECKING:` (its else branch does run)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _type_checking(child.test):
            for stmt in child.orelse:
                yield stmt
                yield from _runtime_nodes(stmt)
            continue
        yield child
        yield from _runtime_nodes(child)


def _absolute(name: str, node: ast.ImportFrom, modules: dict[str, Path]) -> str:
    """The module a `from ... import` in module `name` reads from, relative imports resolved."""
    base = node.module or ""
    if node.level:  # relative: from the module's package, one level up per extra dot
        package = name.split(".") if modules.get(name, Path()).name == "__init__.py" else name.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    return base


def imports_of(name: str, source: str, modules: dict[str, Path], *, type_checking: bool = False) -> set[str]:
    """The orchestrator modules that module `name` imports when it runs, by the rules above; with type_checking,
    also those it imports under `if TYPE_CHECKING:`."""
    out: set[str] = set()
    tree = ast.parse(source)
    for node in ast.walk(tree) if type_checking else _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(name, node, modules)
            subs = {f"{base}.{a.name}" for a in node.names} & modules.keys()
            out |= subs
            if base in modules and len(subs) < len(node.names):
                out.add(base)
    out.discard(name)
    return out


def import_graph(root: Path = PACKAGE, *, type_checking: bool = False) -> dict[str, set[str]]:
    modules = module_names(root)
    return {
        name: imports_of(name, path.read_text(encoding="utf-8"), modules, type_checking=type_checking)
        for name, path in modules.items()
    }


def private_imports(name: str, source: str, modules: dict[str, Path]) -> list[str]:
    """Each `_private` name module `name` takes from another orchestrator module, as `line: module._name`."""
    out = []
    tree = ast.parse(source)
    imported: dict[str, str] = {}  # a local name bound to an orchestrator module: the module
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in modules:
                    imported[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(name, node, modules)
            for a in node.names:
                if f"{base}.{a.name}" in modules:
                    imported[a.asname or a.name] = f"{base}.{a.name}"
                elif base in modules and base != name and _private(a.name):
                    out.append(f"{node.lineno}: {base}.{a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            target = imported.get(ast.unparse(node.value)) or ast.unparse(node.value)
            if target in modules and target != name:
                out.append(f"{node.lineno}: {target}.{node.attr}")
    return sorted(out)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def layer_of(module: str) -> int | None:
    """The index in LAYERS of a module (dotted name, with the `orchestrator` prefix); None when it is in none."""
    short = module.removeprefix("orchestrator").removeprefix(".")
    found = [i for i, (_, patterns) in enumerate(LAYERS) if any(fnmatch.fnmatchcase(short, p) for p in patterns)]
    assert len(found) <= 1, f"{module} is in more than one layer: {[LAYERS[i][0] for i in found]}"
    return found[0] if found else None


def upward_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], str]:
    """Each import that points to a higher layer, by (importer, imported) without the prefix: the layers' names."""
    out = {}
    for a, targets in graph.items():
        for b in targets:
            la, lb = layer_of(a), layer_of(b)
            if la is not None and lb is not None and lb > la:
                key = (a.removeprefix("orchestrator."), b.removeprefix("orchestrator."))
                out[key] = f"{LAYERS[la][0]} -> {LAYERS[lb][0]}"
    return out


def _shipped(module: str) -> bool:
    short = module.removeprefix("orchestrator").removeprefix(".")
    return any(fnmatch.fnmatchcase(short, p) for p in SHIPPED)


def shipped_violations(root: Path = PACKAGE) -> list[str]:
    """Each import of a shipped module that would fail on the host: an orchestrator module that does not ship, or
    a third-party package other than psutil (lazy imports counted; TYPE_CHECKING ones never run)."""
    modules = module_names(root)
    out = []
    for name, path in modules.items():
        if not _shipped(name):
            continue
        source = path.read_text(encoding="utf-8")
        out += [f"{name} -> {dep}" for dep in sorted(imports_of(name, source, modules)) if not _shipped(dep)]
        for node in _runtime_nodes(ast.parse(source)):
            tops = []
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                tops = [node.module.split(".")[0]]
            allowed = {"orchestrator", *sys.stdlib_module_names, *SHIPPED_THIRD_PARTY}
            out += [f"{name} -> {top} (third-party)" for top in tops if top not in allowed]
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path that ends where it starts (a -> b -> a), or None."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path, on_path = [start], {start}
        stack = [iter(sorted(graph[start]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                done.add(path[-1])
                on_path.discard(path.pop())
            elif nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_no_module_reaches_itself_through_its_imports() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_graph_sees_lazy_imports_and_skips_type_checking() -> None:
    modules = {name: Path(f"{name.replace('.', '/')}.py") for name in ("o.a", "o.b", "o.c", "o.d", "o.e", "o.f")}
    modules["o.p"] = Path("o/p/__init__.py")
    modules["o.p.s"] = Path("o/p/s.py")
    source = """
from typing import TYPE_CHECKING
import o.a
if TYPE_CHECKING:
    from o import b
else:
    from o import c
def later():
    from o.d import thing
    if True:
        import o.e
from o.p import s
from o.p import factory
from . import f
"""
    assert imports_of("o.x", source, modules) == {"o.a", "o.c", "o.d", "o.e", "o.p.s", "o.p", "o.f"}
    assert imports_of("o.p.s", "from . import s\nfrom .. import a\nfrom . import factory", modules) == {"o.a", "o.p"}
    assert imports_of("o.p", "from . import s\nfrom .s import x", modules) == {"o.p.s"}
    real = import_graph()
    assert "orchestrator.whatif.predict" in real["orchestrator.report.lines"]  # a lazy import is an edge
    assert "orchestrator.config.workload" not in real["orchestrator.ui.progress"]  # a TYPE_CHECKING one is not


def test_a_cycle_is_found_and_shown() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_module_imports_a_private_name_of_another() -> None:
    found = []
    for root in (PACKAGE, PACKAGE.parent / "benchmarks"):
        modules = module_names(PACKAGE) | module_names(root)
        for name, path in module_names(root).items():
            found += [f"{name}:{hit}" for hit in private_imports(name, path.read_text(encoding="utf-8"), modules)]
    assert not found, "private names imported across modules (give them a public name): " + "; ".join(found)


def test_private_imports_are_found_in_every_form() -> None:
    modules = {name: Path(f"{name.replace('.', '/')}.py") for name in ("o.a", "o.b", "o.p.s")}
    modules["o.p"] = Path("o/p/__init__.py")
    source = """
from o.a import public, _hidden, __version__
from o import b
import o.p.s as s
from .b import _rel
def later():
    return b._helper(), s._STATE, o.a._direct, _hidden._attr, self._fine
"""
    assert private_imports("o.x", source, modules) == [
        "2: o.a._hidden",
        "5: o.b._rel",
        "7: o.a._direct",
        "7: o.b._helper",
        "7: o.p.s._STATE",
    ]
    assert private_imports("o.a", "import o.a\nfrom o.a import _mine\no.a._x", modules) == []  # its own


def test_every_module_has_one_layer() -> None:
    missing = [name for name in module_names(PACKAGE) if layer_of(name) is None]
    assert not missing, "put these modules in a layer of LAYERS (tests/test_imports.py, docs/architecture.md): " + (
        ", ".join(missing)
    )


def test_imports_point_down_the_layers() -> None:
    """Run-time and TYPE_CHECKING imports alike: a type-only import up a layer still inverts the design."""
    found = upward_edges(import_graph(type_checking=True))
    unexpected = {edge: layers for edge, layers in found.items() if edge not in UPWARD}
    assert not unexpected, "imports up a layer (move the shared piece down, or list it in UPWARD with why): " + (
        "; ".join(f"{a} -> {b} ({layers})" for (a, b), layers in sorted(unexpected.items()))
    )
    stale = sorted(set(UPWARD) - set(found))
    assert not stale, f"UPWARD lists imports that no longer point up: {stale}"


def test_an_upward_import_is_caught_even_under_type_checking() -> None:
    graph = {"orchestrator.stats.estimates": {"orchestrator.errors"}, "orchestrator.errors": {"orchestrator.cli.ab"}}
    assert upward_edges(graph) == {("errors", "cli.ab"): "base -> cli"}
    modules = {"o.a": Path("o/a.py"), "o.b": Path("o/b.py")}
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from o.b import B\n"
    assert imports_of("o.a", source, modules) == set()
    assert imports_of("o.a", source, modules, type_checking=True) == {"o.b"}


def test_a_forbidden_import_added_to_the_tree_is_caught(tmp_path: Path) -> None:
    """The layer contract on a copy of the real tree: the results model reaching up for the experiment runner (even
    for a type) and the statistics for the CLI are both named."""
    root = tmp_path / "orchestrator"
    for path in PACKAGE.rglob("*.py"):
        (root / path.relative_to(PACKAGE)).parent.mkdir(parents=True, exist_ok=True)
        (root / path.relative_to(PACKAGE)).write_bytes(path.read_bytes())
    assert set(upward_edges(import_graph(root, type_checking=True))) == set(UPWARD)
    with (root / "results" / "model.py").open("a", encoding="utf-8") as f:
        f.write("\nif TYPE_CHECKING:\n    from orchestrator.experiment.ab import run_ab\n")
    with (root / "stats" / "estimates.py").open("a", encoding="utf-8") as f:
        f.write("\n\ndef later() -> None:\n    from orchestrator.cli import main\n")
    assert set(upward_edges(import_graph(root, type_checking=True))) - set(UPWARD) == {
        ("results.model", "experiment.ab"),
        ("stats.estimates", "cli"),
    }


def test_what_ships_to_the_host_imports_only_what_ships_with_it(tmp_path: Path) -> None:
    assert not shipped_violations(), "the host-side agent would fail to import: " + "; ".join(shipped_violations())
    # The same check on a copy whose shipped teardown reaches for the orch side, lazily, and for a third party.
    root = tmp_path / "orchestrator"
    for path in PACKAGE.rglob("*.py"):
        (root / path.relative_to(PACKAGE)).parent.mkdir(parents=True, exist_ok=True)
        (root / path.relative_to(PACKAGE)).write_bytes(path.read_bytes())
    with (root / "agent" / "teardown.py").open("a", encoding="utf-8") as f:
        f.write("\n\ndef later() -> None:\n    from orchestrator.results import store\n    import yaml\n")
    assert shipped_violations(root) == [
        "orchestrator.agent.teardown -> orchestrator.results.store",
        "orchestrator.agent.teardown -> yaml (third-party)",
    ]


def test_each_package_face_names_its_modules() -> None:
    """A package's `__init__` has a docstring and an `__all__`; where `__all__` lists modules (every package but
    cli, engines and hosts, whose faces are the functions callers use), it lists every one of them."""
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        tree = ast.parse(init.read_text(encoding="utf-8"))
        assert ast.get_docstring(tree), f"{init} has no docstring"
        found = [n for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "__all__"]
        assert found, f"{init} has no __all__"
        if init.parent.name in ("cli", "engines", "hosts"):
            continue
        listed = set(ast.literal_eval(found[0].value))
        modules = {p.stem for p in init.parent.glob("*.py") if p.stem not in ("__init__", "__main__")}
        assert listed == modules, f"{init}: __all__ misses {sorted(modules - listed)}, names {sorted(listed - modules)}"
