"""One typed path for every config value: command-line flags, YAML files and Python alike.

Each dataclass field of a learner config declares its type (``int``, ``float``, ``bool``,
``str``, ``X | None``, ``Sequence[str] | str | None``). :func:`coerce_value` turns a value into
that type or raises :class:`ConfigTypeError` naming the field and the value:

- text (a flag, or a YAML string such as ``1e-3`` that PyYAML reads as a string) is parsed:
  ``float`` from ``"1e-3"``; ``int`` from ``"8"`` (not ``"8.5"``); ``bool`` from exactly
  ``"true"`` / ``"false"`` (any case); ``"none"`` / ``"null"`` for an optional field; a
  sequence from comma-separated text (``"cuda:0,cuda:1"``);
- typed values (YAML numbers, Python objects) must already have the field's type; an ``int`` is
  accepted for a ``float`` field, a ``bool`` is never accepted as a number, and a list's
  entries are checked one by one.

:func:`check_types` applies the same rules, without parsing text, to a config built in Python
(the configs call it in ``__post_init__``, before their range checks). Range and choice checks
("num_generations >= 2", "joint_mode is aligned or cross") are not type coercion and live in
``config.py``.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import types
import typing
from typing import Any

_NONE_WORDS = ("none", "null")


class ConfigTypeError(ValueError, TypeError):
    """A config value does not have, and cannot be read as, its field's type: a ValueError (the
    value is wrong) and a TypeError (of the wrong type), so ``except`` of either catches it, as
    code written for CoMLRL, whose configs fail with TypeError there, expects."""


def field_types(config_class: type) -> dict[str, Any]:
    """Field name -> resolved type annotation of a config dataclass."""
    hints = typing.get_type_hints(config_class)
    return {f.name: hints[f.name] for f in dataclasses.fields(config_class)}


def coerce_value(name: str, hint: Any, value: Any, *, parse_text: bool = True) -> Any:
    """``value`` as field ``name`` of type ``hint``; text is parsed when ``parse_text``."""
    options = _options(hint)
    optional = type(None) in options
    if value is None:
        if optional:
            return None
        raise ConfigTypeError(f"{name}: expected {describe(hint)}, got None")
    if parse_text and isinstance(value, str) and optional and value.strip().lower() in _NONE_WORDS:
        return None
    kinds = [kind for kind in options if kind is not type(None)]
    # A string field takes text as it is; where a list is allowed too, text with a comma is a list.
    if isinstance(value, str) and str in kinds:
        if not (parse_text and _sequence_kinds(kinds) and "," in value):
            return value
        kinds = _sequence_kinds(kinds)
    for kind in kinds:
        try:
            return _coerce_one(name, kind, value, parse_text)
        except ConfigTypeError:
            continue
    raise ConfigTypeError(f"{name}: expected {describe(hint)}, got {value!r}")


def coerce_mapping(config_class: type, values: dict[str, Any], *, source: str = "") -> dict[str, Any]:
    """Every entry of ``values`` that is a field of ``config_class``, coerced to its type.

    Keys that are not fields are returned unchanged. ``source`` (a file name) prefixes errors.
    """
    types_ = field_types(config_class)
    out = {}
    for key, value in values.items():
        if key not in types_:
            out[key] = value
            continue
        try:
            out[key] = coerce_value(key, types_[key], value)
        except ConfigTypeError as exc:
            raise ConfigTypeError(f"{source}: {exc}" if source else str(exc)) from None
    return out


def check_types(config: Any) -> None:
    """Raise ConfigTypeError naming the first field of ``config`` whose value has the wrong type."""
    for name, hint in field_types(type(config)).items():
        value = getattr(config, name)
        coerced = coerce_value(name, hint, value, parse_text=False)
        if coerced is not value:
            setattr(config, name, coerced)


def describe(hint: Any) -> str:
    """A short human name of a field type: ``a float``, ``an int or none``, ``a list of str``..."""
    names = []
    for kind in _options(hint):
        if kind is type(None):
            continue
        if typing.get_origin(kind) in (list, tuple, collections.abc.Sequence):
            entries = [e for e in typing.get_args(kind) if e is not Ellipsis]
            plural = {bool: "true/false values", int: "ints", float: "floats", str: "strings"}
            names.append("a comma-separated list" + (f" of {plural[entries[0]]}" if len(entries) == 1 and entries[0] in plural else ""))
        else:
            names.append({bool: "true or false", int: "an int", float: "a float (e.g. 1e-3)", str: "a string"}.get(kind, str(kind)))
    if type(None) in _options(hint):
        names.append("none")
    return " or ".join(dict.fromkeys(names))


def _options(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _sequence_kinds(kinds: list[Any]) -> list[Any]:
    return [k for k in kinds if typing.get_origin(k) in (list, tuple, collections.abc.Sequence)]


def _coerce_one(name: str, kind: Any, value: Any, parse_text: bool) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        if parse_text and isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if parse_text and isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value if isinstance(value, float) else float(value)
        if parse_text and isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
    elif kind is str:
        if isinstance(value, str):
            return value
    elif typing.get_origin(kind) in (list, tuple, collections.abc.Sequence):
        (item_kind,) = typing.get_args(kind)[:1] or (Any,)
        if parse_text and isinstance(value, str):
            value = [part.strip() for part in value.split(",")]
            if any(part == "" for part in value):
                raise ConfigTypeError(f"{name}: empty entry in {value!r}")
        if isinstance(value, (list, tuple)):
            if item_kind is Any:
                return list(value)
            return [_coerce_one(f"{name}[{i}]", item_kind, v, parse_text) for i, v in enumerate(value)]
    elif kind is Any:
        return value
    raise ConfigTypeError(f"{name}: expected {describe(kind)}, got {value!r}")
