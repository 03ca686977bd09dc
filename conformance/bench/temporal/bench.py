"""Drives the Temporal side of berth's peer benchmarks (run by ../suite.py).

    python bench.py worker  --address HOST:PORT
    python bench.py ready   --address HOST:PORT [--timeout-s S]
    python bench.py timers  --address HOST:PORT --n N [--delay-ms 1000]
    python bench.py control --address HOST:PORT --n N --mode seq|conc
    python bench.py steps   --address HOST:PORT --concurrency C --secs S [--steps 10]
    python bench.py park    --address HOST:PORT --n N --probes P --probe-ms MS --out FILE
    python bench.py probes  --address HOST:PORT --ids FILE --since EPOCH_S

Every command but ``worker`` prints one JSON object as its last line of
output. ``worker`` runs a worker (the workflows and the activity of
``workflows.py`` on task queue ``bench``) until it is terminated. Latencies
are in microseconds, measured with ``time.perf_counter()`` around the
client's own calls; lateness compares the workflow's own clock readings
(``workflow.now()``) or this process's wall clock with a due time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import uuid

from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import Worker

from workflows import (
    ParkWorkflow,
    SignalWorkflow,
    StepsWorkflow,
    TimerWorkflow,
    noop_step,
)

TASK_QUEUE = "bench"


def percentile(sorted_values: list[float], p: int) -> float:
    """Nearest-rank percentile (the same method as berth_conformance::stats)."""
    n = len(sorted_values)
    rank = max(1, -(-p * n // 100))
    return sorted_values[min(rank, n) - 1]


def spread(values_us: list[float]) -> dict:
    """count/min/p50/p90/p99/max/mean of microsecond samples."""
    if not values_us:
        return {"count": 0}
    v = sorted(values_us)
    return {
        "count": len(v),
        "min_us": round(v[0]),
        "p50_us": round(percentile(v, 50)),
        "p90_us": round(percentile(v, 90)),
        "p99_us": round(percentile(v, 99)),
        "max_us": round(v[-1]),
        "mean_us": round(sum(v) / len(v)),
    }


async def connect(address: str, timeout_s: float = 60.0) -> Client:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await Client.connect(address)
        except (RPCError, RuntimeError, OSError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def cmd_worker(args: argparse.Namespace) -> None:
    client = await connect(args.address)
    worker = Worker(
        client,
        task_queue=TASK_QUEUE,
        workflows=[TimerWorkflow, SignalWorkflow, StepsWorkflow, ParkWorkflow],
        activities=[noop_step],
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with worker:
        print("worker running", flush=True)
        await stop.wait()


async def cmd_ready(args: argparse.Namespace) -> None:
    """Waits until the server answers (a namespace describe) and prints the time."""
    started = time.perf_counter()
    client = await connect(args.address, args.timeout_s)
    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest

    deadline = time.monotonic() + args.timeout_s
    while True:
        try:
            await client.workflow_service.describe_namespace(
                DescribeNamespaceRequest(namespace="default")
            )
            break
        except RPCError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)
    print(json.dumps({"ready_s": time.perf_counter() - started}))


async def cmd_timers(args: argparse.Namespace) -> None:
    client = await connect(args.address)
    run = uuid.uuid4().hex[:8]
    delay_s = args.delay_ms / 1000

    async def one(i: int) -> dict:
        sent_wall = time.time()
        sent = time.perf_counter()
        handle = await client.start_workflow(
            TimerWorkflow.run,
            args.delay_ms,
            id=f"timer-{run}-{i}",
            task_queue=TASK_QUEUE,
        )
        acked = time.perf_counter()
        t0, t1 = await handle.result()
        done_wall = time.time()
        return {
            "ack_us": (acked - sent) * 1e6,
            "unit_late_us": (t1 - t0 - delay_s) * 1e6,
            "client_late_us": (done_wall - sent_wall - delay_s) * 1e6,
            "sent": sent_wall,
            "done": done_wall,
        }

    results = await asyncio.gather(*(one(i) for i in range(args.n)))
    wall = max(r["done"] for r in results) - min(r["sent"] for r in results)
    print(
        json.dumps(
            {
                "system": "temporal",
                "n": args.n,
                "delay_ms": args.delay_ms,
                "start_ack": spread([r["ack_us"] for r in results]),
                "lateness_unit": spread([r["unit_late_us"] for r in results]),
                "lateness_client": spread([r["client_late_us"] for r in results]),
                "wall_s": wall,
            }
        )
    )


async def wait_parked(handles: list, query, concurrency: int = 64,
                      limit_s: float = 900.0) -> None:
    """Queries every workflow until it reports itself parked (a query is
    answered after the workflow's pending task, so True means it waits).
    A query that times out (the dev server or the worker is still working
    through its backlog: the workflow task is not done yet) counts as "not
    parked yet" and is asked again; past `limit_s` in all, the last error is
    raised."""
    sem = asyncio.Semaphore(concurrency)
    deadline = time.monotonic() + limit_s

    async def one(h) -> None:
        async with sem:
            while True:
                try:
                    if await h.query(query):
                        return
                except RPCError:
                    if time.monotonic() > deadline:
                        raise
                await asyncio.sleep(0.01)

    await asyncio.gather(*(one(h) for h in handles))


async def cmd_control(args: argparse.Namespace) -> None:
    client = await connect(args.address)
    run = uuid.uuid4().hex[:8]
    handles = await asyncio.gather(
        *(
            client.start_workflow(
                SignalWorkflow.run, id=f"sig-{run}-{i}", task_queue=TASK_QUEUE
            )
            for i in range(args.n)
        )
    )
    await wait_parked(handles, SignalWorkflow.parked)

    async def one(i: int, h) -> float:
        payload = f"resume input {i}"
        # The result is awaited (long poll) before the signal is sent, so the
        # figure is signal sent → result seen, not two round trips in a row.
        pending = asyncio.ensure_future(h.result())
        await asyncio.sleep(0)
        t0 = time.perf_counter()
        await h.signal(SignalWorkflow.go, payload)
        result = await pending
        elapsed = time.perf_counter() - t0
        if result != payload:
            raise RuntimeError(f"workflow {h.id} returned {result!r}, not {payload!r}")
        return elapsed * 1e6

    started = time.perf_counter()
    if args.mode == "seq":
        samples = [await one(i, h) for i, h in enumerate(handles)]
    else:
        samples = list(await asyncio.gather(*(one(i, h) for i, h in enumerate(handles))))
    wall = time.perf_counter() - started
    print(
        json.dumps(
            {
                "system": "temporal",
                "n": args.n,
                "mode": args.mode,
                "signal_to_result": spread(samples),
                "wall_s": wall,
            }
        )
    )


async def cmd_steps(args: argparse.Namespace) -> None:
    client = await connect(args.address)
    run = uuid.uuid4().hex[:8]
    counter = 0

    async def unit() -> float:
        nonlocal counter
        counter += 1
        t0 = time.perf_counter()
        n = await client.execute_workflow(
            StepsWorkflow.run,
            args.steps,
            id=f"steps-{run}-{counter}",
            task_queue=TASK_QUEUE,
        )
        if n != args.steps:
            raise RuntimeError(f"a steps workflow returned {n}")
        return (time.perf_counter() - t0) * 1e6

    # One unmeasured unit per lane.
    await asyncio.gather(*(unit() for _ in range(args.concurrency)))
    samples: list[float] = []
    start = time.perf_counter()
    deadline = start + args.secs
    last = start

    async def lane() -> None:
        nonlocal last
        while time.perf_counter() < deadline:
            samples.append(await unit())
            last = max(last, time.perf_counter())

    await asyncio.gather(*(lane() for _ in range(args.concurrency)))
    window = last - start
    print(
        json.dumps(
            {
                "system": "temporal",
                "concurrency": args.concurrency,
                "steps_per_unit": args.steps,
                "units": len(samples),
                "window_s": window,
                "steps_per_sec": len(samples) * args.steps / window,
                "unit": spread(samples),
            }
        )
    )


async def cmd_park(args: argparse.Namespace) -> None:
    client = await connect(args.address)
    run = uuid.uuid4().hex[:8]
    sem = asyncio.Semaphore(256)

    async def start(i: int, delay_ms: int, kind: str):
        async with sem:
            return await client.start_workflow(
                ParkWorkflow.run, delay_ms, id=f"park-{run}-{kind}-{i}", task_queue=TASK_QUEUE
            )

    t0 = time.perf_counter()
    far = 24 * 3600 * 1000
    handles = await asyncio.gather(*(start(i, far, "far") for i in range(args.n)))
    probes = await asyncio.gather(
        *(start(i, args.probe_ms, "probe") for i in range(args.probes))
    )
    started_s = time.perf_counter() - t0
    await wait_parked(list(handles) + list(probes), ParkWorkflow.parked)
    parked_s = time.perf_counter() - t0
    with open(args.out, "w") as f:
        json.dump({"probes": [h.id for h in probes], "probe_ms": args.probe_ms}, f)
    print(
        json.dumps(
            {
                "system": "temporal",
                "parked": args.n,
                "probes": args.probes,
                "started_s": started_s,
                "parked_s": parked_s,
                "parked_at": time.time(),
            }
        )
    )


async def cmd_probes(args: argparse.Namespace) -> None:
    """Awaits every probe's result; prints how long after --since the last came."""
    with open(args.ids) as f:
        ids = json.load(f)["probes"]
    client = await connect(args.address, 120)
    done: list[float] = []

    async def one(wid: str) -> None:
        result = await client.get_workflow_handle(wid).result()
        if result != "woke":
            raise RuntimeError(f"probe {wid} returned {result!r}")
        done.append(time.time())

    await asyncio.gather(*(one(w) for w in ids))
    print(json.dumps({"probes": len(ids), "fired_after_s": max(done) - args.since}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command")
    parser.add_argument("--address", required=True)
    parser.add_argument("--n", type=int, default=0)
    parser.add_argument("--delay-ms", type=int, default=1000)
    parser.add_argument("--mode", choices=["seq", "conc"], default="seq")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--secs", type=float, default=5.0)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--probes", type=int, default=0)
    parser.add_argument("--probe-ms", type=int, default=1000)
    parser.add_argument("--out")
    parser.add_argument("--ids")
    parser.add_argument("--since", type=float, default=0.0)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    args = parser.parse_args()
    commands = {
        "worker": cmd_worker,
        "ready": cmd_ready,
        "timers": cmd_timers,
        "control": cmd_control,
        "steps": cmd_steps,
        "park": cmd_park,
        "probes": cmd_probes,
    }
    if args.command not in commands:
        parser.error(f"unknown command {args.command!r}; one of {', '.join(commands)}")
    asyncio.run(commands[args.command](args))
    # The SDK's native runtime can abort while the interpreter finalizes
    # ("PyGILState_Release ... must be current"): the result is printed, so
    # leave without finalizing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
