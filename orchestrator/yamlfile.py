"""Reading orch's YAML input files: yaml.safe_load semantics, plus refusals of what safe_load lets through."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node

from orchestrator import files
from orchestrator.errors import InputError
from orchestrator.fields import key_name

# Hand-written profiles and inventories are a few KB and a few levels deep; anything far beyond is a mistake
# or hostile, and PyYAML's recursive composer would otherwise die with a RecursionError near 1000 levels.
MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MERGE_TAG = "tag:yaml.org,2002:merge"


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (safe_load keeps the last silently) and deep nesting."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise ConstructorError(None, None, f"nested more than {MAX_DEPTH} levels deep", mark)
            node: Node | None = super().compose_node(parent, index)
            return node
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        # Checked before SafeLoader flattens `<<` merge keys: a key written twice is a mistake, overriding a
        # merged key is what merge keys are for.
        if isinstance(node, MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: SafeLoader itself refuses it with its own message
                if first is not None:
                    raise ConstructorError(
                        None,
                        None,
                        f"duplicate key {key_name(key)} (lines {first} and {line}); keep one of them",
                        key_node.start_mark,
                    )
                seen[key] = line
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def is_file(path: Path) -> bool:
    """Path.is_file() that answers False instead of raising for names the OS refuses (too long, NUL bytes)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def exists(path: Path) -> bool:
    """Path.exists() that answers False instead of raising for names the OS refuses (too long, NUL bytes)."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def load(path: Path, error: type[InputError], what: str) -> Any:
    """Parse one YAML file; every problem is `error` naming the file (and the line where YAML knows it)."""
    try:
        with files.open_regular(path) as f:  # a FIFO or /dev/zero named as a profile must not hang or flood orch
            raw = f.read(MAX_BYTES + 1)
    except files.NotRegularFile as e:
        raise error(f"{path}: {e}; a {what} is a YAML file on disk") from None
    except OSError as e:
        raise error(f"{path}: cannot read: {e.strerror or e}") from e
    if len(raw) > MAX_BYTES:
        raise error(f"{path}: larger than {MAX_BYTES // 1024} KiB; is this really a {what}?")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte {e.start}); is this really a {what}?") from None
    try:
        return yaml.load(text, Loader=StrictLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise error(f"{path}: not valid YAML{where}: {problem}") from None
    except ValueError as e:
        # PyYAML converts integer literals with int(), which refuses more than 4300 digits.
        raise error(f"{path}: not valid YAML: {e}") from None
    except RecursionError:
        raise error(f"{path}: not valid YAML: nested too deeply") from None
