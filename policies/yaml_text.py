"""YAML as sparkgate's files are read: the safe subset, and a key given twice in one mapping is an error.

PyYAML's safe loader keeps the last of two equal keys without a word, so a policy file with two
``gates:`` blocks would run the second while a reader of the file sees the first. Every YAML file an
operator writes (the rollout policy, the writers file) is read through ``load``.

Keys are compared on the composed document, as written, before construction: constructing a merge
(``<<``) rewrites the merged mapping's node in place, and a check then would see a key that a mapping
overrides within its own merge as given twice. A merge key itself may repeat keys it merges: overriding
them is what merging is for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError

_MERGE = "tag:yaml.org,2002:merge"


class YAMLTextError(ValueError):
    """Text that is not YAML, or repeats a key; the message is one line naming where."""


class NotUTF8Error(YAMLTextError):
    """A file that is not UTF-8 text, so not YAML at all; the message names the first bad byte."""


class _Loader(yaml.SafeLoader):
    """The safe loader, with a date that does not exist (``2024-13-01``) refused where it is written:
    PyYAML's constructor raises a bare ``ValueError`` there, with no mark."""

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> Any:
        try:
            return super().construct_yaml_timestamp(node)
        except ValueError as exc:
            raise ConstructorError(None, None, f"{node.value!r} is not a date ({exc})", node.start_mark) from None


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _Loader.construct_yaml_timestamp)


def load_file(path: str | Path) -> Any:
    """The decoded document of the file at ``path``: ``load`` of its UTF-8 text, or ``NotUTF8Error``.
    ``OSError`` when it cannot be read."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise NotUTF8Error(f"not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    return load(text)


def load(text: str) -> Any:
    """The decoded document, or ``YAMLTextError`` naming the line and column of the first problem."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_repeated_keys(loader, node)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise YAMLTextError(f"{where}{exc.problem}") from exc
    except yaml.YAMLError as exc:
        raise YAMLTextError(" ".join(str(exc).split())) from exc
    finally:
        loader.dispose()


def _refuse_repeated_keys(loader: _Loader, root: yaml.Node) -> None:
    """Raise ``ConstructorError`` at the first mapping, in document order, that names a scalar key twice
    (keys compared as the values they construct to: ``1`` and ``0x1`` are one key, ``1`` and ``'1'`` two)."""
    pending, visited = [root], set()
    while pending:
        node = pending.pop()
        if id(node) in visited:  # an alias repeats a node: check it once
            continue
        visited.add(id(node))
        children = []
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, yaml.Node] = {}
            for key_node, value_node in node.value:
                children += [key_node, value_node]
                if key_node.tag == _MERGE or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = loader.construct_object(key_node)
                seen = first.setdefault(key, key_node)
                if seen is not key_node:
                    raise ConstructorError(
                        "while reading a mapping", node.start_mark,
                        f"key {key!r} appears twice (first on line {seen.start_mark.line + 1})",
                        key_node.start_mark,
                    )  # fmt: skip
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        pending += reversed(children)
