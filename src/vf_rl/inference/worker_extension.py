"""vLLM worker extension: receives new weights inside each vLLM worker process.

vLLM mixes this class into its worker (``--worker-extension-cls``), so ``self`` is the
worker and ``self.model_runner`` its model runner. The server reaches these methods through
``engine_client.collective_rpc(name, args=...)``.
"""

from __future__ import annotations

import time
from pathlib import Path


class WeightSyncExtension:
    """Methods called on every vLLM worker by vf-vllm's weight-update routes."""

    def vf_reload_weights(self, path: str) -> dict:
        """Reload weights in place from safetensors files in checkpoint format.

        Uses ``model_runner.reload_weights(is_checkpoint_format=True)``, which re-runs the
        model's weight processing (on the CPU, oneDNN prepacking of linear layers). Calling
        ``model.load_weights`` directly corrupts a prepacked CPU model half-way (see
        shared/notes/vllm-cpu.md), so it is never used here.

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
        self.model_runner.reload_weights(weights_iterator=iter(weights.items()), is_checkpoint_format=True)
        return {"tensors": len(weights), "seconds": time.perf_counter() - start}
