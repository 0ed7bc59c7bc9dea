"""The config's kinds of value: a command-line value keeps the kind (node, number, boolean, text, list) that the
config composed without it has at its key (OmegaConf only)."""
from __future__ import annotations

from typing import Any, Container

from mtbench.errors import UsageError


def short(value: Any, limit: int = 60) -> str:
    """repr(value), cut to `limit` characters with its full length said, for one-line messages."""
    text = repr(value) if not isinstance(value, (int, float)) or isinstance(value, bool) else str(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def plain_value(node: Any) -> Any:
    """An OmegaConf node as plain dicts and lists, resolved; any other value as it is."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "a node of keys"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    return "a text"


def check_shape(base: Any, value: Any, key: str, checked: Container[str] = ()) -> None:
    """`value` at `key` is of the kind the config composed without the command line's values has there (`base`),
    or a UsageError names it: a node stays a node with all its keys (`memory=/tmp/f`, `sampler.options={}`), a
    number a number, true or false stays so, a text stays a scalar, a list a list or a text. A null base, a key
    with a rule of its own (`checked`: the config's schema) and a key the base lacks (`+key=`) are left to their
    own checks; a null value is left to the code that reads the key."""
    if base is None or value is None or key in checked:
        return
    if isinstance(base, dict):
        if not isinstance(value, dict):
            keys = ", ".join(list(base)[:4]) + (", ..." if len(base) > 4 else "")
            raise UsageError(f"{key}={short(value)} replaces the node {key} (keys {keys}) with one value; allowed: "
                             f"its keys one by one ({key}.{next(iter(base), 'KEY')}=...)")
        lost = [k for k in base if k not in value]
        if lost:
            raise UsageError(f"{key}={short(value)} drops {key}.{lost[0]}" + (f" and {len(lost) - 1} more key(s)"
                             if len(lost) > 1 else "") + f"; allowed: its keys one by one ({key}.KEY=VALUE)")
        for k in base:
            check_shape(base[k], value[k], f"{key}.{k}", checked)
        return
    if isinstance(base, bool):
        ok = isinstance(value, bool)
    elif isinstance(base, (int, float)):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif isinstance(base, list):
        ok = isinstance(value, (list, str))
    else:
        ok = not isinstance(value, (dict, list))
    if not ok:
        raise UsageError(f"{key}={short(value)} is {_kind(value)}; allowed: {_kind(base)}, as "
                         f"{key}={short(base)} is")
