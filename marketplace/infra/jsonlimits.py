"""Limits on parsed JSON that Python and PostgreSQL would otherwise fail on with a server error: nesting deeper
than anything our API or agent protocol needs (``json`` and ``repr`` recurse, and give up near 1000 levels with
a RecursionError) and NUL characters (PostgreSQL refuses them in text and in jsonb)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

_SCALARS = frozenset({int, float, bool, type(None)})
_SCALARS_OR_TEXT = _SCALARS | {str}


class JSONLimitError(ValueError):
    """``path`` (``task.options.0``; empty for the document itself) names where, ``reason`` what."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path or 'body'}: {reason}")
        self.path = path
        self.reason = reason


def max_depth() -> int:
    return settings.ECHO2["JSON_MAX_DEPTH"]


def check_json(value: Any, *, depth: int | None = None, forbid_nul: bool = False) -> None:
    """Raise :class:`JSONLimitError` if ``value`` nests objects and arrays more than ``depth`` levels (default the
    setting ``ECHO2_JSON_MAX_DEPTH``) or, with ``forbid_nul``, holds a NUL character in a string or a key.
    Iterative, so it cannot itself run out of stack."""
    limit = max_depth() if depth is None else depth
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        node, level, path = stack.pop()
        if isinstance(node, str):
            if forbid_nul and "\x00" in node:
                raise JSONLimitError(path, "NUL characters are not allowed")
            continue
        if not isinstance(node, dict | list):
            continue
        if level > limit:
            raise JSONLimitError(path, f"nested deeper than {limit} levels")
        if isinstance(node, list) and (_SCALARS if forbid_nul else _SCALARS_OR_TEXT).issuperset(map(type, node)):
            continue  # nothing to look into, found at C speed (a group's token ids and log-probs)
        items = node.items() if isinstance(node, dict) else enumerate(node)
        # The path is spelled only for what is looked into: a group's long lists of token ids and log-probs hold
        # none, and an f-string per number was most of a large frame's cost.
        for key, item in items:
            if forbid_nul and isinstance(key, str) and "\x00" in key:
                raise JSONLimitError(f"{path}.{key}" if path else key, "NUL characters are not allowed in keys")
            if isinstance(item, dict | list) or (forbid_nul and isinstance(item, str)):
                stack.append((item, level + 1, f"{path}.{key}" if path else str(key)))
