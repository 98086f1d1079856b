"""Find an environment by id: ``load_environment("owner/my-env", **args)``."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

from .environment import Environment

BUILTIN_PACKAGE = "vf_rl.environments"


def builtin_environments() -> list[str]:
    """Ids of the environments shipped with vf-rl (e.g. ``["reverse-text"]``)."""
    import vf_rl.environments as pkg

    return sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(pkg.__path__))


def module_name(env_id: str) -> str:
    """``"primeintellect/reverse-text"`` -> ``"reverse_text"``: drop an ``owner/`` prefix, ``-`` -> ``_``."""
    return env_id.rsplit("/", 1)[-1].replace("-", "_")


def load_environment(env_id: str, **env_args) -> Environment:
    """Import the environment module named by ``env_id`` and call its ``load_environment(**env_args)``.

    A module of that name on ``sys.path`` (an installed environment package, or a module in the
    working directory) wins over a built-in of the same name.

    Raises:
        ValueError: no such module (the message lists the built-ins), or the module has no
            ``load_environment``.
    """
    name = module_name(env_id)
    module = None
    for candidate in (name, f"{BUILTIN_PACKAGE}.{name}"):
        if importlib.util.find_spec(candidate) is not None:
            module = importlib.import_module(candidate)  # errors inside the module propagate
            break
    if module is None:
        raise ValueError(f"unknown environment {env_id!r} (module {name!r} not found); "
                         f"built-in environments: {', '.join(builtin_environments())}")
    if not hasattr(module, "load_environment"):
        raise ValueError(f"environment module {module.__name__!r} has no load_environment()")
    return module.load_environment(**env_args)
