"""Pipelines and overrides from Python values: TOML literals, a whole pipeline document from a
nested dict (Session.from_dict), and override keywords flattened to dotted keys.

    >>> print(to_toml({"run": {"epochs": 2}, "model": {"name": "mlp", "hidden": [32]}}))
    [run]
    epochs = 2
    <BLANKLINE>
    [model]
    name = "mlp"
    hidden = [32]
    <BLANKLINE>
"""

import math
import numbers
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Union

__all__ = ["toml_literal", "to_toml", "override_strings", "flatten_overrides"]

Overrides = Union[Mapping[str, Any], Iterable[str], None]


def _toml_string(s: str) -> str:
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch in "\b\t\n\f\r":
            out.append({"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _toml_key(k: Any, where: str = "") -> str:
    if not isinstance(k, str) or not k:
        raise TypeError(f"{where + ': ' if where else ''}TOML table keys must be non-empty "
                        f"strings, not {k!r}")
    bare = all(c.isascii() and (c.isalnum() or c in "-_") for c in k)
    return k if bare else _toml_string(k)


def _literal(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        v = float(value)
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)  # always has a '.' or an exponent, so TOML reads a float back
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, os.PathLike):
        return _toml_string(os.fspath(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v, f"{where}[{i}]") for i, v in enumerate(value)) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_toml_key(k, where)} = {_literal(v, f'{where}.{k}')}"
                               for k, v in value.items()) + "}"
    what = "None has no TOML value (leave the key out)" if value is None else \
        f"no TOML value for {type(value).__name__} {value!r}"
    raise TypeError(f"{where}: {what}" if where else what)


def toml_literal(value: Any) -> str:
    """The TOML literal of a Python value: str or os.PathLike (quoted), bool, int, float
    (nan/inf included), list/tuple (array) or dict (inline table). Anything else (None
    included) raises TypeError."""
    return _literal(value, "")


def _is_table_array(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and \
        all(isinstance(v, Mapping) for v in value)


def _emit_table(lines: List[str], where: str, parts: List[str], table: Mapping[str, Any],
                header: Optional[str]):
    """Writes `table` (at dotted `where` for messages, header keys `parts`): its plain keys under
    `header`, then its sub-tables ([a.b]) and arrays of tables ([[a.b]])."""
    plain, tables, arrays = [], [], []
    for k, v in table.items():
        key = _toml_key(k, where)
        at = f"{where}.{k}" if where else str(k)
        if isinstance(v, Mapping):
            tables.append((key, at, v))
        elif _is_table_array(v):
            arrays.append((key, at, v))
        else:
            plain.append(f"{key} = {_literal(v, at)}")
    # A table with only sub-tables needs no header of its own (TOML defines it implicitly).
    if header is not None and (plain or not (tables or arrays)):
        lines.append(header)
    lines.extend(plain)
    if plain or (header is not None and not (tables or arrays)):
        lines.append("")
    for key, at, v in tables:
        _emit_table(lines, at, parts + [key], v, f"[{'.'.join(parts + [key])}]")
    for key, at, items in arrays:
        for item in items:
            _emit_table(lines, at, parts + [key], item, f"[[{'.'.join(parts + [key])}]]")


def to_toml(config: Mapping[str, Any]) -> str:
    """A pipeline document from a nested dict: each top-level dict is a [section], dicts within
    it are [section.sub] tables, a list of dicts is an array of tables ([[section.items]]), and
    other values are TOML values (str, bool, int, float, list, os.PathLike). A value with no
    TOML form (None, an object) raises TypeError naming its dotted key."""
    if not isinstance(config, Mapping):
        raise TypeError(f"a pipeline dict must be a mapping, not {type(config).__name__}")
    for k in config:
        if isinstance(k, str) and "." in k:
            # Nested paths are built from keys; a dotted top-level key would be quoted instead.
            raise TypeError(f"{k!r}: give sections as nested dicts, not dotted keys")
    lines: List[str] = []
    _emit_table(lines, "", [], config, None)
    return "\n".join(lines).strip("\n") + "\n"


def flatten_overrides(sections: Mapping[str, Any], what: str = "override") -> Dict[str, Any]:
    """{"run": {"epochs": 2}, "optimizer.lr": 0.1} -> {"run.epochs": 2, "optimizer.lr": 0.1}.

    A key without a dot whose value is a dict is a section: each of its entries becomes
    "section.key" (one level: a dict inside it stays a value, an inline table). A dotted key is
    kept as it is, whatever its value. Anything else is a TypeError naming the key."""
    out: Dict[str, Any] = {}
    for key, value in sections.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"{what} keys must be dotted key strings, not {key!r}")
        if "." in key:
            out[key] = value
        elif isinstance(value, Mapping):
            for sub, v in value.items():
                if not isinstance(sub, str) or not sub:
                    raise TypeError(f"{what} {key}: keys must be strings, not {sub!r}")
                out[f"{key}.{sub}"] = v
        else:
            raise TypeError(f"{what} {key}={value!r}: a section needs a dict of its keys "
                            f"({key}={{...}}), or give a dotted key ('{key}.name')")
    return out


def override_strings(overrides: Overrides = None, **sections: Any) -> List[str]:
    """The "dotted.key=value" strings the C API takes, from a dict of dotted keys (values are
    Python values, turned into TOML literals; see flatten_overrides for section dicts), a list
    of such strings as `kiln run --set` takes, and keyword sections (run={"epochs": 2}). Later
    ones win: keyword sections come after `overrides`."""
    out: List[str] = []
    if isinstance(overrides, Mapping):
        for key, value in flatten_overrides(overrides).items():
            out.append(f"{key}={_literal(value, key)}")
    elif isinstance(overrides, (str, bytes)):
        raise TypeError('overrides must be a dict or a list of "key=value" strings, '
                        "not a single string")
    elif overrides is not None:
        for o in overrides:
            if not isinstance(o, str) or "=" not in o:
                raise TypeError(f'override {o!r} is not a "dotted.key=value" string')
            out.append(o)
    for key, value in flatten_overrides(sections, "keyword").items():
        out.append(f"{key}={_literal(value, key)}")
    return out
