"""End-to-end: berth's A2A 1.0 endpoint driven by the official Python SDK
(`a2a-sdk` 1.3.0, installed by scripts/test.sh into conformance/a2a/.venv).

Starts `berth serve --listen 127.0.0.1:0` (BERTH_BIN) on a fresh data
directory with the scripted model (e2e-script.toml), and checks: blocking and
non-blocking send, get, list, cancel (idempotent, then terminal → -32004),
streaming, subscribe, a suspension made over ACP (berth's stdio) resumed by an
A2A message, an agent's own park resumed by the next message, artifacts with
data and file-URL parts (publish_artifact), and a direct Message answer
(direct_reply).

No sleeps stand in for waiting: a held turn ends when the test creates its
`release` file, and every wait is on an event (a stream, an ACP answer).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import tempfile
import threading
import unittest
from pathlib import Path

import httpx
from google.protobuf.json_format import MessageToDict
from a2a.client import ClientConfig, create_client
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import TaskNotFoundError, UnsupportedOperationError

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "e2e-script.toml"
# The listener's bearer token (BERTH_API_KEYS): A2A calls carry it; the agent
# card is public.
TOKEN = "a2a-e2e-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Berth:
    """A `berth serve --listen` process, with ACP on its stdin/stdout."""

    def __init__(self) -> None:
        binary = os.environ.get("BERTH_BIN") or str(HERE.parent.parent / "target" / "debug" / "berth")
        self.dir = tempfile.TemporaryDirectory(prefix="berth-a2a-e2e-")
        self.data = Path(self.dir.name) / "data"
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:0", "--data-dir", str(self.data),
             "--model", f"scripted:{SCRIPT}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "BERTH_LOG": "warn", "BERTH_API_KEYS": f"{TOKEN}=a2a-e2e:controller"},
        )
        self.url = None
        ready = threading.Event()
        self.responses: dict[int, dict] = {}
        self.answered = threading.Condition()

        def read_stderr() -> None:
            for line in self.proc.stderr:
                match = re.search(rb"berth: listening on (http://\S+)", line)
                if match and not ready.is_set():
                    self.url = match.group(1).decode().rstrip("/") + "/"
                    ready.set()
            ready.set()

        def read_stdout() -> None:
            for line in self.proc.stdout:
                frame = json.loads(line)
                if "id" in frame and ("result" in frame or "error" in frame):
                    with self.answered:
                        self.responses[frame["id"]] = frame
                        self.answered.notify_all()

        threading.Thread(target=read_stderr, daemon=True).start()
        threading.Thread(target=read_stdout, daemon=True).start()
        if not ready.wait(60) or not self.url:
            self.stop()
            raise RuntimeError("berth did not start its A2A listener")
        self.next_id = 0
        self.acp("initialize", {"protocolVersion": 1, "clientCapabilities": {}})

    def acp_send(self, method: str, params: dict) -> int:
        self.next_id += 1
        frame = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.proc.stdin.write((json.dumps(frame) + "\n").encode())
        self.proc.stdin.flush()
        return self.next_id

    def acp_wait(self, request_id: int) -> dict:
        with self.answered:
            if not self.answered.wait_for(lambda: request_id in self.responses, timeout=60):
                raise TimeoutError(f"no ACP answer to request {request_id}")
            return self.responses.pop(request_id)

    def acp(self, method: str, params: dict) -> dict:
        return self.acp_wait(self.acp_send(method, params))

    def release(self, context_id: str) -> None:
        # A2A contexts live beside the data dir, never inside it.
        (self.data.parent / f"{self.data.name}-a2a-contexts" / context_id / "release").touch()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.dir.cleanup()


def message(text: str, *, task_id: str = "", context_id: str = "", message_id: str | None = None) -> Message:
    return Message(
        message_id=message_id or f"m-{os.urandom(6).hex()}",
        role=Role.ROLE_USER,
        parts=[Part(text=text)],
        task_id=task_id,
        context_id=context_id,
    )


def texts(task) -> list[str]:
    return ["".join(p.text for p in a.parts) for a in task.artifacts]


class A2aSdkEndToEnd(unittest.IsolatedAsyncioTestCase):
    berth: Berth

    @classmethod
    def setUpClass(cls) -> None:
        cls.berth = Berth()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.berth.stop()

    async def client(self, *, streaming: bool = False, polling: bool = False):
        http = httpx.AsyncClient(headers=AUTH, timeout=60)
        self.addAsyncCleanup(http.aclose)
        return await create_client(
            self.berth.url, ClientConfig(streaming=streaming, polling=polling, httpx_client=http)
        )

    async def send(self, client, msg: Message):
        """The events of one send_message call."""
        return [event async for event in client.send_message(SendMessageRequest(message=msg))]

    async def test_agent_card_has_cache_headers(self) -> None:
        async with httpx.AsyncClient() as http:
            url = self.berth.url + ".well-known/agent-card.json"
            first = await http.get(url)
            self.assertEqual(first.status_code, 200)
            card = first.json()
            self.assertEqual(card["supportedInterfaces"][0]["protocolBinding"], "JSONRPC")
            self.assertEqual(card["supportedInterfaces"][0]["protocolVersion"], "1.0")
            self.assertTrue(card["capabilities"]["streaming"])
            self.assertFalse(card["capabilities"]["pushNotifications"])
            self.assertIn("max-age=", first.headers["cache-control"])
            again = await http.get(url, headers={"If-None-Match": first.headers["etag"]})
            self.assertEqual(again.status_code, 304)

    async def test_blocking_send_completes_with_an_artifact(self) -> None:
        client = await self.client()
        [event] = await self.send(client, message("say hello"))
        task = event.task
        self.assertEqual(task.status.state, TaskState.TASK_STATE_COMPLETED)
        self.assertEqual(texts(task), ["Hello from berth"])
        self.assertTrue(task.context_id)
        got = await client.get_task(GetTaskRequest(id=task.id))
        self.assertEqual(got.status.state, TaskState.TASK_STATE_COMPLETED)
        self.assertEqual(got.history[0].parts[0].text, "say hello")
        # A terminal task takes no more messages.
        with self.assertRaises(UnsupportedOperationError):
            await self.send(client, message("more", task_id=task.id))
        await client.close()

    async def test_non_blocking_send_then_subscribe_and_get(self) -> None:
        client = await self.client(streaming=True, polling=True)
        poller = await self.client(polling=True)
        [event] = await self.send(poller, message("hold until released"))
        task = event.task
        self.assertEqual(task.status.state, TaskState.TASK_STATE_WORKING)
        stream = client.subscribe(SubscribeToTaskRequest(id=task.id))
        first = await anext(stream)
        self.assertEqual(first.task.id, task.id)
        self.berth.release(task.context_id)
        events = [e async for e in stream]
        self.assertEqual(events[-1].status_update.status.state, TaskState.TASK_STATE_COMPLETED)
        got = await client.get_task(GetTaskRequest(id=task.id))
        self.assertEqual(got.status.state, TaskState.TASK_STATE_COMPLETED)
        self.assertEqual(texts(got), ["Holding.", "Released."])
        listed = await client.list_tasks(ListTasksRequest(context_id=task.context_id))
        self.assertEqual([t.id for t in listed.tasks], [task.id])
        self.assertEqual(listed.next_page_token, "")
        self.assertEqual(len(listed.tasks[0].artifacts), 0)
        await client.close()
        await poller.close()

    async def test_stream_sends_the_task_then_updates_until_completed(self) -> None:
        client = await self.client(streaming=True)
        events = await self.send(client, message("say hello"))
        self.assertTrue(events[0].HasField("task"))
        chunks = [e.artifact_update for e in events if e.HasField("artifact_update")]
        self.assertEqual("".join(p.text for c in chunks for p in c.artifact.parts), "Hello from berth")
        self.assertEqual(events[-1].status_update.status.state, TaskState.TASK_STATE_COMPLETED)
        await client.close()

    async def test_cancel_is_idempotent_and_ends_the_task(self) -> None:
        client = await self.client(polling=True)
        [event] = await self.send(client, message("hold until released"))
        task = event.task
        canceled = await client.cancel_task(CancelTaskRequest(id=task.id))
        self.assertEqual(canceled.status.state, TaskState.TASK_STATE_CANCELED)
        again = await client.cancel_task(CancelTaskRequest(id=task.id))
        self.assertEqual(again.status.state, TaskState.TASK_STATE_CANCELED)
        with self.assertRaises(TaskNotFoundError):
            await client.get_task(GetTaskRequest(id="turn_nope.ctx_nope"))
        await client.close()

    async def test_suspend_over_acp_then_resume_with_an_a2a_message(self) -> None:
        client = await self.client(polling=True)
        [event] = await self.send(client, message("hold until released"))
        task = event.task
        # The ACP control path: session id = contextId. finish_step parks the
        # turn once its in-flight tool call settles, which the release allows.
        pending = self.berth.acp_send("session/suspend", {"sessionId": task.context_id, "reason": "operator pause"})
        self.berth.release(task.context_id)
        suspended = await asyncio.to_thread(self.berth.acp_wait, pending)
        handle = suspended["result"]["handle"]
        got = await client.get_task(GetTaskRequest(id=task.id))
        self.assertEqual(got.status.state, TaskState.TASK_STATE_INPUT_REQUIRED)
        suspension = got.metadata["berth"]["suspension"]
        self.assertEqual(suspension["handle"], handle)
        self.assertEqual(suspension["initiator"], "client")
        self.assertEqual(suspension["reason"], "operator pause")
        blocking = await self.client()
        [event] = await self.send(blocking, message("finish now", task_id=task.id, message_id="resume-1"))
        done = event.task
        self.assertEqual(done.id, task.id)
        self.assertEqual(done.status.state, TaskState.TASK_STATE_COMPLETED)
        self.assertIn("Finished after the resume.", texts(done))
        self.assertIn("resume-1", [m.message_id for m in done.history])
        self.assertNotIn("suspension", done.metadata["berth"])
        await client.close()
        await blocking.close()

    async def test_agent_park_is_input_required_and_the_next_message_resumes_it(self) -> None:
        client = await self.client()
        [event] = await self.send(client, message("ask me"))
        task = event.task
        self.assertEqual(task.status.state, TaskState.TASK_STATE_INPUT_REQUIRED)
        self.assertEqual(task.metadata["berth"]["suspension"]["initiator"], "agent")
        self.assertEqual(task.status.message.parts[0].text.split(" (")[0], "which colour?")
        [event] = await self.send(client, message("blue", task_id=task.id, context_id=task.context_id))
        done = event.task
        self.assertEqual(done.status.state, TaskState.TASK_STATE_COMPLETED)
        self.assertTrue(any("with input: blue" in t for t in texts(done)), texts(done))
        await client.close()


    async def test_published_artifacts_have_data_and_url_parts(self) -> None:
        client = await self.client()
        [event] = await self.send(client, message("publish numbers"))
        task = event.task
        self.assertEqual(task.status.state, TaskState.TASK_STATE_COMPLETED)
        [artifact] = task.artifacts
        self.assertEqual(artifact.name, "numbers")
        self.assertEqual(artifact.parts[0].WhichOneof("content"), "data")
        self.assertEqual(MessageToDict(artifact.parts[0].data), {"key": "value", "count": 42})
        [event] = await self.send(client, message("publish a link"))
        part = event.task.artifacts[0].parts[0]
        self.assertEqual(part.WhichOneof("content"), "url")
        self.assertEqual(part.url, "https://example.com/output.txt")
        self.assertEqual(part.filename, "output.txt")
        self.assertEqual(part.media_type, "text/plain")
        await client.close()

    async def test_a_direct_reply_is_a_message_to_a_blocking_send(self) -> None:
        client = await self.client()
        [event] = await self.send(client, message("reply briefly"))
        self.assertTrue(event.HasField("message"), event)
        reply = event.message
        self.assertEqual(reply.role, Role.ROLE_AGENT)
        self.assertEqual([p.text for p in reply.parts], ["Direct message response"])
        self.assertEqual(reply.task_id, "")
        self.assertTrue(reply.context_id)
        # The journaled turn stays readable as a completed task.
        got = await client.get_task(GetTaskRequest(id=reply.metadata["berth"]["taskId"]))
        self.assertEqual(got.status.state, TaskState.TASK_STATE_COMPLETED)
        self.assertEqual(got.context_id, reply.context_id)
        # A stream commits to a task before the agent speaks: the reply is
        # the completed task's status message.
        streaming = await self.client(streaming=True)
        events = await self.send(streaming, message("reply briefly"))
        self.assertTrue(events[0].HasField("task"))
        final = events[-1].status_update.status
        self.assertEqual(final.state, TaskState.TASK_STATE_COMPLETED)
        self.assertEqual(final.message.parts[0].text, "Direct message response")
        await client.close()
        await streaming.close()


if __name__ == "__main__":
    unittest.main()
