"""A run config's ``[env]`` tables checked against the environments they name, before anything
starts: the id names an importable environment, ``[env.args]`` binds to its ``load_environment``,
and an environment that calls tools has a server with tool calling."""

from __future__ import annotations

import contextlib
import io
import re
from typing import Any

from pydantic import TypeAdapter, ValidationError

from vf_rl.config.errors import ConfigError, suggest
from vf_rl.config.tools import chat_template, template_parser


def check_environments(config, path) -> None:
    """:func:`validate_env` with the config file's name in the message.

    Raises:
        ConfigError: ``"<path>: env.id: ..."`` or ``"<path>: env.args.<key>: ..."``.
    """
    try:
        validate_env(config)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def check_call_args(function, args: dict[str, Any], prefix: str) -> None:
    """``function(**args)`` would bind: every key is a parameter (unless it takes ``**kwargs``)
    and every value has the parameter's annotated type where pydantic can check it (lax: an
    int for a float is fine). Used for ``[env.args]`` against ``load_environment``.

    Raises:
        ConfigError: ``"<prefix><key>: ..."`` naming the nearest valid parameter or the type.
    """
    import inspect
    import typing

    signature = inspect.signature(function)
    params = signature.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    names = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # annotations naming what is not importable here: check names only
        hints = {}
    for key, value in args.items():
        if key not in names:
            if takes_any:
                continue
            raise ConfigError(f"{prefix}{key}: {function.__module__}.{function.__name__}() takes no argument "
                              f"{key!r}{suggest(key, names)}; it takes: {', '.join(names) or 'nothing'}")
        if key not in hints:
            continue
        try:
            adapter = TypeAdapter(hints[key])
        except Exception:  # a type pydantic cannot check
            continue
        try:
            adapter.validate_python(value)
        except ValidationError:
            expected = getattr(hints[key], "__name__", None) or str(hints[key]).replace("typing.", "")
            raise ConfigError(f"{prefix}{key}: expected {expected}, got {value!r}") from None


def validate_env(config) -> None:
    """The environment id names an importable module, a module in the working directory or a
    built-in (``vf_rl.env_api.registry.find_environment``'s precedence) whose ``load_environment``
    takes ``[env.args]`` (names and annotated types; the module is imported, nothing is run).

    Raises:
        ConfigError: naming ``env.id`` or the ``env.args`` key.
    """
    from vf_rl.env_api.registry import factory, import_environment_module, is_v1_plugin

    if not config.envs:
        raise ConfigError("env: [[env]] needs at least one table with an id")
    for i, entry in enumerate(config.envs):
        where = "env" if len(config.envs) == 1 else f"env[{i}]"
        try:
            module = import_environment_module(entry.id)
        except ValueError as exc:  # unknown id, or no load_environment()
            raise ConfigError(f"{where}.id: {exc}") from None
        except Exception as exc:
            raise ConfigError(f"{where}.id: importing environment module for {entry.id!r} failed: "
                              f"{type(exc).__name__}: {exc}") from None
        if ":" not in entry.id and is_v1_plugin(module):  # verifiers v1: [env.args] is verifiers' own [env] table
            from vf_rl.env_api.verifiers_v1 import VerifiersError, plugin_config

            try:
                plugin_config(module, entry.args)
            except VerifiersError as exc:
                raise ConfigError(f"{where}.args: {exc}") from None
            continue
        check_call_args(factory(module, entry.id), entry.args, prefix=f"{where}.args.")


def mentions_tools(module) -> bool:
    """Whether the source of an environment module (or of the package it belongs to) mentions
    tools at all: only such environments are built to ask :func:`uses_tools`."""
    import inspect
    import sys

    names = {module.__name__, module.__name__.split(".")[0]}
    for name in names:
        try:
            source = inspect.getsource(sys.modules.get(name) or module)
        except (OSError, TypeError):
            return True  # no source to read: build it to find out
        if re.search(r"tool", source, re.IGNORECASE):
            return True
    return False


def uses_tools(env) -> bool:
    """Whether an environment (vf-rl's, a verifiers adapter, a mixture) sends ``tools`` to the
    model: vf-rl's ``ToolEnv`` with tools, a classic verifiers environment with tool
    definitions, a verifiers v1 taskset with toolsets."""
    if hasattr(env, "envs") and isinstance(env.envs, dict):  # EnvMixture
        return any(uses_tools(e) for e in env.envs.values())
    inner = getattr(env, "env", None)
    for obj in (env, inner):
        if obj is None:
            continue
        for attr in ("tool_schemas", "oai_tools", "tool_defs"):
            if getattr(obj, attr, None):
                return True
    return bool(getattr(env, "uses_tools", False))


def check_tool_calling(config) -> None:
    """Refuse a run whose environments call tools on a server started without tool calling.

    Only when the resolved ``[inference.args]`` leave ``enable_auto_tool_choice`` off, each
    environment whose module mentions tools (:func:`mentions_tools`) is built to ask
    :func:`uses_tools`.

    Raises:
        ConfigError: one line naming the environment and the flag to set, or why building the
            environment failed.
    """
    if config.inference.args.get("enable_auto_tool_choice"):
        return
    from vf_rl.env_api.registry import import_environment_module, load_environment

    for entry in config.envs:
        if not mentions_tools(import_environment_module(entry.id)):
            continue
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                env = load_environment(entry.id, **entry.args)  # quietly: no progress bars in a one-line check
        except Exception as exc:
            raise ConfigError(f"env {entry.id!r}: load_environment failed: {type(exc).__name__}: {exc}") from None
        if uses_tools(env):
            found = template_parser(chat_template(config.model))
            hint = (f'tool_call_parser = "{found[0]}"' if found else
                    'tool_call_parser = "<vLLM\'s parser for this model, e.g. hermes>"')
            raise ConfigError(f"env {entry.id!r} calls tools, but the inference server would start without tool "
                              f"calling: set enable_auto_tool_choice = true and {hint} in [inference.args]")
