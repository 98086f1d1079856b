"""The trainer's side of weight sync: talk to vf-vllm's routes over HTTP."""

from __future__ import annotations

import time

import httpx

from vf_rl.inference.routes import SECRET_HEADER, weight_secret
from vf_rl.inference.supervision import check_server_alive

KEEPALIVE_EXPIRY_S = 1.0
"""Seconds an idle pooled HTTP connection may be reused. vLLM's server (uvicorn) closes idle
connections after ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` = 5 s; a client that keeps them as long (httpx's
default) can send on a connection just as the server closes it and get "Connection error" (a GPU
run lost 31 of 128 rollouts of one batch to it when a training step took ~5 s)."""

HTTP_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100, keepalive_expiry=KEEPALIVE_EXPIRY_S)


def openai_client(base_url: str, api_key: str, timeout: float):
    """``AsyncOpenAI`` for rollouts: idle connections dropped after ``KEEPALIVE_EXPIRY_S``, and
    connection errors retried twice (openai's retry, with back-off).

    Args:
        base_url: the server's OpenAI API root (``http://host:port/v1``).
        timeout: seconds allowed for one request.
    """
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    return AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=2,
                       http_client=DefaultAsyncHttpxClient(limits=HTTP_LIMITS, timeout=timeout))


def wait_for_server(process, health_url: str, timeout: float, poll: float = 1.0) -> bool:
    """Poll ``GET health_url`` until it answers 200 (True), or until the server's ``process``
    (a ``subprocess.Popen``) exits or ``timeout`` seconds pass (False: ``process.poll()`` tells
    which)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(health_url, timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(poll)
    return False


class InferenceClient:
    """Client for one vf-vllm server.

    Args:
        host, port: where vf-vllm listens (or ``url``, e.g. ``http://10.0.0.2:8000``).
        timeout: seconds allowed for one weight update.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 8000, timeout: float = 300.0, url: str | None = None):
        self.base_url = (url or f"http://{host}:{port}").rstrip("/")
        headers = {}
        if secret := weight_secret():
            headers[SECRET_HEADER] = secret
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout, headers=headers, limits=HTTP_LIMITS)

    def wait_until_ready(self, timeout: float = 300.0, poll: float = 2.0) -> None:
        """Block until ``GET /health`` answers 200.

        Raises:
            TimeoutError: not ready after ``timeout`` seconds.
            ServerExited: the server ``vf-rl`` launched exited for good meanwhile (seen within
                ``poll`` seconds; see ``supervision.py``).
        """
        deadline = time.monotonic() + timeout
        while True:
            check_server_alive()
            try:
                if self.http.get("/health", timeout=5.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"vf-vllm at {self.base_url} not ready after {timeout:.0f} s "
                                   "(raise vllm_server_timeout, or look at the Inference pane's log)")
            time.sleep(poll)

    def is_healthy(self) -> bool:
        """Whether ``GET /health`` answers 200 now."""
        try:
            return self.http.get("/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _check(self, route: str, response: httpx.Response) -> None:
        if response.status_code == 401:
            raise PermissionError(f"vf-vllm at {self.base_url} refused {route}: missing or wrong weight-update secret "
                                  "(set the same VF_RL_WEIGHT_SECRET or VF_RL_WEIGHT_SECRET_FILE for vf-vllm and vf-train)")

    def _post(self, route: str, json: dict | None = None) -> dict:
        response = self.http.post(route, json=json or {})
        self._check(route, response)
        if response.status_code != 200:
            raise RuntimeError(f"vf-vllm {route} failed ({response.status_code}): {response.text[:500]}")
        try:
            return response.json()
        except ValueError:  # vLLM's LoRA routes answer plain text
            return {"status": response.text}

    def weight_sync_info(self) -> dict:
        """``{"workers": int, "devices": [GPU UUID or "cpu", one per vLLM worker]}``."""
        response = self.http.get("/weight_sync_info")
        self._check("/weight_sync_info", response)
        if response.status_code != 200:
            raise RuntimeError(f"vf-vllm /weight_sync_info failed ({response.status_code}): {response.text[:500]} "
                               "(is the server vf-vllm, not plain vllm serve?)")
        return response.json()

    def init_broadcast(self, host: str, port: int, world_size: int, backend: str, timeout_s: float,
                       rank_offset: int = 0) -> dict:
        """Make every vLLM worker join the trainer's broadcast group (returns when all joined);
        worker ``i`` takes rank ``rank_offset + 1 + i``."""
        return self._post("/init_weight_broadcast", {"host": host, "port": port, "world_size": world_size,
                                                     "backend": backend, "timeout_s": timeout_s,
                                                     "rank_offset": rank_offset})

    def update_weights_broadcast(self, buckets: list[dict]) -> dict:
        """Announce a broadcast weight update (``Bucket.to_json()`` per bucket); returns when
        every worker has received and reloaded the weights."""
        return self._post("/update_weights_broadcast", {"buckets": buckets})

    def update_weights_ipc(self, buckets: list[dict], handles: list[dict]) -> dict:
        """Announce a weight update in the trainer's shared GPU buffers (``ipc.share`` per
        bucket); returns when every worker has copied and loaded the weights."""
        return self._post("/update_weights_ipc", {"buckets": buckets, "handles": handles})

    def load_lora_adapter(self, name: str, path: str) -> dict:
        """Load (or reload in place) the peft adapter at ``path`` as model ``name``.

        Raises:
            RuntimeError: the server has no runtime LoRA loading (start vf-vllm with
                ``--enable-lora --max-lora-rank R``; ``vf-rl`` does for ``weight_sync = "lora"``).
        """
        response = self.http.post("/v1/load_lora_adapter",
                                  json={"lora_name": name, "lora_path": path, "load_inplace": True})
        if response.status_code == 404:
            raise RuntimeError("vf-vllm has no /v1/load_lora_adapter: start it with --enable-lora --max-lora-rank R "
                               "(vf-rl does this for weight_sync = 'lora')")
        if response.status_code != 200:
            raise RuntimeError(f"vf-vllm /v1/load_lora_adapter failed ({response.status_code}): {response.text[:500]}")
        self.reset_prefix_cache()
        return {"status": response.text}

    def update_weights(self, path: str) -> dict:
        """Make the server reload its weights from safetensors at ``path`` (a path the server
        can read) and reset its prefix cache. Returns the workers' reports."""
        return self._post("/update_weights", {"path": str(path)})

    def upload_weights(self, path: str) -> dict:
        """Send the safetensors file at ``path`` in the request body; the server reloads it like
        :meth:`update_weights` (for a server on another host, with no shared filesystem)."""
        with open(path, "rb") as f:
            response = self.http.post("/upload_weights", content=f)
        self._check("/upload_weights", response)
        if response.status_code != 200:
            raise RuntimeError(f"vf-vllm /upload_weights failed ({response.status_code}): {response.text[:500]}")
        return response.json()

    @property
    def is_local(self) -> bool:
        """The server listens on this machine's loopback address (it can read our files)."""
        return httpx.URL(self.base_url).host in ("127.0.0.1", "localhost", "::1")

    def reset_prefix_cache(self) -> None:
        self._post("/reset_prefix_cache")

    def close(self) -> None:
        self.http.close()
