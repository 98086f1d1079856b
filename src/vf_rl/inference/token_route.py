"""vf-vllm's own ``POST /inference/v1/generate`` (token in, token out), for a vLLM that lacks it.

verifiers v1 environments sample through ``renderers.client.generate``, which POSTs rendered
prompt token ids to vLLM's token route. vLLM 0.32 serves that route only with
``--enable-scale-out`` (vf-vllm adds the flag when its vLLM knows it); vLLM 0.26-0.31 have no
such route, so without this module v1 environments could not run there. When the running app
has no such route (checked once per app in ``app.routes``), the routes middleware
(:mod:`vf_rl.inference.routes`) hands the request here, and it is answered with vLLM's engine
client (``app.state.engine_client.generate``) for text prompts.

Request (JSON object, what renderers sends)::

    {"model": str, "token_ids": [int, ...], "sampling_params": {vLLM SamplingParams fields},
     optional "cache_salt": str, "priority": int, "request_id": str,
     "output_mode": "text", "return_token_ids": bool, "stream": false}

Response (vLLM 0.32's text-mode answer under ``--return-tokens-as-token-ids``)::

    {"request_id": str, "model": str, "created": int, "output_mode": "text",
     "choices": [{"index": 0, "text": str, "token_ids": [int, ...], "finish_reason": "stop"|"length"|...,
                  "stop_reason": int|str|null,
                  "logprobs": {"content": [{"token": "token_id:<id>", "logprob": float, "bytes": null,
                                            "top_logprobs": [{"token", "logprob", "bytes"}, ...]}, ...]}
                              (null without sampling_params.logprobs)}],
     "prompt_token_ids": [int, ...],
     "usage": {"prompt_tokens": int, "completion_tokens": int, "total_tokens": int}}

The logprob of each sampled token is the engine's (``RequestOutput`` logprobs for that
position, so ``--logprobs-mode`` applies as on ``/v1/completions``); a sampled token missing
from them gets vLLM's sentinel -9999.0. Without ``max_tokens`` the reply may run to the
context's end, as vLLM's own route does.

Errors (``{"error": {"message", "type", "param", "code"}}``, vLLM's shape, one line):
400 for a body that is not a JSON object, missing or non-int ``token_ids``, unknown top-level or
sampling keys (named), multimodal fields (``features``, ``content_parts``), streaming,
``output_mode`` other than ``"text"``, prompt log-probs, and anything vLLM refuses (bad sampling
values, a prompt longer than the context); 401 without the ``--api-key`` bearer token (the
middleware runs before vLLM's own authentication); 404 for a model the server does not serve;
500 with the exception's one-line message when the engine fails. A client that disconnects
mid-request has its request aborted in the engine.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import math
import os
import time
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse

PATH = "/inference/v1/generate"
NATIVE_HINT = "needs vLLM's own /inference/v1/generate (vLLM >= 0.32 with --enable-scale-out)"
BODY_KEYS = {"model", "token_ids", "sampling_params", "cache_salt", "priority", "request_id", "output_mode",
             "return_token_ids", "stream", "features", "content_parts"}
UNANSWERED_SAMPLING_KEYS = {"prompt_logprobs", "prompt_logprob_token_ids", "prompt_logprob_start"}
LOGPROB_SENTINEL = -9999.0
_ERROR_TYPES = {400: "BadRequestError", 401: "Unauthorized", 404: "NotFoundError", 499: "ClientDisconnected",
                500: "InternalServerError"}


def has_native_route(app) -> bool:
    """Whether ``app`` (vLLM's FastAPI app) serves ``POST /inference/v1/generate`` itself; looked
    up in ``app.routes`` once and cached on ``app.state``. vLLM 0.32 started with
    ``--no-enable-scale-out`` keeps the path with a stub that answers 403 (``disabled_scale_out``):
    that is no route."""
    native = getattr(app.state, "vf_rl_native_generate", None)
    if native is None:
        native = any(getattr(route, "path", None) == PATH and "POST" in (getattr(route, "methods", None) or ())
                     and getattr(getattr(route, "endpoint", None), "__name__", "") != "disabled_scale_out"
                     for route in app.routes)
        app.state.vf_rl_native_generate = native
    return native


def error(message: str, status: int = 400) -> JSONResponse:
    """A JSON error in vLLM's shape, its message on one line."""
    message = " ".join(str(message).split())
    return JSONResponse({"error": {"message": message, "type": _ERROR_TYPES.get(status, "Error"), "param": None,
                                   "code": status}}, status_code=status)


def _describe(exc: BaseException) -> str:
    """``Type: message`` of ``exc``, with its cause when it says nothing itself (vLLM wraps engine
    failures in an empty ``EngineGenerateError``)."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if not str(exc) and exc.__cause__ is not None:
        text += f" ({type(exc.__cause__).__name__}: {exc.__cause__})"
    return text


@functools.cache
def _sampling_api():
    """``(SamplingParams, its public keyword names, a pydantic TypeAdapter or None, FINAL_ONLY or None)``
    of the installed vLLM; the adapter converts JSON values (nested params, int dict keys) as vLLM's
    own route does, where this vLLM supports it."""
    import inspect

    from vllm import SamplingParams

    keys = {name for name in inspect.signature(SamplingParams).parameters if not name.startswith("_")}
    keys -= {"output_kind"}
    try:
        from pydantic import TypeAdapter

        adapter = TypeAdapter(SamplingParams)
    except Exception:  # a vLLM whose SamplingParams pydantic cannot validate
        adapter = None
    try:
        from vllm.sampling_params import RequestOutputKind

        final_only = RequestOutputKind.FINAL_ONLY
    except (ImportError, AttributeError):
        final_only = None
    return SamplingParams, keys, adapter, final_only


def sampling_params(raw: dict):
    """``vllm.SamplingParams`` from the request's ``sampling_params`` (already checked for
    unknown keys); ``max_tokens`` unset means up to the context's end.

    Raises:
        ValueError: a value vLLM refuses (one line).
    """
    cls, _, adapter, final_only = _sampling_api()
    raw = {"max_tokens": None, **raw}
    try:
        if adapter is None:
            params = cls(**raw)
        else:
            params = adapter.validate_python(raw)
    except Exception as exc:
        errors = getattr(exc, "errors", None)
        if callable(errors):  # pydantic: the failed fields, without its union's bookkeeping
            found = [f"sampling_params.{e['loc'][-1]}: {e['msg']}" for e in exc.errors() if e["type"] != "is_instance_of"]
            raise ValueError("; ".join(found) or str(exc)) from exc
        raise ValueError(str(exc)) from exc
    if final_only is not None:
        params.output_kind = final_only
    return params


def parse_body(body) -> tuple[dict, object] | str:
    """``(body, SamplingParams)`` of a valid request body, else the one-line reason it is refused."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    if multimodal := [key for key in ("features", "content_parts") if body.get(key)]:
        return f"multimodal input ({', '.join(multimodal)}) {NATIVE_HINT}"
    if unknown := sorted(set(body) - BODY_KEYS):
        return f"unknown keys {', '.join(unknown)}: this vf-vllm answers text prompts only; the rest {NATIVE_HINT}"
    ids = body.get("token_ids")
    if not isinstance(ids, list) or not ids or not all(type(t) is int and t >= 0 for t in ids):
        return "token_ids must be a non-empty list of non-negative ints (the prompt's token ids)"
    if body.get("stream"):
        return f"stream=true {NATIVE_HINT}"
    if body.get("output_mode", "text") != "text":
        return f"output_mode={body['output_mode']!r} {NATIVE_HINT} (this vf-vllm answers output_mode 'text')"
    raw = body.get("sampling_params") or {}
    if not isinstance(raw, dict):
        return "sampling_params must be a JSON object"
    _, keys, _, _ = _sampling_api()
    if unknown := sorted(set(raw) - keys - UNANSWERED_SAMPLING_KEYS):
        return f"unknown sampling_params keys: {', '.join(unknown)}"
    if unanswered := sorted(set(raw) & UNANSWERED_SAMPLING_KEYS):
        return f"sampling_params {', '.join(unanswered)} {NATIVE_HINT}"
    for key, kind in (("cache_salt", str), ("request_id", str), ("priority", int)):
        if body.get(key) is not None and type(body[key]) is not kind:
            return f"{key} must be a {kind.__name__}"
    try:
        return body, sampling_params(raw)
    except ValueError as exc:
        return str(exc)


def _authorized(request: Request) -> bool:
    """Whether the request carries one of vLLM's ``--api-key`` tokens (``VLLM_API_KEY`` without
    the flag) as ``Authorization: Bearer``, or the server has none."""
    args = getattr(request.app.state, "args", None)
    keys = getattr(args, "api_key", None) or [os.environ.get("VLLM_API_KEY")]
    tokens = [key for key in ([keys] if isinstance(keys, str) else keys) if key]
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return not tokens or (scheme.lower() == "bearer" and any(hmac.compare_digest(given, t) for t in tokens))


def _logprobs(token_ids, steps, top: int) -> dict:
    """Text-mode log-probs: ``{"content": [...]}``, one entry per sampled token, tokens as
    ``token_id:N`` (``--return-tokens-as-token-ids``), at most ``max(top, 1)`` top entries."""
    def clamp(value: float) -> float:
        return LOGPROB_SENTINEL if math.isnan(value) else max(value, LOGPROB_SENTINEL)

    content = []
    for i, token_id in enumerate(token_ids):
        step = steps[i] if i < len(steps) else None
        sampled = step.get(token_id) if step is not None else None
        entry = {"token": f"token_id:{token_id}", "logprob": LOGPROB_SENTINEL, "bytes": None, "top_logprobs": []}
        if sampled is not None:
            entry["logprob"] = clamp(sampled.logprob)
            entry["top_logprobs"] = [{"token": f"token_id:{k}", "logprob": clamp(v.logprob), "bytes": None}
                                     for n, (k, v) in enumerate(step.items()) if top == -1 or n < max(top, 1)]
        content.append(entry)
    return {"content": content}


def _lora(request: Request, model: str | None):
    """``(LoRARequest or None, None)`` for the model the body names, or ``(None, 404 response)``."""
    models = getattr(request.app.state, "openai_serving_models", None)
    if not model or models is None:
        return None, None
    if model in (getattr(models, "lora_requests", None) or {}):
        return models.lora_requests[model], None
    is_base = getattr(models, "is_base_model", None)
    if is_base is not None and not is_base(model):
        return None, error(f"The model `{model}` does not exist.", 404)
    return None, None


async def _run(engine, body: dict, params, request_id: str, lora) -> dict:
    """Generate for one request and build the response (see the module docstring)."""
    prompt = {"prompt_token_ids": body["token_ids"]}
    if body.get("cache_salt"):
        prompt["cache_salt"] = body["cache_salt"]
    kwargs = {**({"lora_request": lora} if lora is not None else {}),
              **({"priority": body["priority"]} if body.get("priority") else {})}
    final = None
    try:
        async for output in engine.generate(prompt, params, request_id, **kwargs):
            final = output
    except asyncio.CancelledError:  # client gone or server stopping: free the engine's slot
        try:
            await engine.abort(request_id)
        except Exception:
            pass
        raise
    if final is None:
        raise RuntimeError("the engine returned no output")
    choices, completion_tokens = [], 0
    for out in final.outputs:
        if out.finish_reason == "error":
            raise RuntimeError(f"generation failed for request {request_id} (finish_reason 'error')")
        token_ids = list(out.token_ids)
        completion_tokens += len(token_ids)
        choices.append({"index": out.index, "text": out.text, "token_ids": token_ids,
                        "logprobs": None if params.logprobs is None else _logprobs(token_ids, out.logprobs or [],
                                                                                   params.logprobs),
                        "finish_reason": out.finish_reason or "stop", "stop_reason": out.stop_reason})
    prompt_ids = list(final.prompt_token_ids or body["token_ids"])
    return {"request_id": request_id, "model": body.get("model"), "created": int(time.time()), "output_mode": "text",
            "choices": choices, "prompt_token_ids": prompt_ids,
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": completion_tokens,
                      "total_tokens": len(prompt_ids) + completion_tokens}}


async def _disconnected(request: Request) -> None:
    """Return when the client disconnects (the body has been read: ``http.disconnect`` is all that
    can come); never, where the server's messages cannot be watched."""
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except Exception:  # not a disconnect: let the request run to its end
        await asyncio.get_running_loop().create_future()


async def serve_generate(request: Request) -> JSONResponse:
    """Answer ``POST /inference/v1/generate`` with the engine client (see the module docstring)."""
    import json

    if not _authorized(request):
        return JSONResponse({"error": "Unauthorized"}, status_code=401)
    try:
        body = json.loads(await request.body())
    except ValueError as exc:
        return error(f"the body is not JSON: {exc}")
    parsed = parse_body(body)
    if isinstance(parsed, str):
        return error(parsed)
    body, params = parsed
    lora, refused = _lora(request, body.get("model"))
    if refused is not None:
        return refused
    if not body.get("model"):
        models = getattr(request.app.state, "openai_serving_models", None)
        body["model"] = getattr(models, "model_name", lambda: None)()
    request_id = f"generate-tokens-{body.get('request_id') or uuid.uuid4().hex}"
    work = asyncio.ensure_future(_run(request.app.state.engine_client, body, params, request_id, lora))
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work, watch):
            task.cancel()
    if not work.done() or work.cancelled():  # the client left: _run aborted the request
        await asyncio.gather(work, return_exceptions=True)
        return error("client disconnected", 499)
    exc = work.exception()
    if exc is None:
        return JSONResponse(work.result())
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:  # older vLLM: request errors are ValueErrors
        VLLMClientError = ValueError  # noqa: N806
    return error(_describe(exc), 400 if isinstance(exc, (ValueError, VLLMClientError)) else 500)
