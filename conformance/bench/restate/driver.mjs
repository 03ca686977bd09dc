// Drives the Restate side of berth's peer benchmarks (run by ../suite.py)
// through restate-server's HTTP ingress and admin API, with Node's fetch
// (and, for the timers workload, Node's HTTP/2 client: see `h2call`).
//
//   node driver.mjs ready    --ingress URL --admin URL
//   node driver.mjs register --admin URL --uri SERVICE_URL
//   node driver.mjs timers   --ingress URL --n N [--delay-ms 1000]
//   node driver.mjs control  --ingress URL --n N --mode seq|conc
//   node driver.mjs steps    --ingress URL --concurrency C --secs S [--steps 10]
//   node driver.mjs park     --ingress URL --admin URL --n N --probes P --probe-ms MS --out FILE
//   node driver.mjs probes   --ingress URL --ids FILE --since EPOCH_MS
//
// Every command prints one JSON object as its last line. Latencies are in
// microseconds (performance.now() around the client's own calls); lateness
// compares the handler's journaled clock (ctx.date.now()) or this process's
// wall clock with a due time.

import { readFileSync, writeFileSync } from "node:fs";
import { randomUUID } from "node:crypto";
import http2 from "node:http2";

function parseArgs(argv) {
  const [command, ...rest] = argv;
  const opts = {};
  for (let i = 0; i < rest.length; i += 2) {
    if (!rest[i].startsWith("--") || rest[i + 1] === undefined) {
      throw new Error(`bad argument ${rest[i]}: expected --name value pairs`);
    }
    opts[rest[i].slice(2)] = rest[i + 1];
  }
  return { command, opts };
}

/** Nearest-rank percentile (the same method as berth_conformance::stats). */
function percentile(sorted, p) {
  const n = sorted.length;
  const rank = Math.max(1, Math.ceil((p * n) / 100));
  return sorted[Math.min(rank, n) - 1];
}

function spread(values) {
  if (values.length === 0) return { count: 0 };
  const v = [...values].sort((a, b) => a - b);
  return {
    count: v.length,
    min_us: Math.round(v[0]),
    p50_us: Math.round(percentile(v, 50)),
    p90_us: Math.round(percentile(v, 90)),
    p99_us: Math.round(percentile(v, 99)),
    max_us: Math.round(v[v.length - 1]),
    mean_us: Math.round(v.reduce((a, b) => a + b, 0) / v.length),
  };
}

async function call(url, { method = "POST", body, headers = {} } = {}) {
  const res = await fetch(url, {
    method,
    headers: body === undefined ? headers : { "content-type": "application/json", ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  if (!res.ok) {
    throw new Error(`${method} ${url} answered ${res.status}: ${text}`);
  }
  return text.length ? JSON.parse(text) : null;
}

/**
 * HTTP/2 (cleartext, prior knowledge) to Restate's ingress, which speaks it:
 * many calls in flight share a few connections. The timers workload keeps
 * every unit's call open until its unit wakes (10,000 at once); over
 * HTTP/1.1 that is a socket per call on both sides, and under this
 * machine's 20,000 open-files hard limit (which the suite cannot raise
 * without CAP_SYS_RESOURCE) Restate's ingress ran out of file descriptors
 * near 8,000 and the server shut itself down. `H2_STREAMS` calls share one
 * connection (below the server's advertised stream limit); connections are
 * opened as the calls in flight need them.
 */
const H2_STREAMS = 100;
const h2Pool = [];

function h2Session(origin) {
  let entry = h2Pool.find(
    (e) => e.origin === origin && e.inFlight < H2_STREAMS && !e.gone && !e.session.closed && !e.session.destroyed,
  );
  if (!entry) {
    const session = http2.connect(origin);
    entry = { origin, session, inFlight: 0, gone: false };
    const e = entry;
    // A connection the server is ending (GOAWAY) or that failed takes no
    // new calls; each call on it reports its own failure.
    session.on("goaway", () => { e.gone = true; });
    session.on("error", () => { e.gone = true; });
    session.on("close", () => { e.gone = true; });
    h2Pool.push(entry);
  }
  return entry;
}

/** `call` over HTTP/2: the same contract (JSON in and out, throws on a non-2xx). */
function h2call(url, { method = "POST", body } = {}) {
  const u = new URL(url);
  const entry = h2Session(u.origin);
  entry.inFlight++;
  return new Promise((resolve, reject) => {
    const headers = { ":method": method, ":path": u.pathname + u.search };
    if (body !== undefined) headers["content-type"] = "application/json";
    const req = entry.session.request(headers);
    let status = 0;
    const chunks = [];
    req.on("response", (h) => { status = h[":status"]; });
    req.on("data", (c) => chunks.push(c));
    req.on("error", (e) => { entry.inFlight--; reject(e); });
    req.on("end", () => {
      entry.inFlight--;
      const text = Buffer.concat(chunks).toString("utf8");
      if (status < 200 || status > 299) {
        reject(new Error(`${method} ${url} answered ${status}: ${text}`));
      } else {
        resolve(text.length ? JSON.parse(text) : null);
      }
    });
    req.end(body === undefined ? undefined : JSON.stringify(body));
  });
}

function h2close() {
  for (const e of h2Pool.splice(0)) e.session.close();
}

/** Runs `fn(i)` for i in 0..n with at most `limit` at once. */
async function pool(n, limit, fn) {
  const out = new Array(n);
  let next = 0;
  async function lane() {
    while (next < n) {
      const i = next++;
      out[i] = await fn(i);
    }
  }
  await Promise.all(Array.from({ length: Math.min(limit, n) }, lane));
  return out;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const micros = (t0) => (performance.now() - t0) * 1000;

async function ready({ ingress, admin, "timeout-s": timeoutS = "60" }) {
  const t0 = performance.now();
  const deadline = Date.now() + Number(timeoutS) * 1000;
  for (const url of [`${admin}/health`, `${ingress}/restate/health`]) {
    for (;;) {
      try {
        const res = await fetch(url);
        if (res.ok) break;
      } catch {
        // not listening yet
      }
      if (Date.now() > deadline) throw new Error(`${url} did not answer in ${timeoutS} s`);
      await sleep(20);
    }
  }
  return { ready_s: (performance.now() - t0) / 1000 };
}

async function register({ admin, uri }) {
  const res = await call(`${admin}/deployments`, { body: { uri, force: true } });
  return { registered: uri, services: (res?.services ?? []).map((s) => s.name) };
}

async function timers({ ingress, n, "delay-ms": delayMs = "1000" }) {
  const delay = Number(delayMs);
  const count = Number(n);
  const one = async () => {
    const sentWall = Date.now();
    const t0 = performance.now();
    const sent = await h2call(`${ingress}/bench/timer/send`, { body: delay });
    const ack = micros(t0);
    const { t0: u0, t1: u1 } = await h2call(
      `${ingress}/restate/invocation/${sent.invocationId}/attach`,
      { method: "GET" },
    );
    const doneWall = Date.now();
    return {
      ack,
      unitLate: (u1 - u0 - delay) * 1000,
      clientLate: (doneWall - sentWall - delay) * 1000,
      sentWall,
      doneWall,
    };
  };
  const results = await Promise.all(Array.from({ length: count }, one));
  h2close();
  return {
    system: "restate",
    n: count,
    delay_ms: delay,
    start_ack: spread(results.map((r) => r.ack)),
    lateness_unit: spread(results.map((r) => r.unitLate)),
    lateness_client: spread(results.map((r) => r.clientLate)),
    wall_s:
      (Math.max(...results.map((r) => r.doneWall)) - Math.min(...results.map((r) => r.sentWall))) /
      1000,
  };
}

async function control({ ingress, n, mode }) {
  const count = Number(n);
  const run = randomUUID().slice(0, 8);
  const keys = Array.from({ length: count }, (_, i) => `sig-${run}-${i}`);
  await pool(count, 256, (i) => call(`${ingress}/sig/${keys[i]}/run/send`));
  // Each `ready` answers once its workflow has parked on the `go` promise.
  await pool(count, 256, (i) => call(`${ingress}/sig/${keys[i]}/ready`));
  const one = async (i) => {
    const payload = `resume input ${i}`;
    // Attach (wait for the result) before resolving the promise, so the
    // figure is signal sent → result seen, not two round trips in a row.
    const pending = call(`${ingress}/restate/workflow/sig/${keys[i]}/attach`, {
      method: "GET",
    });
    await sleep(0);
    const t0 = performance.now();
    await call(`${ingress}/sig/${keys[i]}/go`, { body: payload });
    const result = await pending;
    const us = micros(t0);
    if (result !== payload) throw new Error(`workflow ${keys[i]} returned ${result}`);
    return us;
  };
  const started = performance.now();
  let samples;
  if (mode === "seq") {
    samples = [];
    for (let i = 0; i < count; i++) samples.push(await one(i));
  } else {
    samples = await Promise.all(keys.map((_, i) => one(i)));
  }
  return {
    system: "restate",
    n: count,
    mode,
    signal_to_result: spread(samples),
    wall_s: (performance.now() - started) / 1000,
  };
}

async function steps({ ingress, concurrency, secs, steps: stepsPerUnit = "10" }) {
  const c = Number(concurrency);
  const k = Number(stepsPerUnit);
  const unit = async () => {
    const t0 = performance.now();
    const got = await call(`${ingress}/bench/steps`, { body: k });
    if (got !== k) throw new Error(`a steps handler returned ${got}`);
    return micros(t0);
  };
  await Promise.all(Array.from({ length: c }, unit)); // one unmeasured unit per lane
  const samples = [];
  const start = performance.now();
  const deadline = start + Number(secs) * 1000;
  let last = start;
  const lane = async () => {
    while (performance.now() < deadline) {
      samples.push(await unit());
      last = Math.max(last, performance.now());
    }
  };
  await Promise.all(Array.from({ length: c }, lane));
  const window = (last - start) / 1000;
  return {
    system: "restate",
    concurrency: c,
    steps_per_unit: k,
    units: samples.length,
    window_s: window,
    steps_per_sec: (samples.length * k) / window,
    unit: spread(samples),
  };
}

/** Rows of the admin SQL introspection API. */
async function query(admin, sql) {
  const res = await call(`${admin}/query`, {
    body: { query: sql },
    headers: { accept: "application/json" },
  });
  return res.rows;
}

async function park({ ingress, admin, n, probes, "probe-ms": probeMs = "1000", out }) {
  const far = 24 * 3600 * 1000;
  const count = Number(n);
  const p = Number(probes);
  const t0 = performance.now();
  await pool(count, 256, () => call(`${ingress}/bench/park/send`, { body: far }));
  const probeIds = await pool(p, 256, async () =>
    (await call(`${ingress}/bench/park/send`, { body: Number(probeMs) })).invocationId,
  );
  const startedS = (performance.now() - t0) / 1000;
  // Parked = the handler reached its sleep: the sleep is in its journal.
  const total = count + p;
  for (;;) {
    const rows = await query(
      admin,
      "SELECT count(*) AS n FROM sys_journal WHERE entry_type LIKE '%Sleep%'",
    );
    if (Number(rows[0].n) >= total) break;
    await sleep(200);
  }
  const parkedS = (performance.now() - t0) / 1000;
  writeFileSync(out, JSON.stringify({ probes: probeIds, probe_ms: Number(probeMs) }));
  return {
    system: "restate",
    parked: count,
    probes: p,
    started_s: startedS,
    parked_s: parkedS,
    parked_at: Date.now() / 1000,
  };
}

async function probes({ ingress, ids, since }) {
  const list = JSON.parse(readFileSync(ids, "utf8")).probes;
  const deadline = Date.now() + 120_000;
  const times = await pool(list.length, 256, async (i) => {
    for (;;) {
      try {
        const got = await call(`${ingress}/restate/invocation/${list[i]}/attach`, {
          method: "GET",
        });
        if (got !== "woke") throw new Error(`probe ${list[i]} returned ${got}`);
        return Date.now() / 1000;
      } catch (e) {
        // The server may still be starting: retry until the deadline.
        if (Date.now() > deadline) throw e;
        await sleep(20);
      }
    }
  });
  return { probes: list.length, fired_after_s: Math.max(...times) - Number(since) };
}

const commands = { ready, register, timers, control, steps, park, probes };
const { command, opts } = parseArgs(process.argv.slice(2));
if (!commands[command]) {
  console.error(`unknown command ${command}; one of ${Object.keys(commands).join(", ")}`);
  process.exit(2);
}
try {
  console.log(JSON.stringify(await commands[command](opts)));
} catch (e) {
  console.error(`driver.mjs ${command}: ${e.stack ?? e}`);
  process.exit(1);
}
