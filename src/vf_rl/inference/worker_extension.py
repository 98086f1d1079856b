"""vLLM worker extension: receives new weights inside each vLLM worker process.

vLLM mixes this class into its worker (``--worker-extension-cls``), so ``self`` is the
worker and ``self.model_runner`` its model runner. The server reaches these methods through
``engine_client.collective_rpc(name, args=...)``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

from vf_rl.inference.buckets import DTYPES, Bucket, unpack_bucket

if TYPE_CHECKING:
    import torch


TIED_HEAD = "lm_head.weight"
"""The checkpoint name of a causal LM's output embedding, which a model with tied word embeddings
shares with its input embedding (``*embed_tokens.weight``)."""


def with_tied_head(weights: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """``weights`` plus ``("lm_head.weight", <the input embedding>)`` when the update holds an input
    embedding (a name ending in ``embed_tokens.weight``) and no ``lm_head.weight``.

    A model with tied word embeddings saves one matrix for both (``save_pretrained``, and the
    trainer's export, leave ``lm_head.weight`` out). vLLM's ``reload_weights`` re-runs a module's
    weight processing only for the modules the update names, and on the CPU the LM head's
    processing builds the prepacked copy of its weight that computes the logits: without the head
    in the update, the logits keep the weights the server started with while the input embedding
    follows the trainer. With it, vLLM loads the head (its storage is the embedding's) and repacks it.

    Args:
        weights: ``(name, tensor)`` pairs in checkpoint format.
    Returns:
        the pairs, the head's appended (the same tensor as the embedding's, no copy) where needed.
    """
    names = [name for name, _ in weights]
    if TIED_HEAD in names:
        return weights
    embedding = [tensor for name, tensor in weights if name.endswith("embed_tokens.weight")]
    return [*weights, (TIED_HEAD, embedding[0])] if len(embedding) == 1 else weights


LAYERWISE_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
"""The logger of vLLM's layerwise reload (``finalize_layerwise_processing``), which warns
``"%s: Failed to load weights"`` for every module that an update left untouched."""


def buffer_only_classes(model: torch.nn.Module) -> frozenset[str]:
    """The class names of ``model``'s modules that have nothing to load: every module of the class
    holds no parameter of its own and only non-persistent buffers (a rotary embedding's
    ``cos_sin_cache``, which no checkpoint holds and vLLM restores after a reload)."""
    verdicts: dict[str, bool] = {}
    for module in model.modules():
        buffers = [name for name, b in module._buffers.items() if b is not None]
        params = [p for p in module._parameters.values() if p is not None]
        nothing_to_load = bool(buffers) and not params and set(buffers) <= module._non_persistent_buffers_set
        name = type(module).__name__
        verdicts[name] = verdicts.get(name, True) and nothing_to_load
    return frozenset(name for name, ok in verdicts.items() if ok)


class _DropBufferOnlyWarnings:
    """A ``logging`` filter that drops ``"%s: Failed to load weights"`` for the given class names."""

    def __init__(self, classes: frozenset[str]):
        self.classes = classes

    def filter(self, record) -> bool:
        return not (record.msg == "%s: Failed to load weights" and isinstance(record.args, tuple)
                    and record.args and record.args[0] in self.classes)


@contextlib.contextmanager
def quiet_reload_warnings(classes: frozenset[str]):
    """While the block runs, vLLM's layerwise reload does not warn about the modules of ``classes``
    (:func:`buffer_only_classes`): a reload in checkpoint format never reaches them, and the
    warning would read as a failed weight sync. Every other module's failure is still logged."""
    logger = logging.getLogger(LAYERWISE_LOGGER)
    drop = _DropBufferOnlyWarnings(classes)
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


class WeightSyncExtension:
    """Methods called on every vLLM worker by vf-vllm's weight-update routes."""

    def vf_reload_weights(self, path: str) -> dict:
        """Reload weights in place from safetensors files in checkpoint format.

        On the CPU through ``model_runner.reload_weights(is_checkpoint_format=True)``, which re-runs the
        model's weight processing (on the CPU, oneDNN prepacking of linear layers). Calling
        ``model.load_weights`` directly fails half-way on a prepacked CPU model and leaves it
        half-updated, so on the CPU it is never used (``_vf_reload``).

        Args:
            path: a ``.safetensors`` file or a directory of them, tensor names as
                ``save_pretrained`` writes them (e.g. ``model.layers.0.self_attn.q_proj.weight``).
        Returns:
            ``{"tensors": int, "seconds": float}``.
        Raises:
            FileNotFoundError: no safetensors file at ``path``.
        """
        from safetensors.torch import load_file

        start = time.perf_counter()
        p = Path(path)
        files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
        if not files or not all(f.is_file() for f in files):
            raise FileNotFoundError(f"no safetensors weights at {path}")
        device = "cpu" if self.device.type == "cpu" else str(self.device)
        weights = {}
        for f in files:
            weights.update(load_file(str(f), device=device))
        return self._vf_reload(weights.items(), start)

    def _vf_reload(self, weights, start: float) -> dict:
        """Load ``(name, tensor)`` pairs in checkpoint format into the live model.

        On a GPU with an unquantized model the tensors are copied straight into the parameters
        (``model.load_weights``, several times faster than ``reload_weights``: docs/benchmarks.md);
        the copies are in place, so captured CUDA graphs stay valid. Elsewhere (the CPU's prepacked layers, quantized
        weights, whose processing must run again) through ``model_runner.reload_weights``, a tied LM
        head included (:func:`with_tied_head`) and without the warnings about modules that have
        nothing to load (:func:`quiet_reload_warnings`).
        Returns ``{"tensors": int, "seconds": float}`` (seconds since ``start``)."""
        weights = list(weights)
        received = len(weights)
        if self._vf_loads_directly():
            import torch

            self.model_runner.get_model().load_weights(weights=weights)
            torch.cuda.current_stream(self.device).synchronize()  # the source buffers may be reused after we return
        else:
            model = self.model_runner.get_model()
            tied = getattr(self.vllm_config.model_config.hf_text_config, "tie_word_embeddings", False)
            weights = with_tied_head(weights) if tied else weights
            if getattr(self, "_vf_buffer_only", None) is None:  # the model's modules do not change
                self._vf_buffer_only = buffer_only_classes(model)
            with quiet_reload_warnings(self._vf_buffer_only):
                self.model_runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        return {"tensors": received, "seconds": time.perf_counter() - start}

    def _vf_loads_directly(self) -> bool:
        """Whether weights are copied straight into the parameters (a GPU, an unquantized model),
        so any subset of them can be loaded on its own, as vLLM's ``load_weights`` allows."""
        return self.device.type == "cuda" and getattr(self.vllm_config.model_config, "quantization", None) is None

    # --- the broadcast (nccl) transport -----------------------------------------------------

    def vf_broadcast_rank(self) -> int:
        """This worker's rank in the weight-broadcast group: 1 + its global index over data
        parallel x pipeline parallel x tensor parallel (the trainer is rank 0).

        The engine's index is ``parallel_config.data_parallel_index``: vLLM runs the data-parallel
        engines of a dense model as independent replicas and sets ``data_parallel_rank = 0`` in
        each (vLLM 0.26-0.33, ``EngineCoreProc.run_engine_core``); the index keeps the real one."""
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        parallel = self.vllm_config.parallel_config
        engine = getattr(parallel, "data_parallel_index", parallel.data_parallel_rank)
        tp, pp = get_tp_group(), get_pp_group()
        per_engine = tp.world_size * pp.world_size
        return 1 + engine * per_engine + pp.rank_in_group * tp.world_size + tp.rank_in_group

    def vf_init_broadcast(self, host: str, port: int, world_size: int, backend: str, timeout_s: float,
                          rank_offset: int = 0, warning_s: float | None = None) -> dict:
        """Join the trainer's weight-broadcast group (blocks until every member has joined).

        Args:
            rank_offset: added to this worker's rank: the workers of earlier servers when one
                group spans several servers.
            warning_s: a wait for a bucket this long prints the watchdog's line (``BroadcastGroup``).
        Returns ``{"rank": int, "device": str}``."""
        from vf_rl.inference.communicator import BroadcastGroup

        if getattr(self, "_vf_group", None) is not None:
            self._vf_group.close()
        rank = self.vf_broadcast_rank() + rank_offset
        device = self.device if backend == "nccl" else None
        self._vf_group = BroadcastGroup(host, port, rank, world_size, backend, timeout_s, device=device,
                                        warning_s=warning_s)
        return {"rank": rank, "device": str(self._vf_group.device)}

    def vf_receive_broadcast(self, buckets: list[dict]) -> dict:
        """Receive one weight update as broadcast buckets (see ``buckets.py``) and reload.

        On a GPU each bucket is loaded as soon as it arrives and its buffer freed, so an update
        needs one bucket of free GPU memory beside vLLM's reservation, not a second copy of the
        model (16 GB for an 8B model in bf16, more than the 10% vLLM leaves free by default).
        Elsewhere the whole update is reloaded at once (``_vf_reload``).

        Args:
            buckets: ``Bucket.to_json()`` of each bucket, in the order they are broadcast.
        Returns:
            ``{"tensors": int, "seconds": float}``.
        Raises:
            RuntimeError: no broadcast group (``vf_init_broadcast`` was not called), or the
                broadcast broke off (the trainer died or stopped sending): this worker leaves the
                group (the next ``vf_init_broadcast`` forms a new one) and prints one line first.
        """
        import torch

        group = getattr(self, "_vf_group", None)
        if group is None:
            raise RuntimeError("no weight-broadcast group: POST /init_weight_broadcast first")
        start = time.perf_counter()
        direct, pending, tensors = self._vf_loads_directly(), [], 0
        for i, data in enumerate(buckets):
            bucket = Bucket.from_json(data)
            buffer = torch.empty(bucket.numel, dtype=DTYPES[bucket.dtype], device=group.device)
            try:
                group.broadcast(buffer, what=f"weight bucket {i + 1}/{len(buckets)}")  # watched (communicator.py)
            except Exception as exc:
                raise self._vf_broken_off(exc, i, len(buckets), loaded=direct and i > 0) from exc
            pending += unpack_bucket(bucket, buffer)
            if direct:
                tensors += self._vf_reload(pending, start)["tensors"]
                pending = []
        if pending:
            tensors += self._vf_reload(pending, start)["tensors"]
        return {"tensors": tensors, "seconds": time.perf_counter() - start}

    def _vf_broken_off(self, exc: Exception, index: int, count: int, loaded: bool) -> RuntimeError:
        """After a broadcast that broke off at bucket ``index`` (0-based) of ``count``: leave the
        group, print one line (the Inference pane and its log) and return the error to raise.
        ``loaded``: the buckets before it are already in the model, so until the trainer's next
        update the weights are partly the new ones (a trainer resumed with ``--resume`` pushes its
        checkpoint's before its first batch)."""
        from vf_rl.watchdog import Stalled

        self._vf_group.close()
        self._vf_group = None
        if isinstance(exc, Stalled):  # the watchdog's own line: who waited on whom, how long
            line = str(exc)
        else:
            # the error's first sentence, without a leading source location ("[.../pair.cc:537] Read error ...")
            cause = re.sub(r"^\[[^\]]*\] ", "", (str(exc).strip().splitlines() or [""])[0]).split(". ")[0][:300]
            line = (f"[vf-rl] weight update broken off at bucket {index + 1}/{count}: the trainer (rank 0 of the "
                    f"broadcast group) stopped sending ({type(exc).__name__}: {cause})")
        if loaded:
            line += "; the buckets before it are loaded, so the weights are partly new until the next update"
        print(line, flush=True)
        return RuntimeError(line)

    # --- the ipc transport (a trainer on this worker's GPU) -----------------------------------

    def vf_receive_ipc(self, buckets: list[dict], handles: list[dict]) -> dict:
        """Copy one weight update out of the trainer's shared GPU buffers and load it.

        Each handle (``ipc.share``) is opened once and kept while the trainer sends the same
        handles; a new set (a new trainer) closes the old ones first.

        Args:
            buckets: ``Bucket.to_json()`` per buffer; handles: ``ipc.share(buffer)`` per buffer.
        Raises:
            ValueError: the two lists differ in length, or a buffer's size differs from its bucket's.
        """
        from vf_rl.inference.ipc import open_shared

        start = time.perf_counter()
        if len(buckets) != len(handles):
            raise ValueError(f"{len(buckets)} buckets but {len(handles)} ipc handles")
        keys = [h["handle"] for h in handles]
        opened = getattr(self, "_vf_ipc", {})
        if set(opened) - set(keys):  # another trainer's buffers: let go of them
            opened = {}
            import torch

            torch.cuda.ipc_collect()
        self._vf_ipc = {k: opened.get(k) if k in opened else open_shared(h, self.device)
                        for k, h in zip(keys, handles)}
        weights = []
        for data, key in zip(buckets, keys):
            bucket, buffer = Bucket.from_json(data), self._vf_ipc[key]
            if buffer.numel() != bucket.numel or buffer.dtype != DTYPES[bucket.dtype]:
                raise ValueError(f"ipc buffer holds {buffer.numel()} x {buffer.dtype}, its bucket "
                                 f"{bucket.numel} x {bucket.dtype}")
            weights += unpack_bucket(bucket, buffer)
        return self._vf_reload(weights, start)

    def vf_device_uuid(self) -> str:
        """This worker's GPU UUID, or "cpu" (``communicator.device_uuid``)."""
        from vf_rl.inference.communicator import device_uuid

        return device_uuid(self.device)
