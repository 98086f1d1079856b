"""The field types of transformers' ``TrainingArguments``, which ``[trainer.args]`` may name
beside vf-rl's own keys, for the config check (``rules.check_types``) without importing
transformers, and torch with it, at a launch: read from the annotations in transformers' source
(else from the imported class) and kept in vf-rl's cache (``config/cache.py``) per transformers
version, as JSON that rebuilds them."""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import importlib.util
import operator
import types
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any

from vf_rl.config.cache import cached_json, package_version


@lru_cache(maxsize=1)
def training_arguments_types() -> dict[str, Any]:
    """transformers' ``TrainingArguments`` field types by name, asked for when ``[trainer.args]``
    names a key vf-rl does not declare. Kept in vf-rl's cache per transformers version
    (``config/cache.py``): the first check of a version reads transformers' source (importing it,
    and torch with it, seconds before a launch starts anything, only where that fails); later
    checks rebuild the types from the cache."""
    version = package_version("transformers")
    encoded = (cached_json(f"training-arguments-{version}", _encode_training_arguments) if version
               else _encode_training_arguments())
    return {name: decode_type(spec) for name, spec in encoded.items()}


def _encode_training_arguments() -> dict[str, Any]:
    """The encoded field types, read from transformers' source (:func:`_encode_from_source`), else
    from the imported class."""
    try:
        encoded = _encode_from_source()
    except Exception:  # a source this reader does not follow: the class itself, imported
        encoded = None
    if encoded:
        return encoded
    from transformers import TrainingArguments

    try:
        hints = typing.get_type_hints(TrainingArguments)
    except Exception:  # an annotation that does not evaluate here: names only
        hints = {}
    return {f.name: encode_type(hints.get(f.name, Any)) for f in dataclasses.fields(TrainingArguments) if f.init}


def _encode_from_source() -> dict[str, Any] | None:
    """``TrainingArguments``' fields as :func:`encode_type` writes them, from the annotations in
    transformers' ``training_args.py`` (``ast``, without importing it: ~0.03 s against 3-17 s):
    its fields with ``init``, each annotation's builtins, unions, ``Optional``, ``list``, ``dict``
    and ``Literal``; a class derived from an ``...Enum`` (defined there or imported from a module
    of the package) as ``"str"``, any other name as ``"Any"``. ``None`` when the package or the
    class is not found there, or the class has a base class."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    package = Path(next(iter(spec.submodule_search_locations)))
    tree = ast.parse((package / "training_args.py").read_text())
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainingArguments"), None)
    if cls is None or cls.bases:  # fields from a base class would be missed: import it instead
        return None
    enums = _enum_names(tree, package)
    fields = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        if _name(node.annotation.value if isinstance(node.annotation, ast.Subscript) else node.annotation) == "ClassVar":
            continue
        if isinstance(node.value, ast.Call) and any(k.arg == "init" and isinstance(k.value, ast.Constant)
                                                    and k.value.value is False for k in node.value.keywords):
            continue
        fields[node.target.id] = _encode_annotation(node.annotation, enums)
    return fields


def _name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _enum_names(tree: ast.Module, package: Path) -> set[str]:
    """The classes derived from an ``...Enum`` that ``tree`` defines or imports from a module of
    ``package`` (``from .trainer_utils import IntervalStrategy``)."""
    def enum_classes(body: list[ast.stmt]) -> set[str]:
        return {n.name for n in body if isinstance(n, ast.ClassDef)
                and any((_name(b) or "").endswith("Enum") for b in n.bases)}

    names = enum_classes(tree.body)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            path = package / (node.module.replace(".", "/") + ".py")
            if path.is_file():
                names |= enum_classes(ast.parse(path.read_text()).body) & {a.name for a in node.names}
    return names


def _encode_annotation(node: ast.AST, enums: set[str]) -> Any:
    """:func:`encode_type` of an annotation's syntax tree."""
    def union(parts: list[ast.AST]) -> list:
        out = ["|"]
        for part in parts:
            spec = _encode_annotation(part, enums)
            out += spec[1:] if isinstance(spec, list) and spec[:1] == ["|"] else [spec]
        return out

    if isinstance(node, ast.Constant):
        if node.value is None:
            return "None"
        return _encode_annotation(ast.parse(node.value, mode="eval").body, enums) if isinstance(node.value, str) else "Any"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return union([node.left, node.right])
    if isinstance(node, ast.Subscript):
        head = _name(node.value)
        args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head == "Optional":
            return union([args[0], ast.Constant(None)])
        if head == "Union":
            return union(args)
        if head == "Literal" and all(isinstance(a, ast.Constant) and isinstance(a.value, (bool, int, float, str))
                                     for a in args):
            return ["Literal", *(a.value for a in args)]
        if head in ("list", "List") and len(args) == 1:
            return ["list", _encode_annotation(args[0], enums)]
        if head in ("dict", "Dict") and len(args) == 2:
            return ["dict", *(_encode_annotation(a, enums) for a in args)]
        return "Any"
    name = node.id if isinstance(node, ast.Name) else None
    if name in _BUILTIN_TYPES:
        return name
    return "str" if name in enums else "Any"


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
