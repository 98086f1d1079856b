"""The trainer's argument fields, read from source without importing torch or transformers.

``RLConfig`` (ours) and ``transformers.TrainingArguments`` are dataclasses; this module reads
their field names, type annotations, defaults and help texts from the source files with
``ast``, so that the launcher can validate ``[trainer.args]`` instantly and the README table
can be generated. ``tests/test_config.py`` checks the result against the imported classes.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import types
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any, Union

MISSING = dataclasses.MISSING


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """One dataclass field: ``annotation`` is the source text; ``default`` is ``MISSING`` when
    it is not a literal (a factory or an expression)."""

    name: str
    annotation: str
    default: Any
    help: str
    owner: str  # "RLConfig" or "TrainingArguments"


def _literal(node: ast.AST | None) -> Any:
    if node is None:
        return MISSING
    try:
        return ast.literal_eval(node)
    except ValueError:
        return MISSING


def _dataclass_fields(source: Path, class_name: str) -> dict[str, FieldSpec]:
    tree = ast.parse(source.read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name)
    fields = {}
    for stmt in cls.body:
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        name, default, help_text = stmt.target.id, MISSING, ""
        value = stmt.value
        if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
            kwargs = {k.arg: k.value for k in value.keywords}
            default = _literal(kwargs.get("default"))
            metadata = _literal(kwargs.get("metadata"))
            if isinstance(metadata, dict):
                help_text = " ".join(str(metadata.get("help", "")).split())
        elif value is not None:
            default = _literal(value)
        fields[name] = FieldSpec(name, ast.unparse(stmt.annotation), default, help_text, class_name)
    return fields


@lru_cache(maxsize=1)
def trainer_fields() -> dict[str, FieldSpec]:
    """Every key ``[trainer.args]`` accepts: TrainingArguments' fields, overridden by RLConfig's.

    Raises:
        ModuleNotFoundError: transformers is not installed.
    """
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.origin:
        raise ModuleNotFoundError("transformers is not installed")
    fields = _dataclass_fields(Path(spec.origin).parent / "training_args.py", "TrainingArguments")
    fields.update(rl_fields())
    return fields


@lru_cache(maxsize=1)
def rl_fields() -> dict[str, FieldSpec]:
    """The fields RLConfig declares (its own keys and the defaults it changes)."""
    return _dataclass_fields(Path(__file__).with_name("rl_config.py"), "RLConfig")


@lru_cache(maxsize=1)
def scheduler_types() -> list[str]:
    """Names ``lr_scheduler_type`` accepts (transformers' ``SchedulerType`` values)."""
    spec = importlib.util.find_spec("transformers")
    tree = ast.parse((Path(spec.origin).parent / "trainer_utils.py").read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "SchedulerType")
    return [stmt.value.value for stmt in cls.body
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)]


_SIMPLE = {"int": int, "float": float, "bool": bool, "str": str, "None": type(None), "dict": dict, "list": list,
           "Any": Any, "Optional": typing.Optional, "Union": typing.Union}


def annotation_type(annotation: str) -> Any:
    """A Python type for a field's annotation text, for validation: unknown names (enums such as
    ``SchedulerType``, classes) become ``str`` when they are enums or ``Any`` otherwise;
    containers keep their outer type only."""

    def convert(node: ast.AST) -> Any:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return Union[convert(node.left), convert(node.right)]
        if isinstance(node, ast.Constant) and node.value is None:
            return type(None)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return convert(ast.parse(node.value, mode="eval").body)
        if isinstance(node, ast.Subscript):
            outer = getattr(node.value, "id", getattr(node.value, "attr", ""))
            inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if outer == "Optional":
                return Union[convert(inner[0]), type(None)]
            if outer == "Union":
                return Union[tuple(convert(i) for i in inner)]
            return {"list": list, "dict": dict, "List": list, "Dict": dict, "Literal": str}.get(outer, Any)
        name = getattr(node, "id", getattr(node, "attr", ""))
        if name in _SIMPLE and name not in ("Optional", "Union"):
            return _SIMPLE[name]
        if name.endswith(("Type", "Strategy", "Names", "Option")):
            return str
        return Any

    return convert(ast.parse(annotation, mode="eval").body)


def is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)
