"""The rollout client survives the server closing an idle keep-alive connection.

vLLM's server drops idle connections after 5 s; a client that reuses one just then gets a
"Connection error" (seen on a GPU run). The server below answers the first request of each
connection and closes the connection without answering any later one, the way a request that
races the server's keep-alive close sees it.
"""

import asyncio
import json

import pytest

from vf_rl.inference.client import KEEPALIVE_EXPIRY_S, openai_client

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


@pytest.mark.parametrize("pause_s", [0.0, KEEPALIVE_EXPIRY_S + 0.5])
def test_requests_survive_a_connection_closed_by_the_server(pause_s):
    async def main():
        connections = []
        server = await _closing_server(connections)
        port = server.sockets[0].getsockname()[1]
        client = openai_client(f"http://127.0.0.1:{port}/v1", "key", timeout=10.0)
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
