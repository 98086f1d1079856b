"""The rollout client: it survives the server closing an idle keep-alive connection, and it counts
its requests for the watchdog under every openai the extras allow (1.x-2.x on httpx, 3.x on httpx2).

vLLM's server drops idle connections after 5 s; a client that reuses one just then gets a
"Connection error" (seen on a GPU run). The server below answers the first request of each
connection and closes the connection without answering any later one, the way a request that
races the server's keep-alive close sees it.
"""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vf_rl.inference.client import KEEPALIVE_EXPIRY_S, openai_client, request_count

CLASSIC_OVERLAY = Path(__file__).resolve().parents[1] / ".venv" / "verifiers-classic"

COMPLETION = {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
              "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


async def _closing_server(connections: list):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        connections.append(writer)
        answered = 0
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            if answered:  # a reused connection: close it unanswered
                writer.close()
                return
            body = json.dumps(COMPLETION).encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: keep-alive\r\n"
                         + f"content-length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
            answered += 1

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.mark.parametrize("counted", [False, True], ids=["plain", "counted"])
@pytest.mark.parametrize("pause_s", [0.0, KEEPALIVE_EXPIRY_S + 0.5])
def test_requests_survive_a_connection_closed_by_the_server(pause_s, counted):
    async def main():
        connections = []
        server = await _closing_server(connections)
        port = server.sockets[0].getsockname()[1]
        client = openai_client(f"http://127.0.0.1:{port}/v1", "key", timeout=10.0,
                               count=request_count() if counted else None)
        try:
            answers = []
            for _ in range(3):
                reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
                answers.append(reply.choices[0].message.content)
                await asyncio.sleep(pause_s)
            return answers, len(connections)
        finally:
            await client.close()
            server.close()

    answers, connections = asyncio.run(main())
    assert answers == ["ok"] * 3
    assert connections >= 3  # every request after the first needed a fresh connection


COUNTED = """
import asyncio, sys
sys.path.insert(0, sys.argv[2])
import openai
from test_http_client import _closing_server
from vf_rl.inference.client import http_module, openai_client, request_count

async def main():
    server = await _closing_server([])
    count = request_count()
    client = openai_client(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", "key", 10.0, count)
    reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    await client.close()
    server.close()
    print(openai.__version__, http_module().__name__, reply.choices[0].message.content, count.answered, count.in_flight)

asyncio.run(main())
"""


@pytest.mark.parametrize("overlay", ["venv", "classic-overlay"])
def test_the_watchdogs_request_count_works_with_each_openai(overlay):
    """The orchestrator's clients send through a :class:`RequestCount` (the watchdog's figures). openai 3.x
    builds its client on httpx2, whose requests an httpx transport refuses (a bare AssertionError on every
    rollout); the count must wrap a transport of the client's own package. The classic overlay of the
    set-up (``vf-rl install-verifiers-classic``) carries an openai 3.x, the venv a 2.x."""
    env = dict(os.environ)
    if overlay == "classic-overlay":
        if not CLASSIC_OVERLAY.is_dir():
            pytest.skip(f"no {CLASSIC_OVERLAY} (scripts/setup.sh makes it)")
        env["PYTHONPATH"] = str(CLASSIC_OVERLAY)
    result = subprocess.run([sys.executable, "-c", COUNTED, "", str(Path(__file__).parent)], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    version, module, content, answered, in_flight = result.stdout.split()
    assert (content, answered, in_flight) == ("ok", "1", "0")
    assert module == ("httpx2" if int(version.split(".")[0]) >= 3 else "httpx")
    if overlay == "classic-overlay":
        assert int(version.split(".")[0]) >= 3, version  # the case this test exists for


def test_an_engine_dead_answer_is_a_lost_server_not_a_failure():
    """vf-vllm answers 500 with vLLM's EngineDeadError message once its engine died: the client
    raises ``EngineDied``, one of ``SERVER_LOST`` (what the trainer waits out); another 500 stays
    an error. (The real engine death: test_faults.py's engine cases, slow tier.)"""
    import httpx

    from vf_rl.inference.client import SERVER_LOST, EngineDied, InferenceClient

    def answer(request):
        message = "EngineCore encountered an issue. See stack trace (above) for the root cause."
        if request.url.path == "/update_weights":
            return httpx.Response(500, json={"error": f"EngineDeadError: {message}"})
        return httpx.Response(500, json={"error": "ValueError: no such weights"})

    client = InferenceClient(port=1)
    client.http = httpx.Client(base_url=client.base_url, transport=httpx.MockTransport(answer))
    with pytest.raises(EngineDied) as lost:
        client.update_weights("/x")
    assert isinstance(lost.value, SERVER_LOST)
    with pytest.raises(RuntimeError) as other:
        client.update_weights_broadcast([])
    assert not isinstance(other.value, SERVER_LOST)


def test_a_weight_update_in_flight_ends_when_the_engine_dies():
    """vLLM leaves a call to a dead engine unanswered; the route gives it up once the engine
    client's ``errored`` turns true, raising the engine's ``dead_error`` (vLLM's engine is stood in
    for by its two attributes; the real death: test_faults.py's engine cases, slow tier)."""
    from vf_rl.inference.routes import ENGINE_POLL_S, _while_engine_lives

    class Engine:  # the two attributes of vLLM's AsyncLLM that the route reads
        errored = False
        dead_error = RuntimeError("EngineCore encountered an issue.")

    async def main():
        engine = Engine()
        never = asyncio.get_running_loop().create_future()  # the call the dead engine never answers
        assert await _while_engine_lives(engine, asyncio.sleep(0.01, result=[1])) == [1]
        asyncio.get_running_loop().call_later(0.2, setattr, engine, "errored", True)
        with pytest.raises(RuntimeError, match="EngineCore encountered an issue"):  # not asyncio's TimeoutError:
            await asyncio.wait_for(_while_engine_lives(engine, never), 100 * ENGINE_POLL_S)  # a guard, not a bound
        assert never.cancelled()

    asyncio.run(main())
