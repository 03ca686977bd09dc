// End-to-end test of berth's MID-TURN CONTROLS over a real `berth serve`
// process, driven by the OFFICIAL ACP TypeScript SDK (`@agentclientprotocol/sdk`
// 2.4.0, see package.json).
//
// How to run (Linux; Node >= 20; the test reads /proc):
//
//     cd <repo> && cargo build --bin berth
//     cd conformance/e2e && npm ci && node --test
//
// The berth binary is `$BERTH_BIN` (default `<repo>/target/debug/berth`); each
// server is `berth serve --data-dir <temp dir> --model scripted:<this
// dir>/mid-turn-script.toml`. BERTH_E2E_KEEP=1 keeps the temp dir and
// BERTH_E2E_DUMP=<dir> writes every frame (both directions) and each server's
// stderr there. Takes ~4 s. The server process, wire tap, SDK client and
// cleanup are in harness.mjs.
//
// berth's controls are extension methods ACP does not define (`session/inject`,
// `session/revoke_inject`, `session/replace_inject`,
// `session/pending_injections`, `session/cancel_tool_call`,
// `berth.session_view.query` / `_berth/session_view`) or defines only as a
// notification (`session/cancel`). All of them go through the SDK's generic
// `agent.request(method, params)`, which sends any method name as a JSON-RPC
// request and, having no response schema for it, resolves with the raw result
// (or rejects with `acp.RequestError {code, message, data}`).
//
// One server, one SDK client; every scenario gets its own session and working
// directory, and runs as a subtest:
//
//  1. cancel mid-sequence: the first model response is a `sleep 30` shell call,
//     the next would be two `write_file`s; `session/cancel` during the sleep →
//     the prompt answers `cancelled`, the writes were never even announced, the
//     files never exist, the sleep process is dead.
//  2. steer: `session/inject` mode `steer` during the model's delay is held
//     until the pending tool batch has settled (post_tool_dispatch), echoed as a
//     `user_message_chunk` carrying the returned messageId, and the turn's last
//     answer is the steer rule's ("Did the smaller fix.").
//  3. interrupt (`interrupt_immediate`, then the alias `interrupt`): the pending
//     batch of two writes is skipped (each call `failed` with
//     `rawOutput.interrupted`), the files never exist, the model answers the
//     interrupt, `end_turn`.
//  4. queue: pending (FIFO) in `session/pending_injections` and in the session
//     view while the turn runs; delivered only at loop exit (echoes after every
//     agent_message_chunk, right before `turn_ended`); the answer is unchanged.
//  5. revoke / replace before delivery, revoke / replace after (-32008 with
//     `already_revoked`, `already_delivered`, `unknown_message_id`); only the
//     replaced content is echoed.
//  6. rejected controls: inject on an idle session (-32004 "Session has no
//     active prompt", bogus mode too), bad mode (-32602 invalid_mode), empty
//     content (-32602 invalid_content), controls naming an unknown session
//     (-32004, a receipt WITHOUT an eventId).
//  7. `session/cancel_tool_call` on a running `sleep 30`: `cancelled`, the turn
//     goes on to `end_turn`, the call `failed` with `rawOutput.cancelled`;
//     again → already_cancelled / not_found.
//  8. exactly one `control_outcome` `_berth/agentEvent` per control sent above
//     (per session, in order, with matching method / status / outcome / reason /
//     target), and none for anything else (prompts, queries).
//  9. `berth.session_view.query` (and `_berth/session_view`) before a SIGKILL
//     while idle equals the view after a restart + `session/load`
//     (`prefix_hash`, `projection_hash`, everything).
//
// Every wait is a wait for a specific frame (or, for facts no frame announces —
// a pid in /proc, a file the shell wrote — a bounded poll), under a hard
// timeout. All servers (and any process they left behind) are SIGKILLed at the
// end, failed or not.
//
// The live stream must have no gaps: every journaled event of a session
// reaches its attached client live, in id order, even when a control's receipt
// (journaled by the session actor) races the turn's own events (journaled by
// the turn task). `settle` checks that after every scenario.

import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";

import * as acp from "@agentclientprotocol/sdk";

import {
  AGENT_EVENT,
  BerthServer,
  E2E_DIR,
  Recorder,
  SESSION_UPDATE,
  assertBerthBin,
  assertSdkDeliveredAll,
  clientApp,
  eventIdOf,
  initialize,
  killEverything,
  pollUntil,
  procCmdline,
  procState,
  reportServer,
  sdkErrors,
  sessionHelpers,
  stepper,
  strayPids,
  subtestRunner,
  tempRoot,
  within,
} from "./harness.mjs";

const SCRIPT = path.join(E2E_DIR, "mid-turn-script.toml");
const CLIENT = "berth-e2e-mid-turn";
const startServer = (dataDir, label) => new BerthServer({ label, dataDir, script: SCRIPT, dumpPrefix: "mid-turn-" });
const UNKNOWN_SESSION = "sess_does_not_exist";
const INTERRUPTED_REASON = "a user interrupt arrived before this tool call was dispatched";

// ---------------------------------------------------------------- helpers

/** Asserts `promise` rejects with a JSON-RPC error of `code` (and `data.reason`, `message` when given). */
async function assertRpcError(promise, { code, reason, message }, label) {
  let caught;
  await assert.rejects(promise, (error) => {
    caught = error;
    return true;
  }, label);
  assert.ok(caught instanceof acp.RequestError, `${label}: ${caught?.stack ?? caught}`);
  assert.equal(caught.code, code, `${label}: ${caught.code} ${caught.message} ${JSON.stringify(caught.data)}`);
  if (reason !== undefined) assert.equal(caught.data?.reason, reason, `${label}: data ${JSON.stringify(caught.data)}`);
  if (message !== undefined) assert.equal(caught.message, message, `${label}: message`);
  return caught;
}

// ---------------------------------------------------------------- the test

test("berth mid-turn controls end to end with @agentclientprotocol/sdk 2.4.0", { timeout: 90_000 }, async (t) => {
  assertBerthBin();
  const root = tempRoot("berth-e2e-mid-turn-");
  const dataDir = path.join(root, "data");
  const step = stepper(t);
  let current;

  /** Files that must never exist (checked in their scenario and again at the very end). */
  const neverExist = [];

  try {
    const s1 = (current = startServer(dataDir, "server 1"));
    const seen = new Recorder();
    const conn1 = clientApp(seen, CLIENT).connect(s1.stream);
    const agent = conn1.agent;
    await initialize(agent, CLIENT);

    // ------------------------------------------------------------ helpers

    /** Every control this test sent, in order: what its receipt must say. */
    const controls = [];

    /**
     * Sends one control through the SDK's generic request and records it with
     * the receipt it must produce: `receipt` is `{status, outcome, reason?,
     * target?}`, or a function of the result / error (for answers only known
     * afterwards). Returns the result; rethrows the error.
     */
    async function control(method, params, receipt, ms = 5_000) {
      const entry = { method, sessionId: params.sessionId, params, receipt };
      controls.push(entry);
      try {
        entry.result = await within(agent.request(method, params), ms, `${method} ${JSON.stringify(params)}`);
        return entry.result;
      } catch (error) {
        entry.error = error;
        throw error;
      }
    }

    const { sessions, newSession, lastEventId, waitUpdate, startPrompt, runningCall, loadReplayed } = sessionHelpers({ agent, seen, server: s1, root });

    /**
     * The session's events as `{kind, eventId, update, params}`, in id order:
     * the live notifications the SDK delivered, plus, for ids the live stream
     * skipped (see `settle`), the copies a `session/load` replayed.
     */
    function events(sessionId, after = 0, upTo = Infinity) {
      const byId = new Map();
      for (const n of seen.items) {
        const id = eventIdOf(n.params);
        if (n.params.sessionId !== sessionId || id === undefined || id <= after || id > upTo) continue;
        const replayed = n.params._meta?.berth?.replayed === true;
        if (byId.has(id) && (replayed || !byId.get(id).replayed)) continue;
        byId.set(id, {
          kind: n.method === AGENT_EVENT ? `agent:${n.params.type}` : n.params.update.sessionUpdate,
          eventId: id,
          update: n.params.update,
          params: n.params,
          replayed,
        });
      }
      return [...byId.values()].sort((a, b) => a.eventId - b.eventId);
    }

    /** Event ids of `sessionId` that were delivered live. */
    const liveIds = (sessionId) =>
      new Set(
        seen.items
          .filter((n) => n.params.sessionId === sessionId && n.params._meta?.berth?.replayed !== true)
          .map((n) => eventIdOf(n.params))
          .filter((id) => id !== undefined),
      );

    /**
     * `settle` checks, for an idle session, that every event id 1..lastEventId
     * of its session view arrived live on this connection; a gap fails the
     * test (berth releases events to watchers strictly in id order).
     */
    const liveGaps = [];
    async function settle(sessionId, label) {
      const view = await within(agent.request("berth.session_view.query", { sessionId }), 5_000, `${label}: session view`);
      const last = view.lastEventId;
      const live = liveIds(sessionId);
      const missing = [];
      for (let id = 1; id <= last; id++) if (!live.has(id)) missing.push(id);
      if (!missing.length) return;
      const have = new Set(events(sessionId).map((e) => e.eventId));
      if (missing.some((id) => !have.has(id))) {
        const entry = sessions.find((e) => e.sessionId === sessionId);
        const loaded = await within(
          agent.request(acp.methods.agent.session.load, { sessionId, cwd: entry.cwd, mcpServers: [] }),
          10_000,
          `${label}: session/load to fill live gaps ${missing}`,
        );
        assert.ok(loaded._meta.berth.lastEventId >= last);
        await seen.waitFor(
          () => {
            const ids = new Set(events(sessionId).map((e) => e.eventId));
            return missing.every((id) => ids.has(id));
          },
          5_000,
          `${label}: the replay fills ids ${missing}`,
        );
      }
      const dropped = missing.filter((id) => !liveGaps.some((g) => g.sessionId === sessionId && g.eventId === id));
      for (const id of dropped) {
        const e = events(sessionId).find((x) => x.eventId === id);
        // A prompt's own user_message_chunk is not echoed to the connection
        // that sent it (an injection's delivery, with its messageId, is).
        const ownPrompt = e.params.update?.sessionUpdate === "user_message_chunk" && !e.params._meta?.berth?.messageId;
        if (ownPrompt) continue;
        liveGaps.push({ sessionId, label, eventId: id, frame: { method: e.params.type ? AGENT_EVENT : SESSION_UPDATE, params: e.params } });
      }
    }

    /** Awaits the prompt answer and its `turn_ended`; returns the turn's events. */
    async function finishTurn(sessionId, pending, mark, label, ms = 10_000) {
      const response = await within(pending, ms, `${label}: prompt answer`);
      const turnId = response._meta?.berth?.turnId;
      assert.equal(typeof turnId, "string", `${label}: ${JSON.stringify(response)}`);
      const isEnded = (params) => params.type === "turn_ended" && params.event?.turn_id === turnId;
      // A live turn_ended precedes the answer on the wire; the SDK may run its
      // handler a few microtasks after resolving the answer.
      if (s1.wire.items.some((m) => m.method === AGENT_EVENT && isEnded(m.params))) {
        await seen.waitFor((n) => n.method === AGENT_EVENT && isEnded(n.params), 5_000, `${label}: turn_ended`);
      }
      await settle(sessionId, label);
      const ended = events(sessionId, mark).find((e) => e.kind === "agent:turn_ended" && isEnded(e.params));
      assert.ok(ended, `${label}: turn_ended of ${turnId}`);
      assert.equal(ended.params.event.stop_reason, response.stopReason);
      const turnEvents = events(sessionId, mark, ended.eventId);
      return { response, ended: ended.params, turnEvents };
    }

    const textOf = (evs) => evs.filter((e) => e.kind === "agent_message_chunk").map((e) => e.update.content.text).join("");

    /** Waits until the shell wrote its pid into `pidFile` and exec'd into `sleep 30`. */
    function sleeperPid(pidFile, label) {
      return pollUntil(
        () => {
          let text;
          try {
            text = fs.readFileSync(pidFile, "utf8").trim();
          } catch {
            return null;
          }
          const pid = Number(text);
          if (!/^\d+$/.test(text) || procCmdline(pid) !== "sleep 30") return null;
          strayPids.add(pid);
          return pid;
        },
        5_000,
        `${label}: ${pidFile} names a running 'sleep 30'`,
      );
    }

    /** Dead = gone from /proc, or a zombie nobody reaped yet. */
    async function assertDead(pid, ms, label) {
      const how = await pollUntil(
        () => {
          const state = procState(pid);
          if (state === null) return "gone";
          return state === "Z" ? "a zombie" : null;
        },
        ms,
        `${label}: pid ${pid} dies (state ${procState(pid)})`,
      );
      strayPids.delete(pid);
      return how;
    }

    const callUpdates = (evs, toolCallId) =>
      evs.filter((e) => e.kind === "tool_call_update" && e.update.toolCallId === toolCallId);

    const subtest = subtestRunner(t, { timeout: 30_000, server: () => current });

    // ------------------------------------------------------------ 1. cancel
    await subtest("1. cancel during the first call leaves no trace of the later ones", async () => {
      const { sessionId, cwd } = await newSession("cancel");
      const files = [path.join(cwd, "later-a.txt"), path.join(cwd, "later-b.txt")];
      neverExist.push(...files);
      const mark = lastEventId(sessionId);
      const pending = startPrompt(sessionId, "cancel during the sleeper");
      const call = await runningCall(sessionId, mark, "exec sleep 30", "cancel: the sleep tool_call");
      const toolCallId = call.params.update.toolCallId;
      const pid = await sleeperPid(path.join(cwd, "sleeper.pid"), "cancel");

      const cancelledAt = Date.now();
      const answer = await control("session/cancel", { sessionId }, { status: "accepted", outcome: "cancelled" });
      assert.deepEqual(answer, { status: "cancelled" });
      const { response, turnEvents } = await finishTurn(sessionId, pending, mark, "cancel", 2_000);
      assert.equal(response.stopReason, "cancelled", JSON.stringify(response));
      assert.equal(response._meta.berth.terminal?.kind, "user_cancelled");

      // Only the sleep was ever announced; the two writes never were.
      const calls = turnEvents.filter((e) => e.kind === "tool_call");
      assert.deepEqual(calls.map((e) => e.update.toolCallId), [toolCallId], "only the sleep call was announced");
      assert.ok(!turnEvents.some((e) => e.kind === "tool_call" && e.update.kind === "edit"), "no write_file announced");
      assert.deepEqual(
        callUpdates(turnEvents, toolCallId).map((e) => e.update.status),
        ["in_progress", "failed"],
        "sleep call statuses",
      );
      assert.ok(!textOf(turnEvents).includes("Wrote both files"), "the second response never streamed");
      for (const file of files) assert.equal(fs.existsSync(file), false, `${file} must not exist`);
      const how = await assertDead(pid, 2_000 - Math.min(Date.now() - cancelledAt, 1_900), "cancel");

      // A second cancel on the now idle session is idempotent.
      const again = await control("session/cancel", { sessionId }, { status: "idempotent", outcome: "already_cancelled" });
      assert.deepEqual(again, { status: "already_cancelled" });
      step(`1. cancel: prompt cancelled, writes never announced, sleep pid ${pid} ${how}`);
    });

    // ------------------------------------------------------------ 2. steer
    await subtest("2. steer is held past the pending batch and changes the final answer", async () => {
      const { sessionId } = await newSession("steer");
      const mark = lastEventId(sessionId);
      const pending = startPrompt(sessionId, "do the big fix");
      await waitUpdate(
        sessionId,
        mark,
        (u) => u.sessionUpdate === "agent_message_chunk" && u.content?.text === "Starting the big fix.",
        "steer: first chunk (the model is now in its 1 s delay)",
      );
      const steer = await control(
        "session/inject",
        { sessionId, mode: "steer", content: "prefer the smaller fix" },
        (r) => ({ status: "accepted", outcome: "accepted", target: { sessionId, messageId: r.messageId } }),
      );
      assert.equal(steer.status, "accepted", JSON.stringify(steer));
      assert.match(steer.messageId, /\S/);
      assert.deepEqual(Object.keys(steer).sort(), ["messageId", "status"]);

      const { response, turnEvents } = await finishTurn(sessionId, pending, mark, "steer");
      assert.equal(response.stopReason, "end_turn", JSON.stringify(response));

      const echoes = turnEvents.filter((e) => e.kind === "user_message_chunk" && e.update.messageId === steer.messageId);
      assert.equal(echoes.length, 1, `one echo of the steer in ${JSON.stringify(turnEvents.map((e) => e.kind))}`);
      const echo = echoes[0];
      assert.deepEqual(echo.update.content, { type: "text", text: "prefer the smaller fix" });
      const accepted = turnEvents.find((e) => e.kind === "agent:injection_accepted");
      assert.equal(accepted?.params.event.injection?.message_id, steer.messageId);
      assert.equal(accepted.params.event.injection.mode, "steer");
      assert.ok(accepted.eventId < echo.eventId);

      // Not before the pending batch dispatched: the shell call ran (and settled) first.
      const shell = turnEvents.find((e) => e.kind === "tool_call" && e.update.rawInput?.command === "true");
      assert.ok(shell, "the pending shell call was announced");
      const shellStatuses = callUpdates(turnEvents, shell.update.toolCallId);
      assert.deepEqual(shellStatuses.map((e) => e.update.status), ["in_progress", "completed"], "the batch ran");
      assert.ok(shellStatuses.at(-1).eventId < echo.eventId, "the steer lands after the batch settled (post_tool_dispatch)");

      // The model read it: the next answer is the steer rule's.
      assert.equal(textOf(turnEvents.filter((e) => e.eventId > echo.eventId)), "Did the smaller fix.");
      assert.equal(textOf(turnEvents), "Starting the big fix.Did the smaller fix.");
      assert.ok(!textOf(turnEvents).includes("Did the big fix."));
      step(`2. steer ${steer.messageId} delivered after the batch; final answer "Did the smaller fix."`);
    });

    // ------------------------------------------------------------ 3. interrupt
    await subtest("3. interrupt before dispatch skips the whole batch", async () => {
      const { sessionId, cwd } = await newSession("interrupt");
      const files = [path.join(cwd, "note-1.txt"), path.join(cwd, "note-2.txt")];
      neverExist.push(...files);
      for (const mode of ["interrupt_immediate", "interrupt"]) {
        const label = `interrupt (${mode})`;
        const mark = lastEventId(sessionId);
        const pending = startPrompt(sessionId, "write two notes");
        await waitUpdate(
          sessionId,
          mark,
          (u) => u.sessionUpdate === "agent_message_chunk" && u.content?.text === "Writing two notes.",
          `${label}: first chunk (the model is now in its 1 s delay)`,
        );
        const content = `stop writing now (${mode})`;
        const inj = await control(
          "session/inject",
          { sessionId, mode, content },
          (r) => ({ status: "accepted", outcome: "accepted", target: { sessionId, messageId: r.messageId } }),
        );
        assert.equal(inj.status, "accepted");
        const { response, turnEvents } = await finishTurn(sessionId, pending, mark, label);
        assert.equal(response.stopReason, "end_turn", JSON.stringify(response));
        assert.equal(response._meta.berth.terminal?.kind, "completed");

        const writes = turnEvents.filter((e) => e.kind === "tool_call");
        assert.deepEqual(
          writes.map((e) => e.update.rawInput?.path),
          files,
          `${label}: the batch of two writes was announced`,
        );
        const echo = turnEvents.find((e) => e.kind === "user_message_chunk" && e.update.messageId === inj.messageId);
        assert.ok(echo, `${label}: the interrupt is echoed with its messageId`);
        assert.deepEqual(echo.update.content, { type: "text", text: content });
        const accepted = turnEvents.find(
          (e) => e.kind === "agent:injection_accepted" && e.params.event.injection?.message_id === inj.messageId,
        );
        assert.equal(accepted?.params.event.injection.mode, "interrupt_immediate", `${label}: the alias is normalized`);
        for (const call of writes) {
          const updates = callUpdates(turnEvents, call.update.toolCallId);
          assert.deepEqual(updates.map((e) => e.update.status), ["failed"], `${label}: ${call.update.toolCallId} never ran`);
          const raw = updates[0].update.rawOutput;
          assert.equal(raw?.interrupted, true, `${label}: rawOutput ${JSON.stringify(raw)}`);
          assert.equal(raw.reason, INTERRUPTED_REASON);
          assert.ok(updates[0].eventId < echo.eventId, `${label}: skipped before the interrupt is delivered`);
        }
        // The model's next response answers the interrupt.
        assert.equal(textOf(turnEvents.filter((e) => e.eventId > echo.eventId)), "Stopped, as asked.");
        assert.ok(!textOf(turnEvents).includes("Wrote two notes."));
        for (const file of files) assert.equal(fs.existsSync(file), false, `${label}: ${file} must not exist`);
        step(`3. ${label}: batch skipped, model answered the interrupt`);
      }
    });

    /** Starts the "hold until released" turn and waits until its shell call runs. */
    async function holdTurn(sessionId, label) {
      const mark = lastEventId(sessionId);
      const pending = startPrompt(sessionId, "hold until released");
      const call = await waitUpdate(
        sessionId,
        mark,
        (u) => u.sessionUpdate === "tool_call" && u.rawInput?.command?.includes("release"),
        `${label}: the held shell call`,
      );
      await waitUpdate(
        sessionId,
        mark,
        (u) => u.sessionUpdate === "tool_call_update" && u.toolCallId === call.params.update.toolCallId && u.status === "in_progress",
        `${label}: the held shell call runs`,
      );
      return { mark, pending, toolCallId: call.params.update.toolCallId };
    }
    const release = (cwd) => fs.writeFileSync(path.join(cwd, "release"), "");
    const pendingInjections = (sessionId) =>
      within(agent.request("session/pending_injections", { sessionId }), 5_000, "session/pending_injections");
    const textBlock = (text) => [{ type: "text", text }];
    const injected = (r) => ({ status: "accepted", outcome: "accepted", target: { sessionId: r.sessionId, messageId: r.messageId } });

    // ------------------------------------------------------------ 4. queue
    await subtest("4. queue is pending FIFO, delivered only at loop exit, and changes nothing", async () => {
      const { sessionId, cwd } = await newSession("queue");
      const { mark, pending } = await holdTurn(sessionId, "queue");
      const contents = ["queued note one", "queued note two"];
      const ids = [];
      for (const content of contents) {
        const r = await control("session/inject", { sessionId, mode: "queue", content }, (res) => injected({ ...res, sessionId }));
        assert.equal(r.status, "accepted");
        ids.push(r.messageId);
      }
      assert.deepEqual(await pendingInjections(sessionId), {
        injections: ids.map((messageId, i) => ({ messageId, mode: "queue", content: textBlock(contents[i]) })),
      });
      const view = await within(agent.request("berth.session_view.query", { sessionId }), 5_000, "session view (running)");
      assert.equal(view.run?.status, "running", JSON.stringify(view));
      assert.equal(typeof view.run.turnId, "string");
      assert.deepEqual(view.pending?.injections, ids.map((messageId) => ({ messageId, mode: "queue" })));
      // Still nothing delivered.
      assert.ok(!events(sessionId, mark).some((e) => e.kind === "user_message_chunk" && e.update.messageId), "not delivered yet");

      release(cwd);
      const { response, turnEvents } = await finishTurn(sessionId, pending, mark, "queue");
      assert.equal(response.stopReason, "end_turn", JSON.stringify(response));
      // The turn's last events: every agent_message_chunk, then the two echoes
      // (FIFO), each followed by its signed drain receipt (delivered at
      // loop_exit), then turn_ended.
      const drains = turnEvents.slice(-5).filter((e) => e.kind === "agent:drain_decision_receipt");
      assert.deepEqual(
        drains.map((e) => [e.params.event.item.message_id, e.params.event.seam, e.params.event.action]),
        ids.map((id) => [id, "loop_exit", "delivered"]),
        `the drain receipts: ${JSON.stringify(turnEvents.map((e) => e.kind))}`,
      );
      const tail = turnEvents.slice(-5).filter((e) => e.kind !== "agent:drain_decision_receipt");
      assert.deepEqual(
        tail.map((e) => [e.kind, e.update?.messageId, e.update?.content?.text]),
        [
          ["user_message_chunk", ids[0], contents[0]],
          ["user_message_chunk", ids[1], contents[1]],
          ["agent:turn_ended", undefined, undefined],
        ],
        `tail of the turn: ${JSON.stringify(turnEvents.map((e) => e.kind))}`,
      );
      const lastChunk = turnEvents.findLast((e) => e.kind === "agent_message_chunk");
      assert.ok(lastChunk.eventId < tail[0].eventId, "echoes come after every agent_message_chunk");
      // The answer is what it would have been without the queued messages.
      assert.equal(textOf(turnEvents), "Waiting for the release file.Released; the held turn is done.");
      assert.deepEqual(await pendingInjections(sessionId), { injections: [] });
      step("4. queue: pending FIFO while running, echoed at loop exit, answer unchanged");
    });

    // ------------------------------------------------------------ 5. revoke / replace
    await subtest("5. revoke and replace before delivery; -32008 after", async () => {
      const { sessionId, cwd } = await newSession("retract");
      const { mark, pending } = await holdTurn(sessionId, "retract");
      const a = await control("session/inject", { sessionId, mode: "queue", content: "original A" }, (r) => injected({ ...r, sessionId }));
      const b = await control("session/inject", { sessionId, mode: "queue", content: "doomed B" }, (r) => injected({ ...r, sessionId }));
      const targetOf = (messageId) => ({ sessionId, messageId });

      const replaced = await control(
        "session/replace_inject",
        { sessionId, messageId: a.messageId, content: "replaced A" },
        { status: "accepted", outcome: "replaced", target: targetOf(a.messageId) },
      );
      assert.deepEqual(replaced, { messageId: a.messageId, status: "replaced" });
      const revoked = await control(
        "session/revoke_inject",
        { sessionId, messageId: b.messageId },
        { status: "accepted", outcome: "revoked", target: targetOf(b.messageId) },
      );
      assert.deepEqual(revoked, { messageId: b.messageId, status: "revoked" });
      const rejected = (reason, messageId) => ({ status: "rejected", outcome: "rejected", reason, target: targetOf(messageId) });
      const e1 = await assertRpcError(
        control("session/revoke_inject", { sessionId, messageId: b.messageId }, rejected("already_revoked", b.messageId)),
        { code: -32008, reason: "already_revoked" },
        "revoke twice",
      );
      assert.equal(e1.data.messageId, b.messageId);
      await assertRpcError(
        control("session/replace_inject", { sessionId, messageId: b.messageId, content: "too late" }, rejected("already_revoked", b.messageId)),
        { code: -32008, reason: "already_revoked" },
        "replace a revoked message",
      );
      await assertRpcError(
        control("session/replace_inject", { sessionId, messageId: a.messageId, content: "" }, rejected("invalid_content", a.messageId)),
        { code: -32602, reason: "invalid_content" },
        "replace with empty content",
      );
      assert.deepEqual(await pendingInjections(sessionId), {
        injections: [{ messageId: a.messageId, mode: "queue", content: textBlock("replaced A") }],
      });

      release(cwd);
      const { response, turnEvents } = await finishTurn(sessionId, pending, mark, "retract");
      assert.equal(response.stopReason, "end_turn");
      const echoes = turnEvents.filter((e) => e.kind === "user_message_chunk" && e.update.messageId);
      assert.deepEqual(
        echoes.map((e) => [e.update.messageId, e.update.content]),
        [[a.messageId, { type: "text", text: "replaced A" }]],
        "only the replaced content is echoed",
      );
      const all = JSON.stringify(turnEvents.filter((e) => e.kind === "user_message_chunk"));
      assert.ok(!all.includes("original A") && !all.includes("doomed B"));
      assert.ok(turnEvents.some((e) => e.kind === "agent:injection_replaced" && e.params.event.injection?.message_id === a.messageId));
      assert.ok(turnEvents.some((e) => e.kind === "agent:injection_revoked" && e.params.event.message_id === b.messageId));
      assert.ok(!turnEvents.some((e) => e.kind === "agent:injection_dropped"));

      // After the turn: delivered / revoked / unknown.
      await assertRpcError(
        control("session/revoke_inject", { sessionId, messageId: a.messageId }, rejected("already_delivered", a.messageId)),
        { code: -32008, reason: "already_delivered" },
        "revoke a delivered message",
      );
      await assertRpcError(
        control("session/replace_inject", { sessionId, messageId: a.messageId, content: "later" }, rejected("already_delivered", a.messageId)),
        { code: -32008, reason: "already_delivered" },
        "replace a delivered message",
      );
      await assertRpcError(
        control("session/revoke_inject", { sessionId, messageId: b.messageId }, rejected("already_revoked", b.messageId)),
        { code: -32008, reason: "already_revoked" },
        "revoke a revoked message after the turn",
      );
      await assertRpcError(
        control("session/revoke_inject", { sessionId, messageId: "msg_never_issued" }, rejected("unknown_message_id", "msg_never_issued")),
        { code: -32008, reason: "unknown_message_id" },
        "revoke an unknown message id",
      );
      step("5. replace/revoke before delivery; already_revoked / already_delivered / unknown_message_id");
    });

    // ------------------------------------------------------------ 6. rejected controls
    await subtest("6. rejected controls answer their errors", async () => {
      const { sessionId, cwd } = await newSession("rejected");
      const rejected = (reason) => ({ status: "rejected", outcome: "rejected", reason, target: { sessionId } });
      for (const mode of ["steer", "sideways"]) {
        await assertRpcError(
          control("session/inject", { sessionId, mode, content: "anyone there?" }, rejected("no_active_prompt")),
          { code: -32004, reason: "no_active_prompt", message: "Session has no active prompt" },
          `inject (${mode}) on an idle session`,
        );
      }
      const { mark, pending } = await holdTurn(sessionId, "rejected");
      await assertRpcError(
        control("session/inject", { sessionId, mode: "sideways", content: "hi" }, rejected("invalid_mode")),
        { code: -32602, reason: "invalid_mode" },
        "inject with mode sideways",
      );
      for (const content of ["", "   ", []]) {
        await assertRpcError(
          control("session/inject", { sessionId, mode: "steer", content }, rejected("invalid_content")),
          { code: -32602, reason: "invalid_content" },
          `inject with content ${JSON.stringify(content)}`,
        );
      }
      assert.deepEqual(await pendingInjections(sessionId), { injections: [] }, "nothing rejected was queued");
      release(cwd);
      const { response, turnEvents } = await finishTurn(sessionId, pending, mark, "rejected");
      assert.equal(response.stopReason, "end_turn");
      assert.ok(!turnEvents.some((e) => e.kind === "agent:injection_accepted"));

      // Controls naming a session the server does not hold.
      const unknown = { status: "rejected", outcome: "unknown_session", reason: "unknown_session", target: { sessionId: UNKNOWN_SESSION } };
      const calls = [
        ["session/inject", { sessionId: UNKNOWN_SESSION, mode: "steer", content: "hello?" }],
        ["session/cancel", { sessionId: UNKNOWN_SESSION }],
        ["session/revoke_inject", { sessionId: UNKNOWN_SESSION, messageId: "msg_x" }],
        ["session/replace_inject", { sessionId: UNKNOWN_SESSION, messageId: "msg_x", content: "x" }],
        ["session/cancel_tool_call", { sessionId: UNKNOWN_SESSION, toolCallId: "call_x" }],
      ];
      for (const [method, params] of calls) {
        await assertRpcError(control(method, params, unknown), { code: -32004 }, `${method} on an unknown session`);
      }
      step("6. rejected controls: -32004 / -32602 / unknown session");
    });

    // ------------------------------------------------------------ 7. cancel_tool_call
    await subtest("7. cancel_tool_call stops one call and the turn goes on", async () => {
      const { sessionId, cwd } = await newSession("cancel-call");
      const mark = lastEventId(sessionId);
      const pending = startPrompt(sessionId, "sleep then carry on");
      const call = await runningCall(sessionId, mark, "exec sleep 30", "cancel_tool_call: the sleep tool_call");
      const toolCallId = call.params.update.toolCallId;
      const pid = await sleeperPid(path.join(cwd, "sleeper.pid"), "cancel_tool_call");
      const target = { sessionId, toolCallId };
      const first = await control("session/cancel_tool_call", target, { status: "accepted", outcome: "cancelled", target });
      assert.deepEqual(first, { status: "cancelled" });
      // Right away again: still running (already_cancelled) or already settled (not_found).
      const second = await control("session/cancel_tool_call", target, (r) =>
        r.status === "already_cancelled"
          ? { status: "idempotent", outcome: "already_cancelled", target }
          : { status: "rejected", outcome: "not_found", reason: "not_found", target },
      );
      assert.ok(["already_cancelled", "not_found"].includes(second.status), JSON.stringify(second));

      const { response, turnEvents } = await finishTurn(sessionId, pending, mark, "cancel_tool_call");
      assert.equal(response.stopReason, "end_turn", JSON.stringify(response));
      const updates = callUpdates(turnEvents, toolCallId);
      assert.deepEqual(updates.map((e) => e.update.status), ["in_progress", "failed"]);
      assert.equal(updates[1].update.rawOutput?.cancelled, true, JSON.stringify(updates[1].update.rawOutput));
      assert.equal(
        textOf(turnEvents.filter((e) => e.eventId > updates[1].eventId)),
        "Carried on after the sleep.",
        "the model carried on",
      );
      const how = await assertDead(pid, 2_000, "cancel_tool_call");
      const third = await control("session/cancel_tool_call", target, {
        status: "rejected",
        outcome: "not_found",
        reason: "not_found",
        target,
      });
      assert.deepEqual(third, { status: "not_found" });
      step(`7. cancel_tool_call: cancelled, then ${second.status}, turn end_turn, sleep ${how}, then not_found`);
    });

    // ------------------------------------------------------------ 8. receipts
    await subtest("8. exactly one control_outcome per control", async () => {
      // A journaled receipt is the event itself: `params.event = {type:
      // "control_outcome", session_id, control_id, method, …}`.
      // Unjournaled receipts (unknown session) have the journaled shape too.
      const receiptOf = (params) => {
        assert.equal(params.event?.control_outcome, undefined, `flat receipt shape: ${JSON.stringify(params)}`);
        return params.event;
      };
      const bySession = new Map();
      for (const c of controls) {
        if (!bySession.has(c.sessionId)) bySession.set(c.sessionId, []);
        bySession.get(c.sessionId).push(c);
      }
      // Receipts are journaled (and published) before the answer, so every
      // receipt of a session is within its view's lastEventId; `settle` fills
      // ids the live stream skipped. Receipts for an unknown session have no
      // id: they are sent before the error answer, and waited for.
      for (const sessionId of bySession.keys()) {
        if (sessionId !== UNKNOWN_SESSION) await settle(sessionId, `receipts of ${sessionId}`);
      }
      const unknownOutcomes = () =>
        seen.items
          .filter((n) => n.method === AGENT_EVENT && n.params.type === "control_outcome" && n.params.sessionId === UNKNOWN_SESSION)
          .map((n) => n.params);
      await seen.waitFor(
        () => unknownOutcomes().length >= (bySession.get(UNKNOWN_SESSION)?.length ?? 0),
        5_000,
        "control_outcomes for the unknown session",
      );
      const outcomes = (sessionId) =>
        sessionId === UNKNOWN_SESSION
          ? unknownOutcomes()
          : events(sessionId)
              .filter((e) => e.kind === "agent:control_outcome")
              .map((e) => e.params);
      const controlIds = new Set();
      let total = 0;
      for (const [sessionId, sent] of bySession) {
        const got = outcomes(sessionId);
        assert.deepEqual(
          got.map((p) => receiptOf(p).method),
          sent.map((c) => c.method),
          `control_outcome methods, in order, for ${sessionId}`,
        );
        sent.forEach((c, i) => {
          const n = { params: got[i] };
          const label = `receipt #${i + 1} of ${sessionId} (${c.method} ${JSON.stringify(c.params)})`;
          const want = typeof c.receipt === "function" ? c.receipt(c.result) : c.receipt;
          assert.equal(n.params.event?.type, "control_outcome", label);
          const ev = receiptOf(n.params);
          assert.equal(ev.session_id, sessionId, label);
          assert.equal(ev.method, c.method, label);
          assert.equal(ev.status, want.status, `${label}: ${JSON.stringify(ev)}`);
          assert.equal(ev.outcome, want.outcome, `${label}: ${JSON.stringify(ev)}`);
          assert.equal(ev.reason, want.reason, `${label}: ${JSON.stringify(ev)}`);
          assert.deepEqual(ev.target, want.target ?? { sessionId }, `${label}: target`);
          assert.match(ev.control_id, /^ctl_/, label);
          assert.ok(!controlIds.has(ev.control_id), `${label}: control_id ${ev.control_id} is unique`);
          controlIds.add(ev.control_id);
          assert.equal(typeof ev.actor, "string", label);
          assert.ok(ev.actor.length > 0, label);
          if (sessionId === UNKNOWN_SESSION) {
            assert.equal(n.params.eventId, undefined, `${label}: not journaled, so no eventId`);
            assert.equal(eventIdOf(n.params), undefined, `${label}: no _meta.berth.eventId`);
          } else {
            assert.equal(typeof n.params.eventId, "number", label);
            assert.equal(n.params.eventId, eventIdOf(n.params), label);
          }
          // The answer agrees with the receipt.
          const answeredRejection = c.error !== undefined || c.result?.status === "not_found";
          assert.equal(want.status === "rejected", answeredRejection, `${label}: rejected iff answered with an error or not_found`);
          total += 1;
        });
      }
      // The same actor (this connection) sent every control.
      const actors = new Set(
        seen.items.filter((n) => n.method === AGENT_EVENT && n.params.type === "control_outcome").map((n) => receiptOf(n.params).actor),
      );
      assert.equal(actors.size, 1, `one actor: ${[...actors]}`);
      // Nothing else (prompts, pending_injections, session views, loads) left
      // a receipt: the live ones plus the ones the live stream skipped are
      // exactly one per control.
      const liveOutcomes = s1.wire.items.filter(
        (m) => m.method === AGENT_EVENT && m.params?.type === "control_outcome" && m.params._meta?.berth?.replayed !== true,
      );
      const skipped = liveGaps.filter((g) => g.frame.params.type === "control_outcome");
      assert.equal(liveOutcomes.length + skipped.length, controls.length, "no receipt beyond one per control");
      step(`8. ${total} controls, ${total} control_outcomes (${controlIds.size} distinct control ids)`);
    });

    // Live stream gaps (see `settle`): reported, and fatal only when asked.
    if (liveGaps.length) {
      const lines = liveGaps.map(
        (g) => `  ${g.label}: eventId ${g.eventId} of ${g.sessionId} journaled but never sent live: ${JSON.stringify(g.frame)}`,
      );
      assert.fail(`live stream gaps (journaled events never sent live):\n${lines.join("\n")}`);
    }

    // Every notification on the wire reached the SDK handlers, none rejected by zod.
    assertSdkDeliveredAll(s1, seen);
    for (const file of neverExist) assert.equal(fs.existsSync(file), false, `${file} never exists`);

    // ------------------------------------------------------------ 9. session view across a restart
    await subtest("9. session_view prefix_hash / projection_hash survive a SIGKILL and restart", async () => {
      const view = (a, sessionId, method = "berth.session_view.query") =>
        within(a.request(method, { sessionId }), 5_000, `${method} ${sessionId}`);
      const before = new Map();
      for (const { sessionId } of sessions) {
        const v = await view(agent, sessionId);
        assert.deepEqual(await view(agent, sessionId, "_berth/session_view"), v, "the alias answers the same view");
        assert.equal(v.schema, "berth.session_view.v1");
        assert.equal(v.sessionId, sessionId);
        assert.deepEqual(v.run, { status: "idle" });
        assert.equal(v.lastEventId, lastEventId(sessionId), "lastEventId is the last event the client saw");
        assert.equal(typeof v.messageCount, "number");
        assert.ok(v.messageCount > 0);
        assert.match(v.prefix_hash, /^[0-9a-f]{64}$/);
        assert.match(v.projection_hash, /^[0-9a-f]{64}$/);
        assert.deepEqual(v.pending, { approvals: [], auth: [], injections: [] });
        before.set(sessionId, v);
      }
      assert.equal(new Set([...before.values()].map((v) => v.prefix_hash)).size, sessions.length, "histories differ");

      s1.kill();
      const exit1 = await within(s1.exited, 5_000, "server 1 dies on SIGKILL");
      assert.equal(exit1.signal, "SIGKILL");
      conn1.close();

      const s2 = (current = startServer(dataDir, "server 2"));
      const seen2 = new Recorder();
      const conn2 = clientApp(seen2, CLIENT).connect(s2.stream);
      const agent2 = conn2.agent;
      await initialize(agent2, CLIENT);
      for (const { sessionId, cwd, label } of sessions) {
        const loaded = await within(
          agent2.request(acp.methods.agent.session.load, { sessionId, cwd, mcpServers: [] }),
          10_000,
          `session/load ${label}`,
        );
        assert.equal(loaded._meta?.berth?.lastEventId, before.get(sessionId).lastEventId, `${label}: nothing added by the restart`);
        const v = await view(agent2, sessionId);
        assert.deepEqual(v, before.get(sessionId), `${label}: the view after the restart equals the view before`);
      }
      // The hash moves with the history.
      const probe = sessions[0];
      const hello = await within(
        agent2.request(acp.methods.agent.session.prompt, { sessionId: probe.sessionId, prompt: [{ type: "text", text: "hello" }] }),
        10_000,
        "hello after the restart",
      );
      assert.equal(hello.stopReason, "end_turn");
      const moved = await view(agent2, probe.sessionId);
      assert.notEqual(moved.prefix_hash, before.get(probe.sessionId).prefix_hash);
      assert.ok(moved.messageCount > before.get(probe.sessionId).messageCount);
      assert.deepEqual(sdkErrors, [], "the SDK logged no errors");
      await s2.shutdown();
      conn2.close();
      step(`9. ${sessions.length} session views identical across SIGKILL + restart`);
    });
    current = undefined;
  } catch (error) {
    for (const server of [current].filter(Boolean)) reportServer(t, server);
    throw error;
  } finally {
    killEverything();
  }
});
