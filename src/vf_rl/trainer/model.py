"""Loading the model to train: dtype, attention kernel, liger kernels, the LoRA adapter."""

from __future__ import annotations

import contextlib
import importlib.util
import warnings
import weakref
from collections.abc import Callable

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, TrainerCallback

from vf_rl.config.args import CUDA_GRAPH_MODES
from vf_rl.config.rl_config import RLConfig


def attention_implementation(args: RLConfig) -> str:
    """``args.attn_implementation`` if set; else ``flash_attention_2`` on a GPU in bf16 when
    the ``flash_attn`` package is installed, ``sdpa`` otherwise."""
    if args.attn_implementation:
        return args.attn_implementation
    if args.bf16 and torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def apply_liger(model: PreTrainedModel, args: RLConfig) -> bool:
    """Patch ``model`` with liger-kernel's fused kernels (RMSNorm, RoPE, SwiGLU) when
    ``args.use_liger`` and training on a GPU, unless ``args.torch_compile`` (the compiled
    layers fuse those ops themselves, :func:`compile_layers`; so by default liger applies only
    with ``torch_compile = false``). Warns (once) and returns False when liger-kernel is not
    installed; returns whether the model was patched."""
    if not args.use_liger or not torch.cuda.is_available() or args.use_cpu or args.torch_compile:
        return False
    if importlib.util.find_spec("liger_kernel") is None:
        warnings.warn("use_liger = true but liger-kernel is not installed: training without it "
                      "(pip install liger-kernel, or set use_liger = false to silence this)", stacklevel=2)
        return False
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    # the loss never asks the model for a cross-entropy: vf-rl computes log-probs itself (logprobs.py, loss.py)
    _apply_liger_kernel_to_instance(model=model, cross_entropy=False, fused_linear_cross_entropy=False)
    return True


def load_model(model: str, args: RLConfig) -> PreTrainedModel:
    """Load a causal LM (hub id or local directory) for training: bf16 when ``args.bf16``,
    float32 otherwise; attention from :func:`attention_implementation`; liger kernels from
    :func:`apply_liger`."""
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    loaded = AutoModelForCausalLM.from_pretrained(model, dtype=dtype, attn_implementation=attention_implementation(args))
    apply_liger(loaded, args)
    return loaded


def float32_rotary_buffers(model: torch.nn.Module) -> int:
    """Recompute in float32 every RoPE inverse-frequency buffer (``inv_freq``,
    ``original_inv_freq``, ``{layer_type}_inv_freq`` of transformers' ``*RotaryEmbedding``
    modules) held in a lower precision; returns how many modules were fixed.

    transformers computes these buffers in float32 and RoPE's angles from them
    (``position * inv_freq``). Two things leave them in bf16/fp16 instead: DeepSpeed ZeRO-3
    builds the model inside ``deepspeed.zero.Init``, which casts every floating tensor that
    ``torch.arange`` creates to the training dtype, and older DeepSpeed releases (like any
    ``model.to(torch.bfloat16)``) cast buffers with the weights. bf16 rounds an inverse frequency
    by up to 2**-9 of itself, so a token's angle drifts by about ``position / 500`` radians:
    attention at long positions changes, and the trainer's log-probs part from vLLM's (which
    computes RoPE in float32) more and more along a sequence, with no error raised
    (docs/benchmarks.md). The fix builds a fresh module of the same class from its
    ``config`` (outside ``zero.Init``: float32 buffers) and takes its buffers, on the old ones'
    devices. A module whose constructor needs more than its config keeps its buffers, with a warning.
    """
    fixed = 0
    for module in model.modules():
        low = [name for name, b in module.named_buffers(recurse=False)
               if name.endswith("inv_freq") and b.is_floating_point() and b.dtype != torch.float32]
        if not low or getattr(module, "config", None) is None:
            continue
        try:
            fresh = type(module)(module.config)
        except Exception as exc:  # noqa: BLE001 - any constructor failure: keep what is there
            warnings.warn(f"{type(module).__name__}: its RoPE buffers stay in {module.get_buffer(low[0]).dtype}, "
                          f"and long positions lose precision (rebuilding it from its config failed: {exc})",
                          stacklevel=2)
            continue
        for name in low:
            module.register_buffer(name, fresh.get_buffer(name).float().to(module.get_buffer(name).device),
                                   persistent=False)
        fixed += 1
    return fixed


class Float32Rotary(TrainerCallback):
    """Before the first step, :func:`float32_rotary_buffers` on the model (wrapped, and under
    DeepSpeed built and cast, by then), said once on the main process when it fixed any. The RL
    trainer (through ``RunCallback``) and ``vf-sft`` both use it."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        fixed = float32_rotary_buffers(model) if model is not None else 0
        if fixed and state.is_world_process_zero:
            print(f"RoPE: the inverse frequencies of {fixed} module(s) were below float32 (DeepSpeed builds "
                  f"them in the training dtype): recomputed in float32", flush=True)


def apply_lora(model: PreTrainedModel, args: RLConfig):
    """Wrap ``model`` in a peft LoRA model built from the ``lora_*`` arguments."""
    from peft import LoraConfig, get_peft_model

    config = args.lora_config or LoraConfig(
        r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
        target_modules=args.lora_target_modules, modules_to_save=args.lora_modules_to_save,
        use_rslora=args.lora_use_rslora, task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def lora_input_casts_off(model: torch.nn.Module, autocast: bool) -> contextlib.AbstractContextManager:
    """While active, peft's LoRA layers do not cast their input to the adapter's dtype.

    peft keeps the adapter in float32 on a bf16/fp16 model and casts each LoRA layer's input
    to float32; under autocast the adapter's matmuls cast it straight back. The round trip is
    exact, and it costs four tensor copies per LoRA layer and micro batch (two forward, two
    backward; their share of a step: docs/benchmarks.md). Turning off the layers'
    ``cast_input_dtype_enabled`` (what peft's ``disable_input_dtype_casting`` does) leaves
    log-probs and gradients bitwise equal. The tuner layers are found once per model: walking a
    small model's ~2,500 modules took ~10 ms of host time per step (docs/benchmarks.md).

    Args:
        model: the (possibly wrapped) model; no effect unless it holds peft tuner layers.
        autocast: whether every forward and backward inside runs under autocast (accelerate's
            ``native_amp``). Without autocast the cast is needed, and this is a no-op.
    """
    if not autocast:
        return contextlib.nullcontext()
    if model not in _TUNER_LAYERS:
        from peft.tuners.tuners_utils import BaseTunerLayer

        _TUNER_LAYERS[model] = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    return _casts_off(_TUNER_LAYERS[model])


_TUNER_LAYERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its peft tuner layers
_MODULES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> weak references to its modules


def train_mode(model: torch.nn.Module) -> None:
    """``model.train()`` only where some module is out of training mode (after an evaluation).

    ``Module.train`` sets the flag on every module, through ``Module.__setattr__``: a small LoRA
    model's thousands of modules take milliseconds of host time at the start of each step, with
    the GPU idle. Reading the flags of the modules
    listed once per model takes a fraction of that.
    """
    if model not in _MODULES:  # weak: the list holds the model itself, which a strong one would keep alive
        _MODULES[model] = [weakref.ref(m) for m in model.modules()]
    if not all(getattr(ref(), "training", True) for ref in _MODULES[model]):
        model.train()


@contextlib.contextmanager
def _casts_off(layers: list):
    before = [layer.cast_input_dtype_enabled for layer in layers]
    for layer in layers:
        layer.cast_input_dtype_enabled = False
    try:
        yield
    finally:
        for layer, value in zip(layers, before):
            layer.cast_input_dtype_enabled = value


def offload_checkpoints(checkpoint_kwargs: dict, args: RLConfig) -> dict:
    """``gradient_checkpointing_kwargs`` for ``activation_offloading``: transformers' ``offload``
    on, so each checkpointed decoder layer's input (``[tokens, hidden]`` bf16, the
    ``layers x tokens x hidden x 2`` bytes that dominate a long sequence's memory) is held in
    pinned host memory from the forward to the backward (torch's ``save_on_cpu`` around the
    checkpoint; a device-to-host copy per layer in the forward, host-to-device in the backward).
    On the CPU the activations already live in host memory: the kwargs come back unchanged.

    Raises:
        ConfigError: this transformers' ``gradient_checkpointing_enable`` cannot offload.
    """
    import inspect

    import transformers

    from vf_rl.config.rules import ConfigError

    if args.use_cpu or not torch.cuda.is_available():
        print("activation_offloading: the trainer runs on the CPU, where activations already live in host "
              "memory; nothing to offload", flush=True)
        return checkpoint_kwargs
    if "offload" not in inspect.signature(PreTrainedModel.gradient_checkpointing_enable).parameters:
        raise ConfigError(f"activation_offloading = true needs a transformers whose gradient checkpointing can "
                          f"offload (gradient_checkpointing_enable(offload=...)); this is {transformers.__version__}")
    return {**checkpoint_kwargs, "offload": True}


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside DDP/accelerate wrappers (``.module``) and a peft model."""
    inner = model
    while hasattr(inner, "module") and not hasattr(inner, "config"):
        inner = inner.module
    return inner.get_base_model() if hasattr(inner, "get_base_model") else inner


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated transformer blocks: modules whose class transformers names in
    ``_no_split_modules`` (the unit it never splits across devices) or that subclass its
    ``GradientCheckpointingLayer``, outermost only (a block inside another is not listed).
    Looks through peft and DDP wrappers (:func:`base_model`)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    base = base_model(model)
    names = set(getattr(base, "_no_split_modules", None) or ())
    found: dict[str, torch.nn.Module] = {}
    for name, module in base.named_modules():
        inside = any(name.startswith(f"{outer}.") for outer in found)
        if not inside and (type(module).__name__ in names or isinstance(module, GradientCheckpointingLayer)):
            found[name] = module
    return list(found.values())


def compile_layers(model: torch.nn.Module, backend: str = "inductor", mode: str | None = None) -> int:
    """Regional ``torch.compile``: compile each decoder layer in place (``nn.Module.compile``).

    One compiled graph serves every layer (same code, parameters as graph inputs): the first
    packed row compiles it with the sizes that change between rows dynamic
    (:func:`_compile_region`), and rows of later lengths reuse it (``warmup.py`` compiles before
    the first step). With frozen input embeddings (LoRA) their output is made to require grad,
    so the first layer's input is like every other layer's and the layers share one graph
    instead of compiling a second one for it. The layers' own
    modules, parameter names and state dict are unchanged (weight sync, peft and checkpoints
    see the eager model); the LM head and the log-prob kernels stay outside. The win is
    host time: a compiled layer launches a handful of fused kernels instead of dozens of
    small ops per LoRA linear (docs/benchmarks.md).

    A layer that fails to compile runs eagerly (dynamo's ``suppress_errors``, with its warning),
    and a model with no repeated blocks is left as it is.

    Returns:
        the number of layers compiled.
    """
    layers = decoder_layers(model)
    base = base_model(model)
    embeddings = base.get_input_embeddings() if layers and hasattr(base, "get_input_embeddings") else None
    if embeddings is not None and not any(p.requires_grad for p in embeddings.parameters()):
        base.enable_input_require_grads()  # one output hook; the embedding weights stay frozen
    for layer in layers:
        _compile_region(layer, backend, mode)
    return len(layers)


def _compile_region(module: torch.nn.Module, backend: str, mode: str | None) -> None:
    """``module.compile`` with room in dynamo's cache for every input form (each distinct form of
    one layer class is an entry of the same code: training/no-grad, packed/padded, static then
    dynamic sizes), and what cannot compile (an op inductor cannot lower) running eagerly, with
    dynamo's warning.

    Only the sizes that change between micro batches are dynamic: a packed row's length, segment
    count and gathered keys are marked so before each call (:func:`_mark_row_sizes`), so its first
    compile is already the one every later row reuses; other sizes turn dynamic once they change
    (``dynamic=None``). With inductor, projections that read the same input compile as one
    product (:mod:`fusion`). With every size symbolic from the first call (``dynamic=True``) the
    stack's CUDA graphs crash with torch 2.11 (SIGSEGV) and the layers compile slower."""
    import torch._dynamo

    from vf_rl.trainer.speed import fusion

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    torch._dynamo.config.suppress_errors = True
    if backend == "inductor" and fusion.ENABLED:  # narrow projections on one input as one product (fusion.py)
        import torch._inductor

        options = {**(torch._inductor.list_mode_options(mode) if mode else {}), "pre_grad_custom_pass": fusion.FUSE}
        try:
            module.compile(backend=backend, options=options)
        except RuntimeError:  # an inductor that refuses the option: the layers compile as they are
            module.compile(backend=backend, mode=mode)
    else:
        module.compile(backend=backend, mode=mode)
    compiled = getattr(module, "_compiled_call_impl", None)  # what nn.Module.__call__ runs once compiled
    if compiled is not None:
        def call(*args, **kwargs):
            _mark_row_sizes(args, kwargs)
            return compiled(*args, **kwargs)

        module._compiled_call_impl = call


def _mark_row_sizes(args: tuple, kwargs: dict) -> None:
    """For a call on a packed row (``vf_rl_packing``, a ``packing.PackedLayout``): mark dynamic
    (``maybe_mark_dynamic``: a size the code needs fixed stays static) every dimension of the
    tensor arguments (in tuples too) whose size is the row's length ``N``, but the last one of a
    float tensor of 3 or more dimensions (a feature width: ``[1, N, hidden]``), and the layout's
    ``cu_q``/``cu_k`` (segments + 1) and ``key_index`` (gathered keys). These are the sizes dynamo
    would turn dynamic at the second row (automatic dynamic shapes), which costs a second compile
    of the region (minutes for the decoder stack)."""
    layout = kwargs.get("vf_rl_packing")
    if layout is None or not layout.segments:
        return
    from torch._dynamo import maybe_mark_dynamic

    n = layout.segments[-1][1]
    for t in (layout.cu_q, layout.cu_k, layout.key_index):
        if t is not None:
            maybe_mark_dynamic(t, 0)

    def mark(x) -> None:
        if isinstance(x, torch.Tensor):
            feature = x.dim() - 1 if x.is_floating_point() and x.dim() >= 3 else -1
            for d, size in enumerate(x.shape):
                if size == n > 1 and d != feature:
                    maybe_mark_dynamic(x, d)
        elif isinstance(x, (tuple, list)):
            for y in x:
                mark(y)

    for x in (*args, *kwargs.values()):
        mark(x)


def compile_stack(model: torch.nn.Module, backend: str = "inductor", mode: str | None = None) -> bool:
    """``torch.compile`` of the decoder stack as one region (the embedding, every layer, the last
    norm: the base model's ``get_decoder()``, looked up through peft and DDP wrappers), in place.

    With ``mode`` in :data:`CUDA_GRAPH_MODES` the region runs as CUDA graphs: one forward and
    one backward graph per input shape, replayed without host work, so a host-bound step (small
    models, LoRA) runs at the GPU's pace (``docs/benchmarks.md``). Per-layer regions
    (:func:`compile_layers`) cannot replay graphs: every
    layer runs the same compiled code, whose replay overwrites the previous layer's output
    (pytorch/pytorch#152887).
    Each forward of the model (the LM head runs after the stack) marks a new cudagraph-trees
    step, and before it every trainable parameter gets a ``.grad`` (zeros where it has none), so
    that autograd adds each micro batch's gradient into it in place: a parameter without one
    would take the backward graph's output buffer itself as its ``.grad``, which the next micro
    batch's replay overwrites (pytorch/pytorch#169545; scripts/gpu/cudagraph_accum_check.py).
    On the CPU inductor skips CUDA graphs and the stack runs as one compiled region.

    Returns:
        whether the stack was compiled: False (nothing changed) when the model has no decoder
        distinct from itself.
    """
    base = base_model(model)
    stack = base.get_decoder() if hasattr(base, "get_decoder") else None
    if stack is None or stack is base:
        return False
    _compile_region(stack, backend, mode)  # a packed row's sizes dynamic; one recorded graph per padded shape
    if mode in CUDA_GRAPH_MODES:
        _grads_before_forward(model, torch.compiler.cudagraph_mark_step_begin)
    return True


def record_layer_graphs(model: torch.nn.Module) -> int:
    """The decoder layers' forward and backward recorded as one CUDA graph each per padded shape
    and replayed (``layer_graphs.LayerGraphs``: the stack's speed without its compile time), over
    the layers as they are (compiled by :func:`compile_layers`, or eager); every
    trainable parameter gets a ``.grad`` before each forward, as with :func:`compile_stack`.
    Micro batches should be padded to bucket sizes (``packing.pad_to_buckets``).

    Returns:
        the number of layers routed (0: the model has no repeated blocks, nothing records).
    """
    from vf_rl.trainer.speed.layer_graphs import LayerGraphs

    layers = decoder_layers(model)
    if layers:
        LayerGraphs(layers)
        _grads_before_forward(model)
        # autocast's weight cache off for the process: a recording needs it off (make_graphed_callables
        # refuses it), and layers compiled with it on compile again when it turns off (a guard on global
        # state, seconds in a run's early steps). It only saves re-casting a
        # float32 weight used twice in one autocast region.
        torch.set_autocast_cache_enabled(False)
    return len(layers)


def _grads_before_forward(model: torch.nn.Module, begin: Callable[[], None] | None = None) -> None:
    """Before each forward of ``model`` (after ``begin``), a ``.grad`` of zeros for every trainable
    parameter without one, so autograd adds a replayed backward's gradient into it in place rather
    than taking the graph's output buffer, which the next replay overwrites (pytorch/pytorch#169545;
    scripts/gpu/cudagraph_accum_check.py)."""
    trainable = [p for p in model.parameters() if p.requires_grad]

    def before(*_):
        if begin is not None:
            begin()
        missing = [p for p in trainable if p.grad is None]
        if missing:  # after each optimizer step's zero_grad: one buffer, not a zeros_like per parameter
            for p, grad in zip(missing, zero_grads(missing)):
                p.grad = grad

    base_model(model).register_forward_pre_hook(before)


def zero_grads(params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    """Zero gradients for ``params``, each a view into one zeroed buffer per (device, dtype) group:
    one allocation and one fill instead of one per parameter (a LoRA model's ~400 adapter
    matrices cost ~400 launches at the start of every step). Views keep the parameter's shape
    and are contiguous, so autograd adds into them in place and the optimizer reads them as it
    reads any ``.grad``."""
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault((p.device, p.dtype), []).append(i)
    out: list[torch.Tensor] = [None] * len(params)  # type: ignore[list-item]
    for (device, dtype), members in groups.items():
        flat = torch.zeros(sum(params[i].numel() for i in members), device=device, dtype=dtype)
        start = 0
        for i in members:
            n = params[i].numel()
            out[i] = flat[start:start + n].view(params[i].shape)
            start += n
    return out


def compile_model(model: torch.nn.Module, backend: str = "inductor", mode: str | None = None) -> tuple[bool, str]:
    """``torch_compile = true``: each decoder layer (:func:`compile_layers`); with ``mode``
    ``"reduce-overhead"`` the layers then recorded as CUDA graphs per padded shape
    (:func:`record_layer_graphs`: the stack's speed at the per-layer compile's start-up,
    docs/benchmarks.md), with ``"max-autotune"`` the decoder stack compiled instead as one
    region of inductor's CUDA graphs with autotuned kernels (:func:`compile_stack`; a model with no
    stack apart from its head compiles its layers without CUDA graphs).

    Returns:
        ``(cuda_graphs, what)``: whether CUDA graphs replay (the trainer then pads micro batches to a
        few shapes, ``packing.pad_to_buckets``), and a line saying what compiles.
    """
    if mode == "reduce-overhead":
        n = compile_layers(model, backend)  # inductor's own CUDA graphs cannot replay per-layer regions
        if record_layer_graphs(model):
            return True, f"{n} decoder layers compile, then record as CUDA graphs per padded shape on a GPU ({mode})"
        return False, f"{n} decoder layers compile"
    if mode in CUDA_GRAPH_MODES:
        if compile_stack(model, backend, mode):
            return True, f"the decoder stack compiles as CUDA graphs ({mode})"
        return False, (f"{compile_layers(model, backend)} decoder layers compile without CUDA graphs "
                       f"({type(base_model(model)).__name__} has no decoder stack apart from its head)")
    return False, f"{compile_layers(model, backend, mode)} decoder layers compile"
