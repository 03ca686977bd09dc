// Shared harness of the end-to-end tests in this directory (`*.test.mjs`):
// each runs a real `berth serve` process and drives it with the OFFICIAL ACP
// TypeScript SDK (`@agentclientprotocol/sdk`, pinned in package.json), or, for
// methods and fields the SDK does not have, with the raw JSON-RPC client
// `RawClient` below. This file is not a test itself (`node --test` only picks
// up `*.test.mjs`).
//
// Environment:
//   BERTH_BIN=<path>        the berth binary (default `<repo>/target/debug/berth`)
//   BERTH_E2E_KEEP=1        keep the temp dirs made by `tempRoot`
//   BERTH_E2E_DUMP=<dir>    write every server's frames (both directions, sent
//                           order then received order) and its stderr there
//
// Importing this module (once per test process) installs:
//   - a console.error hook that records everything printed into `sdkErrors`
//     (and still prints it): the SDK only logs, via console.error, a
//     notification it rejects (e.g. zod failing on a `session/update`), so a
//     non-empty `sdkErrors` is a test failure;
//   - `killEverything` on process exit and in a top-level node:test `after`
//     hook, which also removes the `tempRoot` dirs unless BERTH_E2E_KEEP is set.
//
// Exports:
//   E2E_DIR                  this directory (where the model scripts live)
//   BERTH_BIN                the binary under test
//   AGENT_EVENT              "_berth/agentEvent", berth's extension notification
//   SESSION_UPDATE           ACP `session/update`
//   NOTIFICATION_METHODS     Set of the two notification methods above
//   sdkErrors                everything console.error printed (see above)
//   strayPids                pids to SIGKILL at the end (a test adds the tool
//                            processes it found, and deletes them once dead)
//   within(p, ms, label)     `p`, or a rejection "timed out after ms ms: label"
//   pollUntil(fn, ms, label, everyMs)
//                            polls `fn` until truthy (for facts no frame
//                            announces: a pid in /proc, a file on disk)
//   Recorder                 append-only log: `items`, `push`, and
//                            `waitFor(pred(item, all), ms, label)` under a hard
//                            timeout (the error lists the last items)
//   eventIdOf(params)        `params._meta.berth.eventId`
//   maxEventId(server, sessionId?)
//                            highest eventId among the notifications `server`
//                            wrote on the wire (of `sessionId` when given), or 0
//   processTable()           Linux /proc table: {pid, state, ppid, pgid, cmdline}
//   descendants(pid)         the process-table entries below `pid`, breadth first
//   procState(pid)           /proc state letter of `pid`, or null once it is gone
//   procCmdline(pid)         its command line joined by spaces, or null
//   BerthServer              one `berth serve` child process with a wire tap:
//                            `new BerthServer({label, dataDir, script, config?,
//                            args?, env?, dumpPrefix?})` runs `berth serve [--config C]
//                            --data-dir D --model scripted:S [...args]`; `.stream` is the
//                            ndjson stream for the SDK, `.wire` (a Recorder) every
//                            message berth wrote, in wire order, before the SDK
//                            saw it, `.sent` every message the SDK wrote,
//                            `.stderr` (last 20 kB), `.exited` ({code, signal}),
//                            `.responseIndex(method, ms)`, `.shutdown(ms)`
//                            (stdin EOF, wait for exit), `.kill()` (SIGKILL it and
//                            everything below it), `.listening(ms)` (the
//                            `http://IP:PORT` of its HTTP listener, from the
//                            `berth: listening on …` stderr line, when started
//                            with `--listen`); dumped on exit (see above)
//   killEverything()         SIGKILLs every running server (and what is below
//                            it) and every pid in `strayPids`
//   tempRoot(prefix)         a fresh (realpath'd) temp dir, removed at the end
//   assertBerthBin()         fails early, with a hint, when BERTH_BIN is missing
//   stepper(t)               `step(name)`: a t.diagnostic timed from its creation
//   clientApp(seen, name)    the SDK client app (name `name`): zod-validated
//                            `session/update`s and raw `_berth/agentEvent`s, each
//                            pushed to `seen` as {method, params}
//   initialize(agent, name)  ACP `initialize` (clientInfo `name`); asserts protocol
//                            1, loadSession and sessionCapabilities list/resume/close
//   prompt(agent, sessionId, text)
//                            ACP `session/prompt` with one text block
//   sessionHelpers({agent, seen, server, root})
//                            per-connection helpers: `sessions` (every
//                            {label, sessionId, cwd} made), `newSession(label)`
//                            (cwd `<root>/work-<label>`), `lastEventId(sessionId)`,
//                            `waitUpdate(sessionId, after, pred(update), label,
//                            ms)`, `startPrompt(sessionId, text)` (a prompt whose
//                            rejection is not unhandled)
//   assertSdkDeliveredAll(server, seen)
//                            every notification `server` wrote reached the SDK
//                            handlers (same method#eventId multiset), and the SDK
//                            logged no errors
//   reportServer(t, server, {stderrChars, frames, frameChars})
//                            t.diagnostic of the server's stderr tail and last frames
//   subtestRunner(t, {timeout, server})
//                            `subtest(name, fn)`: a t.test with that timeout that
//                            reports `server()` (a getter) when `fn` throws
//   RpcError                 a JSON-RPC error answer as an Error: `code`,
//                            `rpcMessage` (the answer's `message`), `data`
//   RawClient                a raw JSON-RPC 2.0 client, for methods and fields
//                            the SDK does not have (`session/suspend`, resume with
//                            `input`, agent→client `session/await_resumption`):
//                            `new RawClient(server, {name})` takes over
//                            `server.stream` (instead of the SDK: one client per
//                            server; the wire tap and dumps still see
//                            every frame; each message is one JSON line on the
//                            server's stdin / stdout) and matches answers to
//                            requests by id. `.call(method, params)` resolves
//                            `{result}` or `{error}` (never rejects, for races);
//                            `.request(method, params, ms?, label?)` resolves the
//                            result or rejects with an `RpcError` (or a timeout);
//                            `.notify(method, params)`; `.notifications` (a
//                            Recorder of `{method, params}`, wire order);
//                            `.requests` (a Recorder of the agent's requests
//                            `{id, method, params}`), answered by the handler
//                            `.onRequest(method, fn(params) → result)` (unknown
//                            methods get -32601); `.initialize({suspendUpdates,
//                            awaitResumption})` declares those
//                            `clientCapabilities._meta.berth` extensions;
//                            `.close()` ends stdin

import { after, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

import * as acp from "@agentclientprotocol/sdk";

export const E2E_DIR = path.dirname(fileURLToPath(import.meta.url));
const REPO = path.resolve(E2E_DIR, "..", "..");
export const BERTH_BIN = process.env.BERTH_BIN || path.join(REPO, "target", "debug", "berth");
export const AGENT_EVENT = "_berth/agentEvent";
export const SESSION_UPDATE = acp.methods.client.session.update;
export const NOTIFICATION_METHODS = new Set([SESSION_UPDATE, AGENT_EVENT]);

// ---------------------------------------------------------------- utilities

export function within(promise, ms, label) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${label}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** Polls `fn` (for facts no event announces, e.g. a pid in /proc) until it is truthy. */
export async function pollUntil(fn, ms, label, everyMs = 20) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = fn();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms: ${label}`);
    await new Promise((resolve) => setTimeout(resolve, everyMs));
  }
}

/** An append-only log with `waitFor(predicate)`. */
export class Recorder {
  items = [];
  #waiters = [];
  push(item) {
    this.items.push(item);
    for (const w of [...this.#waiters]) {
      if (w.pred(item, this.items)) {
        this.#waiters.splice(this.#waiters.indexOf(w), 1);
        w.resolve(item);
      }
    }
  }
  waitFor(pred, ms, label) {
    const hit = this.items.find((item) => pred(item, this.items));
    if (hit) return Promise.resolve(hit);
    let waiter;
    const p = new Promise((resolve) => {
      waiter = { pred, resolve };
      this.#waiters.push(waiter);
    });
    return within(p, ms, label).catch((error) => {
      const at = this.#waiters.indexOf(waiter);
      if (at >= 0) this.#waiters.splice(at, 1);
      const tail = this.items.slice(-8).map((i) => JSON.stringify(i).slice(0, 300));
      error.message += `\nlast items:\n  ${tail.join("\n  ")}`;
      throw error;
    });
  }
}

export const eventIdOf = (params) => params?._meta?.berth?.eventId;

/** Highest eventId `server` sent on the wire (for `sessionId` only, when given); 0 if none. */
export function maxEventId(server, sessionId) {
  let max = 0;
  for (const m of server.wire.items) {
    if (NOTIFICATION_METHODS.has(m.method) && (sessionId === undefined || m.params?.sessionId === sessionId)) {
      max = Math.max(max, eventIdOf(m.params) ?? 0);
    }
  }
  return max;
}

// ---------------------------------------------------------------- /proc

/** Linux process table from /proc. */
export function processTable() {
  const table = [];
  for (const name of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${name}/stat`, "utf8");
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      const cmdline = fs
        .readFileSync(`/proc/${name}/cmdline`, "utf8")
        .split("\0")
        .filter(Boolean)
        .join(" ");
      table.push({ pid: Number(name), state: fields[0], ppid: Number(fields[1]), pgid: Number(fields[2]), cmdline });
    } catch {
      // raced with the process exiting
    }
  }
  return table;
}

/** The process-table entries of every process below `rootPid`. */
export function descendants(rootPid) {
  const table = processTable();
  const found = [];
  const queue = [rootPid];
  while (queue.length) {
    const parent = queue.shift();
    for (const p of table) {
      if (p.ppid === parent) {
        found.push(p);
        queue.push(p.pid);
      }
    }
  }
  return found;
}

/** The /proc state letter of `pid`, or null once the pid no longer exists. */
export function procState(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0];
  } catch {
    return null;
  }
}

export function procCmdline(pid) {
  try {
    return fs.readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").filter(Boolean).join(" ");
  } catch {
    return null;
  }
}

// Every console.error the SDK prints (e.g. "Error handling notification" when zod
// rejects a `session/update`) is a failure of the test.
export const sdkErrors = [];
const consoleError = console.error;
console.error = (...args) => {
  sdkErrors.push(args.map((a) => (a instanceof Error ? a.stack : JSON.stringify(a))).join(" "));
  consoleError(...args);
};

// ---------------------------------------------------------------- servers

const servers = new Set();
export const strayPids = new Set();
const tempDirs = [];

function sigkill(pid) {
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    // already gone
  }
}

export class BerthServer {
  /**
   * Spawns `berth serve [--config <config>] --data-dir <dataDir> --model
   * scripted:<script> [...args]` (`args`: extra flags, e.g. `--require-approval
   * write_file`); `env`: extra environment variables (e.g. BERTH_API_KEYS);
   * `dumpPrefix` starts the names of its BERTH_E2E_DUMP files.
   */
  constructor({ label, dataDir, script, config, args: extraArgs = [], env = {}, dumpPrefix = "" }) {
    this.label = label;
    this.dumpPrefix = dumpPrefix;
    const args = [
      "serve",
      ...(config ? ["--config", config] : []),
      "--data-dir",
      dataDir,
      "--model",
      `scripted:${script}`,
      ...extraArgs,
    ];
    this.child = spawn(BERTH_BIN, args, {
      cwd: os.tmpdir(),
      stdio: ["pipe", "pipe", "pipe"],
      env: { ...process.env, NO_COLOR: "1", ...env },
    });
    servers.add(this);
    this.pid = this.child.pid;
    this.stderr = "";
    this.child.stderr.on("data", (d) => {
      this.stderr = (this.stderr + d).slice(-20_000);
    });
    this.child.stdin.on("error", () => {}); // EPIPE after a kill
    this.exited = new Promise((resolve) => {
      this.child.once("exit", (code, signal) => {
        servers.delete(this);
        this.dump();
        resolve({ code, signal });
      });
    });
    this.child.once("error", (error) => {
      throw new Error(`cannot spawn ${BERTH_BIN}: ${error.message}`);
    });
    /** Every message berth wrote, in wire order, before the SDK saw it. */
    this.wire = new Recorder();
    /** Every message the SDK wrote, in order. */
    this.sent = [];
    const base = acp.ndJsonStream(Writable.toWeb(this.child.stdin), Readable.toWeb(this.child.stdout));
    const inTap = new TransformStream({
      transform: (msg, controller) => {
        this.wire.push(msg);
        controller.enqueue(msg);
      },
    });
    const outTap = new TransformStream({
      transform: (msg, controller) => {
        this.sent.push(msg);
        controller.enqueue(msg);
      },
    });
    outTap.readable.pipeTo(base.writable).catch(() => {});
    this.stream = { readable: base.readable.pipeThrough(inTap), writable: outTap.writable };
  }

  /** Wire index of the response to the last request of `method` the SDK sent. */
  async responseIndex(method, ms) {
    const request = this.sent.findLast((m) => m.method === method && "id" in m);
    assert.ok(request, `no ${method} request was sent`);
    await this.wire.waitFor((m) => !("method" in m) && m.id === request.id, ms, `${method} response on the wire`);
    return this.wire.items.findIndex((m) => !("method" in m) && m.id === request.id);
  }

  /** With BERTH_E2E_DUMP=<dir>: writes this server's frames (both ways) and stderr there. */
  dump() {
    const dir = process.env.BERTH_E2E_DUMP;
    if (!dir) return;
    fs.mkdirSync(dir, { recursive: true });
    const file = path.join(dir, `${this.dumpPrefix}${this.label.replace(/\W+/g, "-")}.jsonl`);
    const lines = [...this.sent.map((m) => ["->", m]), ...this.wire.items.map((m) => ["<-", m])];
    fs.writeFileSync(file, lines.map(([d, m]) => `${d} ${JSON.stringify(m)}`).join("\n") + "\n");
    fs.writeFileSync(file.replace(/\.jsonl$/, ".stderr.log"), this.stderr);
  }

  /** The `http(s)://IP:PORT` its HTTP listener announced on stderr (started with `--listen`). */
  listening(ms = 10_000) {
    return pollUntil(
      // The whole line: stderr arrives in chunks that may cut it short.
      () => this.stderr.match(/berth: listening on (https?:\/\/\S+)\n/)?.[1],
      ms,
      `${this.label} announces its HTTP listener`,
    );
  }

  /** Closes stdin (berth then shuts down by itself) and waits for the exit. */
  async shutdown(ms = 10_000) {
    this.child.stdin.end();
    return within(this.exited, ms, `${this.label} exits after stdin EOF`);
  }

  /**
   * SIGKILLs the server and every process below it (found before the kill,
   * since they are reparented after it); those pids are also kept in
   * `strayPids` for the final sweep.
   */
  kill() {
    const below = descendants(this.pid).map((p) => p.pid);
    for (const pid of below) strayPids.add(pid);
    sigkill(this.pid);
    for (const pid of below) sigkill(pid);
  }
}

export function killEverything() {
  for (const server of [...servers]) server.kill();
  for (const pid of strayPids) sigkill(pid);
}

process.on("exit", killEverything);
after(() => {
  killEverything();
  if (!process.env.BERTH_E2E_KEEP) {
    for (const dir of tempDirs) fs.rmSync(dir, { recursive: true, force: true });
  }
});

/** A fresh temp dir (realpath'd), removed at the end unless BERTH_E2E_KEEP is set. */
export function tempRoot(prefix) {
  const root = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), prefix)));
  tempDirs.push(root);
  return root;
}

export function assertBerthBin() {
  assert.ok(fs.existsSync(BERTH_BIN), `no berth binary at ${BERTH_BIN}: run \`cargo build --bin berth\` or set BERTH_BIN`);
}

/** `step(name)`: a diagnostic line with the seconds since this call. */
export function stepper(t) {
  const started = Date.now();
  return (name) => t.diagnostic(`${((Date.now() - started) / 1000).toFixed(2)} s: ${name}`);
}

// ---------------------------------------------------------------- the SDK client

/**
 * The SDK client app. It validates every `session/update` with zod before the
 * handler runs; `_berth/agentEvent` is an extension notification, registered
 * with an identity params parser.
 */
export function clientApp(seen, name) {
  return acp
    .client({ name })
    .onNotification(SESSION_UPDATE, ({ params }) => {
      seen.push({ method: SESSION_UPDATE, params });
    })
    .onNotification(AGENT_EVENT, (params) => params, ({ params }) => {
      seen.push({ method: AGENT_EVENT, params });
    });
}

export async function initialize(agent, name) {
  const init = await within(
    agent.request(acp.methods.agent.initialize, {
      protocolVersion: acp.PROTOCOL_VERSION,
      clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
      clientInfo: { name, version: "0.0.0" },
    }),
    10_000,
    "initialize",
  );
  assert.equal(init.protocolVersion, 1);
  assert.equal(init.agentCapabilities?.loadSession, true);
  for (const cap of ["list", "resume", "close"]) {
    assert.ok(init.agentCapabilities?.sessionCapabilities?.[cap], `sessionCapabilities.${cap}: ${JSON.stringify(init)}`);
  }
  return init;
}

export function prompt(agent, sessionId, text) {
  return agent.request(acp.methods.agent.session.prompt, { sessionId, prompt: [{ type: "text", text }] });
}

/** Helpers bound to one connection (`agent`, its `seen` Recorder, its `server`) and a temp `root`. */
export function sessionHelpers({ agent, seen, server, root }) {
  const sessions = [];
  async function newSession(label) {
    const cwd = path.join(root, `work-${label}`);
    fs.mkdirSync(cwd);
    const created = await within(
      agent.request(acp.methods.agent.session.new, { cwd, mcpServers: [] }),
      10_000,
      `session/new (${label})`,
    );
    const entry = { label, sessionId: created.sessionId, cwd };
    sessions.push(entry);
    return entry;
  }

  const lastEventId = (sessionId) => maxEventId(server, sessionId);

  function waitUpdate(sessionId, after, pred, label, ms = 10_000) {
    return seen.waitFor(
      (n) =>
        n.method === SESSION_UPDATE &&
        n.params.sessionId === sessionId &&
        eventIdOf(n.params) > after &&
        pred(n.params.update),
      ms,
      label,
    );
  }

  function startPrompt(sessionId, text) {
    const pending = prompt(agent, sessionId, text);
    pending.catch(() => {});
    return pending;
  }

  /**
   * Waits (after event `mark`) for the `tool_call` whose shell command
   * contains `commandPart` and then for it to be `in_progress`; returns the
   * `tool_call` notification.
   */
  async function runningCall(sessionId, mark, commandPart, label) {
    const call = await waitUpdate(
      sessionId,
      mark,
      (u) => u.sessionUpdate === "tool_call" && u.rawInput?.command?.includes(commandPart),
      label,
    );
    const toolCallId = call.params.update.toolCallId;
    await waitUpdate(
      sessionId,
      mark,
      (u) => u.sessionUpdate === "tool_call_update" && u.toolCallId === toolCallId && u.status === "in_progress",
      `${label}: in_progress`,
    );
    return call;
  }

  /**
   * `session/load` of an idle session: asserts nothing is newer than what was
   * seen live, waits until the SDK ran the handlers of every replayed event
   * (ids 1..lastEventId), and returns the load answer.
   */
  async function loadReplayed(sessionId, cwd, label) {
    const loaded = await within(
      agent.request(acp.methods.agent.session.load, { sessionId, cwd, mcpServers: [] }),
      10_000,
      `session/load ${label}`,
    );
    const last = loaded._meta?.berth?.lastEventId;
    assert.equal(last, lastEventId(sessionId), `${label}: nothing new since the last turn`);
    // Replayed events are sent before the answer; the SDK may run their
    // handlers a few microtasks later.
    await seen.waitFor(
      () => sessionEvents(seen, sessionId, 0, Infinity, { replayed: true }).length === last,
      5_000,
      `${label}: the replay of ids 1..${last}`,
    );
    return loaded;
  }

  return { sessions, newSession, lastEventId, waitUpdate, startPrompt, runningCall, loadReplayed };
}

/** Every ACP notification on the wire reached the SDK handlers (none dropped by validation). */
export function assertSdkDeliveredAll(server, seen) {
  const onWire = server.wire.items.filter((m) => NOTIFICATION_METHODS.has(m.method));
  const delivered = seen.items.map((n) => `${n.method}#${eventIdOf(n.params)}`);
  assert.deepEqual(
    delivered.sort(),
    onWire.map((m) => `${m.method}#${eventIdOf(m.params)}`).sort(),
    "the SDK delivered every notification on the wire",
  );
  assert.deepEqual(sdkErrors, [], "the SDK logged no errors");
}

// ---------------------------------------------------------------- failure reports

/** Diagnostics for a failure: the server's stderr tail and its last frames. */
export function reportServer(t, server, { stderrChars = 4_000, frames = 20, frameChars = 500 } = {}) {
  t.diagnostic(`${server.label} stderr (tail):\n${server.stderr.slice(-stderrChars)}`);
  t.diagnostic(
    `${server.label} last frames:\n${server.wire.items
      .slice(-frames)
      .map((m) => JSON.stringify(m).slice(0, frameChars))
      .join("\n")}`,
  );
}

/** `subtest(name, fn)`: `t.test` under `timeout` that reports `server()` when `fn` throws. */
export function subtestRunner(t, { timeout, server }) {
  return (name, fn) =>
    t.test(name, { timeout }, async (st) => {
      try {
        await fn(st);
      } catch (error) {
        reportServer(st, server(), { stderrChars: 2_000 });
        throw error;
      }
    });
}

/**
 * The events of `sessionId` the SDK delivered (live, or only the replayed
 * ones), as `{kind, eventId, update, params}` in id order, with ids in
 * (after, upTo]. Fails if one id was delivered twice.
 */
export function sessionEvents(seen, sessionId, after = 0, upTo = Infinity, { replayed = false } = {}) {
  const byId = new Map();
  for (const n of seen.items) {
    const id = eventIdOf(n.params);
    if (n.params.sessionId !== sessionId || id === undefined || id <= after || id > upTo) continue;
    if ((n.params._meta?.berth?.replayed === true) !== replayed) continue;
    assert.ok(!byId.has(id), `eventId ${id} of ${sessionId} delivered twice ${replayed ? "in the replay" : "live"}`);
    byId.set(id, {
      kind: n.method === AGENT_EVENT ? `agent:${n.params.type}` : n.params.update.sessionUpdate,
      eventId: id,
      update: n.params.update,
      params: n.params,
    });
  }
  return [...byId.values()].sort((a, b) => a.eventId - b.eventId);
}

// ---------------------------------------------------------------- the raw client

/** A JSON-RPC error answer (`{code, message, data}`). */
export class RpcError extends Error {
  constructor({ code, message, data }, label = "") {
    super(`${label ? `${label}: ` : ""}JSON-RPC error ${code} ${message} ${JSON.stringify(data)}`);
    this.code = code;
    this.rpcMessage = message;
    this.data = data;
  }
}

/**
 * A raw JSON-RPC 2.0 client over `server.stream` (newline-delimited JSON on
 * the server's stdin/stdout, through the wire tap). See the header.
 */
export class RawClient {
  /** Every notification the server sent, `{method, params}`, in wire order. */
  notifications = new Recorder();
  /** Every request the server sent this client, `{id, method, params}`. */
  requests = new Recorder();
  #pending = new Map();
  #handlers = new Map();
  #nextId = 1;
  #writer;

  constructor(server, { name = "berth-e2e-raw" } = {}) {
    this.server = server;
    this.name = name;
    this.#writer = server.stream.writable.getWriter();
    this.#writer.closed.catch(() => {});
    this.done = (async () => {
      for await (const msg of server.stream.readable) this.#receive(msg);
    })()
      .catch(() => {})
      .finally(() => {
        for (const { resolve } of this.#pending.values()) {
          resolve({ error: { code: -1, message: "connection closed", data: null } });
        }
        this.#pending.clear();
      });
  }

  #receive(msg) {
    if (typeof msg.method === "string" && "id" in msg) {
      this.requests.push({ id: msg.id, method: msg.method, params: msg.params });
      const handler = this.#handlers.get(msg.method);
      Promise.resolve()
        .then(() => {
          if (!handler) throw new RpcError({ code: -32601, message: "Method not found", data: { method: msg.method } });
          return handler(msg.params);
        })
        .then(
          (result) => this.#send({ jsonrpc: "2.0", id: msg.id, result: result ?? {} }),
          (e) =>
            this.#send({
              jsonrpc: "2.0",
              id: msg.id,
              error: { code: e.code ?? -32603, message: e.rpcMessage ?? e.message, data: e.data ?? null },
            }),
        );
    } else if (typeof msg.method === "string") {
      this.notifications.push({ method: msg.method, params: msg.params });
    } else if ("id" in msg) {
      const waiting = this.#pending.get(msg.id);
      if (!waiting) return;
      this.#pending.delete(msg.id);
      waiting.resolve("error" in msg ? { error: msg.error } : { result: msg.result });
    }
  }

  #send(msg) {
    return this.#writer.write(msg).catch(() => {});
  }

  /** Answers the server's `method` requests with `fn(params)` (a result, or a thrown RpcError). */
  onRequest(method, fn) {
    this.#handlers.set(method, fn);
    return this;
  }

  /** Sends a request; resolves `{result}` or `{error}`, never rejects. */
  call(method, params = {}) {
    const id = this.#nextId++;
    const answer = new Promise((resolve) => this.#pending.set(id, { resolve }));
    this.#send({ jsonrpc: "2.0", id, method, params });
    return answer;
  }

  /** Sends a request; resolves the result, rejects with an RpcError (or a timeout). */
  async request(method, params = {}, ms = 10_000, label = method) {
    const answer = await within(this.call(method, params), ms, label);
    if (answer.error) throw new RpcError(answer.error, label);
    return answer.result;
  }

  notify(method, params = {}) {
    return this.#send({ jsonrpc: "2.0", method, params });
  }

  /** ACP `initialize`, declaring the berth suspend extensions asked for. */
  initialize({ suspendUpdates = false, awaitResumption = false } = {}) {
    const berth = {};
    if (suspendUpdates) berth.suspendUpdates = true;
    if (awaitResumption) berth.awaitResumption = true;
    return this.request("initialize", {
      protocolVersion: 1,
      clientCapabilities: {
        fs: { readTextFile: false, writeTextFile: false },
        terminal: false,
        ...(Object.keys(berth).length ? { _meta: { berth } } : {}),
      },
      clientInfo: { name: this.name, version: "0.0.0" },
    });
  }

  /** Ends the server's stdin (berth then shuts down by itself). */
  close() {
    return this.#writer.close().catch(() => {});
  }
}

/**
 * A `scenario(name, fn, { timeout })` declarer: each scenario is a node:test
 * test that runs `fn(ctx, t)` with `new Ctx(t, label)` (label: the name up to
 * its first `.` or space), prints the stderr of every server the context
 * started (`ctx.servers`) when it fails, and kills them all when it ends.
 */
export function scenarioRunner(Ctx, { stderrChars = 2_000 } = {}) {
  return (name, fn, { timeout = 30_000 } = {}) =>
    test(name, { timeout }, async (t) => {
      assertBerthBin();
      const ctx = new Ctx(t, name.split(/[. ]/)[0]);
      try {
        await fn(ctx, t);
      } catch (error) {
        for (const server of ctx.servers) reportServer(t, server, { stderrChars });
        throw error;
      } finally {
        for (const server of ctx.servers) server.kill();
      }
    });
}

/** The lines of the `log` file a scripted tool wrote in `cwd` (none yet: `[]`). */
export function logLines(cwd) {
  try {
    return fs.readFileSync(path.join(cwd, "log"), "utf8").split("\n").filter(Boolean);
  } catch (e) {
    if (e.code === "ENOENT") return [];
    throw e;
  }
}

/** Asserts `answer` (`{result}` or `{error}`) is a result and returns it. */
export function result(answer, label) {
  assert.ok(answer && !answer.error, `${label}: expected a result, got ${JSON.stringify(answer)}`);
  return answer.result;
}

/** Asserts `answer` is a JSON-RPC error with `code` and, when given, `data.reason` / `data.field`. */
export function rpcError(answer, { code, reason, field }, label) {
  assert.ok(answer?.error, `${label}: expected error ${code}, got ${JSON.stringify(answer)}`);
  const { error } = answer;
  assert.equal(error.code, code, `${label}: ${JSON.stringify(error)}`);
  if (reason !== undefined) assert.equal(error.data?.reason, reason, `${label}: ${JSON.stringify(error)}`);
  if (field !== undefined) assert.equal(error.data?.field, field, `${label}: ${JSON.stringify(error)}`);
  return error;
}
