// End-to-end test of berth's HTTP LISTENER (issue 8): ACP over WebSocket at
// `/acp` driven by the `ws` client library, bearer-token auth and roles, the
// ops routes (`/healthz`, `/readyz`, `/metrics` parsed with
// `parse-prometheus-text-format`, `POST /v1/events`, `GET /v1/sessions`),
// against a real `berth serve --listen 127.0.0.1:0` (loopback only).
//
// How to run (Linux; Node >= 20):
//
//     cd <repo> && cargo build --bin berth
//     cd conformance/e2e && npm ci && node --test http.test.mjs
//
// The berth binary is `$BERTH_BIN` (default `<repo>/target/debug/berth`).
// Tokens come from BERTH_API_KEYS: `alice` (controller), `grafana`
// (observer), `root` (host_owner). Every wait is for a wire fact (a frame, an
// answer, an HTTP status); nothing sleeps.
//
//  1. auth before the upgrade: a wrong token, no token and a malformed
//     header get 401 (with `WWW-Authenticate: Bearer`) and no WebSocket; a
//     browser Origin not allowed gets 403; `/healthz` and `/readyz` answer
//     without a token, `/metrics` does not.
//  2. two clients on one session: alice creates it, grafana attaches with
//     `session/load` (alice hears `_berth/presence` attached); alice prompts
//     and both receive the same updates, each with `_meta.berth.eventId`.
//  3. roles: grafana's `session/prompt`, `session/suspend`, `session/inject`
//     and `session/close` get -32011 `role_not_authorized` (data names the
//     method, role and required role) and a rejected `control_outcome`
//     receipt whose actor is `grafana` (not what the client claims), which
//     alice sees too; alice (not the creator... she is) may not
//     `_berth/suspend_many`; a binary frame gets -32600 `binary_frame`.
//  4. reconnect: grafana disconnects (alice hears `_berth/presence`
//     detached), alice prompts again, grafana reconnects and loads with
//     `_meta.berth.lastEventId` = the last id it acknowledged: it receives
//     exactly the events it missed (the ids alice saw live after it), each
//     once; a lastEventId past the end is -32602.
//  5. `/metrics` parses as Prometheus text and carries sessions by state,
//     controls by method and outcome (the refusals above), the journal
//     commit latency, turn duration and wake-up lateness histograms.
//  6. `POST /v1/events` wakes a session the agent parked with
//     `resumeWhen.onEvent` (cause `external_event`, the payload as the
//     resume input the model reads); an observer's POST is 403 -32011; a
//     bad body is a typed 400; `GET /v1/sessions[/{id}]` read the sessions.
//  7. SIGKILL: a session parked (`session/suspend`, `onEvent`) is woken by
//     a `POST /v1/events` that is answered; berth is SIGKILLed at once;
//     after a restart the session was resumed exactly once and the next
//     event's `seq` follows the acknowledged one (the event row survived).

import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";

import WebSocket from "ws";
import parsePrometheusTextFormat from "parse-prometheus-text-format";

import {
  AGENT_EVENT,
  BerthServer,
  E2E_DIR,
  Recorder,
  RpcError,
  SESSION_UPDATE,
  assertBerthBin,
  eventIdOf,
  reportServer,
  tempRoot,
  within,
} from "./harness.mjs";

const SCRIPT = path.join(E2E_DIR, "http-script.toml");
const TOKENS = {
  alice: "alice-token-0123456789",
  grafana: "grafana-token-0123456789",
  root: "root-token-0123456789",
};
const API_KEYS = `${TOKENS.alice}=alice:controller,${TOKENS.grafana}=grafana:observer,${TOKENS.root}=root:host_owner`;
const PRESENCE = "_berth/presence";

function startServer(label, dataDir) {
  return new BerthServer({
    label,
    dataDir,
    script: SCRIPT,
    args: ["--listen", "127.0.0.1:0"],
    env: { BERTH_API_KEYS: API_KEYS },
  });
}

/** A raw JSON-RPC client over one WebSocket (one message per text frame). */
class WsClient {
  notifications = new Recorder();
  frames = [];
  #pending = new Map();
  #nextId = 1;

  static connect(base, token, { headers = {} } = {}) {
    const url = `${base.replace(/^http/, "ws")}/acp`;
    const ws = new WebSocket(url, { headers: { ...(token ? { Authorization: `Bearer ${token}` } : {}), ...headers } });
    return new Promise((resolve, reject) => {
      ws.once("open", () => resolve(new WsClient(ws)));
      ws.once("unexpected-response", (_req, res) => {
        let body = "";
        res.on("data", (d) => (body += d));
        res.on("end", () => {
          const error = new Error(`upgrade refused: HTTP ${res.statusCode} ${body}`);
          error.statusCode = res.statusCode;
          error.headers = res.headers;
          error.body = body;
          reject(error);
        });
      });
      ws.once("error", reject);
    });
  }

  constructor(ws) {
    this.ws = ws;
    this.closed = new Promise((resolve) => ws.once("close", (code, reason) => resolve({ code, reason: `${reason}` })));
    ws.on("message", (data, isBinary) => {
      assert.equal(isBinary, false, "berth sends text frames only");
      const msg = JSON.parse(`${data}`);
      this.frames.push(msg);
      if (typeof msg.method === "string" && !("id" in msg)) {
        this.notifications.push({ method: msg.method, params: msg.params });
      } else if ("id" in msg && !("method" in msg)) {
        const waiting = this.#pending.get(msg.id);
        if (waiting) {
          this.#pending.delete(msg.id);
          waiting("error" in msg ? { error: msg.error } : { result: msg.result });
        }
      }
    });
    this.closed.then(() => {
      for (const resolve of this.#pending.values()) resolve({ error: { code: -1, message: "closed", data: null } });
      this.#pending.clear();
    });
  }

  call(method, params = {}) {
    const id = this.#nextId++;
    const answer = new Promise((resolve) => this.#pending.set(id, resolve));
    this.ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
    return answer;
  }

  async request(method, params = {}, ms = 10_000) {
    const answer = await within(this.call(method, params), ms, method);
    if (answer.error) throw new RpcError(answer.error, method);
    return answer.result;
  }

  initialize(name) {
    return this.request("initialize", {
      protocolVersion: 1,
      clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
      clientInfo: { name, version: "0.0.0" },
    });
  }

  /** Session notifications (`session/update`, `_berth/agentEvent`) of `sessionId`, in wire order. */
  sessionEvents(sessionId) {
    return this.notifications.items.filter(
      (n) => (n.method === SESSION_UPDATE || n.method === AGENT_EVENT) && n.params.sessionId === sessionId,
    );
  }

  maxEventId(sessionId) {
    return Math.max(0, ...this.sessionEvents(sessionId).map((n) => eventIdOf(n.params) ?? 0));
  }

  close() {
    this.ws.close(1000);
    return this.closed;
  }
}

async function http(base, route, { token, method = "GET", body, headers = {} } = {}) {
  const response = await fetch(`${base}${route}`, {
    method,
    headers: {
      ...(token ? { Authorization: `Bearer ${token}` } : {}),
      ...(body !== undefined ? { "content-type": "application/json" } : {}),
      ...headers,
    },
    body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
  });
  const text = await response.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: response.status, headers: response.headers, text, json };
}

const prompt = (client, sessionId, text) =>
  client.request("session/prompt", { sessionId, prompt: [{ type: "text", text }] }, 20_000);

test("berth HTTP listener: ACP over WebSocket, auth and roles, ops routes", { timeout: 120_000 }, async (t) => {
  assertBerthBin();
  const root = tempRoot("berth-http-e2e-");
  const dataDir = path.join(root, "data");
  let server = startServer("http", dataDir);
  const clients = [];
  try {
    const base = await server.listening();
    const connect = async (token, name) => {
      const c = await WsClient.connect(base, token);
      clients.push(c);
      await c.initialize(name);
      return c;
    };

    await t.test("1. auth is checked before the upgrade", async () => {
      for (const [label, headers] of [
        ["wrong token", { Authorization: "Bearer not-a-token-of-ours-000" }],
        ["no token", {}],
        ["malformed header", { Authorization: "Basic YWxpY2U6cHc=" }],
      ]) {
        const refused = await WsClient.connect(base, null, { headers }).then(
          () => assert.fail(`${label}: the upgrade succeeded`),
          (e) => e,
        );
        assert.equal(refused.statusCode, 401, `${label}: ${refused.message}`);
        assert.match(refused.headers["www-authenticate"], /^Bearer/);
        assert.equal(JSON.parse(refused.body).error.message, "Unauthenticated");
      }
      const browser = await WsClient.connect(base, TOKENS.alice, { headers: { Origin: "https://evil.example" } }).then(
        () => assert.fail("a foreign origin was upgraded"),
        (e) => e,
      );
      assert.equal(browser.statusCode, 403);
      assert.equal(JSON.parse(browser.body).error.data.reason, "origin_not_allowed");
      assert.deepEqual((await http(base, "/healthz")).json, { status: "ok" });
      const ready = await http(base, "/readyz");
      assert.equal(ready.status, 200);
      assert.equal(ready.json.status, "ready");
      assert.equal(ready.json.scheduler.ok, true);
      assert.equal((await http(base, "/metrics")).status, 401);
      assert.equal((await http(base, "/v1/sessions", { token: "nope-nope-nope-nope" })).status, 401);
    });

    const alice = await connect(TOKENS.alice, "alice");
    const cwd = path.join(root, "work");
    fs.mkdirSync(cwd);
    const { sessionId } = await alice.request("session/new", { cwd, mcpServers: [] });
    let grafana;

    await t.test("2. two clients on one session see the same updates", async () => {
      grafana = await connect(TOKENS.grafana, "grafana");
      const init = await grafana.initialize("grafana-twice");
      assert.deepEqual(init._meta.berth.principal, { actor: "grafana", role: "observer" });
      const loaded = await grafana.request("session/load", { sessionId, cwd, mcpServers: [] });
      assert.equal(loaded._meta.berth.lastEventId, 0);
      const joined = await alice.notifications.waitFor(
        (n) => n.method === PRESENCE && n.params.change === "attached",
        5_000,
        "alice hears grafana attach",
      );
      assert.equal(joined.params.sessionId, sessionId);
      assert.equal(joined.params.actor, "grafana");
      assert.equal(joined.params.role, "observer");
      assert.equal(joined.params.attached, 2);
      assert.equal(typeof eventIdOf(joined.params), "number");
      const answer = await prompt(alice, sessionId, "stream please");
      assert.equal(answer.stopReason, "end_turn");
      const last = alice.maxEventId(sessionId);
      await grafana.notifications.waitFor(
        () => grafana.maxEventId(sessionId) >= last,
        5_000,
        `grafana receives up to event ${last}`,
      );
      const ids = (c) => c.sessionEvents(sessionId).map((n) => eventIdOf(n.params));
      for (const n of [...alice.sessionEvents(sessionId), ...grafana.sessionEvents(sessionId)]) {
        assert.equal(typeof eventIdOf(n.params), "number", `eventId on ${JSON.stringify(n).slice(0, 200)}`);
      }
      // A prompt renders one user_message_chunk per block: ids repeat only there.
      // The sender (alice) is not shown its own prompt; the other watcher is.
      const isPrompt = (n) => n.params.update?.sessionUpdate === "user_message_chunk";
      const promptIds = new Set(grafana.sessionEvents(sessionId).filter(isPrompt).map((n) => eventIdOf(n.params)));
      assert.ok(promptIds.size > 0, "grafana sees alice's prompt");
      assert.ok(!alice.sessionEvents(sessionId).some(isPrompt), "alice is not echoed her own prompt");
      assert.deepEqual(
        [...new Set(ids(grafana))].filter((id) => !promptIds.has(id)),
        [...new Set(ids(alice))],
        "both saw the same events",
      );
      const kinds = grafana.sessionEvents(sessionId).map((n) => n.params.update?.sessionUpdate ?? n.params.type);
      for (const kind of ["agent_thought_chunk", "tool_call", "tool_call_update", "agent_message_chunk", "turn_ended"]) {
        assert.ok(kinds.includes(kind), `grafana saw ${kind}: ${kinds}`);
      }
    });

    await t.test("3. an observer is refused controls with -32011 and a rejected receipt", async () => {
      const attempts = [
        ["session/prompt", { sessionId, prompt: [{ type: "text", text: "stream" }] }, "controller"],
        ["session/suspend", { sessionId, reason: "nope" }, "controller"],
        ["session/inject", { sessionId, mode: "steer", content: "x" }, "controller"],
        ["session/close", { sessionId }, "controller"],
        // The client claims to be someone else: receipts record the token's actor.
        ["session/cancel", { sessionId, _meta: { berth: { actor: "alice" } } }, "controller"],
      ];
      for (const [method, params, requiredRole] of attempts) {
        const { error } = await grafana.call(method, params);
        assert.ok(error, `${method} was refused`);
        assert.equal(error.code, -32011, `${method}: ${JSON.stringify(error)}`);
        assert.equal(error.data.reason, "role_not_authorized");
        assert.equal(error.data.method, method);
        assert.equal(error.data.role, "observer");
        assert.equal(error.data.requiredRole, requiredRole);
        assert.equal(error.data.actor, "grafana");
        for (const [who, client] of [["grafana", grafana], ["alice", alice]]) {
          const receipt = await client.notifications.waitFor(
            (n) =>
              n.method === AGENT_EVENT &&
              n.params.type === "control_outcome" &&
              n.params.event.method === method &&
              n.params.event.reason === "role_not_authorized",
            5_000,
            `${who} sees the rejected receipt of ${method}`,
          );
          assert.equal(receipt.params.event.status, "rejected");
          assert.equal(receipt.params.event.actor, "grafana");
          assert.equal(typeof eventIdOf(receipt.params), "number", "the receipt is journaled");
        }
      }
      // The operator broadcast is the host owner's.
      const { error } = await alice.call("_berth/suspend_many", { all: true });
      assert.equal(error.code, -32011);
      assert.equal(error.data.requiredRole, "host_owner");
      // Observers may read.
      const list = await grafana.request("session/list", {});
      const entry = list.sessions.find((s) => s.sessionId === sessionId);
      assert.deepEqual(entry._meta.berth.attachableRoles, ["observer"]);
      const view = await grafana.request("berth.session_view.query", { sessionId });
      assert.ok(view, "observers may query the session view");
      // A binary frame is an Invalid Request, and the connection goes on.
      const before = grafana.frames.length;
      grafana.ws.send(Buffer.from('{"jsonrpc":"2.0","id":99,"method":"session/list"}'), { binary: true });
      const invalid = await within(
        (async () => {
          for (;;) {
            const hit = grafana.frames.slice(before).find((f) => f.error?.data?.reason === "binary_frame");
            if (hit) return hit;
            await new Promise((r) => setTimeout(r, 10));
          }
        })(),
        5_000,
        "the binary frame's error",
      );
      assert.equal(invalid.error.code, -32600);
      assert.equal(invalid.id, null);
      await grafana.request("session/list", {});
    });

    await t.test("4. a reconnecting client receives exactly what it missed", async () => {
      const acked = grafana.maxEventId(sessionId);
      assert.ok(acked > 0);
      await grafana.close();
      const left = await alice.notifications.waitFor(
        (n) => n.method === PRESENCE && n.params.change === "detached" && n.params.actor === "grafana",
        5_000,
        "alice hears grafana detach",
      );
      assert.equal(left.params.attached, 1);
      await prompt(alice, sessionId, "stream again");
      // Every event after `acked`: alice saw them all live but her own
      // prompt's user_message_chunk, which is not echoed to its sender.
      const seenByAlice = new Set(
        alice
          .sessionEvents(sessionId)
          .map((n) => eventIdOf(n.params))
          .filter((id) => id > acked),
      );
      const missed = [];
      for (let id = acked + 1; id <= Math.max(...seenByAlice); id++) missed.push(id);
      assert.ok(missed.length - seenByAlice.size <= 1, `alice lacks at most her prompt's echo: ${missed} vs ${[...seenByAlice]}`);
      assert.ok(missed.length >= 5, `alice saw a turn's events after ${acked}: ${missed}`);
      const back = await connect(TOKENS.grafana, "grafana-again");
      const loaded = await back.request("session/load", {
        sessionId,
        cwd,
        mcpServers: [],
        _meta: { berth: { lastEventId: acked } },
      });
      const replayed = back.sessionEvents(sessionId);
      assert.ok(replayed.every((n) => n.params._meta.berth.replayed === true), "all marked replayed");
      assert.deepEqual(
        [...new Set(replayed.map((n) => eventIdOf(n.params)))],
        missed,
        "exactly the missed events, in order",
      );
      assert.deepEqual(
        loaded._meta.berth.replayed.map((r) => r.eventId),
        missed,
        "the answer lists them",
      );
      assert.equal(loaded._meta.berth.lastEventId, missed.at(-1));
      const past = await back.call("session/load", { sessionId, _meta: { berth: { lastEventId: missed.at(-1) + 100 } } });
      assert.equal(past.error.code, -32602);
      assert.equal(past.error.data.field, "_meta.berth.lastEventId");
      grafana = back;
    });

    await t.test("4b. a message larger than the 8 KiB initial read buffer arrives whole", async () => {
      // berth starts each connection's read buffer at 8 KiB (READ_BUFFER_BYTES
      // in adapters/acp/src/transport/websocket.rs); a larger message, under
      // max_frame_bytes (8 MiB here), must still be read and answered.
      const big = await connect(TOKENS.grafana, "big-frame");
      const pad = "x".repeat(300_000);
      const list = await big.request("session/list", { _meta: { pad } });
      assert.ok(Array.isArray(list.sessions), `session/list answered: ${JSON.stringify(list).slice(0, 200)}`);
      assert.ok(list.sessions.length >= 1, "the session made above is listed");
      const again = await big.request("session/list", {});
      assert.deepEqual(again.sessions.map((s) => s.sessionId), list.sessions.map((s) => s.sessionId));
    });

    await t.test("5. /metrics is Prometheus text with berth's families", async () => {
      // A timer wake-up, for the lateness histogram.
      const timed = path.join(root, "work-timer");
      fs.mkdirSync(timed);
      const { sessionId: timer } = await alice.request("session/new", { cwd: timed, mcpServers: [] });
      await alice.request("session/suspend", {
        sessionId: timer,
        resumeWhen: { timeout: { durationMinutes: 0.001, onTimeout: "resume_with_input", input: "go" } },
      });
      await alice.notifications.waitFor(
        (n) => n.method === AGENT_EVENT && n.params.sessionId === timer && n.params.type === "resumed",
        10_000,
        "the 60 ms timer fires",
      );
      const scraped = await http(base, "/metrics", { token: TOKENS.grafana });
      assert.equal(scraped.status, 200);
      assert.match(scraped.headers.get("content-type"), /^text\/plain; version=0\.0\.4/);
      const families = new Map(parsePrometheusTextFormat(scraped.text).map((f) => [f.name, f]));
      const sessions = families.get("berth_sessions");
      assert.equal(sessions?.type, "GAUGE");
      const states = Object.fromEntries(sessions.metrics.map((m) => [m.labels.state, Number(m.value)]));
      assert.deepEqual(Object.keys(states).sort(), ["idle", "running", "suspended"]);
      assert.ok(states.idle >= 1, JSON.stringify(states));
      const controls = families.get("berth_controls_total");
      assert.equal(controls?.type, "COUNTER");
      const refused = controls.metrics.find(
        (m) => m.labels.method === "session/prompt" && m.labels.outcome === "rejected",
      );
      assert.ok(Number(refused?.value) >= 1, "the observer's refused prompt is counted");
      const suspends = controls.metrics.find(
        (m) => m.labels.method === "session/suspend" && m.labels.outcome === "accepted",
      );
      assert.ok(Number(suspends?.value) >= 1, "the accepted suspend is counted");
      // Label-free histogram: the parser keeps its count and buckets.
      const commits = families.get("berth_journal_commit_seconds");
      assert.equal(commits?.type, "HISTOGRAM");
      assert.ok(Number(commits.metrics[0].count) > 0, JSON.stringify(commits));
      assert.ok(Object.keys(commits.metrics[0].buckets).length > 5);
      // Labelled histograms: this parser folds label sets together, so their
      // per-label counts are read from the `_count` samples of the text.
      for (const [name, label] of [
        ["berth_turn_duration_seconds", 'terminal="completed"'],
        ["berth_wakeup_lateness_seconds", 'kind="timeout"'],
      ]) {
        assert.equal(families.get(name)?.type, "HISTOGRAM", name);
        const count = scraped.text.match(new RegExp(`^${name}_count\\{${label}\\} (\\d+)$`, "m"));
        assert.ok(Number(count?.[1]) >= 1, `${name}{${label}} has observations`);
      }
    });

    await t.test("6. POST /v1/events wakes a parked session; sessions are readable", async () => {
      const parked = prompt(alice, sessionId, "park for ci.passed");
      await alice.notifications.waitFor(
        (n) => n.method === AGENT_EVENT && n.params.sessionId === sessionId && n.params.type === "suspended",
        10_000,
        "the agent parks itself",
      );
      const observer = await http(base, "/v1/events", { token: TOKENS.grafana, method: "POST", body: { name: "ci.passed" } });
      assert.equal(observer.status, 403);
      assert.equal(observer.json.error.code, -32011);
      for (const [body, field] of [
        [{}, "name"],
        [{ name: "" }, "name"],
        [{ name: "ci.passed", extra: 1 }, "extra"],
        [[1], "body"],
      ]) {
        const bad = await http(base, "/v1/events", { token: TOKENS.alice, method: "POST", body });
        assert.equal(bad.status, 400, JSON.stringify(body));
        assert.equal(bad.json.error.code, -32602);
        assert.equal(bad.json.error.data.field, field);
      }
      const notJson = await http(base, "/v1/events", { token: TOKENS.alice, method: "POST", body: "{nope" });
      assert.equal(notJson.status, 400);
      assert.equal(notJson.json.error.code, -32700);
      // Nothing matched a refused or bad request: still parked.
      const view = await http(base, `/v1/sessions/${sessionId}`, { token: TOKENS.grafana });
      assert.equal(view.json.state, "suspended");
      assert.equal(view.json.suspension.initiator, "agent");
      assert.equal(view.json.createdBy, "alice");
      const emitted = await http(base, "/v1/events", {
        token: TOKENS.alice,
        method: "POST",
        body: { name: "ci.passed", data: { sha: "abc123" } },
      });
      assert.equal(emitted.status, 200, emitted.text);
      assert.deepEqual(emitted.json.woke, [{ sessionId, handle: view.json.suspension.handle, resumed: true }]);
      // The prompt answered when the turn parked; the resumed turn streams on.
      const answer = await within(parked, 10_000, "the parked prompt answers");
      assert.equal(answer._meta.berth.terminal.kind, "suspended");
      const resumed = await alice.notifications.waitFor(
        (n) => n.method === AGENT_EVENT && n.params.sessionId === sessionId && n.params.type === "resumed",
        10_000,
        "the session resumes",
      );
      assert.equal(resumed.params.event.cause, "external_event");
      await alice.notifications.waitFor(
        (n) =>
          n.method === AGENT_EVENT &&
          n.params.sessionId === sessionId &&
          n.params.type === "turn_ended" &&
          eventIdOf(n.params) > eventIdOf(resumed.params),
        10_000,
        "the resumed turn ends",
      );
      const text = alice
        .sessionEvents(sessionId)
        .filter((n) => eventIdOf(n.params) > eventIdOf(resumed.params))
        .filter((n) => n.params.update?.sessionUpdate === "agent_message_chunk")
        .map((n) => n.params.update.content.text)
        .join("");
      assert.match(text, /Event: .*abc123/, "the model read the payload");
      const list = await http(base, "/v1/sessions", { token: TOKENS.grafana });
      assert.equal(list.status, 200);
      const entry = list.json.sessions.find((s) => s.sessionId === sessionId);
      assert.equal(entry.state, "idle");
      assert.ok(entry.lastEventId >= alice.maxEventId(sessionId));
      assert.equal((await http(base, "/v1/sessions/sess_nope", { token: TOKENS.grafana })).json.error.code, -32004);
      const badQuery = await http(base, "/v1/sessions?cwd=relative", { token: TOKENS.grafana });
      assert.equal(badQuery.status, 400);
      assert.equal(badQuery.json.error.data.field, "cwd");
    });

    await t.test("7. an acknowledged event survives SIGKILL", async () => {
      const cwd2 = path.join(root, "work-kill");
      fs.mkdirSync(cwd2);
      const { sessionId: idle } = await alice.request("session/new", { cwd: cwd2, mcpServers: [] });
      const suspended = await alice.request("session/suspend", {
        sessionId: idle,
        reason: "wait for the deploy",
        resumeWhen: { onEvent: "deploy.done" },
      });
      const emitted = await http(base, "/v1/events", {
        token: TOKENS.alice,
        method: "POST",
        body: { name: "deploy.done", data: { version: "1.2.3" } },
      });
      assert.equal(emitted.status, 200, emitted.text);
      server.kill(); // at once, after the acknowledgment
      assert.equal((await server.exited).signal, "SIGKILL");
      for (const c of clients) await within(c.closed, 5_000, "a websocket sees the kill");
      server = startServer("http-restarted", dataDir);
      const base2 = await server.listening();
      const after = await WsClient.connect(base2, TOKENS.root);
      clients.push(after);
      await after.initialize("root");
      const loaded = await after.request("session/load", { sessionId: idle });
      const resumes = loaded._meta.berth.replayed.filter((r) => r.type === "resumed");
      assert.equal(resumes.length, 1, `resumed exactly once: ${JSON.stringify(loaded._meta.berth.replayed)}`);
      const resumed = after
        .sessionEvents(idle)
        .find((n) => n.method === AGENT_EVENT && n.params.type === "resumed");
      assert.equal(resumed.params.event.cause, "external_event");
      assert.equal(resumed.params.event.handle, suspended.handle);
      const next = await http(base2, "/v1/events", { token: TOKENS.root, method: "POST", body: { name: "after.restart" } });
      assert.equal(next.json.seq, emitted.json.seq + 1, "the acknowledged event's row survived");
    });
  } catch (error) {
    reportServer(t, server);
    throw error;
  } finally {
    for (const c of clients) c.ws.terminate();
    server.kill();
  }
});

// A second server, from a config file: TLS (a throwaway self-signed
// certificate made with the openssl CLI), an allowed browser origin, a
// 4 KiB frame bound, a 100 ms ping interval and a 2,500-byte outbound bound.
//
//  8. TLS: `wss://` with the certificate as CA carries ACP; `/healthz` over
//     https; the allowed Origin is upgraded.
//  9. liveness: a client whose library answers pings sees several pings and
//     stays usable; one that never answers (`autoPong: false`) is closed
//     with 1001.
// 10. a text message over `max_frame_bytes` closes the connection with 1009.
// 11. a client whose queued frames pass `max_outbound_bytes` (a replay of a
//     long session) is closed with 1008; a replay that fits (`lastEventId`
//     near the end) is served.
test("berth HTTP listener: TLS, liveness and bounds", { timeout: 60_000 }, async (t) => {
  assertBerthBin();
  const { execFileSync } = await import("node:child_process");
  const https = await import("node:https");
  const root = tempRoot("berth-https-e2e-");
  const cert = path.join(root, "cert.pem");
  const key = path.join(root, "key.pem");
  execFileSync("openssl", [
    "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
    "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
    "-addext", "subjectAltName=IP:127.0.0.1",
  ], { stdio: "ignore" });
  const ca = fs.readFileSync(cert);
  const config = path.join(root, "berth.toml");
  fs.writeFileSync(
    config,
    `[acp]
max_frame_bytes = 4096
[http]
listen = "127.0.0.1:0"
tls_cert = ${JSON.stringify(cert)}
tls_key = ${JSON.stringify(key)}
allowed_origins = ["https://console.example"]
[http.websocket]
ping_interval_ms = 100
max_outbound_bytes = 2500
[[http.tokens]]
actor = "ops"
role = "host_owner"
token_env = "E2E_OPS_TOKEN"
`,
  );
  const token = "ops-token-0123456789abcdef";
  const server = new BerthServer({
    label: "https",
    dataDir: path.join(root, "data"),
    script: SCRIPT,
    config,
    env: { E2E_OPS_TOKEN: token },
  });
  const open = [];
  const wss = (options = {}, headers = {}) =>
    new Promise((resolve, reject) => {
      const ws = new WebSocket(`${base.replace(/^https/, "wss")}/acp`, {
        ca,
        headers: { Authorization: `Bearer ${token}`, ...headers },
        ...options,
      });
      open.push(ws);
      ws.once("open", () => resolve(ws));
      ws.once("error", reject);
      ws.once("unexpected-response", (_q, res) => reject(new Error(`HTTP ${res.statusCode}`)));
    });
  const closed = (ws) => new Promise((resolve) => ws.once("close", (code, reason) => resolve({ code, reason: `${reason}` })));
  let base;
  try {
    base = await server.listening();
    assert.match(base, /^https:\/\/127\.0\.0\.1:\d+$/);

    await t.test("8. TLS carries ACP and the probes; an allowed origin is upgraded", async () => {
      const health = await new Promise((resolve, reject) =>
        https
          .get(`${base}/healthz`, { ca }, (res) => {
            let body = "";
            res.on("data", (d) => (body += d));
            res.on("end", () => resolve({ status: res.statusCode, body }));
          })
          .on("error", reject),
      );
      assert.equal(health.status, 200);
      assert.deepEqual(JSON.parse(health.body), { status: "ok" });
      const ws = await wss({}, { Origin: "https://console.example" });
      const client = new WsClient(ws);
      const init = await client.initialize("tls");
      assert.equal(init.protocolVersion, 1);
      const list = await client.request("session/list", {});
      assert.deepEqual(list.sessions, []);
      ws.close(1000);
    });

    await t.test("9. liveness: pings are answered by live clients; a silent one is closed", async () => {
      const alive = await wss();
      let pings = 0;
      const threePings = new Promise((resolve) =>
        alive.on("ping", () => {
          pings += 1;
          if (pings === 3) resolve();
        }),
      );
      const silent = await wss({ autoPong: false });
      const silentClosed = closed(silent);
      await within(threePings, 5_000, "three pings");
      const client = new WsClient(alive);
      await client.initialize("alive");
      assert.equal(alive.readyState, WebSocket.OPEN, "a client that answers pings stays");
      const { code } = await within(silentClosed, 5_000, "the silent client is closed");
      assert.equal(code, 1001);
      alive.close(1000);
    });

    await t.test("10. a message over max_frame_bytes closes with 1009", async () => {
      const ws = await wss();
      const done = closed(ws);
      ws.send(JSON.stringify({ jsonrpc: "2.0", id: 1, method: "session/list", params: { pad: "x".repeat(5000) } }));
      const { code } = await within(done, 5_000, "closed for the big message");
      assert.equal(code, 1009);
    });

    await t.test("11. a replay larger than max_outbound_bytes is streamed under the bound to a reading client", async () => {
      const writer = new WsClient(await wss());
      await writer.initialize("writer");
      const cwd = path.join(root, "work");
      fs.mkdirSync(cwd);
      const { sessionId } = await writer.request("session/new", { cwd, mcpServers: [] });
      await prompt(writer, sessionId, "stream one");
      await prompt(writer, sessionId, "stream two");
      await prompt(writer, sessionId, "stream three");
      const last = writer.maxEventId(sessionId);
      // The whole replay (three turns, ~8 KB) is more than the bound, so it is
      // sent as the client reads: every event, then the answer.
      const reader = new WsClient(await wss());
      await reader.initialize("reader");
      const loaded = await reader.request("session/load", { sessionId });
      const ids = loaded._meta.berth.replayed.map((r) => r.eventId);
      assert.deepEqual(ids, Array.from({ length: last }, (_, i) => i + 1), "every event replayed");
      // A replay that fits is served too: the last two events.
      const again = new WsClient(await wss());
      await again.initialize("again");
      const tail = await again.request("session/load", { sessionId, _meta: { berth: { lastEventId: last - 2 } } });
      assert.deepEqual(
        tail._meta.berth.replayed.map((r) => r.eventId),
        [last - 1, last],
      );
      writer.ws.close(1000);
    });
  } catch (error) {
    reportServer(t, server);
    throw error;
  } finally {
    for (const ws of open) ws.terminate();
    server.kill();
  }
});
