"""Train environments written for the real ``verifiers`` package, unchanged.

``load_environment`` wraps any object of the real package (the ``verifiers`` extra: 0.4, the v1 API)
in :class:`VerifiersEnvironment`, which gives the trainer the same three things as vf-rl's
own environments (``get_dataset``, ``get_eval_dataset``, ``generate``) and runs every rollout
through the package's own group rollout call, so its datasets, parsers, rubrics, stop
conditions, tools and state handling are the package's, not look-alikes.

Supported: the classic API (``import verifiers as vf``; ``vf.SingleTurnEnv``,
``vf.MultiTurnEnv``, ``vf.ToolEnv``, ...) of verifiers 0.2.1 through 0.3.x, here; the v1 API
(``verifiers.v1``: ``Env``/``Taskset``/``Harness``/``Trace``) of the versions in
``V1_SUPPORTED``, in :mod:`vf_rl.env_api.verifiers_v1`, which shares this module's version checks
and group runner (:class:`GroupRunner`). Other versions are refused at load time with a
one-line error.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import logging
import sys
from pathlib import Path
from typing import Any

from vf_rl.env_api.environment import Rollout, Turn, merge_sampling_args, prompt_messages, row_info
from vf_rl.env_api.errors import kind_of_names
from vf_rl.env_api.group_sampling import GroupRunner
from vf_rl.env_api.mixture import ENV_KEY

logger = logging.getLogger(__name__)

#: Versions whose classic ``Environment.run_group(inputs, client, model, sampling_args,
#: max_retries, state_columns)`` contract the adapter uses (tested: 0.3.1).
CLASSIC_MIN, CLASSIC_BELOW = (0, 2, 1), (0, 4, 0)
SUPPORTED = ">=0.2.1,<0.4"
#: Versions whose ``verifiers.v1`` API (``Env.serving``/``slots``/``run_slot``, ``Trace`` message
#: graph, ``TrainClientConfig``) :mod:`vf_rl.env_api.verifiers_v1` uses (tested: 0.3.1).
V1_MIN, V1_BELOW = (0, 3, 1), (0, 5, 0)
V1_SUPPORTED = ">=0.3.1,<0.5"

#: State key where the adapter records reward-function exceptions (verifiers scores them 0
#: and only logs them; vf-rl counts them as rollout errors).
REWARD_ERRORS_KEY = "vf_rl_reward_errors"


class VerifiersError(ValueError):
    """An environment of the ``verifiers`` package that vf-rl cannot train (one-line message)."""


def _version_tuple(version: str) -> tuple[int, ...]:
    """``"0.3.1"`` -> ``(0, 3, 1)`` (pre/post/dev parts ignored)."""
    from packaging.version import Version

    release = Version(version).release
    return tuple(release[:3]) + (0,) * (3 - len(release[:3]))


def verifiers_version() -> str | None:
    """The installed ``verifiers`` distribution's version, or ``None`` when not installed."""
    try:
        return importlib.metadata.version("verifiers")
    except importlib.metadata.PackageNotFoundError:
        return None


def verifiers_api(obj: Any) -> str | None:
    """Which API of the real ``verifiers`` package ``obj`` belongs to.

    Returns:
        ``"classic"`` (an ``Environment`` of 0.2.x/0.3.x, ``verifiers.legacy`` in 0.3),
        ``"v1"`` (a ``verifiers.v1`` object), or ``None`` for anything else (vf-rl's own
        environments included).
    """
    for cls in type(obj).__mro__:
        module = getattr(cls, "__module__", "") or ""
        if module == "verifiers.v1" or module.startswith("verifiers.v1."):
            return "v1"
        if module.split(".")[0] == "verifiers":
            return "classic"
    return None


def check_console_scripts(bin_dir: Path | None = None) -> str | None:
    """A warning when a ``verifiers`` install replaced vf-rl's console scripts.

    vf-rl's commands (``vf-rl``, ``vf-train``, ``vf-vllm``, ``vf-sft``) share no name with those of
    verifiers 0.2-0.4 (its ``vf-eval`` is its own: vf-rl's evaluation is ``vf-rl eval``), but
    verifiers 0.1.x installs ``vf-rl``, ``vf-train`` and ``vf-vllm``; whichever package was
    installed last owns the file in ``bin/``.

    Args:
        bin_dir: the scripts directory (default: the one next to ``sys.executable``).
    Returns:
        ``None`` when every script there is vf-rl's (or absent), else a one-line message
        naming the shadowed scripts and the command that restores them.
    """
    bin_dir = bin_dir or Path(sys.executable).parent
    shadowed = []
    for name in ("vf-rl", "vf-train", "vf-vllm", "vf-sft"):
        path = bin_dir / name
        if not path.is_file():
            continue
        try:
            text = path.read_text(errors="replace")[:2000]
        except OSError:
            continue
        if "vf_rl" not in text:
            shadowed.append(name)
    if not shadowed:
        return None
    return (f"{', '.join(shadowed)} in {bin_dir} belong(s) to the verifiers package, not vf-rl; restore "
            f"vf-rl's with: pip install --no-deps --force-reinstall vf-rl (or -e <checkout>); "
            f"meanwhile use python -m vf_rl.launcher.main")



def warn_console_scripts() -> None:
    """Log :func:`check_console_scripts`'s warning (at load time of a verifiers environment)."""
    warning = check_console_scripts()
    if warning:
        logger.warning(warning)

def check_supported(api: str, version: str | None) -> None:
    """Raise :class:`VerifiersError` unless vf-rl can train this API (``"classic"`` or ``"v1"``)
    of this version.

    Raises:
        VerifiersError: a classic version outside ``SUPPORTED``, a v1 version outside
            ``V1_SUPPORTED``, or no installed version.
    """
    if version is None:
        raise VerifiersError("an environment of the verifiers package was returned, but no installed "
                             "'verifiers' distribution was found (pip install 'vf-rl[verifiers]' installs 0.4)")
    v = _version_tuple(version)
    if api == "v1":
        if not V1_MIN <= v < V1_BELOW:
            raise VerifiersError(
                f"verifiers {version} is not supported: vf-rl trains v1 environments (verifiers.v1 Env/"
                f"Taskset/Harness) of verifiers {V1_SUPPORTED} (pip install 'vf-rl[verifiers]' installs 0.4)")
        return
    if not CLASSIC_MIN <= v < CLASSIC_BELOW:
        raise VerifiersError(
            f"verifiers {version} is not supported: vf-rl trains classic environments of verifiers "
            f"{SUPPORTED} (`vf-rl install-verifiers-classic` installs 0.3.1 beside vLLM)")


def _wrap_reward_func(func):
    """``func`` with the same name and parameters (plus ``state``), recording any exception
    in ``state[REWARD_ERRORS_KEY]`` before re-raising it to the rubric (which scores 0)."""
    if getattr(func, "_vf_rl_wrapped", False):
        return func
    sig = inspect.signature(func)
    takes_state = "state" in sig.parameters or any(
        p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
    params = list(sig.parameters.values())
    if not takes_state:
        state_param = inspect.Parameter("state", inspect.Parameter.KEYWORD_ONLY, default=None)
        var_kw = [p for p in params if p.kind == p.VAR_KEYWORD]
        params = [p for p in params if p.kind != p.VAR_KEYWORD] + [state_param] + var_kw
    name = getattr(func, "__name__", type(func).__name__)

    @functools.wraps(func)
    async def wrapper(*args, **kwargs):
        state = kwargs.get("state") if takes_state else kwargs.pop("state", None)
        try:
            value = func(*args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
            return value
        except Exception as exc:
            if isinstance(state, dict):
                message = f"reward function {name} raised {type(exc).__name__}: {exc}"
                state.setdefault(REWARD_ERRORS_KEY, []).append(message)
            raise

    wrapper.__signature__ = sig.replace(parameters=params)
    wrapper._vf_rl_wrapped = True
    return wrapper


def _instrument_rubric(rubric: Any) -> None:
    """Wrap the per-rollout reward functions of ``rubric`` (and of the rubrics it groups) so
    that their exceptions reach vf-rl's error count; group reward functions are left as is."""
    if rubric is None:
        return
    for child in getattr(rubric, "rubrics", None) or []:
        _instrument_rubric(child)
    funcs = getattr(rubric, "funcs", None)
    if not isinstance(funcs, list):
        return
    is_group = getattr(rubric, "_is_group_func", lambda f: False)
    for i, func in enumerate(funcs):
        if callable(func) and not is_group(func):
            funcs[i] = _wrap_reward_func(func)


def _plain(value: Any) -> Any:
    """pydantic messages / nested containers -> plain JSON-like Python objects."""
    if hasattr(value, "model_dump"):
        return _plain(value.model_dump(exclude_none=True))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# row keys not passed to verifiers: vf-rl's own (prompt_rows' row_id, a mixture's env) and a
# plain-string task, which verifiers 0.3 reads as a serialized task payload
VF_RL_ROW_KEYS = frozenset({"row_id", ENV_KEY, "task"})


async def turn_truncated(state: dict) -> bool:
    """A stop condition vf-rl adds to classic multi-turn environments: the last model turn was
    cut at ``max_tokens``. The rollout then ends as truncated, as vf-rl's own multi-turn
    environments end it, instead of answering a half-written turn (an environment that sets
    ``stop_on_truncated_turn = False`` keeps verifiers' behaviour: it goes on)."""
    trajectory = state.get("trajectory") or []
    return bool(trajectory) and bool(trajectory[-1].get("is_truncated"))


def _error(error: Any) -> tuple[str, str] | None:
    """``(text, kind)`` of the error a classic rollout recorded (verifiers' ``ErrorData``: the
    exception's name and message and its chain of causes), or ``None``. verifiers gives a
    ``ModelError`` the message ``"ModelError"``; the text carries the causes (the server's own
    answer) instead."""
    if error is None:
        return None
    if not isinstance(error, dict):
        return str(error), "environment"
    name, message = str(error.get("error") or "Error"), str(error.get("message") or "")
    text = f"{name}: {message}" if message and message != name else name
    causes = str(error.get("error_chain_repr") or "").split(" -> ")[1:]
    text += "".join(f" (caused by {cause})" for cause in causes)
    names = [n.strip() for n in str(error.get("error_chain_str") or name).split("->")]
    return text, kind_of_names(names, message)


class VerifiersEnvironment(GroupRunner):
    """vf-rl's environment interface over a classic environment of the ``verifiers`` package.

    Args:
        env: a ``verifiers`` ``Environment`` (``SingleTurnEnv``, ``MultiTurnEnv``, ``ToolEnv``...).
    Raises:
        VerifiersError: the object is a v1 environment (see :mod:`vf_rl.env_api.verifiers_v1`) or its
            package version is unsupported.
    """

    def __init__(self, env: Any):
        self.api = verifiers_api(env)
        self.version = verifiers_version()
        if self.api == "v1":
            raise VerifiersError(f"{type(env).__name__} is a verifiers v1 object: wrap it in "
                                 f"vf_rl.env_api.verifiers_v1.VerifiersV1Environment")
        check_supported("classic", self.version)
        if not hasattr(env, "run_group"):
            raise VerifiersError(f"{type(env).__name__} (verifiers {self.version}) has no run_group(); "
                                 f"return an Environment (vf.SingleTurnEnv, vf.MultiTurnEnv, ...)")
        message_type = getattr(env, "message_type", "chat")
        if message_type not in (None, "chat"):
            raise VerifiersError(f"{type(env).__name__}: message_type={message_type!r} is not supported; "
                                 f"vf-rl runs verifiers environments through chat completions only")
        warn_console_scripts()
        self.env = env
        self.sampling_args = dict(getattr(env, "sampling_args", None) or {})
        _instrument_rubric(getattr(env, "rubric", None))
        stops = getattr(env, "_stop_conditions", None)
        if isinstance(stops, list) and getattr(env, "stop_on_truncated_turn", True) and turn_truncated not in stops:
            stops.insert(0, turn_truncated)  # a turn cut at max_tokens ends the rollout, as in vf-rl's own
        self._client_cache: tuple[Any, Any] | None = None

    def __repr__(self) -> str:
        return f"VerifiersEnvironment({type(self.env).__name__}, verifiers {self.version})"

    # --- rows ------------------------------------------------------------------------------

    @staticmethod
    def _rows(dataset):
        if "answer" not in dataset.column_names:
            dataset = dataset.add_column("answer", [""] * len(dataset))
        return dataset

    def get_dataset(self, n: int = -1):
        """Training rows from the environment's own dataset (``prompt`` chat messages,
        ``answer``, ``info``, ``example_id``); its eval dataset when it has none."""
        if self.env.build_dataset() is None:
            return self.get_eval_dataset(n)
        return self._rows(self.env.get_dataset(n))

    def get_eval_dataset(self, n: int = -1):
        """Evaluation rows from the environment's own eval dataset (its training rows when it
        has none)."""
        return self._rows(self.env.get_eval_dataset(n))

    # --- rollouts --------------------------------------------------------------------------

    def _client(self, client):
        """vf-rl's ``AsyncOpenAI`` wrapped in verifiers' chat-completions client (cached)."""
        if self._client_cache is None or self._client_cache[0] is not client:
            import verifiers as vf

            self._client_cache = (client, vf.OpenAIChatCompletionsClient(client))
        return self._client_cache[1]

    @staticmethod
    def _sampling(args: dict) -> dict:
        """Ask vLLM for the token ids and log-probs the trainer needs."""
        args = dict(args)
        args["logprobs"] = True
        args["extra_body"] = {"return_token_ids": True, "skip_special_tokens": False,
                              **(args.get("extra_body") or {})}
        return args

    @staticmethod
    def _input(row: dict, index: int) -> dict:
        """verifiers' ``RolloutInput`` for a row: its other columns go along (verifiers hands
        them to reward functions as keyword arguments); ``task`` and vf-rl's own keys do not."""
        example_id = row.get("example_id")
        extra = {k: v for k, v in row.items() if k not in VF_RL_ROW_KEYS}
        return {**extra, "prompt": prompt_messages(row["prompt"]),
                "example_id": int(example_id) if isinstance(example_id, int) else index,
                "answer": row.get("answer") or "", "info": row_info(row.get("info"))}

    def _to_rollout(self, output: dict, row: dict, index: int) -> Rollout:
        """One verifiers ``RolloutOutput`` -> a vf-rl :class:`Rollout` (one Turn per step)."""
        rollout = Rollout(example_id=index, prompt=prompt_messages(row["prompt"]),
                          answer=row.get("answer"), info=dict(self._input(row, index)["info"]),
                          task=row.get("task"))
        rollout.completion = _plain(output.get("completion") or [])
        rollout.is_truncated = bool(output.get("is_truncated", False))
        rollout.metrics = {k: float(v) for k, v in (output.get("metrics") or {}).items()
                           if isinstance(v, (int, float))}
        rollout.reward = float(output.get("reward") or 0.0)
        rollout.state = {"stop_condition": output.get("stop_condition")}
        error = _error(output.get("error"))
        reward_errors = output.get(REWARD_ERRORS_KEY) or []
        if error is None and reward_errors:
            error = "; ".join(reward_errors), "reward"
        for step in output.get("trajectory") or []:
            tokens = step.get("tokens") if isinstance(step, dict) else None
            if not tokens:
                error = error or ("verifiers returned a trajectory step without token ids (is the server vf-vllm?)",
                                  "model")
                break
            if tokens.get("overlong_prompt"):
                rollout.is_truncated = True
                break
            mask = tokens.get("completion_mask") or []
            if mask and not all(mask):
                error = error or ("verifiers masked completion tokens (completion_mask), which vf-rl cannot train yet",
                                  "environment")
                break
            ids, logprobs = list(tokens["completion_ids"]), [float(x) for x in tokens["completion_logprobs"]]
            if len(ids) != len(logprobs):
                error = error or (f"trajectory step has {len(ids)} token ids but {len(logprobs)} logprobs", "model")
                break
            rollout.turns.append(Turn(list(tokens["prompt_ids"]), ids, logprobs))
        if error is not None:
            (rollout.error, rollout.error_kind), rollout.reward = error, 0.0
        return rollout

    def _start(self, client, model: str, sampling_args: dict) -> tuple:
        return self._client(client), model, self._sampling(merge_sampling_args(self.sampling_args, sampling_args))

    async def _run_group(self, context: tuple, row: dict, index: int, r: int) -> list[Rollout]:
        """One ``env.run_group`` of ``r`` copies of ``row``, trajectories included."""
        vf_client, model, sampling_args = context
        inputs = [self._input(row, index) for _ in range(r)]
        outputs = await self.env.run_group(inputs, vf_client, model, sampling_args, max_retries=0,
                                           state_columns=["trajectory", REWARD_ERRORS_KEY])
        return [self._to_rollout(o, row, index) for o in outputs]
