"""The field types of transformers' ``TrainingArguments``, which ``[trainer.args]`` may name
beside vf-rl's own keys, for the config check (``rules.check_types``) without importing
transformers, and torch with it, at every launch: they are kept in vf-rl's cache
(``config/cache.py``) per transformers version, as JSON that rebuilds them."""

from __future__ import annotations

import dataclasses
import enum
import functools
import operator
import types
import typing
from functools import lru_cache
from typing import Any

from .cache import cached_json, package_version


@lru_cache(maxsize=1)
def training_arguments_types() -> dict[str, Any]:
    """transformers' ``TrainingArguments`` field types by name, asked for when ``[trainer.args]``
    names a key vf-rl does not declare. Kept in vf-rl's cache per transformers version
    (``config/cache.py``): the first check of a version imports transformers, and with it torch
    (seconds before a launch starts anything); later checks rebuild the types from the cache."""
    version = package_version("transformers")
    encoded = (cached_json(f"training-arguments-{version}", _encode_training_arguments) if version
               else _encode_training_arguments())
    return {name: decode_type(spec) for name, spec in encoded.items()}


def _encode_training_arguments() -> dict[str, Any]:
    from transformers import TrainingArguments

    try:
        hints = typing.get_type_hints(TrainingArguments)
    except Exception:  # an annotation that does not evaluate here: names only
        hints = {}
    return {f.name: encode_type(hints.get(f.name, Any)) for f in dataclasses.fields(TrainingArguments) if f.init}


_BUILTIN_TYPES = {t.__name__: t for t in (bool, int, float, str, dict, list)} | {"None": type(None), "Any": Any}


def encode_type(tp: Any) -> Any:
    """A field type as JSON that rebuilds without transformers: a builtin's name, ``["|", ...]``
    for a union, ``["list", item]``, ``["dict", key, value]``, ``["Literal", values...]``; an enum
    class is ``"str"`` (a TOML value names its member by the string), any other class ``"Any"``
    (left to ``TrainingArguments`` to check)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return ["|", *map(encode_type, args)]
    if origin is typing.Literal and all(isinstance(a, (bool, int, float, str)) for a in args):
        return ["Literal", *args]
    if origin in (list, dict) and args:
        return [origin.__name__, *map(encode_type, args)]
    if tp is type(None) or tp is None:
        return "None"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "str"
    if isinstance(tp, type) and tp.__name__ in _BUILTIN_TYPES and _BUILTIN_TYPES[tp.__name__] is tp:
        return tp.__name__
    return "Any"


def decode_type(spec: Any) -> Any:
    """The type :func:`encode_type` wrote (``Any`` for what it does not know)."""
    if isinstance(spec, str):
        return _BUILTIN_TYPES.get(spec, Any)
    if not isinstance(spec, list) or not spec:
        return Any
    head, args = spec[0], spec[1:]
    if head == "|" and args:
        return functools.reduce(operator.or_, map(decode_type, args))
    if head == "Literal" and args:
        return typing.Literal[tuple(args)]
    if head == "list" and len(args) == 1:
        return list[decode_type(args[0])]
    if head == "dict" and len(args) == 2:
        return dict[decode_type(args[0]), decode_type(args[1])]
    return Any
