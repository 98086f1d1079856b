"""Weight-update routes of vf-vllm, installed into vLLM's own OpenAI server as an HTTP
middleware (``vllm serve --middleware vf_rl.inference.routes.weight_sync_routes``).

Routes (all JSON):
    GET  /weight_sync_info    -> {"workers": int, "devices": [GPU UUID or "cpu", one per worker]}
    POST /update_weights      {"path": str} -> reload the weights in every worker
    POST /init_weight_broadcast   {"host", "port", "world_size", "backend", "timeout_s"[, "rank_offset",
                              "warning_s"]} -> every worker joins the trainer's broadcast group
    POST /update_weights_broadcast {"buckets": [Bucket.to_json(), ...]}
                              -> every worker receives the buckets the trainer broadcasts, reloads
    POST /update_weights_ipc  {"buckets": [Bucket.to_json(), ...], "handles": [ipc.share(), ...]}
                              -> every worker copies the trainer's buffers on their shared GPU, reloads
    POST /upload_weights      (body: one .safetensors file) -> the same reload, for a trainer on
                              another host that shares no filesystem with the server
    POST /reset_prefix_cache  -> drop cached KV blocks computed with old weights

If a secret is set (``VF_RL_WEIGHT_SECRET``, or a file named by ``VF_RL_WEIGHT_SECRET_FILE``),
every route here requires the header ``X-VF-RL-Secret`` with that value (``vf-rl`` generates
one when the server listens beyond loopback, and ``vf-vllm`` refuses to listen beyond loopback
without one). vLLM's OpenAI routes keep vLLM's own ``--api-key``. vLLM's dev-mode routes
(``/collective_rpc``...) are never needed.

``POST /inference/v1/generate`` (vLLM's token-in/token-out route, which verifiers v1's training
client ``renderers.client.generate`` calls) is adjusted or supplied:

- where vLLM serves it (0.32 with ``--enable-scale-out``), a JSON body that names no
  ``output_mode`` is answered in ``"text"`` mode instead of vLLM 0.32's default ``"tokens"``:
  renderers <= 0.1.12 sends none and reads the text-mode logprobs (``{"token": "token_id:N",
  "logprob": ...}`` under ``--return-tokens-as-token-ids``);
- where it does not (vLLM 0.26-0.31, or 0.32 with ``--no-enable-scale-out``; checked once in the
  app's routes), vf-vllm answers it itself for text prompts with vLLM's engine client, in the
  same text-mode shape (:mod:`vf_rl.inference.token_route`; multimodal requests get a 400).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
from pathlib import Path

from fastapi import Request
from fastapi.responses import JSONResponse

from vf_rl.inference.token_route import PATH as GENERATE_PATH
from vf_rl.inference.token_route import has_native_route, serve_generate

SECRET_HEADER = "X-VF-RL-Secret"
ROUTES = {("GET", "/weight_sync_info"), ("POST", "/update_weights"), ("POST", "/upload_weights"),
          ("POST", "/init_weight_broadcast"), ("POST", "/update_weights_broadcast"), ("POST", "/update_weights_ipc"),
          ("POST", "/reset_prefix_cache")}


def weight_secret() -> str | None:
    """The shared secret of the weight-update routes: ``VF_RL_WEIGHT_SECRET``, else the first
    line of the file ``VF_RL_WEIGHT_SECRET_FILE`` names, else ``None`` (no secret).

    Raises:
        ValueError: ``VF_RL_WEIGHT_SECRET_FILE`` names a missing or empty file.
    """
    if secret := os.environ.get("VF_RL_WEIGHT_SECRET"):
        return secret
    path = os.environ.get("VF_RL_WEIGHT_SECRET_FILE")
    if not path:
        return None
    try:
        secret = Path(path).expanduser().read_text().strip().splitlines()[0].strip()
    except (OSError, IndexError):
        secret = ""
    if not secret:
        raise ValueError(f"VF_RL_WEIGHT_SECRET_FILE: {path} is missing or empty")
    return secret


GENERATE_ROUTE = ("POST", GENERATE_PATH)


ENGINE_POLL_S = 0.5
"""How often a weight update in flight checks that vLLM's engine is still alive."""


async def every_worker(engine, method: str, args: tuple = ()) -> list:
    """``collective_rpc(method, args)`` on every worker of every engine, one result per worker,
    given up once the engine has died (:func:`_while_engine_lives`).

    vLLM's own ``engine_client.collective_rpc`` calls every data-parallel engine but returns only
    the first engine's results (``DPAsyncMPClient.call_utility_async``, vLLM 0.26-0.33), so with
    ``--data-parallel-size 2`` half the workers would go uncounted: the trainer would size its
    weight-broadcast group for one engine and the other engine's workers would hold ranks
    outside it. This gathers each engine's list instead (engine order, then worker order).

    Args:
        engine: the server's ``app.state.engine_client`` (vLLM's ``AsyncLLM``).
    Returns:
        one result per worker.
    Raises:
        EngineDeadError (vLLM's): the engine process died during the call.
    """
    return await _while_engine_lives(engine, _every_worker(engine, method, args))


async def _while_engine_lives(engine, call):
    """Await the coroutine ``call`` unless vLLM's engine dies first. vLLM marks its engine client
    dead (``errored``) as soon as the engine process exits, but leaves a call in flight to it
    unanswered: a weight update would then wait until the server's shutdown cancels it, and the
    trainer would read a bare 500. This raises the engine's ``dead_error`` instead, whose message
    the trainer recognizes (``client.ENGINE_DEAD``)."""
    task = asyncio.ensure_future(call)
    while True:
        done, _ = await asyncio.wait({task}, timeout=ENGINE_POLL_S)
        if done:
            return task.result()
        if getattr(engine, "errored", False):
            task.cancel()
            raise engine.dead_error


async def _every_worker(engine, method: str, args: tuple) -> list:
    core = getattr(engine, "engine_core", None)
    engines = getattr(core, "core_engines", None) or []
    if len(engines) <= 1:
        return await engine.collective_rpc(method, args=args)
    call = ("collective_rpc", method, None, args, None)
    if hasattr(core, "call_utility_all_async"):  # vLLM >= 0.32
        per_engine = await core.call_utility_all_async(*call)
    else:
        per_engine = await asyncio.gather(*(core._call_utility_async(*call, engine=e) for e in engines))
    return [result for results in per_engine for result in results]


async def _text_output_mode_by_default(request: Request) -> None:
    """Set ``output_mode = "text"`` in a generate request body that names none (see the module
    docstring). The body is replaced in the request's receive cache, which the app reads next."""
    try:
        body = json.loads(await request.body())
    except ValueError:
        return  # vLLM answers the malformed body itself
    if isinstance(body, dict) and "output_mode" not in body:
        body["output_mode"] = "text"
        request._body = json.dumps(body).encode()


async def weight_sync_routes(request: Request, call_next):
    """ASGI HTTP middleware: answer vf-rl's routes (and ``/inference/v1/generate`` where vLLM lacks
    it), pass everything else to vLLM."""
    if (request.method, request.url.path) == GENERATE_ROUTE:
        if not has_native_route(request.app):
            return await serve_generate(request)
        await _text_output_mode_by_default(request)
        return await call_next(request)
    if (request.method, request.url.path) not in ROUTES:
        return await call_next(request)
    secret = weight_secret()
    if secret and not hmac.compare_digest(request.headers.get(SECRET_HEADER, ""), secret):
        return JSONResponse({"error": f"missing or wrong {SECRET_HEADER} header"}, status_code=401)
    engine = request.app.state.engine_client
    path = request.url.path
    try:
        if path == "/reset_prefix_cache":
            await engine.reset_prefix_cache()
            return JSONResponse({"status": "ok"})
        if path == "/weight_sync_info":
            devices = await every_worker(engine, "vf_device_uuid")
            return JSONResponse({"workers": len(devices), "devices": devices})
        if path == "/upload_weights":
            return await _upload_weights(request, engine)
        body = await request.json()
        if path == "/init_weight_broadcast":
            keys = ("host", "port", "world_size", "backend", "timeout_s")
            if not isinstance(body, dict) or any(k not in body for k in keys):
                return JSONResponse({"error": f"body needs keys {list(keys)}"}, status_code=400)
            warning_s = body.get("warning_s")  # the trainer's stall_warning_timeout (vf_rl.watchdog)
            args = (*(body[k] for k in keys), int(body.get("rank_offset", 0)),
                    None if warning_s is None else float(warning_s))
            results = await every_worker(engine, "vf_init_broadcast", args)
            return JSONResponse({"status": "ok", "workers": results})
        if path == "/update_weights_broadcast":
            if not isinstance(body, dict) or not isinstance(body.get("buckets"), list):
                return JSONResponse({"error": "body must be {\"buckets\": [...]}"}, status_code=400)
            results = await every_worker(engine, "vf_receive_broadcast", (body["buckets"],))
            await engine.reset_prefix_cache()
            return JSONResponse({"status": "ok", "workers": results})
        if path == "/update_weights_ipc":
            if not isinstance(body, dict) or not all(isinstance(body.get(k), list) for k in ("buckets", "handles")):
                return JSONResponse({"error": "body must be {\"buckets\": [...], \"handles\": [...]}"},
                                    status_code=400)
            results = await every_worker(engine, "vf_receive_ipc", (body["buckets"], body["handles"]))
            await engine.reset_prefix_cache()
            return JSONResponse({"status": "ok", "workers": results})
        if not isinstance(body, dict) or not isinstance(body.get("path"), str):
            return JSONResponse({"error": "body must be {\"path\": \"<safetensors file or dir>\"}"}, status_code=400)
        weights = Path(body["path"])
        if not (weights.is_file() or (weights.is_dir() and any(weights.glob("*.safetensors")))):
            return JSONResponse({"error": f"no safetensors weights at {weights}"}, status_code=404)
        results = await every_worker(engine, "vf_reload_weights", (str(weights),))
        await engine.reset_prefix_cache()
        return JSONResponse({"status": "ok", "workers": results})
    except Exception as exc:  # report, don't crash the server
        hint = ""
        if "base_layer" in str(exc):
            hint = (" (this vLLM cannot reload full weights into a server started with --enable-lora: use "
                    "weight_sync = 'lora', or start vf-vllm without --enable-lora)")
        return JSONResponse({"error": f"{type(exc).__name__}: {exc}{hint}"}, status_code=500)


async def _upload_weights(request: Request, engine) -> JSONResponse:
    """``POST /upload_weights``: the request body is one safetensors file; written to a temporary
    directory, reloaded by every worker like ``/update_weights``, then deleted."""
    import shutil
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="vf-rl-upload-"))
    try:
        path = directory / "model.safetensors"
        with path.open("wb") as f:
            async for chunk in request.stream():
                f.write(chunk)
        if path.stat().st_size == 0:
            return JSONResponse({"error": "empty body: POST the safetensors file"}, status_code=400)
        results = await every_worker(engine, "vf_reload_weights", (str(path),))
        await engine.reset_prefix_cache()
        return JSONResponse({"status": "ok", "workers": results})
    finally:
        shutil.rmtree(directory, ignore_errors=True)
