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
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "orchestrator"

# Edges a cycle may still use, each with why. Keep this empty: move the shared piece down instead.


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


def imports_of(name: str, source: str, modules: dict[str, Path]) -> set[str]:
    """The orchestrator modules that module `name` imports when it runs, by the rules above."""
    is_package = modules.get(name, Path()).name == "__init__.py"
    out: set[str] = set()
    for node in _runtime_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, one level up per extra dot
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            subs = {f"{base}.{a.name}" for a in node.names} & modules.keys()
            out |= subs
            if base in modules and len(subs) < len(node.names):
                out.add(base)
    out.discard(name)
    return out


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    modules = module_names(root)
    return {name: imports_of(name, path.read_text(encoding="utf-8"), modules) for name, path in modules.items()}


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
    assert "orchestrator.whatif" in real["orchestrator.report"]  # a lazy import is an edge
    assert "orchestrator.bench" not in real["orchestrator.progress"]  # a TYPE_CHECKING one is not


def test_a_cycle_is_found_and_shown() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
