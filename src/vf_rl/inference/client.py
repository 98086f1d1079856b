"""The trainer's side of weight sync: talk to vf-vllm's routes over HTTP."""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass

import httpx

from vf_rl.inference.routes import SECRET_HEADER, weight_secret
from vf_rl.inference.supervision import check_server_alive, exited_message, final_exit_status

KEEPALIVE_EXPIRY_S = 1.0
"""Seconds an idle pooled HTTP connection may be reused. vLLM's server (uvicorn) closes idle
connections after ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` = 5 s; a client that keeps them as long (httpx's
default) can send on a connection just as the server closes it and get "Connection error" (a GPU
run lost 31 of 128 rollouts of one batch to it when a training step took ~5 s)."""


def http_module():
    """The HTTP package that openai's async client is built on: ``httpx`` (openai 1.x-2.x) or
    ``httpx2`` (openai 3.x, which the classic API's ``openai-agents`` pulls in). A transport or limits
    object must come from that package: an ``httpx`` transport refuses an ``httpx2`` request (a bare
    ``AssertionError`` on its stream type)."""
    from openai import DefaultAsyncHttpxClient

    client = next(cls for cls in DefaultAsyncHttpxClient.__mro__ if cls.__name__ == "AsyncClient")
    return importlib.import_module(client.__module__.partition(".")[0])


def http_limits(http=None):
    """The rollout client's connection limits, as ``http``'s ``Limits`` (default: :func:`http_module`):
    1,000 connections, 100 kept alive, each idle one dropped after :data:`KEEPALIVE_EXPIRY_S`."""
    http = http or http_module()
    return http.Limits(max_connections=1000, max_keepalive_connections=100, keepalive_expiry=KEEPALIVE_EXPIRY_S)


class RequestCount:
    """An async HTTP transport (the interface of httpx's and httpx2's ``AsyncBaseTransport``) that
    counts the requests it carries to one server, for the watchdog: ``in_flight`` (sent, not
    answered), ``answered`` (a response's headers came back: for vLLM's non-streamed completions,
    the whole answer) and :meth:`quiet_s`.

    Args:
        inner: the transport that sends them, of the client's own HTTP package (:func:`request_count`).
    """

    def __init__(self, inner):
        self.inner, self.in_flight, self.answered = inner, 0, 0
        self._quiet_since = time.monotonic()

    async def handle_async_request(self, request):
        if self.in_flight == 0:
            self._quiet_since = time.monotonic()
        self.in_flight += 1
        try:
            response = await self.inner.handle_async_request(request)
            self.answered += 1
            self._quiet_since = time.monotonic()
            return response
        finally:
            self.in_flight -= 1

    def quiet_s(self) -> float:
        """Seconds since the last answer, or since requests began to be in flight after none were."""
        return time.monotonic() - self._quiet_since

    async def __aenter__(self):
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.inner.__aexit__(*exc_info)

    async def aclose(self) -> None:
        await self.inner.aclose()


def openai_client(base_url: str, api_key: str, timeout: float, count: RequestCount | None = None):
    """``AsyncOpenAI`` for rollouts: idle connections dropped after ``KEEPALIVE_EXPIRY_S``, and
    connection errors retried twice (openai's retry, with back-off).

    Args:
        base_url: the server's OpenAI API root (``http://host:port/v1``).
        timeout: seconds allowed for one request.
        count: a :class:`RequestCount` whose inner transport sends the requests (and counts them).
    """
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    transport = {"transport": count} if count is not None else {}
    return AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=2,
                       http_client=DefaultAsyncHttpxClient(limits=http_limits(), timeout=timeout, **transport))


def request_count() -> RequestCount:
    """A :class:`RequestCount` over the default async transport of openai's HTTP package
    (:func:`http_module`), with :func:`http_limits`."""
    http = http_module()
    return RequestCount(http.AsyncHTTPTransport(limits=http_limits(http)))


@dataclass(frozen=True)
class ServerLoad:
    """vLLM's own gauges, from its ``GET /metrics``: requests ``running`` and ``waiting``
    (queued), and ``generated``, the tokens it has generated since it started (a counter)."""

    running: int
    waiting: int
    generated: int

    def __str__(self) -> str:
        return f"{self.running} running, {self.waiting} waiting requests, {self.generated} tokens generated"


def server_load(base_url: str, timeout: float = 5.0) -> ServerLoad | str:
    """What the server at ``base_url`` (``http://host:port``, with or without ``/v1``) is doing,
    from vLLM's Prometheus metrics (summed over its engines); a sentence saying why not when it
    does not answer within ``timeout`` seconds, or has exited (``supervision.py``)."""
    from prometheus_client.parser import text_string_to_metric_families

    status = final_exit_status()
    if status is not None:
        return exited_message(status)
    url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
    try:
        response = httpx.get(url, timeout=timeout)
    except httpx.TimeoutException:
        return f"no answer to GET /metrics in {timeout:.0f} s (the server is stopped or hung)"
    except httpx.HTTPError as exc:
        return f"GET /metrics failed: {type(exc).__name__}: {exc}"
    if response.status_code != 200:
        return f"GET /metrics answered {response.status_code}"
    sums = dict.fromkeys(("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total"), 0.0)
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name in sums:
                sums[sample.name] += sample.value
    return ServerLoad(*(int(v) for v in sums.values()))


ENGINE_DEAD = "EngineCore encountered an issue"
"""The start of the message of vLLM's ``EngineDeadError``, which the API server answers (status
500) to every request once its engine process has died; it then shuts itself down."""


class EngineDied(RuntimeError):
    """vf-vllm answered that its vLLM engine has died: the server is going down, and ``vf-rl``
    restarts it (``supervision.py``)."""


SERVER_LOST = (httpx.TransportError, EngineDied)
"""What a request to vf-vllm raises when the server is gone (killed, restarting) or going (its
engine died): the caller waits for the restarted server rather than failing the run."""


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
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout, headers=headers, limits=http_limits(httpx))

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
        if response.status_code >= 500 and ENGINE_DEAD in response.text:
            raise EngineDied(f"vf-vllm at {self.base_url} answered {route} with {response.status_code}: its vLLM "
                             "engine died")
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
                       rank_offset: int = 0, warning_s: float | None = None) -> dict:
        """Make every vLLM worker join the trainer's broadcast group (returns when all joined);
        worker ``i`` takes rank ``rank_offset + 1 + i``; a worker that waits ``warning_s`` for a
        bucket prints the watchdog's line (``communicator.BroadcastGroup``)."""
        return self._post("/init_weight_broadcast", {"host": host, "port": port, "world_size": world_size,
                                                     "backend": backend, "timeout_s": timeout_s,
                                                     "rank_offset": rank_offset, "warning_s": warning_s})

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
        self._check("/v1/load_lora_adapter", response)
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
