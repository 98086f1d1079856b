"""Weight-update routes of vf-vllm, installed into vLLM's own OpenAI server as an HTTP
middleware (``vllm serve --middleware vf_rl.inference.routes.weight_sync_routes``).

Routes (all JSON):
    GET  /weight_sync_info    -> {"workers": int, "devices": [GPU UUID or "cpu", one per worker]}
    POST /update_weights      {"path": str} -> reload the weights in every worker
    POST /init_weight_broadcast   {"host", "port", "world_size", "backend", "timeout_s"}
                              -> every worker joins the trainer's broadcast group
    POST /update_weights_broadcast {"buckets": [Bucket.to_json(), ...]}
                              -> every worker receives the buckets the trainer broadcasts, reloads
    POST /reset_prefix_cache  -> drop cached KV blocks computed with old weights

If the environment variable ``VF_RL_WEIGHT_SECRET`` is set, the update routes require the
header ``X-VF-RL-Secret`` with that value (``vf-rl`` sets it when the server listens beyond
loopback). vLLM's dev-mode routes (``/collective_rpc``...) are never needed.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from fastapi import Request
from fastapi.responses import JSONResponse

SECRET_HEADER = "X-VF-RL-Secret"
ROUTES = {("GET", "/weight_sync_info"), ("POST", "/update_weights"),
          ("POST", "/init_weight_broadcast"), ("POST", "/update_weights_broadcast"), ("POST", "/reset_prefix_cache")}


async def weight_sync_routes(request: Request, call_next):
    """ASGI HTTP middleware: answer vf-rl's routes, pass everything else to vLLM."""
    if (request.method, request.url.path) not in ROUTES:
        return await call_next(request)
    secret = os.environ.get("VF_RL_WEIGHT_SECRET")
    if secret and not hmac.compare_digest(request.headers.get(SECRET_HEADER, ""), secret):
        return JSONResponse({"error": f"missing or wrong {SECRET_HEADER} header"}, status_code=401)
    engine = request.app.state.engine_client
    path = request.url.path
    try:
        if path == "/reset_prefix_cache":
            await engine.reset_prefix_cache()
            return JSONResponse({"status": "ok"})
        if path == "/weight_sync_info":
            devices = await engine.collective_rpc("vf_device_uuid")
            return JSONResponse({"workers": len(devices), "devices": devices})
        body = await request.json()
        if path == "/init_weight_broadcast":
            keys = ("host", "port", "world_size", "backend", "timeout_s")
            if not isinstance(body, dict) or any(k not in body for k in keys):
                return JSONResponse({"error": f"body needs keys {list(keys)}"}, status_code=400)
            results = await engine.collective_rpc("vf_init_broadcast", args=tuple(body[k] for k in keys))
            return JSONResponse({"status": "ok", "workers": results})
        if path == "/update_weights_broadcast":
            if not isinstance(body, dict) or not isinstance(body.get("buckets"), list):
                return JSONResponse({"error": "body must be {\"buckets\": [...]}"}, status_code=400)
            results = await engine.collective_rpc("vf_receive_broadcast", args=(body["buckets"],))
            await engine.reset_prefix_cache()
            return JSONResponse({"status": "ok", "workers": results})
        if not isinstance(body, dict) or not isinstance(body.get("path"), str):
            return JSONResponse({"error": "body must be {\"path\": \"<safetensors file or dir>\"}"}, status_code=400)
        weights = Path(body["path"])
        if not (weights.is_file() or (weights.is_dir() and any(weights.glob("*.safetensors")))):
            return JSONResponse({"error": f"no safetensors weights at {weights}"}, status_code=404)
        results = await engine.collective_rpc("vf_reload_weights", args=(str(weights),))
        await engine.reset_prefix_cache()
        return JSONResponse({"status": "ok", "workers": results})
    except Exception as exc:  # report, don't crash the server
        hint = ""
        if "base_layer" in str(exc):
            hint = (" (this vLLM cannot reload full weights into a server started with --enable-lora: use "
                    "weight_sync = 'lora', or start vf-vllm without --enable-lora)")
        return JSONResponse({"error": f"{type(exc).__name__}: {exc}{hint}"}, status_code=500)
