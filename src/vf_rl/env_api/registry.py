"""Find an environment by id: ``load_environment("owner/my-env", **args)``."""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import pkgutil
import sys
from pathlib import Path

BUILTIN_PACKAGE = "vf_rl.environments"


def builtin_environments() -> list[str]:
    """Ids of the environments shipped with vf-rl (e.g. ``["reverse-text"]``)."""
    import vf_rl.environments as pkg

    return sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(pkg.__path__))


def module_name(env_id: str) -> str:
    """The module an id names: ``"primeintellect/reverse-text"`` -> ``"reverse_text"`` (an
    ``owner/`` prefix dropped, ``-`` -> ``_``, as verifiers maps an Environments Hub id to its
    installed package); ``"my_pkg.envs.math"`` and ``"my_pkg.envs:make_env"`` keep their dotted
    module path."""
    return env_id.split(":", 1)[0].rsplit("/", 1)[-1].replace("-", "_")


def factory_name(env_id: str) -> str:
    """The function that builds the environment: ``"module:factory"`` names it, else
    ``load_environment``."""
    return env_id.split(":", 1)[1] if ":" in env_id else "load_environment"


def factory(module, env_id: str):
    """The environment-building function of an imported ``module`` for ``env_id``."""
    return getattr(module, factory_name(env_id))


def find_environment(env_id: str) -> tuple[str, str]:
    """Where ``env_id``'s module (:func:`module_name`) comes from, without importing it. Precedence:

    1. a module importable from ``sys.path``: an installed environment package (an
       Environments Hub environment is a Python package with ``load_environment``) or a
       module in a ``PYTHONPATH`` directory;
    2. ``<name>.py`` or ``<name>/__init__.py`` in the current working directory;
    3. the built-in ``vf_rl.environments.<name>``.

    Returns:
        ``(module_name, where)``, e.g. ``("reverse_text", "built-in")``; ``where`` is one of
        ``"sys.path"``, ``"cwd"``, ``"built-in"``.
    Raises:
        ValueError: none of the three exists; the message lists what was tried and the built-ins.
    """
    name = module_name(env_id)
    if not all(part.isidentifier() for part in name.split(".")) or not factory_name(env_id).isidentifier():
        raise ValueError(f"environment id {env_id!r}: expected a module name, 'package.module', 'owner/name' or "
                         "'module:function'")
    try:
        if importlib.util.find_spec(name) is not None:
            return name, "sys.path"
    except (ImportError, ValueError):
        pass
    cwd = Path.cwd()
    top = name.split(".")[0]
    if (cwd / f"{name}.py").is_file() or (cwd / top / "__init__.py").is_file():
        return name, "cwd"
    if "." in name:
        raise ValueError(f"unknown environment {env_id!r}: module {name!r} cannot be imported; is its package "
                         f"installed (pip install {top.replace('_', '-')})?")
    builtin = f"{BUILTIN_PACKAGE}.{name}"
    if importlib.util.find_spec(builtin) is not None:
        return builtin, "built-in"
    install = f"prime env install {env_id}" if "/" in env_id else f"pip install {name.replace('_', '-')}"
    raise ValueError(
        f"unknown environment {env_id!r}: tried module {name!r} on sys.path (installed environment "
        f"packages, PYTHONPATH), {name}.py in {cwd}, and built-in {builtin}; if it is a published environment, "
        f"install it ({install}); built-in environments: {', '.join(builtin_environments())}")


def import_environment_module(env_id: str):
    """Import the environment module named by ``env_id`` (see :func:`find_environment` for the
    precedence; a module found in the working directory puts it on ``sys.path``).

    Raises:
        ValueError: no such module (the message lists what was tried), or it has neither a
            ``load_environment`` nor the ``__all__`` export of a verifiers v1 plugin
            (:func:`~vf_rl.env_api.verifiers_v1.is_plugin`); errors raised while importing the
            module propagate.
    """
    name, where = find_environment(env_id)
    if where == "cwd" and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(name)
    except AttributeError as exc:  # `vf.SingleTurnEnv` on a verifiers without the classic API
        if "module 'verifiers' has no attribute" not in str(exc):
            raise
        from vf_rl.env_api.verifiers_adapter import SUPPORTED, verifiers_version

        raise ValueError(f"environment module {name!r} uses the classic verifiers API ({exc}), which verifiers "
                         f"{verifiers_version()} does not have: classic environments need verifiers {SUPPORTED}") from None
    if ":" in env_id:
        if not callable(getattr(module, factory_name(env_id), None)):
            raise ValueError(f"environment module {module.__name__!r} ({module.__file__}) has no function "
                             f"{factory_name(env_id)}()")
    elif not callable(getattr(module, "load_environment", None)) and not is_v1_plugin(module):
        raise ValueError(f"environment module {module.__name__!r} ({module.__file__}) has no load_environment() "
                         f"(nor exports a verifiers v1 Taskset in __all__)")
    return module


def is_v1_plugin(module) -> bool:
    """Whether ``module`` is a verifiers v1 plugin (no ``load_environment``; its ``__all__``
    exports a ``verifiers.v1`` Taskset or Env): see :mod:`vf_rl.env_api.verifiers_v1`."""
    if callable(getattr(module, "load_environment", None)):
        return False
    from vf_rl.env_api.verifiers_v1 import is_plugin

    return is_plugin(module)


def load_environment(env_id: str, **env_args):
    """Import the environment module named by ``env_id`` (see :func:`find_environment` for the
    precedence) and call its ``load_environment(**env_args)``, or the function that
    ``"module:function"`` names.

    A verifiers v1 plugin module (no ``load_environment``) is built by verifiers' own loader
    instead, ``env_args`` being verifiers' ``[env]`` table
    (:func:`~vf_rl.env_api.verifiers_v1.load_plugin`).

    Returns:
        a vf-rl :class:`Environment`; an environment of the real ``verifiers`` package comes
        back wrapped in :class:`~vf_rl.env_api.verifiers_adapter.VerifiersEnvironment` (classic
        API) or :class:`~vf_rl.env_api.verifiers_v1.VerifiersV1Environment` (v1 API), which have
        the same ``get_dataset`` / ``get_eval_dataset`` / ``generate`` interface. Its
        ``recipe`` attribute is ``functools.partial(load_environment, env_id, **env_args)``:
        what builds it again in another process (the orchestrator's).
    Raises:
        ValueError: no such module (the message lists what was tried), the module has no
            ``load_environment``, or it gave a ``verifiers`` environment vf-rl cannot train
            (``VerifiersError``, one line: unsupported version, a v1 feature vf-rl cannot train).
    """
    module = import_environment_module(env_id)
    if ":" not in env_id and is_v1_plugin(module):
        from vf_rl.env_api.verifiers_v1 import load_plugin

        env = load_plugin(module, **env_args)
    else:
        env = factory(module, env_id)(**env_args)
        from vf_rl.env_api.verifiers_adapter import VerifiersEnvironment, verifiers_api

        api = verifiers_api(env)
        if api == "v1":
            from vf_rl.env_api.verifiers_v1 import VerifiersV1Environment

            env = VerifiersV1Environment(env)
        elif api is not None:
            env = VerifiersEnvironment(env)
    with contextlib.suppress(AttributeError):  # an object that takes no attributes runs in the trainer's process
        env.recipe = functools.partial(load_environment, env_id, **env_args)
    return env


def load_environments(entries, seed: int):
    """The environment of one ``[env]`` table, or an ``EnvMixture`` of several ``[[env]]`` tables
    (named by id; a repeated id gets ``#2``, ``#3``...), with a ``recipe`` as
    :func:`load_environment` gives.

    Args:
        entries: the config's ``envs`` (objects with ``id``, ``args``, ``weight``).
        seed: the mixture's sampling seed.
    """
    envs, weights = {}, {}
    for entry in entries:
        print(f"Loading environment {entry.id}...", flush=True)
        name = entry.id.split("/")[-1]
        name = name if name not in envs else f"{name}#{sum(k.split('#')[0] == name for k in envs) + 1}"
        envs[name], weights[name] = load_environment(entry.id, **entry.args), entry.weight
    if len(envs) == 1:
        return next(iter(envs.values()))
    from vf_rl.env_api.mixture import EnvMixture

    mixture = EnvMixture(envs, weights, seed)
    mixture.recipe = functools.partial(load_environments, entries, seed)
    return mixture
