// End-to-end test of berth's DURABLE SUSPENSION over the wire
// (`seeds/acp-session-suspend-rfc.md`: `session/suspend`, the enriched
// `session/resume`, agent→client `session/await_resumption`, the `suspended` /
// `resumed` lifecycle facts), against a real `berth serve` process.
//
// How to run (Linux; Node >= 20):
//
//     cd <repo> && cargo build --bin berth
//     cd conformance/e2e && npm ci && node --test
//
// The berth binary is `$BERTH_BIN` (default `<repo>/target/debug/berth`); each
// server is `berth serve --data-dir <temp dir> --model scripted:<this
// dir>/suspension-script.toml --max-in-flight 256`. BERTH_E2E_KEEP=1 keeps the
// temp dirs and BERTH_E2E_DUMP=<dir> writes every frame (both directions) and
// each server's stderr there. Takes ~5 s.
//
// The SDK has no `session/suspend` and no resume `input`, so most scenarios talk
// raw JSON-RPC through harness.mjs's `RawClient` (one JSON line per message on
// the server's stdin/stdout, answers matched by id). Scenario 1 runs on the
// OFFICIAL SDK client (`@agentclientprotocol/sdk`, its generic
// `agent.request` for the extension methods) to show that a stock client
// survives a suspension: every notification passes its zod validation (the
// suspension facts reach it as `_berth/agentEvent`, which it ignores), and the
// suspended prompt answers a plain `end_turn`.
//
// Every scenario is its own `test(...)` with its own server, data dir and
// session directories. Tool effects are lines the scripted shell calls append
// to `log` in the session directory, so the test counts how often each call
// really ran. A call that must be "running" while the test acts waits for a
// `release-a` file the test creates: every wait is a wait for a wire fact (a
// frame, an answer, a session view) or that file's effect, never a timer.
//
//  1. (SDK) caller suspend, mode finish_step, during step A of a two-response
//     turn: `suspend_requested`, view `requested`; A completes, the turn parks
//     before the model's next call (B never announced, log = A); the suspend
//     answers the handle, the prompt `end_turn` / terminal kind `suspended` /
//     owner `user` / the handle; resume → same turn, B runs once; log = A, B.
//  2. interrupt_immediate during call A of the batch [A, B]: A settles, B stays
//     unstarted (no `in_progress` before resume, summary says 1 unstarted);
//     resume → B runs; A and B once each.
//  3. wait_for_completion: the turn completes (kind `completed`), and only then
//     is the session suspended (`suspended` after `turn_ended` on the wire,
//     the suspend answer after both; view `suspended`, no parked turn). The
//     order of the prompt answer and the suspend answer is not defined.
//  4. idle suspend answers at once; again → same handle, `alreadySuspended`;
//     prompt → -32010; wrong handle → -32009 handle_mismatch; resume; resume
//     again → -32009 already_resumed; resume with input while idle → -32009.
//  5. agent self-park (`await_resumption` tool): a client declaring
//     `awaitResumption` gets a `session/await_resumption` request naming the
//     handle; the prompt answers kind `suspended` / owner `agent`; resume with
//     input "the build passed" → the model reads it (agent_message_chunk).
//  6. self-park with no conditions stays suspended (views before and after an
//     unrelated turn) until an explicit resume; a `suspendUpdates` client gets
//     `session/update` `suspended` (initiator agent) and `resumed` (cause
//     explicit_resume) and no `_berth/agentEvent` for them.
//  7. continueTranscript: false → the parked turn is sealed and a fresh turn
//     starts from a digest ("[resumed with a fresh transcript]", with the
//     input) and no earlier tool result in the model's context.
//  8. double-resume race: 100 concurrent `session/resume` of one handle on one
//     connection → exactly one success (its input is what the model read),
//     99 × -32009 already_resumed; three rounds; no event delivered twice.
//  9. close while suspended (a parked batch): close ok, the unstarted call
//     never runs, the turn ends `session_closed`; resume → -32009 (claim kind
//     cancelled) or -32005; prompt → -32005; second close ok.
// 10. SIGKILL while suspended: after a restart on the same data dir the view
//     shows the same handle; resume → the turn completes, nothing re-runs.
// 11. SIGKILL while quiescing (a `sleep 5` call running): after a restart the
//     suspension is completed from the last checkpoint (the interrupted
//     call's outcome unknown, never re-run); resume → the turn completes.
// 12. nested sessions (`_meta.berth.parentSessionId`): parent and child are
//     suspended and resumed independently.
// 13. validation: `resumeWhen` errors name the field; `durationMinutes: 0.001`
//     is accepted; a bad `mode` → -32602 field `mode`; nothing is suspended
//     by a refused request.
// 14. a restart with another model configuration: resuming the parked turn
//     → -32012 `configuration_changed` (nothing claimed); a resume with
//     `continueTranscript: false` still works (fresh digest turn).

import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";

import {
  AGENT_EVENT,
  BerthServer,
  E2E_DIR,
  RawClient,
  RpcError,
  Recorder,
  SESSION_UPDATE,
  assertSdkDeliveredAll,
  clientApp,
  eventIdOf,
  initialize,
  sdkErrors,
  stepper,
  tempRoot,
  within,
  scenarioRunner,
  logLines,
  result,
  rpcError,
} from "./harness.mjs";

const SCRIPT = path.join(E2E_DIR, "suspension-script.toml");
const RELEASE = "release-a";
const FRESH = "[resumed with a fresh transcript]";

// ---------------------------------------------------------------- connections

/**
 * One client connection to one server, raw or SDK, behind one interface:
 * `call` resolves `{result}` / `{error}`, `notes` records every notification.
 */
class Conn {
  constructor(ctx, server, { call, notes, raw }) {
    this.ctx = ctx;
    this.server = server;
    this.call = call;
    this.notes = notes;
    this.raw = raw;
  }

  async request(method, params, ms = 10_000, label = method) {
    const answer = await within(this.call(method, params), ms, label);
    if (answer.error) throw new RpcError(answer.error, label);
    return answer.result;
  }

  async newSession(label, meta) {
    const cwd = path.join(this.ctx.root, `work-${label}`);
    fs.mkdirSync(cwd);
    const created = await this.request("session/new", { cwd, mcpServers: [], ...(meta ? { _meta: meta } : {}) });
    return { sessionId: created.sessionId, cwd, created };
  }

  /** A prompt in flight: resolves `{result}` / `{error}`. */
  prompt(sessionId, text) {
    return this.call("session/prompt", { sessionId, prompt: [{ type: "text", text }] });
  }

  view(sessionId) {
    return this.request("berth.session_view.query", { sessionId }, 5_000, `view of ${sessionId}`);
  }

  /** The live notifications of `sessionId` (not replayed), as `{kind, eventId, update, params, index}`. */
  events(sessionId, { replayed = false } = {}) {
    return this.notes.items
      .map((n, index) => ({ n, index }))
      .filter(({ n }) => n.params?.sessionId === sessionId && (n.params._meta?.berth?.replayed === true) === replayed)
      .map(({ n, index }) => ({
        kind: n.method === AGENT_EVENT ? `agent:${n.params.type}` : n.params.update.sessionUpdate,
        eventId: eventIdOf(n.params),
        update: n.params.update,
        params: n.params,
        index,
      }));
  }

  waitNote(pred, label, ms = 10_000) {
    return this.notes.waitFor((n) => pred(n), ms, label);
  }

  waitUpdate(sessionId, pred, label, ms) {
    return this.waitNote(
      (n) => n.method === SESSION_UPDATE && n.params.sessionId === sessionId && pred(n.params.update),
      label,
      ms,
    );
  }

  waitAgentEvent(sessionId, type, pred = () => true, label = type, ms) {
    return this.waitNote(
      (n) => n.method === AGENT_EVENT && n.params.sessionId === sessionId && n.params.type === type && pred(n.params.event),
      label,
      ms,
    );
  }

  /** Waits for the `tool_call` whose command contains `part`, then its `in_progress`; returns its id. */
  async runningCall(sessionId, part, label) {
    const call = await this.waitUpdate(
      sessionId,
      (u) => u.sessionUpdate === "tool_call" && u.rawInput?.command?.includes(part),
      `${label}: tool_call`,
    );
    const id = call.params.update.toolCallId;
    await this.waitUpdate(
      sessionId,
      (u) => u.sessionUpdate === "tool_call_update" && u.toolCallId === id && u.status === "in_progress",
      `${label}: in_progress`,
    );
    return id;
  }

  /** Ids of the `tool_call`s whose command contains `part`. */
  callIds(sessionId, part) {
    return this.events(sessionId)
      .filter((e) => e.kind === "tool_call" && e.update.rawInput?.command?.includes(part))
      .map((e) => e.update.toolCallId);
  }

  /** Statuses of `toolCallId`'s updates, in order (only events after `afterIndex` in `notes`). */
  statuses(sessionId, toolCallId, afterIndex = -1) {
    return this.events(sessionId)
      .filter((e) => e.index > afterIndex && e.kind === "tool_call_update" && e.update.toolCallId === toolCallId)
      .map((e) => e.update.status);
  }

  turnEnded(sessionId, turnId, label = `turn_ended ${turnId}`) {
    return this.waitAgentEvent(sessionId, "turn_ended", (e) => e.turn_id === turnId, label).then((n) => n.params);
  }

  /** The agent's text in `sessionId` after notification index `afterIndex`. */
  text(sessionId, afterIndex = -1) {
    return this.events(sessionId)
      .filter((e) => e.index > afterIndex && e.kind === "agent_message_chunk")
      .map((e) => e.update.content.text)
      .join("");
  }

  /** Every live eventId of `sessionId` was delivered exactly once. */
  assertNoDuplicates(sessionId, label) {
    const ids = this.events(sessionId).map((e) => e.eventId);
    assert.equal(new Set(ids).size, ids.length, `${label}: an event of ${sessionId} was delivered twice: ${ids}`);
  }
}

/** Per-test state: a temp root, the servers started (killed at the end), a step logger. */
class Ctx {
  servers = [];
  constructor(t, name) {
    this.t = t;
    this.root = tempRoot(`berth-e2e-susp-${name}-`);
    this.dataDir = path.join(this.root, "data");
    this.step = stepper(t);
  }

  server(label) {
    const server = new BerthServer({
      label,
      dataDir: this.dataDir,
      script: SCRIPT,
      args: ["--max-in-flight", "256"],
      dumpPrefix: "suspension-",
    });
    this.servers.push(server);
    return server;
  }

  /** A server and a raw client, initialized with the given extensions. */
  async raw(label, extensions = {}, setup = () => {}) {
    const server = this.server(label);
    const client = new RawClient(server, { name: `berth-e2e-suspension-${label}` });
    setup(client);
    const init = await client.initialize(extensions);
    assert.equal(init.agentCapabilities?._meta?.berth?.supportsSuspend, true, JSON.stringify(init));
    assert.equal(init.agentCapabilities?._meta?.berth?.supportsAwaitResumption, true);
    return new Conn(this, server, { call: (m, p) => client.call(m, p), notes: client.notifications, raw: client });
  }

  /** A server and the official SDK client app (zod-validated `session/update`s). */
  async sdk(label) {
    const server = this.server(label);
    const seen = new Recorder();
    const connection = clientApp(seen, `berth-e2e-suspension-${label}`).connect(server.stream);
    const agent = connection.agent;
    await initialize(agent, `berth-e2e-suspension-${label}`);
    const call = (method, params) =>
      agent.request(method, params).then(
        (result) => ({ result }),
        (e) => ({ error: { code: e.code, message: e.message, data: e.data } }),
      );
    const conn = new Conn(this, server, { call, notes: seen });
    conn.seen = seen;
    conn.connection = connection;
    return conn;
  }
}

const scenario = scenarioRunner(Ctx, { stderrChars: 2_000 });

// ---------------------------------------------------------------- helpers

const release = (cwd) => fs.writeFileSync(path.join(cwd, RELEASE), "");

/** A suspended prompt's answer: `end_turn`, terminal kind `suspended`, `owner`, and the handle. */
function assertSuspendedAnswer(answer, owner, label) {
  const r = result(answer, label);
  assert.equal(r.stopReason, "end_turn", `${label}: ${JSON.stringify(r)}`);
  const berth = r._meta?.berth;
  assert.equal(berth?.terminal?.kind, "suspended", `${label}: ${JSON.stringify(r)}`);
  assert.equal(berth.terminal.owner, owner, `${label}: ${JSON.stringify(r)}`);
  assert.match(berth.handle, /^susp_/, label);
  assert.equal(typeof berth.turnId, "string", label);
  return berth;
}

/** A suspend answer (RFC `SessionSuspendResponse` + `_meta.berth`). */
function assertSuspendAnswer(answer, { initiator = "client", already = false, reason } = {}, label) {
  const r = result(answer, label);
  assert.match(r.handle, /^susp_/, `${label}: ${JSON.stringify(r)}`);
  assert.ok(!Number.isNaN(Date.parse(r.suspendedAt)), `${label}: suspendedAt ${r.suspendedAt}`);
  assert.equal(typeof r.summary, "string", label);
  assert.equal(r._meta?.berth?.initiator, initiator, `${label}: ${JSON.stringify(r)}`);
  assert.equal(r._meta.berth.alreadySuspended, already, `${label}: ${JSON.stringify(r)}`);
  if (reason !== undefined) assert.equal(r.reason, reason, label);
  return r;
}

/** `_meta.berth.resumed` of a resume answer. */
function resumedOf(answer, label) {
  const r = result(answer, label);
  const resumed = r._meta?.berth?.resumed;
  assert.ok(resumed, `${label}: no _meta.berth.resumed in ${JSON.stringify(r)}`);
  assert.equal(resumed.cause, "explicit_resume", label);
  assert.ok(!Number.isNaN(Date.parse(resumed.resumedAt)), label);
  return resumed;
}

async function assertStatus(conn, sessionId, status, label) {
  const view = await conn.view(sessionId);
  assert.equal(view.run.status, status, `${label}: ${JSON.stringify(view.run)}`);
  return view;
}

/**
 * Durable before answered: on the wire, the `suspended` event of `handle`
 * precedes the suspend answer and the parked prompt's answer (`turnId`).
 */
function assertAnsweredAfterSuspended(conn, handle, turnId, label) {
  const wire = conn.server.wire.items;
  const at = (pred) => wire.findIndex(pred);
  const suspendedAt = at((m) => m.method === AGENT_EVENT && m.params.type === "suspended" && m.params.event.handle === handle);
  const answerAt = at((m) => !("method" in m) && m.result?.handle === handle);
  const promptAt = at((m) => !("method" in m) && m.result?._meta?.berth?.turnId === turnId);
  assert.ok(suspendedAt >= 0, `${label}: the suspended event is on the wire`);
  assert.ok(answerAt > suspendedAt, `${label}: suspend answer (${answerAt}) after the suspended event (${suspendedAt})`);
  assert.ok(promptAt > suspendedAt, `${label}: prompt answer (${promptAt}) after the suspended event (${suspendedAt})`);
}

/** Suspends `sessionId` while its gated call runs: waits for `suspend_requested` and the `requested` view (the step in flight has not settled yet). */
async function suspendWhileRunning(conn, sessionId, mode, reason, label) {
  const suspending = conn.call("session/suspend", { sessionId, mode, reason });
  const requested = await conn.waitAgentEvent(sessionId, "suspend_requested", () => true, `${label}: suspend_requested`);
  const ev = requested.params.event;
  assert.equal(ev.mode, mode, label);
  assert.equal(ev.initiator, "client", label);
  assert.equal(ev.state, "requested", label);
  assert.match(ev.handle, /^susp_/, label);
  // The view is answered by the session actor after it handled the suspend,
  // so the turn has been told by now.
  const view = await assertStatus(conn, sessionId, "requested", label);
  assert.equal(view.run.suspension?.handle, ev.handle, label);
  assert.equal(view.run.suspension?.mode, mode, label);
  return { suspending, handle: ev.handle };
}

// ---------------------------------------------------------------- scenarios

scenario("1. caller suspend (finish_step) mid-turn, stock SDK client, resume runs the next step", async (ctx) => {
  const conn = await ctx.sdk("finish-step");
  const { sessionId, cwd } = await conn.newSession("finish-step");
  const pending = conn.prompt(sessionId, "two steps");
  const a = await conn.runningCall(sessionId, "echo A", "A");
  const { suspending, handle } = await suspendWhileRunning(conn, sessionId, "finish_step", "review step A", "finish_step");
  assert.deepEqual(logLines(cwd), [], "A is still waiting for its release");
  release(cwd);

  const suspended = assertSuspendAnswer(await within(suspending, 10_000, "suspend answer"), { reason: "review step A" }, "suspend");
  assert.equal(suspended.handle, handle, "the suspend answers the handle of its request");
  const parked = assertSuspendedAnswer(await within(pending, 10_000, "prompt answer"), "user", "prompt");
  assert.equal(parked.handle, handle);
  assertAnsweredAfterSuspended(conn, handle, parked.turnId, "finish_step");
  assert.deepEqual(conn.statuses(sessionId, a), ["in_progress", "completed"], "A settled before the park");
  assert.deepEqual(logLines(cwd), ["A"], "A ran, B did not");
  assert.deepEqual(conn.callIds(sessionId, "echo B"), [], "B was never even announced");
  const view = await assertStatus(conn, sessionId, "suspended", "after the park");
  assert.equal(view.run.suspension.handle, handle);
  assert.equal(view.run.turnId, parked.turnId, "the view names the parked turn");
  assert.ok(
    conn.events(sessionId).some((e) => e.kind === "agent:suspended" && e.params.event.handle === handle),
    "the stock client gets `suspended` as a _berth/agentEvent",
  );

  const mark = conn.notes.items.length - 1;
  const resumed = resumedOf(
    await within(conn.call("session/resume", { sessionId, cwd, mcpServers: [], handle }), 10_000, "resume"),
    "resume",
  );
  assert.deepEqual(
    { handle: resumed.handle, hadResumeInput: resumed.hadResumeInput, continueTranscript: resumed.continueTranscript, turnId: resumed.turnId },
    { handle, hadResumeInput: false, continueTranscript: true, turnId: parked.turnId },
  );
  const ended = await conn.turnEnded(sessionId, parked.turnId);
  assert.equal(ended.event.terminal.kind, "completed", JSON.stringify(ended.event));
  const b = conn.callIds(sessionId, "echo B");
  assert.equal(b.length, 1, "B announced once");
  assert.deepEqual(conn.statuses(sessionId, b[0]), ["in_progress", "completed"]);
  assert.deepEqual(conn.statuses(sessionId, a, mark), [], "A did not run again");
  assert.equal(conn.text(sessionId, mark), "Both steps done.");
  assert.deepEqual(logLines(cwd), ["A", "B"]);
  await assertStatus(conn, sessionId, "idle", "after the resumed turn");

  // The stock client: no zod rejection, nothing dropped, no RFC session/update variants.
  assert.ok(!conn.events(sessionId).some((e) => e.kind === "suspended" || e.kind === "resumed"));
  assertSdkDeliveredAll(conn.server, conn.seen);
  assert.deepEqual(sdkErrors, []);
  ctx.step("finish_step: A once, parked, B once after resume (SDK client)");
});

scenario("2. interrupt_immediate mid-batch: A settles, B stays unstarted until resume", async (ctx) => {
  const conn = await ctx.raw("interrupt");
  const { sessionId, cwd } = await conn.newSession("interrupt");
  const pending = conn.prompt(sessionId, "one batch");
  const a = await conn.runningCall(sessionId, "echo A", "A");
  const { suspending, handle } = await suspendWhileRunning(conn, sessionId, "interrupt_immediate", "stop after A", "interrupt");
  release(cwd);
  const suspended = assertSuspendAnswer(await within(suspending, 10_000, "suspend answer"), {}, "suspend");
  assert.equal(suspended.handle, handle);
  assert.match(suspended.summary, /\b1 unstarted tool call/, `summary: ${suspended.summary}`);
  const parked = assertSuspendedAnswer(await within(pending, 10_000, "prompt answer"), "user", "prompt");
  assert.equal(parked.handle, handle);
  assertAnsweredAfterSuspended(conn, handle, parked.turnId, "interrupt_immediate");

  assert.deepEqual(logLines(cwd), ["A"], "A ran, B did not");
  assert.deepEqual(conn.statuses(sessionId, a), ["in_progress", "completed"]);
  // The batch was announced whole (tool_call, status pending); B got no update.
  const bBefore = conn.callIds(sessionId, "echo B");
  assert.equal(bBefore.length, 1, `B announced once: ${bBefore}`);
  assert.deepEqual(conn.statuses(sessionId, bBefore[0]), [], "B never went in_progress before the resume");

  const mark = conn.notes.items.length - 1;
  const resumed = resumedOf(await within(conn.call("session/resume", { sessionId, handle }), 10_000, "resume"), "resume");
  assert.equal(resumed.turnId, parked.turnId);
  const ended = await conn.turnEnded(sessionId, parked.turnId);
  assert.equal(ended.event.terminal.kind, "completed");
  const b = conn.callIds(sessionId, "echo B");
  assert.equal(b.length, 1, `B announced once: ${b}`);
  assert.equal(b[0], bBefore[0], "the same call");
  assert.deepEqual(conn.statuses(sessionId, b[0]), ["in_progress", "completed"]);
  assert.deepEqual(conn.statuses(sessionId, a, mark), [], "A did not run again");
  assert.equal(conn.text(sessionId, mark), "Batch done.");
  assert.deepEqual(logLines(cwd), ["A", "B"], "A and B exactly once each");
  conn.assertNoDuplicates(sessionId, "interrupt");
  ctx.step("interrupt_immediate: B announced but unstarted until resume");
});

scenario("3. wait_for_completion: the turn completes, then the session is suspended", async (ctx) => {
  const conn = await ctx.raw("wait");
  const { sessionId, cwd } = await conn.newSession("wait");
  const pending = conn.prompt(sessionId, "hold until released");
  await conn.runningCall(sessionId, "echo held", "held");
  const { suspending, handle } = await suspendWhileRunning(conn, sessionId, "wait_for_completion", "after this turn", "wait");
  release(cwd);
  const answer = result(await within(pending, 10_000, "prompt answer"), "prompt");
  assert.equal(answer.stopReason, "end_turn");
  assert.equal(answer._meta.berth.terminal.kind, "completed", "the turn ran to completion");
  assert.equal(answer._meta.berth.handle, undefined, "a completed turn names no handle");
  const suspended = assertSuspendAnswer(await within(suspending, 10_000, "suspend answer"), {}, "suspend");
  assert.equal(suspended.handle, handle);

  // Wire order: turn_ended, then `suspended` (one durable batch), then the
  // suspend answer. The prompt answer and the suspend answer are sent by two
  // request tasks once that batch is durable; berth defines no order between
  // them (under load the suspend answer sometimes comes first), so only the
  // order against the journaled facts is asserted.
  const ended = await conn.turnEnded(sessionId, answer._meta.berth.turnId);
  const wire = conn.server.wire.items;
  const at = (pred) => wire.findIndex(pred);
  const endedAt = at((m) => m.method === AGENT_EVENT && m.params.type === "turn_ended" && m.params.eventId === ended.eventId);
  const suspendedAt = at((m) => m.method === AGENT_EVENT && m.params.type === "suspended" && m.params.event.handle === handle);
  const promptAt = at((m) => !("method" in m) && m.result?._meta?.berth?.turnId === answer._meta.berth.turnId);
  const suspendAnswerAt = at((m) => !("method" in m) && m.result?.handle === handle);
  assert.ok(endedAt >= 0 && suspendedAt > endedAt, `suspended (${suspendedAt}) after turn_ended (${endedAt})`);
  assert.ok(suspendAnswerAt > suspendedAt, `suspend answer (${suspendAnswerAt}) after the suspended event (${suspendedAt})`);
  assert.ok(promptAt > endedAt, `prompt answer (${promptAt}) after turn_ended (${endedAt})`);
  assert.deepEqual(logLines(cwd), ["held"]);

  const view = await assertStatus(conn, sessionId, "suspended", "after the turn");
  assert.equal(view.run.suspension.handle, handle);
  assert.equal(view.run.turnId, undefined, "no turn is parked");
  const resumed = resumedOf(await within(conn.call("session/resume", { sessionId, handle }), 10_000, "resume"), "resume");
  assert.ok(!("turnId" in resumed), "waking an idle suspension starts no turn (and an absent turnId is omitted, not null)");
  await assertStatus(conn, sessionId, "idle", "after the resume");
  ctx.step(`wait_for_completion: completed, then suspended (answers on the wire: ${promptAt < suspendAnswerAt ? "prompt, suspend" : "suspend, prompt"})`);
});

scenario("4. idle suspend answers at once; again is idempotent; prompt on a suspended session is -32010", async (ctx) => {
  const conn = await ctx.raw("idle");
  const { sessionId } = await conn.newSession("idle");
  const first = assertSuspendAnswer(
    await within(conn.call("session/suspend", { sessionId, reason: "nightly pause" }), 5_000, "idle suspend"),
    { reason: "nightly pause" },
    "idle suspend",
  );
  const view = await assertStatus(conn, sessionId, "suspended", "after the idle suspend");
  assert.equal(view.run.suspension.handle, first.handle);
  assert.equal(view.run.suspension.initiator, "client");
  assert.equal(view.run.turnId, undefined);
  assert.ok(!conn.events(sessionId).some((e) => e.kind === "agent:suspend_requested"), "no quiescing for an idle session");

  const again = assertSuspendAnswer(
    await within(conn.call("session/suspend", { sessionId, mode: "interrupt_immediate", reason: "other" }), 5_000, "again"),
    { already: true },
    "suspend again",
  );
  assert.equal(again.handle, first.handle, "the same handle");
  assert.equal(again.suspendedAt, first.suspendedAt);

  const refused = rpcError(await conn.prompt(sessionId, "hello"), { code: -32010, reason: "session_suspended" }, "prompt");
  assert.equal(refused.data.handle, first.handle);
  assert.equal(refused.data.sessionId, sessionId);
  rpcError(
    await conn.call("session/resume", { sessionId, handle: "susp_not_this_one" }),
    { code: -32009, reason: "handle_mismatch" },
    "resume with a wrong handle",
  );
  await assertStatus(conn, sessionId, "suspended", "a wrong handle claimed nothing");

  const resumed = resumedOf(await conn.call("session/resume", { sessionId, handle: first.handle }), "resume");
  assert.equal(resumed.handle, first.handle);
  assert.ok(!("turnId" in resumed), "no turn: turnId is omitted");
  const used = rpcError(
    await conn.call("session/resume", { sessionId, handle: first.handle }),
    { code: -32009, reason: "already_resumed" },
    "resume again",
  );
  assert.equal(used.data.claim?.kind, "resumed", JSON.stringify(used.data));
  rpcError(
    await conn.call("session/resume", { sessionId, input: "wake up" }),
    { code: -32009, reason: "not_suspended" },
    "resume with input while idle",
  );
  const hello = result(await within(conn.prompt(sessionId, "hello"), 10_000, "hello"), "hello");
  assert.equal(hello._meta.berth.terminal.kind, "completed");
  ctx.step("idle suspend / idempotent / -32010 / -32009");
});

scenario("5. agent self-park, session/await_resumption to the client, resume with input reaches the model", async (ctx) => {
  const conn = await ctx.raw("self-park", { awaitResumption: true }, (client) =>
    client.onRequest("session/await_resumption", (params) => ({
      handle: params._meta.berth.handle,
      suspendedAt: params._meta.berth.suspendedAt,
    })),
  );
  const { sessionId } = await conn.newSession("self-park");
  const parked = assertSuspendedAnswer(await within(conn.prompt(sessionId, "park until resumed"), 10_000, "prompt"), "agent", "prompt");
  const ask = await conn.raw.requests.waitFor((r) => r.method === "session/await_resumption", 5_000, "session/await_resumption");
  assert.equal(ask.params.sessionId, sessionId);
  assert.equal(ask.params._meta?.berth?.handle, parked.handle, JSON.stringify(ask.params));
  assert.equal(ask.params.reason, "waiting for the operator");
  assert.equal(ask.params.summary, "parked by the suspension script");
  assert.equal(conn.raw.requests.items.length, 1, "one request per park");
  const view = await assertStatus(conn, sessionId, "suspended", "parked");
  assert.equal(view.run.suspension.initiator, "agent");
  assert.equal(view.run.suspension.handle, parked.handle);
  const ev = conn.events(sessionId).find((e) => e.kind === "agent:suspended");
  assert.equal(ev?.params.event.initiator, "agent");

  const mark = conn.notes.items.length - 1;
  const resumed = resumedOf(
    await within(conn.call("session/resume", { sessionId, handle: parked.handle, input: "the build passed" }), 10_000, "resume"),
    "resume",
  );
  assert.equal(resumed.hadResumeInput, true);
  assert.equal(resumed.turnId, parked.turnId);
  const ended = await conn.turnEnded(sessionId, parked.turnId);
  assert.equal(ended.event.terminal.kind, "completed");
  const chunk = conn.events(sessionId).find(
    (e) => e.index > mark && e.kind === "agent_message_chunk" && e.update.content.text.includes("the build passed"),
  );
  assert.ok(chunk, `an agent_message_chunk quotes the input: ${conn.text(sessionId, mark)}`);
  assert.equal(conn.text(sessionId, mark), "I was woken: resumed (a client resumed the session) with input: the build passed");
  ctx.step("self-park: await_resumption request, input reached the model");
});

scenario("6. self-park without conditions stays suspended until an explicit resume (suspendUpdates client)", async (ctx) => {
  const conn = await ctx.raw("no-conditions", { suspendUpdates: true });
  const { sessionId } = await conn.newSession("no-conditions");
  const parked = assertSuspendedAnswer(await within(conn.prompt(sessionId, "park until resumed"), 10_000, "prompt"), "agent", "prompt");
  const update = (await conn.waitUpdate(sessionId, (u) => u.sessionUpdate === "suspended", "suspended update")).params.update;
  assert.equal(update.handle, parked.handle);
  assert.equal(update.initiator, "agent");
  assert.equal(update.reason, "waiting for the operator");
  assert.equal(update.resumeWhen ?? null, null, "no conditions");
  assert.ok(!Number.isNaN(Date.parse(update.suspendedAt)));
  const v1 = await assertStatus(conn, sessionId, "suspended", "parked");
  assert.equal(v1.run.suspension.resumeWhen ?? null, null);

  // Time passes (a whole turn in another session) and nothing wakes it.
  const other = await conn.newSession("bystander");
  result(await within(conn.prompt(other.sessionId, "hello"), 10_000, "bystander turn"), "bystander");
  const v2 = await assertStatus(conn, sessionId, "suspended", "still parked");
  assert.equal(v2.run.suspension.handle, parked.handle);
  assert.equal(v2.lastEventId, v1.lastEventId, "nothing happened meanwhile");
  assert.ok(!conn.events(sessionId).some((e) => e.kind === "resumed"));

  const mark = conn.notes.items.length - 1;
  resumedOf(await within(conn.call("session/resume", { sessionId, handle: parked.handle }), 10_000, "resume"), "resume");
  const r = (await conn.waitUpdate(sessionId, (u) => u.sessionUpdate === "resumed", "resumed update")).params.update;
  assert.deepEqual(
    { handle: r.handle, cause: r.cause, hadResumeInput: r.hadResumeInput, continueTranscript: r.continueTranscript },
    { handle: parked.handle, cause: "explicit_resume", hadResumeInput: false, continueTranscript: true },
  );
  await conn.turnEnded(sessionId, parked.turnId);
  assert.equal(conn.text(sessionId, mark), "I was woken: resumed (a client resumed the session) without input");
  assert.ok(
    !conn.events(sessionId).some((e) => e.kind === "agent:suspended" || e.kind === "agent:resumed"),
    "a suspendUpdates client gets session/update variants instead of _berth/agentEvent",
  );
  assert.deepEqual(conn.raw.requests.items, [], "no session/await_resumption without awaitResumption");
  ctx.step("no conditions: parked across a bystander turn, woken only by resume");
});

scenario("7. continueTranscript: false starts a fresh turn from a digest", async (ctx) => {
  const conn = await ctx.raw("fresh");
  const { sessionId } = await conn.newSession("fresh");
  const parked = assertSuspendedAnswer(await within(conn.prompt(sessionId, "park until resumed"), 10_000, "prompt"), "agent", "prompt");
  const parkCall = conn.events(sessionId).find((e) => e.kind === "tool_call" && e.update.title?.startsWith("await resumption"));
  assert.ok(parkCall, "the await_resumption call");

  const mark = conn.notes.items.length - 1;
  const resumed = resumedOf(
    await within(
      conn.call("session/resume", { sessionId, handle: parked.handle, continueTranscript: false, input: "start over please" }),
      10_000,
      "resume",
    ),
    "resume",
  );
  assert.equal(resumed.continueTranscript, false);
  assert.equal(resumed.hadResumeInput, true);
  assert.notEqual(resumed.turnId, parked.turnId, "a fresh turn");
  const old = await conn.turnEnded(sessionId, parked.turnId, "the parked turn is sealed");
  assert.equal(old.event.terminal.kind, "suspended", JSON.stringify(old.event));
  assert.match(old.event.terminal.reason, /continueTranscript: false/);
  assert.deepEqual(conn.statuses(sessionId, parkCall.update.toolCallId, mark), ["failed"], "the park call is settled, never continued");
  const fresh = await conn.turnEnded(sessionId, resumed.turnId);
  assert.equal(fresh.event.terminal.kind, "completed");
  const prompt = conn.events(sessionId).find((e) => e.index > mark && e.kind === "user_message_chunk");
  assert.ok(prompt?.update.content.text.startsWith(FRESH), `the fresh turn's prompt is the digest: ${JSON.stringify(prompt)}`);
  const text = conn.text(sessionId, mark);
  assert.ok(text.startsWith("Fresh start; last tool result: <>; I read: " + FRESH), text);
  assert.match(text, /Resume input: start over please/);
  assert.match(text, /user asked: park until resumed/);
  assert.match(text, /suspended because: waiting for the operator/);
  await assertStatus(conn, sessionId, "idle", "after the fresh turn");

  // An idle suspension resumed with continueTranscript: false and no input
  // also restarts the context at a digest (a fresh turn), not just wakes.
  const idle = await conn.newSession("fresh-idle");
  release(idle.cwd);
  result(await within(conn.prompt(idle.sessionId, "two steps"), 10_000, "a turn with tool results"), "two steps");
  result(await within(conn.prompt(idle.sessionId, "what was the last tool result"), 10_000, "probe"), "probe");
  assert.match(conn.events(idle.sessionId).at(-2)?.update?.content?.text ?? "", /^last tool result: <exit code: 0/, "the context has tool results");
  const susp = assertSuspendAnswer(await conn.call("session/suspend", { sessionId: idle.sessionId }), {}, "idle suspend");
  const mark2 = conn.notes.items.length - 1;
  const woke = resumedOf(
    await within(conn.call("session/resume", { sessionId: idle.sessionId, handle: susp.handle, continueTranscript: false }), 10_000, "resume"),
    "idle resume, continueTranscript false",
  );
  assert.equal(woke.continueTranscript, false);
  assert.equal(typeof woke.turnId, "string", `a fresh turn starts: ${JSON.stringify(woke)}`);
  await conn.turnEnded(idle.sessionId, woke.turnId);
  const digest = conn.text(idle.sessionId, mark2);
  assert.ok(digest.startsWith("Fresh start; last tool result: <>; I read: " + FRESH), digest);
  assert.match(digest, /No resume input was given/);
  const mark3 = conn.notes.items.length - 1;
  result(await within(conn.prompt(idle.sessionId, "what was the last tool result"), 10_000, "probe again"), "probe again");
  assert.equal(conn.text(idle.sessionId, mark3), "last tool result: <>", "the earlier tool results stay out of the context");
  ctx.step("continueTranscript false: digest turn, no earlier tool result in context (parked and idle)");
});

scenario("8. double-resume race: 100 concurrent resumes, exactly one wins (3 rounds)", async (ctx) => {
  const conn = await ctx.raw("race");
  const { sessionId } = await conn.newSession("race");
  for (let round = 1; round <= 3; round++) {
    const parked = assertSuspendedAnswer(
      await within(conn.prompt(sessionId, "park until resumed"), 10_000, `round ${round}: park`),
      "agent",
      `round ${round}`,
    );
    const mark = conn.notes.items.length - 1;
    const answers = await within(
      Promise.all(
        Array.from({ length: 100 }, (_, i) =>
          conn.call("session/resume", { sessionId, handle: parked.handle, input: `racer-${round}-${i}` }),
        ),
      ),
      20_000,
      `round ${round}: 100 resumes`,
    );
    const winners = answers.map((a, i) => (a.result ? i : -1)).filter((i) => i >= 0);
    assert.equal(winners.length, 1, `round ${round}: exactly one winner, got ${winners}`);
    const winner = winners[0];
    const resumed = resumedOf(answers[winner], `round ${round}: winner`);
    assert.equal(resumed.turnId, parked.turnId);
    answers.forEach((a, i) => {
      if (i === winner) return;
      const e = rpcError(a, { code: -32009, reason: "already_resumed" }, `round ${round}: resume #${i}`);
      assert.equal(e.data.handle, parked.handle);
      assert.equal(e.data.claim?.kind, "resumed", JSON.stringify(e.data));
    });
    await conn.turnEnded(sessionId, parked.turnId, `round ${round}: turn_ended`);
    const text = conn.text(sessionId, mark);
    assert.equal(text, `I was woken: resumed (a client resumed the session) with input: racer-${round}-${winner}`, "the winner's input");
    assert.equal(conn.events(sessionId).filter((e) => e.index > mark && e.kind === "agent:resumed").length, 1, "one resumed event");
    conn.assertNoDuplicates(sessionId, `round ${round}`);
    await assertStatus(conn, sessionId, "idle", `round ${round}: after`);
    ctx.step(`round ${round}: winner #${winner}, 99 already_resumed`);
  }
});

scenario("9. close while suspended: the parked turn is sealed; resume and prompt are refused; close again is ok", async (ctx) => {
  const conn = await ctx.raw("close");
  const { sessionId, cwd } = await conn.newSession("close");
  const pending = conn.prompt(sessionId, "one batch");
  await conn.runningCall(sessionId, "echo A", "A");
  const { suspending, handle } = await suspendWhileRunning(conn, sessionId, "interrupt_immediate", "closing soon", "close");
  release(cwd);
  assertSuspendAnswer(await within(suspending, 10_000, "suspend answer"), {}, "suspend");
  const parked = assertSuspendedAnswer(await within(pending, 10_000, "prompt answer"), "user", "prompt");

  const mark = conn.notes.items.length - 1;
  assert.deepEqual(result(await within(conn.call("session/close", { sessionId }), 10_000, "close"), "close"), {});
  await conn.waitAgentEvent(sessionId, "session_closed", () => true, "session_closed");
  const after = conn.events(sessionId).filter((e) => e.index > mark);
  const cancelled = after.find((e) => e.kind === "agent:suspension_cancelled");
  assert.equal(cancelled?.params.event.handle, handle, "suspension_cancelled names the handle");
  const ended = after.find((e) => e.kind === "agent:turn_ended");
  assert.equal(ended?.params.event.turn_id, parked.turnId);
  assert.equal(ended.params.event.terminal.kind, "session_closed", JSON.stringify(ended.params.event));
  const [b] = conn.callIds(sessionId, "echo B");
  assert.deepEqual(conn.statuses(sessionId, b), ["failed"], "B never started; it is settled as never run");
  const bFailed = after.find((e) => e.kind === "tool_call_update" && e.update.toolCallId === b);
  assert.match(bFailed.update.rawOutput?.reason ?? "", /closed while suspended/, JSON.stringify(bFailed.update));
  assert.equal(bFailed.update.rawOutput?.dispatched, false);

  const resume = await within(conn.call("session/resume", { sessionId, handle }), 10_000, "resume after close");
  assert.ok(resume.error, `resume after close is refused: ${JSON.stringify(resume)}`);
  assert.ok([-32009, -32005].includes(resume.error.code), JSON.stringify(resume.error));
  if (resume.error.code === -32009) {
    assert.equal(resume.error.data.reason, "already_resumed");
    assert.equal(resume.error.data.claim?.kind, "cancelled", JSON.stringify(resume.error.data));
  }
  rpcError(await conn.prompt(sessionId, "hello"), { code: -32005, reason: "session_closed" }, "prompt after close");
  assert.deepEqual(result(await within(conn.call("session/close", { sessionId }), 10_000, "close again"), "close again"), {});
  await assertStatus(conn, sessionId, "closed", "closed");
  assert.deepEqual(logLines(cwd), ["A"], "B never ran");
  ctx.step(`close while suspended: resume → ${resume.error.code}`);
});

scenario("10. SIGKILL while suspended: the same handle after a restart; resume completes, nothing re-runs", async (ctx) => {
  const first = await ctx.raw("kill-suspended-1");
  const { sessionId, cwd } = await first.newSession("kill-suspended");
  const pending = first.prompt(sessionId, "two steps");
  const a = await first.runningCall(sessionId, "echo A", "A");
  const { suspending, handle } = await suspendWhileRunning(first, sessionId, "finish_step", "before the kill", "kill");
  release(cwd);
  assertSuspendAnswer(await within(suspending, 10_000, "suspend answer"), {}, "suspend");
  const parked = assertSuspendedAnswer(await within(pending, 10_000, "prompt answer"), "user", "prompt");
  const before = await assertStatus(first, sessionId, "suspended", "before the kill");
  first.server.kill();
  assert.equal((await within(first.server.exited, 5_000, "server 1 dies")).signal, "SIGKILL");

  const second = await ctx.raw("kill-suspended-2");
  const view = await assertStatus(second, sessionId, "suspended", "after the restart");
  assert.deepEqual(view.run.suspension, before.run.suspension, "the same suspension");
  assert.equal(view.run.turnId, parked.turnId);
  assert.equal(view.lastEventId, before.lastEventId, "the restart added nothing");
  const resumed = resumedOf(await within(second.call("session/resume", { sessionId, handle }), 10_000, "resume"), "resume");
  assert.equal(resumed.turnId, parked.turnId);
  const ended = await second.turnEnded(sessionId, parked.turnId);
  assert.equal(ended.event.terminal.kind, "completed");
  assert.deepEqual(second.statuses(sessionId, a), [], "A did not run again");
  assert.equal(second.callIds(sessionId, "echo B").length, 1);
  assert.deepEqual(logLines(cwd), ["A", "B"], "each call ran once across the restart");
  await assertStatus(second, sessionId, "idle", "after");
  ctx.step("SIGKILL while suspended: same handle, resumed, A and B once");
});

scenario("11. SIGKILL while quiescing: the suspension completes at start-up; the running call is never re-run", async (ctx) => {
  const first = await ctx.raw("kill-quiescing-1");
  const { sessionId, cwd } = await first.newSession("kill-quiescing");
  const pending = first.prompt(sessionId, "long tool");
  const a = await first.runningCall(sessionId, "sleep 5", "long A");
  const { handle } = await suspendWhileRunning(first, sessionId, "finish_step", "quiesce then die", "quiescing");
  first.server.kill();
  assert.equal((await within(first.server.exited, 5_000, "server 1 dies")).signal, "SIGKILL");
  assert.ok((await pending).error, "the prompt got no answer before the kill");
  assert.deepEqual(first.statuses(sessionId, a), ["in_progress"], "A had not settled");

  const second = await ctx.raw("kill-quiescing-2");
  const view = await assertStatus(second, sessionId, "suspended", "after the restart");
  assert.equal(view.run.suspension.handle, handle, "the requested suspension completed with its handle");
  assert.equal(view.run.suspension.initiator, "client");
  // Scripted tool call ids are `<turn id>_<model call>_<index>`.
  assert.equal(view.run.turnId, a.replace(/_\d+_\d+$/, ""), "the killed turn is the parked one");

  // The journal (replayed by session/load): A's outcome is unknown, then `suspended`.
  const loaded = await second.request("session/load", { sessionId, cwd, mcpServers: [] });
  const last = loaded._meta.berth.lastEventId;
  await second.notes.waitFor(() => second.events(sessionId, { replayed: true }).length >= last, 5_000, "the replay");
  const replayed = second.events(sessionId, { replayed: true });
  const aUpdates = replayed.filter((e) => e.kind === "tool_call_update" && e.update.toolCallId === a);
  assert.deepEqual(aUpdates.map((e) => e.update.status), ["in_progress", "failed"], "A: in_progress, then failed (unknown)");
  assert.match(aUpdates[1].update.rawOutput?.reason ?? "", /abandoned/, JSON.stringify(aUpdates[1].update));
  const susp = replayed.find((e) => e.kind === "agent:suspended");
  assert.equal(susp?.params.event.handle, handle);
  assert.ok(susp.eventId > aUpdates[1].eventId, "suspended after A was settled as unknown");

  const mark = second.notes.items.length - 1;
  const resumed = resumedOf(await within(second.call("session/resume", { sessionId, handle }), 10_000, "resume"), "resume");
  const ended = await second.turnEnded(sessionId, resumed.turnId);
  assert.equal(ended.event.terminal.kind, "completed", JSON.stringify(ended.event));
  assert.deepEqual(second.statuses(sessionId, a, mark), [], "A is never re-run");
  const b = second.callIds(sessionId, "echo B");
  assert.equal(b.length, 1, "B announced once");
  assert.equal(second.text(sessionId, mark), "Long tool done.");
  const lines = logLines(cwd);
  assert.ok(lines.filter((l) => l === "A").length <= 1, `A at most once: ${lines}`);
  assert.equal(lines.filter((l) => l === "B").length, 1, `B once: ${lines}`);
  second.assertNoDuplicates(sessionId, "after the restart");
  ctx.step(`SIGKILL while quiescing: recovered suspension, log ${JSON.stringify(lines)}`);
});

scenario("12. nested sessions are suspended and resumed independently", async (ctx) => {
  const conn = await ctx.raw("nested");
  const parent = await conn.newSession("parent");
  const child = await conn.newSession("child", { berth: { parentSessionId: parent.sessionId } });
  assert.notEqual(child.sessionId, parent.sessionId);

  const childSusp = assertSuspendAnswer(await conn.call("session/suspend", { sessionId: child.sessionId, reason: "child waits" }), {}, "child");
  await assertStatus(conn, child.sessionId, "suspended", "child");
  await assertStatus(conn, parent.sessionId, "idle", "the parent is untouched");
  const hello = result(await within(conn.prompt(parent.sessionId, "hello"), 10_000, "parent prompt"), "parent prompt");
  assert.equal(hello._meta.berth.terminal.kind, "completed", "the parent stays promptable");

  const parentSusp = assertSuspendAnswer(await conn.call("session/suspend", { sessionId: parent.sessionId }), {}, "parent");
  assert.notEqual(parentSusp.handle, childSusp.handle);
  rpcError(
    await conn.call("session/resume", { sessionId: parent.sessionId, handle: childSusp.handle }),
    { code: -32009 },
    "the child's handle does not resume the parent",
  );
  const resumed = resumedOf(await conn.call("session/resume", { sessionId: parent.sessionId, handle: parentSusp.handle }), "parent resume");
  assert.equal(resumed.handle, parentSusp.handle);
  await assertStatus(conn, parent.sessionId, "idle", "parent resumed");
  const childView = await assertStatus(conn, child.sessionId, "suspended", "the child is untouched by the parent's resume");
  assert.equal(childView.run.suspension.handle, childSusp.handle);
  rpcError(await conn.prompt(child.sessionId, "hello"), { code: -32010 }, "child still suspended");

  resumedOf(await conn.call("session/resume", { sessionId: child.sessionId, handle: childSusp.handle }), "child resume");
  const childHello = result(await within(conn.prompt(child.sessionId, "hello"), 10_000, "child prompt"), "child prompt");
  assert.equal(childHello._meta.berth.terminal.kind, "completed");
  await assertStatus(conn, parent.sessionId, "idle", "parent");
  ctx.step("nested: independent suspensions");
});

scenario("13. validation: resumeWhen errors name the field, bad mode is -32602 field mode", async (ctx) => {
  const conn = await ctx.raw("validation");
  const { sessionId } = await conn.newSession("validation");
  const bad = [
    [{ resumeWhen: { timeout: { durationMinutes: 0 } } }, "resumeWhen.timeout.durationMinutes"],
    [{ resumeWhen: { timeout: { durationMinutes: "5" } } }, "resumeWhen.timeout.durationMinutes"],
    [{ resumeWhen: { timeout: { durationMinutes: -1 } } }, "resumeWhen.timeout.durationMinutes"],
    [{ resumeWhen: { timeout: {} } }, "resumeWhen.timeout.durationMinutes"],
    [{ resumeWhen: { deadline: "tomorrow" } }, "resumeWhen.deadline"],
    [{ resumeWhen: { timeout: { durationMinutes: 5, onTimeout: "explode" } } }, "resumeWhen.timeout.onTimeout"],
    [{ resumeWhen: { onEvent: "" } }, "resumeWhen.onEvent"],
    [{ resumeWhen: { trigger: "every day" } }, "resumeWhen.trigger"],
    [{ resumeWhen: { trigger: {} } }, "resumeWhen.trigger"],
    [{ resumeWhen: { trigger: { cron: "not a cron" } } }, "resumeWhen.trigger.cron"],
    [{ resumeWhen: 5 }, "resumeWhen"],
    [{ mode: "pause_now" }, "mode"],
    [{ mode: 3 }, "mode"],
  ];
  for (const [params, field] of bad) {
    const label = `suspend ${JSON.stringify(params)}`;
    const e = rpcError(await within(conn.call("session/suspend", { sessionId, ...params }), 5_000, label), { code: -32602, field }, label);
    assert.equal(typeof e.data.reason, "string", label);
  }
  await assertStatus(conn, sessionId, "idle", "no refused request suspended anything");
  assert.ok(!conn.events(sessionId).some((e) => e.kind === "agent:suspended" || e.kind === "agent:suspend_requested"));

  const ok = assertSuspendAnswer(
    await conn.call("session/suspend", { sessionId, resumeWhen: { timeout: { durationMinutes: 0.001 } } }),
    {},
    "durationMinutes 0.001",
  );
  assert.equal(ok.resumeWhen?.timeout?.durationMinutes, 0.001, `echoed: ${JSON.stringify(ok.resumeWhen)}`);
  // 0.001 minutes is 60 ms: the scheduler wakes it (cause timeout) by itself.
  const deadline = Date.now() + 10_000;
  for (;;) {
    const woke = conn.events(sessionId).find((e) => e.kind === "agent:resumed");
    if (woke) {
      assert.equal(woke.params.event.cause, "timeout", JSON.stringify(woke.params));
      break;
    }
    assert.ok(Date.now() < deadline, "the 0.001-minute timeout never fired");
    await new Promise((r) => setTimeout(r, 20));
  }
  ctx.step(`${bad.length} refused, 0.001 accepted`);
});

scenario("14. a configuration change while suspended refuses the parked turn (-32012); continueTranscript: false still resumes", async (ctx) => {
  const first = await ctx.raw("config-1");
  const { sessionId, cwd } = await first.newSession("config");
  const pending = first.prompt(sessionId, "two steps");
  await first.runningCall(sessionId, "echo A", "A");
  const { suspending, handle } = await suspendWhileRunning(first, sessionId, "finish_step", "config change ahead", "config");
  release(cwd);
  assertSuspendAnswer(await within(suspending, 10_000, "suspend answer"), {}, "suspend");
  const parked = assertSuspendedAnswer(await within(pending, 10_000, "prompt answer"), "user", "prompt");
  first.server.kill();
  await within(first.server.exited, 5_000, "server 1 dies");

  // The same rules plus one: another model configuration.
  const changed = path.join(ctx.root, "changed-script.toml");
  fs.writeFileSync(changed, `${fs.readFileSync(SCRIPT, "utf8")}\n[[rules]]\nmatch = "only in the changed script"\nsteps = [{ text = "changed" }]\n`);
  const server = new BerthServer({ label: "config-2", dataDir: ctx.dataDir, script: changed, dumpPrefix: "suspension-" });
  ctx.servers.push(server);
  const client = new RawClient(server);
  await client.initialize();
  const second = new Conn(ctx, server, { call: (m, p) => client.call(m, p), notes: client.notifications, raw: client });
  const refused = rpcError(
    await within(second.call("session/resume", { sessionId, handle }), 10_000, "resume"),
    { code: -32012, reason: "resume_refused" },
    "resume after a configuration change",
  );
  assert.equal(refused.data.refusal, "configuration_changed", JSON.stringify(refused.data));
  assert.equal(refused.data.handle, handle);
  const view = await assertStatus(second, sessionId, "suspended", "a refused resume claims nothing");
  assert.equal(view.run.suspension.handle, handle);

  const resumed = resumedOf(
    await within(second.call("session/resume", { sessionId, handle, continueTranscript: false, input: "go on" }), 10_000, "fresh resume"),
    "fresh resume",
  );
  assert.notEqual(resumed.turnId, parked.turnId);
  const old = await second.turnEnded(sessionId, parked.turnId, "the parked turn is sealed");
  assert.equal(old.event.terminal.kind, "suspended");
  await second.turnEnded(sessionId, resumed.turnId);
  assert.match(second.text(sessionId), /Resume input: go on/);
  assert.deepEqual(logLines(cwd), ["A"], "B of the refused turn never ran");
  ctx.step("configuration_changed refused; fresh resume ok");
});
