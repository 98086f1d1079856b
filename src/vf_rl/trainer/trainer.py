"""RLTrainer: asynchronous group-advantage CISPO on a ``transformers.Trainer``.

One optimizer step ``n`` (``training_step``):
    1. take batch ``n`` from the orchestrator (generated with the weights of step ``n - 1``);
    2. push the current weights to the inference server (skipped if unchanged; ``nccl`` and
       ``ipc`` push in the background, under this step's training);
    3. submit batch ``n + 1``, which generates (after the push) while we train;
    4. for each micro batch: forward, log-probs of the sampled tokens at the sampling
       temperature, the loss (``loss.py``: ``loss_type`` or ``loss_fn``), backward.
       ``Trainer`` then clips, steps and schedules;
    5. record: metrics, ``batches.jsonl``, the sample table.
Evaluation (``evaluate``) waits for the batch in flight, syncs the weights and rolls out the
environment's eval split; it does not change which rows the training batches use.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import Future
from pathlib import Path

import psutil
import torch
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.trainer_callback import ProgressCallback

from vf_rl.algorithm.advantage import AdvantageFn, get_advantage
from vf_rl.algorithm.loss import LossFn, get_loss
from vf_rl.config.resolved_toml import record_python_run
from vf_rl.config.rl_config import RLConfig, resolve_temperature
from vf_rl.env_api import Environment
from vf_rl.inference.client import SERVER_LOST, InferenceClient
from vf_rl.inference.supervision import MAX_RESTARTS
from vf_rl.orchestrator.metrics import env_metrics, rollout_metrics
from vf_rl.orchestrator.orchestrator import Batch, Orchestrator
from vf_rl.orchestrator.preflight import check_first_batch
from vf_rl.orchestrator.process import begin_orchestrator, orchestrator_options, start_orchestrator
from vf_rl.orchestrator.samples import prompt_rows
from vf_rl.trainer import display
from vf_rl.trainer.batching import StepsDataset
from vf_rl.trainer.callbacks import QuietProgress, RunCallback, RunSummary, TimeBudget, append_jsonl, evaluating
from vf_rl.trainer.checkpoints import CheckpointingTrainer
from vf_rl.trainer.micro_step import OutOfMemoryStop, oom_metrics, save_last_complete_step, train_on_batch
from vf_rl.trainer.model import apply_lora, compile_model, load_model, offload_checkpoints
from vf_rl.trainer.reference import frozen_copy
from vf_rl.trainer.rollout_log import record_step_rollouts
from vf_rl.trainer.speed.attention import register_attention
from vf_rl.trainer.speed.tiling import tile_mlps
from vf_rl.trainer.speed.warmup import compile_metrics, server_memory_taken, warm_up
from vf_rl.trainer.weight_sync import LORA_NAME, open_weight_sync
from vf_rl.trainer.weights import gathered_weights


class RLTrainer(CheckpointingTrainer):
    """Asynchronous RL trainer (one step off-policy) for vf-rl environments.

    Args:
        model: a hub id, a local model directory, or a loaded ``PreTrainedModel``.
        env: the environment whose training rows, eval rows and rubric are used.
        args: :class:`RLConfig`.
        processing_class: the tokenizer (loaded from ``model`` if omitted).
        loss_fn: the policy loss (``algorithm/loss.py``); default the one ``args.loss_type`` names.
        advantage_fn: rewards to advantages (``algorithm/advantage.py``); default ``args.advantage_type``'s.
        server_shares_gpu: vLLM starts on this GPU too (``[inference] shared``), with this share of it (its
            ``gpu_memory_utilization``; True: not known): compile once it holds that (``speed/warmup.py``).
        served_model_name: the model name the server serves (default ``model``'s id). Other keyword
            arguments go to ``transformers.Trainer``.

    The inference server (vf-vllm) must serve the same base model at
    ``args.vllm_server_host:vllm_server_port``; ``train()`` waits for it up to
    ``vllm_server_timeout`` seconds.
    """

    def __init__(self, model: str | PreTrainedModel, env: Environment, args: RLConfig,
                 processing_class: PreTrainedTokenizerBase | None = None, loss_fn: LossFn | None = None,
                 advantage_fn: AdvantageFn | None = None, server_shares_gpu: float | bool = False,
                 served_model_name: str | None = None, **kwargs):
        model_id = model if isinstance(model, str) else model.config._name_or_path
        resolve_temperature(args, env)
        if isinstance(model, str):
            model = load_model(model, args)
        if args.gradient_checkpointing:
            model.config.use_cache = False
            if args.gradient_checkpointing_kwargs is None:  # non-reentrant: works with frozen inputs (LoRA)
                args.gradient_checkpointing_kwargs = {"use_reentrant": False}
            if args.activation_offloading:
                args.gradient_checkpointing_kwargs = offload_checkpoints(args.gradient_checkpointing_kwargs, args)
        if args.padding_free:  # packed rows need per-sample attention (attention.py); other forwards: sdpa
            model.set_attn_implementation(register_attention())
        tokenizer = processing_class or AutoTokenizer.from_pretrained(model_id)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        if args.use_lora:
            model = apply_lora(model, args)
        if args.tiled_mlp:  # before compiling: a compiled layer calls the tiled MLP eagerly (tiling.py)
            print(f"tiled_mlp: {tile_mlps(model)} MLPs run in tiles", flush=True)
        self.served_model_name = served_model_name or model_id
        self.server_shares_gpu = server_shares_gpu
        with_eval = evaluating(args) or args.eval_on_start
        super().__init__(model=model, args=args, processing_class=tokenizer, data_collator=lambda items: {},
                         train_dataset=StepsDataset(args.max_steps * args.micro_batch_size * args.world_size),
                         eval_dataset=StepsDataset(1) if with_eval else None, **kwargs)
        self.env = env
        # beta > 0 with full weights: a frozen copy of the initial model (its memory); LoRA: the adapter off
        self.ref_model = frozen_copy(self.model) if args.beta > 0 and not args.use_lora else None
        self.cuda_graphs = False  # CUDA graphs replay (torch_compile_mode): micro batches padded to a few shapes
        if args.torch_compile:  # in place (model.py), not accelerate's whole-model compile
            from accelerate.utils import DynamoBackend

            self.accelerator.state.dynamo_plugin.backend = DynamoBackend.NO
            self.cuda_graphs, what = compile_model(self.model, args.torch_compile_backend or "inductor",
                                                   args.torch_compile_mode)
            if self.is_world_process_zero():
                print(f"torch_compile: {what} before the first step (warmup.py)", flush=True)
        self.loss_fn = loss_fn or get_loss(args.loss_type)
        self.advantage_fn = advantage_fn or get_advantage(args.advantage_type)
        self.remove_callback(ProgressCallback)
        self.add_callback(QuietProgress)
        self.add_callback(RunCallback)
        self.add_callback(RunSummary)  # after RunCallback: the summary is the run's last output
        if args.max_time_s is not None:
            self.add_callback(TimeBudget(args.max_time_s))
        self.servers = [InferenceClient(url=url, timeout=args.vllm_server_timeout) for url in args.server_urls()]
        self.orchestrator: Orchestrator | None = None  # main process only
        self.weight_sync = None  # main process only: a transport from weight_sync.py
        self._synced_step = 0  # the server holds (or is being pushed) the weights of this optimizer step
        self._pushing: Future | None = None  # a push overlapping the current step (sync_weights)
        self._step_metrics: dict[str, float] = {}
        self._timings: dict[str, float] = {}  # seconds per phase of the current step
        self._server_reconnects = 0  # batches generated again after the server came back
        self._started = time.perf_counter()  # reset once the server answers: timing/elapsed_s counts from there
        self._last_eval: tuple[int, dict] = (-1, {})
        self._rows = prompt_rows(env.get_dataset(), tokenizer, args.max_prompt_len,
                                 args.seed if args.shuffle_dataset else None)
        self._eval_rows = (prompt_rows(env.get_eval_dataset(args.num_eval_examples), tokenizer, args.max_prompt_len)
                           if with_eval else [])

    # --- the loop ---------------------------------------------------------------------------

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        """Compile on synthetic batches (``torch_compile``, warmup.py) while the inference server
        starts, wait for it, start the orchestrator, then run ``Trainer.train``.

        Args:
            resume_from_checkpoint: ``True`` (the last checkpoint in ``output_dir``) or a path; default
                ``args.resume_from_checkpoint``. Steps, learning-rate schedule, optimizer, RNG and dataset
                position continue from the checkpoint; the server gets its weights before the first batch.
        """
        if resume_from_checkpoint is None:
            resume_from_checkpoint = self.args.resume_from_checkpoint
        if resume_from_checkpoint:  # the newest complete checkpoint; the main process cuts the records back
            resume_from_checkpoint = self.prepare_resume(resume_from_checkpoint)
        a, begun = self.args, None
        if self.is_world_process_zero():
            record_python_run(a, self.served_model_name, self.env)  # <output_dir>/resolved.toml
            print(f"Trainer: {a.world_size} process(es), main on {a.device}", flush=True)
            if a.orchestrator_process:  # its imports and the environment's rebuild, while the server starts
                begun = begin_orchestrator(self.env, self._rows, **orchestrator_options(a, self.servers, self.advantage_fn))
        try:
            if a.torch_compile and (not self.server_shares_gpu or server_memory_taken(self)):  # as it starts (warmup.py)
                warm_up(self)
            if self.is_world_process_zero():
                print(f"Waiting for vf-vllm at {', '.join(c.base_url for c in self.servers)} ...", flush=True)
                up_s, asked = time.time() - psutil.Process().create_time(), time.perf_counter()
                for server in self.servers:
                    server.wait_until_ready(a.vllm_server_timeout)
        except BaseException:
            if begun is not None:
                begun.close()
            raise
        self._started = time.perf_counter()  # timing/elapsed_s: training time, not the server's start-up
        if self.is_world_process_zero():
            # where a run's start goes: the trainer's own start against the wait for vLLM's
            print(f"vf-vllm ready: the trainer process ran {up_s:.1f} s before it asked, then waited "
                  f"{self._started - asked:.1f} s", flush=True)
            self._start_inference_side(begun)
        if a.torch_compile and self.server_shares_gpu:  # after vLLM measured its memory (unless done), while batch 1 generates
            warm_up(self)
        try:
            return super().train(resume_from_checkpoint=resume_from_checkpoint or None, **kwargs)
        finally:
            if self.orchestrator is not None:
                self.orchestrator.close()
            if self.weight_sync is not None:
                self.weight_sync.close()  # waits for a push still in flight

    def _open_weight_sync(self) -> str:
        """Main process: pick and open the weight-sync transport (again after a server restart:
        an NCCL group must be formed with the new workers). Returns its kind."""
        self.weight_sync, kind = open_weight_sync(self.args, self.servers)
        return kind

    def _start_inference_side(self, begun=None) -> None:
        """Main process: open the weight-sync transport, start the orchestrator (in ``begun``, the
        process :func:`begin_orchestrator` started, when there is one)."""
        a = self.args
        kind = self._open_weight_sync()
        model_name = self.served_model_name
        if kind == "lora":  # rollouts ask for the adapter, which must exist before the first batch
            self.weight_sync.push(self.accelerator.unwrap_model(self.model))
            model_name = LORA_NAME
        print(f"Weight sync: {kind}" + (" (auto)" if a.weight_sync == "auto" else ""), flush=True)
        self.orchestrator = start_orchestrator(self.env, self._rows, a.orchestrator_process, begun=begun,
                                               model_name=model_name,
                                               **orchestrator_options(a, self.servers, self.advantage_fn))

    def training_step(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        """One optimizer step's forward/backward passes (``Trainer`` then steps the optimizer)."""
        step = self.state.global_step
        self._timings = {}
        batch = self._next_batch(step)
        with self._timed("train_s"):
            loss, stats = self._train_on_batch(model, batch)
        self._record(batch, stats)
        return loss

    def _next_batch(self, step: int) -> Batch:
        """Batch ``step``, with the weights synced before batch ``step + 1`` starts generating.

        Batch ``step`` was submitted with the weights of step ``step - max_off_policy_steps`` (or
        later; right after a resume it is generated now with the checkpoint's). Then the server
        gets the current weights and batches up to ``step + max_off_policy_steps`` are submitted,
        so they generate while this step trains (batches already in flight finish with the new
        weights: each token's sampling log-prob is the one it was drawn with, so the importance
        ratio stays exact). Every process gets the main process's batch.

        With ``nccl`` or ``ipc`` and one process the push itself overlaps this step's training
        (``push_async``): the next batch waits for it in the orchestrator, the trainer only at
        the start of the next step (``_finish_sync``)."""
        batch = None
        self._finish_sync()
        if self.is_world_process_zero():
            if not self.orchestrator.submitted(step) and self._synced_step != step:
                with self._timed("sync_s"):
                    self.sync_weights(step)  # first step after a resume: generate with the checkpoint's weights
            with self._timed("wait_s"):
                batch = self._wait_for_batch(step)
            if step == 0 and self.args.preflight != "off":  # a fresh run's first batch (not a resumed run's)
                check_first_batch(batch.rollouts, self.env, self.args)
        pushing = None
        if self._synced_step != step:
            with self._timed("sync_s"):
                pushing = self.sync_weights(step, overlap=True)
        if self.is_world_process_zero():  # up to max_off_policy_steps ahead, generated with this step's weights
            for ahead in range(step + 1, min(step + self.args.max_off_policy_steps + 1, self.args.max_steps)):
                self.orchestrator.submit(ahead, policy_step=step, after=pushing)
        return self._share_batch(batch)

    def _wait_for_batch(self, step: int) -> Batch:
        """``orchestrator.wait(step)``; a batch that lost rollouts to an unreachable server (it
        was killed or its engine died, and ``vf-rl`` restarts it) is generated again once the
        server is back, with the current weights pushed first, so no rollout is scored 0 for the
        crash. A batch whose weight update failed is generated only now, after the update's
        retry (``_pushed``), so no rollout comes from the weights before it.

        Raises:
            ServerExited: the server exited for good (restarts used up, start-up error, Ctrl-C).
        """
        for attempt in range(MAX_RESTARTS + 2):
            batch = self.orchestrator.wait(step, on_progress=display.progress_printer(step))
            if not batch.server_errors or attempt > MAX_RESTARTS:
                return batch
            if len(self.servers) > 1 and any(server.is_healthy() for server in self.servers):
                return batch  # training goes on with the other servers; the lost rollouts count as errors
            self._reconnect(f"batch {step + 1}: {batch.server_errors}/{len(batch.rollouts)} rollouts could not reach "
                            "the inference server")
            print(f"[vf-rl] generating batch {step + 1} again", flush=True)
        return batch

    def _reconnect(self, why: str) -> None:
        """Main process, after the server was lost: wait until it answers again (``vf-rl``
        restarts a killed one), open the weight-sync transport anew (a new server has new
        workers) and push the current weights.

        Raises:
            ServerExited: the server exited for good. TimeoutError: not back in ``vllm_server_timeout``.
        """
        print(f"[vf-rl] {why}; waiting for it (up to {self.args.vllm_server_timeout:.0f} s)", flush=True)
        self.servers[0].wait_until_ready(self.args.vllm_server_timeout)
        self._server_reconnects += 1
        self.weight_sync.close()
        self._open_weight_sync()
        self.weight_sync.push(self.accelerator.unwrap_model(self.model))
        print("[vf-rl] inference server back; current weights pushed", flush=True)

    @contextlib.contextmanager
    def _timed(self, name: str):
        """Add the seconds the block takes to ``timing/<name>`` of this step's metrics."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._timings[name] = self._timings.get(name, 0.0) + time.perf_counter() - start

    def _record(self, batch: Batch, stats: dict[str, float]) -> None:
        """Everything a step leaves behind: the metrics logged with the loss, ``batches.jsonl``
        (the dataset rows of each step, for exact resume checks), the sample tables and rollouts file."""
        timings = {"wait_s": 0.0, "sync_s": 0.0, **self._timings}
        self._step_metrics = {**batch.metrics, **stats, **{f"timing/{k}": v for k, v in timings.items()},
                              "timing/elapsed_s": time.perf_counter() - self._started,
                              "server/reconnects": float(self._server_reconnects), **compile_metrics(self), **oom_metrics(self),
                              "throughput/train_tokens_per_s": stats["tokens/trained"] / max(timings["train_s"], 1e-9)}
        if not self.is_world_process_zero():
            return
        append_jsonl(Path(self.args.output_dir) / "batches.jsonl", {"step": batch.step + 1, "rows": batch.row_ids})
        record_step_rollouts(batch, self.args)

    def _share_batch(self, batch: Batch | None) -> Batch:
        """Several processes: the main process's batch, sent to every other process (each
        then trains on its own shard of it)."""
        if self.args.world_size == 1:
            return batch
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([batch], from_process=0)[0]

    def _train_on_batch(self, model, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """Forward, loss and backward over this process's micro batches of ``batch`` (``micro_step.py``:
        a micro batch that runs out of memory is split). Returns ``(loss, stats)``: the summed loss
        (detached, 0-d) and the step statistics.

        Raises:
            OutOfMemoryStop: a sample alone does not fit; the last complete step's checkpoint is saved first.
        """
        try:
            return train_on_batch(self, model, batch)
        except OutOfMemoryStop:
            save_last_complete_step(self)
            raise

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True):
        """accelerate's autocast (a no-op without mixed precision) around every loss
        computation, so the model's forward is under autocast however it was wrapped."""
        return self.accelerator.autocast()

    # --- evaluation ---------------------------------------------------------------------------

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Roll out the eval rows with the current weights; log ``eval/reward``,
        ``eval/reward/<func>`` and the rest of :func:`vf_rl.orchestrator.metrics.rollout_metrics`."""
        if not self._eval_rows:
            return {}
        step = self.state.global_step
        if self._last_eval[0] == step:  # Trainer may ask twice at the last step (step and epoch end)
            return self._last_eval[1]
        self._finish_sync()
        if self.is_world_process_zero():
            self.orchestrator.wait_idle()  # never change the weights under a batch being generated
        if self._synced_step != step:
            self.sync_weights(step)
        if not self.is_world_process_zero():  # the main process rolls out and logs
            self._last_eval = (step, {})
            return {}
        start = time.perf_counter()
        rollouts = self.orchestrator.run(self._eval_rows, self.args.eval_rollouts_per_example)
        group = self.args.eval_rollouts_per_example
        metrics = {f"{metric_key_prefix}/{k}": v for k, v in {**rollout_metrics(rollouts, group),
                                                              **env_metrics(self._eval_rows, rollouts, group)}.items()}
        metrics[f"{metric_key_prefix}/timing_s"] = time.perf_counter() - start
        self.log(metrics)
        self._last_eval = (step, metrics)
        return metrics

    # --- weight sync ------------------------------------------------------------------------

    def sync_weights(self, step: int, overlap: bool = False) -> Future | None:
        """Push the current weights to the inference server (main process; the others wait).
        With ``overlap``, one process and a transport that can (``nccl``, ``ipc``): snapshot them
        and push in the background; returns that push's future (``_finish_sync`` collects it),
        else ``None``, the push done."""
        model = self.accelerator.unwrap_model(self.model)
        if overlap and self.args.world_size == 1 and self.weight_sync.overlaps:
            self._pushing = self.weight_sync.push_async(model, step)
            self._synced_step = step
            return self._pushing
        with gathered_weights(self.model):
            if self.is_world_process_zero():
                self._pushed(lambda: self.weight_sync.push(model, step))
        self.accelerator.wait_for_everyone()
        self._synced_step = step
        return None

    def _finish_sync(self) -> None:
        """Wait for a push started by ``sync_weights(overlap=True)`` (its time counts in
        ``timing/sync_s``, the push's own duration is ``timing/sync_push_s``)."""
        pushing, self._pushing = self._pushing, None
        if pushing is not None:
            with self._timed("sync_s"):
                self._pushed(lambda: self.weight_sync.wait(pushing))  # watched (weight_sync.py)
            self._timings["sync_push_s"] = self.weight_sync.last_push_s

    def _pushed(self, push) -> None:
        """Main process: ``push()``; a server that went away is waited for and given the current
        weights. Then only the servers that got the weights take rollouts."""
        try:
            reached = push()
        except SERVER_LOST:  # the server went away (killed, or its engine died): it is restarted, wait for it
            if len(self.servers) > 1 or self.servers[0].is_healthy():
                raise
            self._reconnect("the weight sync could not reach the inference server")
            reached = [0]
        if self.orchestrator is not None:
            self.orchestrator.set_active(reached)

    # --- logging ------------------------------------------------------------------------------

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "loss" in logs and self._step_metrics:
            logs = {**logs, **self._step_metrics}
            self._step_metrics = {}
        super().log(logs, *args, **kwargs)
