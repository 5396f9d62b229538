"""YAML as sparkgate's files are read: the safe subset, and a key given twice in one mapping is an error.

PyYAML's safe loader keeps the last of two equal keys without a word, so a policy file with two
``gates:`` blocks would run the second while a reader of the file sees the first. Every YAML file an
operator writes (the rollout policy, the writers file) is read through ``load``.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError


class _UniqueKeyLoader(yaml.SafeLoader):
    """The safe loader, refusing a mapping that names a key twice (a merge key ``<<`` may be overridden:
    that is what merging is for)."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    first: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            seen = first.setdefault(key, key_node)
        except TypeError:  # an unhashable key: the safe constructor below names that error itself
            continue
        if seen is not key_node:
            raise ConstructorError(
                "while reading a mapping", node.start_mark,
                f"key {key!r} appears twice (first on line {seen.start_mark.line + 1})", key_node.start_mark,
            )  # fmt: skip
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


class YAMLTextError(ValueError):
    """Text that is not YAML, or repeats a key; the message is one line naming where."""


def load(text: str) -> Any:
    """The decoded document, or ``YAMLTextError`` naming the line and column of the first problem."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a subclass of the safe loader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise YAMLTextError(f"{where}{exc.problem}") from exc
    except yaml.YAMLError as exc:
        raise YAMLTextError(" ".join(str(exc).split())) from exc
