"""The Temporal side of berth's peer benchmarks: workflows and the activity.

Each workload is written the way a Temporal user would write it with the
Python SDK (temporalio 1.35.0), default options throughout:

* ``TimerWorkflow`` — durable timer wake-up: a workflow timer
  (``asyncio.sleep`` inside a workflow). It returns ``workflow.now()`` before
  and after the timer (the start times of the workflow tasks, as recorded by
  the server, seconds since the epoch), so lateness = t1 - t0 - delay is
  measured by the unit itself.
* ``SignalWorkflow`` — control round trip: the workflow waits for the
  ``go`` signal and returns its payload; the ``parked`` query tells the client
  the workflow has started and is waiting.
* ``StepsWorkflow`` — durable step throughput: ``n`` no-op local activities,
  one after another (each result is recorded in the workflow's history).
* ``ParkWorkflow`` — parked density: a long workflow timer.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import activity, workflow


@activity.defn
async def noop_step(i: int) -> int:
    """A zero-latency step: returns its argument."""
    return i


@workflow.defn
class TimerWorkflow:
    @workflow.run
    async def run(self, delay_ms: int) -> list[float]:
        t0 = workflow.now().timestamp()
        await asyncio.sleep(delay_ms / 1000)
        t1 = workflow.now().timestamp()
        return [t0, t1]


@workflow.defn
class SignalWorkflow:
    def __init__(self) -> None:
        self._payload: str | None = None

    @workflow.run
    async def run(self) -> str:
        await workflow.wait_condition(lambda: self._payload is not None)
        assert self._payload is not None
        return self._payload

    @workflow.signal
    def go(self, payload: str) -> None:
        self._payload = payload

    @workflow.query
    def parked(self) -> bool:
        return self._payload is None


@workflow.defn
class StepsWorkflow:
    @workflow.run
    async def run(self, n: int) -> int:
        for i in range(n):
            await workflow.execute_local_activity(
                noop_step, i, start_to_close_timeout=timedelta(seconds=30)
            )
        return n


@workflow.defn
class ParkWorkflow:
    def __init__(self) -> None:
        self._parked = False

    @workflow.run
    async def run(self, delay_ms: int) -> str:
        self._parked = True
        await asyncio.sleep(delay_ms / 1000)
        return "woke"

    @workflow.query
    def parked(self) -> bool:
        return self._parked
