// End-to-end test of berth's APPROVAL-GATED TOOLS over a real `berth serve`
// process, driven by the OFFICIAL ACP TypeScript SDK (`@agentclientprotocol/sdk`
// 2.4.0, see package.json), with the SDK's own client-side request handling:
// `session/request_permission` is answered by a handler registered with
// `clientApp(...).onRequest(acp.methods.client.session.requestPermission, h)`
// (the SDK validates the request params with zod before `h` runs, and writes
// whatever `h` resolves to as the JSON-RPC result).
//
// How to run (Linux; Node >= 20):
//
//     cd <repo> && cargo build --bin berth
//     cd conformance/e2e && npm ci && node --test
//
// The server is `berth serve --data-dir <temp dir> --model scripted:<this
// dir>/permissions-script.toml --require-approval write_file` (the flag, not a
// config file). Its one rule ("write the note") calls `write_file
// {cwd}/note.txt`, then says "Done with the note.". The handler does not answer
// by itself: it records each request with a resolver, so the test holds the
// answer as long as it likes. Takes ~1 s. Every scenario runs in its own
// session (so its own cwd and `note.txt`):
//
//  1. every request: `params.sessionId`, `params.toolCall.toolCallId` (the id
//     of the `tool_call` announced just before), `params.toolCall.rawInput` (the
//     write's path and content), `params.options` kinds `allow_once` /
//     `reject_once` with optionIds `allow` / `reject`; on the wire the order is
//     `tool_call` (pending) < `_berth/agentEvent` `permission_requested` <
//     the request.
//  2. while the answer is held: `berth.session_view.query` shows the call in
//     `result.pending.approvals` as `{toolCallId, title, kind}`, the run is
//     `running`, the call has had no update yet, the file does not exist.
//  3. `reject`: the file never exists; the call's only update is `failed` with
//     `rawOutput.permission.outcome === "rejected"`; `permission_resolved`
//     carries the decision; the model still answers; `end_turn`.
//  4. `allow`: the call runs (`in_progress`, `completed`); the file holds the
//     scripted content; `end_turn`.
//  5. unanswered + `session/cancel` (as a request): `{status: "cancelled"}`, the
//     prompt answers `cancelled`, the file never exists, `pending.approvals` is
//     empty, `permission_resolved` says `cancelled`, the call's only update is
//     `failed` with `rawOutput.permission.outcome === "cancelled"`. Then, as ACP asks of a
//     client that cancelled, the pending request is answered
//     `{outcome: {outcome: "cancelled"}}` (late: the turn is over): berth
//     journals nothing for it, writes no error, stays up, and the next turn of
//     the same session asks again (a new request) and runs once allowed.
//  6. every `permission_requested` / `permission_resolved` event is journaled
//     (`_meta.berth.eventId`), and `session/load` replays exactly them.
//
// Every wait is for a specific frame, under a hard timeout (the only polls are
// for the SDK having written an answer, a fact no frame announces); every
// event id of a session must arrive live (checked against the session view
// after each turn). The server is SIGKILLed at the end, failed or not.

import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";

import * as acp from "@agentclientprotocol/sdk";

import {
  AGENT_EVENT,
  BerthServer,
  E2E_DIR,
  NOTIFICATION_METHODS,
  Recorder,
  SESSION_UPDATE,
  assertBerthBin,
  assertSdkDeliveredAll,
  clientApp,
  eventIdOf,
  initialize,
  killEverything,
  pollUntil,
  reportServer,
  sessionHelpers,
  stepper,
  subtestRunner,
  tempRoot,
  within, sessionEvents } from "./harness.mjs";

const SCRIPT = path.join(E2E_DIR, "permissions-script.toml");
const CLIENT = "berth-e2e-permissions";
const REQUEST_PERMISSION = acp.methods.client.session.requestPermission;
const NOTE_CONTENT = "approved by the berth e2e client\n";
const PERMISSION_EVENTS = new Set(["permission_requested", "permission_resolved"]);

test("berth approval-gated tools end to end with @agentclientprotocol/sdk 2.4.0", { timeout: 60_000 }, async (t) => {
  assertBerthBin();
  const root = tempRoot("berth-e2e-permissions-");
  const step = stepper(t);

  const server = new BerthServer({
    label: "permissions server",
    dataDir: path.join(root, "data"),
    script: SCRIPT,
    args: ["--require-approval", "write_file"],
    dumpPrefix: "permissions-",
  });
  try {
    const seen = new Recorder();
    /** Every `session/request_permission` the SDK handed to the handler: `{requestId, params, answer(response)}`. */
    const asked = new Recorder();
    const conn = clientApp(seen, CLIENT)
      .onRequest(REQUEST_PERMISSION, ({ params, requestId }) => {
        let answer;
        const held = new Promise((resolve) => {
          answer = resolve;
        });
        asked.push({ requestId, params, answer, answered: false });
        return held;
      })
      .connect(server.stream);
    const agent = conn.agent;
    await initialize(agent, CLIENT);

    // ------------------------------------------------------------ helpers

    const { sessions, newSession, lastEventId, waitUpdate, startPrompt, runningCall, loadReplayed } = sessionHelpers({ agent, seen, server, root });

    /** The session's events the SDK delivered (see `sessionEvents` in harness.mjs). */
    const events = (sessionId, after, upTo, options) => sessionEvents(seen, sessionId, after, upTo, options);

    const view = (sessionId, label) =>
      within(agent.request("berth.session_view.query", { sessionId }), 5_000, `${label}: berth.session_view.query`);

    /**
     * Awaits the prompt answer and its `turn_ended`, checks that every event
     * id of the session (per its view) arrived live and that nothing is left
     * pending, and returns the turn's events.
     */
    async function finishTurn(sessionId, pending, mark, label, ms = 10_000) {
      const response = await within(pending, ms, `${label}: prompt answer`);
      const turnId = response._meta?.berth?.turnId;
      assert.equal(typeof turnId, "string", `${label}: ${JSON.stringify(response)}`);
      const ended = await seen.waitFor(
        (n) => n.method === AGENT_EVENT && n.params.type === "turn_ended" && n.params.event?.turn_id === turnId,
        5_000,
        `${label}: turn_ended`,
      );
      assert.equal(ended.params.event.stop_reason, response.stopReason);
      const after = await view(sessionId, label);
      assert.equal(after.lastEventId, eventIdOf(ended.params), `${label}: turn_ended is the session's last event`);
      assert.equal(after.run.status, "idle", `${label}: ${JSON.stringify(after.run)}`);
      assert.deepEqual(after.pending.approvals, [], `${label}: no approval pending after the turn`);
      const live = new Set(events(sessionId).map((e) => e.eventId));
      const missing = [];
      // A prompt's own user_message_chunk is not echoed to the connection
      // that sent it: it is the first event of its turn (after the previous
      // turn_ended, or the session's first).
      const echoes = new Set([1]);
      for (const e of events(sessionId)) if (e.kind === "agent:turn_ended") echoes.add(e.eventId + 1);
      for (let id = 1; id <= after.lastEventId; id++) if (!live.has(id) && !echoes.has(id)) missing.push(id);
      assert.deepEqual(missing, [], `${label}: event ids journaled but never sent live`);
      return { response, turnEvents: events(sessionId, mark, eventIdOf(ended.params)), view: after };
    }

    /** Wire index of the first frame berth wrote that fits `pred`. */
    const wireIndex = (pred, what) => {
      const at = server.wire.items.findIndex(pred);
      assert.ok(at >= 0, `${what} is on the wire`);
      return at;
    };

    /**
     * Starts "write the note" in a fresh session (or `session`), waits for the
     * permission request and checks it (1) and the held state (2). The answer
     * is still held when this returns.
     */
    async function askedWrite(label, session) {
      const { sessionId, cwd } = session ?? (await newSession(label));
      const note = path.join(cwd, "note.txt");
      const mark = lastEventId(sessionId);
      const pending = startPrompt(sessionId, "write the note");
      const alreadyAsked = asked.items.length;
      const req = await asked.waitFor(
        (r, all) => all.indexOf(r) >= alreadyAsked && r.params.sessionId === sessionId,
        10_000,
        `${label}: session/request_permission reaches the SDK handler`,
      );
      const announced = await waitUpdate(sessionId, mark, (u) => u.sessionUpdate === "tool_call", `${label}: the write's tool_call`);
      const call = announced.params.update;
      const toolCallId = call.toolCallId;
      const rawInput = { path: note, content: NOTE_CONTENT };
      const title = `write ${note}`;
      assert.equal(call.kind, "edit");
      // ACP: a tool_call without `status` is `pending` (berth leaves the default out).
      assert.equal(call.status ?? "pending", "pending");
      assert.deepEqual(call.rawInput, rawInput);

      // 1. The request, as the SDK handler saw it (zod-validated) and as berth wrote it.
      const { params } = req;
      assert.equal(params.sessionId, sessionId);
      assert.equal(params.toolCall.toolCallId, toolCallId, `${label}: ${JSON.stringify(params.toolCall)}`);
      assert.deepEqual(params.toolCall.rawInput, rawInput, `${label}: the write's arguments`);
      assert.equal(params.toolCall.title, title);
      assert.deepEqual(
        params.options.map((o) => [o.optionId, o.kind]),
        [
          ["allow", "allow_once"],
          ["reject", "reject_once"],
        ],
        `${label}: options ${JSON.stringify(params.options)}`,
      );
      for (const o of params.options) assert.match(o.name, /\S/, `${label}: option ${o.optionId} has a name`);
      const requestAt = wireIndex((m) => m.method === REQUEST_PERMISSION && m.id === req.requestId, `${label}: the request`);
      assert.deepEqual(server.wire.items[requestAt].params, params, `${label}: the SDK handed the wire params on unchanged`);
      const requested = await seen.waitFor(
        (n) => n.method === AGENT_EVENT && n.params.sessionId === sessionId && n.params.type === "permission_requested" && eventIdOf(n.params) > mark,
        5_000,
        `${label}: permission_requested event`,
      );
      assert.deepEqual(requested.params.event, {
        type: "permission_requested",
        request: { tool_call_id: toolCallId, title, kind: "edit", raw_input: rawInput },
      });
      const announcedAt = wireIndex(
        (m) => m.method === SESSION_UPDATE && m.params?.update?.sessionUpdate === "tool_call" && m.params.update.toolCallId === toolCallId,
        `${label}: the tool_call`,
      );
      const requestedAt = wireIndex(
        (m) => m.method === AGENT_EVENT && eventIdOf(m.params) === eventIdOf(requested.params) && m.params.sessionId === sessionId,
        `${label}: permission_requested`,
      );
      assert.ok(announcedAt < requestedAt && requestedAt < requestAt, `${label}: wire order tool_call ${announcedAt} < permission_requested ${requestedAt} < request ${requestAt}`);

      // 2. While the answer is held.
      const held = await view(sessionId, `${label} (held)`);
      assert.deepEqual(held.pending.approvals, [{ toolCallId, title, kind: "edit" }], `${label}: pending.approvals`);
      assert.equal(held.run.status, "running", `${label}: ${JSON.stringify(held.run)}`);
      assert.equal(held.lastEventId, eventIdOf(requested.params), `${label}: nothing journaled after permission_requested while held`);
      assert.deepEqual(
        events(sessionId, mark).filter((e) => e.kind === "tool_call_update" && e.update.toolCallId === toolCallId),
        [],
        `${label}: the call has no update while its approval is held`,
      );
      assert.ok(!fs.existsSync(note), `${label}: ${note} does not exist while the approval is held`);
      return { sessionId, cwd, note, mark, pending, req, toolCallId, title, rawInput, requested };
    }

    /** Resolves the held handler with `response` and waits until the SDK wrote it. */
    async function answer(req, response, label) {
      req.answered = true;
      req.answer(response);
      const written = await pollUntil(
        () => server.sent.find((m) => !("method" in m) && m.id === req.requestId),
        2_000,
        `${label}: the SDK writes the answer to request ${req.requestId}`,
        5,
      );
      assert.deepEqual(written.result, response, `${label}: the answer as written: ${JSON.stringify(written)}`);
      return written;
    }

    const callUpdates = (turnEvents, toolCallId) =>
      turnEvents.filter((e) => e.kind === "tool_call_update" && e.update.toolCallId === toolCallId);
    const resolvedOf = (turnEvents, toolCallId) =>
      turnEvents.filter((e) => e.kind === "agent:permission_resolved" && e.params.event.tool_call_id === toolCallId);
    const textOf = (evs) => evs.filter((e) => e.kind === "agent_message_chunk").map((e) => e.update.content.text).join("");

    const subtest = subtestRunner(t, { timeout: 20_000, server: () => server });

    // ------------------------------------------------------------ 1-3. reject
    await subtest("1-3. a rejected write never runs: failed with permission rejected, end_turn", async () => {
      const w = await askedWrite("reject");
      step(`reject: request ${w.req.requestId} for ${w.toolCallId} held, pending.approvals shows it`);
      await answer(w.req, { outcome: { outcome: "selected", optionId: "reject" } }, "reject");
      const { response, turnEvents } = await finishTurn(w.sessionId, w.pending, w.mark, "reject");
      assert.equal(response.stopReason, "end_turn", JSON.stringify(response));
      assert.ok(!fs.existsSync(w.note), `${w.note} must never exist after a reject`);

      const updates = callUpdates(turnEvents, w.toolCallId);
      assert.deepEqual(updates.map((e) => e.update.status), ["failed"], "the rejected call never ran");
      const failed = updates[0].update;
      assert.equal(failed.rawOutput?.permission?.outcome, "rejected", JSON.stringify(failed.rawOutput));
      assert.equal(failed.rawOutput.dispatched, false, JSON.stringify(failed.rawOutput));
      assert.match(JSON.stringify(failed.content), /reject/);

      const resolved = resolvedOf(turnEvents, w.toolCallId);
      assert.equal(resolved.length, 1);
      assert.deepEqual(resolved[0].params.event, {
        type: "permission_resolved",
        tool_call_id: w.toolCallId,
        decision: { outcome: "rejected", reason: "reject" },
      });
      assert.deepEqual(
        turnEvents.filter((e) => e.eventId >= w.requested.params.eventId).map((e) => e.kind),
        ["agent:permission_requested", "agent:permission_resolved", "tool_call_update", "agent_message_chunk", "agent:turn_ended"],
        "the turn after the request",
      );
      assert.equal(textOf(turnEvents), "Done with the note.");
      step("reject: failed (permission rejected), no file, end_turn");
    });

    // ------------------------------------------------------------ 4. allow
    await subtest("4. an allowed write runs: completed, the file holds the scripted content", async () => {
      const w = await askedWrite("allow");
      await answer(w.req, { outcome: { outcome: "selected", optionId: "allow" } }, "allow");
      const { response, turnEvents } = await finishTurn(w.sessionId, w.pending, w.mark, "allow");
      assert.equal(response.stopReason, "end_turn", JSON.stringify(response));
      assert.equal(fs.readFileSync(w.note, "utf8"), NOTE_CONTENT);
      const updates = callUpdates(turnEvents, w.toolCallId);
      assert.deepEqual(updates.map((e) => e.update.status), ["in_progress", "completed"], "the allowed call ran");
      const resolved = resolvedOf(turnEvents, w.toolCallId);
      assert.deepEqual(resolved.map((e) => e.params.event.decision), [{ outcome: "allowed" }]);
      assert.ok(resolved[0].eventId < updates[0].eventId, "resolved before the call runs");
      assert.equal(textOf(turnEvents), "Done with the note.");
      step("allow: in_progress, completed, file written, end_turn");
    });

    // ------------------------------------------------------------ 5. cancel
    await subtest("5. session/cancel while an approval is pending: cancelled, nothing written, late answer tolerated", async () => {
      const w = await askedWrite("cancel");
      const cancel = await within(agent.request(acp.methods.agent.session.cancel, { sessionId: w.sessionId }), 2_000, "session/cancel request");
      assert.deepEqual(cancel, { status: "cancelled" });
      const { response, turnEvents, view: idle } = await finishTurn(w.sessionId, w.pending, w.mark, "cancel", 2_000);
      assert.equal(response.stopReason, "cancelled", JSON.stringify(response));
      assert.equal(response._meta?.berth?.terminal?.kind, "user_cancelled", JSON.stringify(response._meta));
      assert.ok(!fs.existsSync(w.note), `${w.note} must never exist after a cancel`);
      const resolved = resolvedOf(turnEvents, w.toolCallId);
      assert.equal(resolved.length, 1, `one permission_resolved: ${JSON.stringify(turnEvents.map((e) => e.kind))}`);
      assert.equal(resolved[0].params.event.decision.outcome, "cancelled", JSON.stringify(resolved[0].params.event));
      const updates = callUpdates(turnEvents, w.toolCallId);
      assert.deepEqual(updates.map((e) => e.update.status), ["failed"], `the call never ran: ${JSON.stringify(updates.map((e) => e.update))}`);
      assert.equal(updates[0].update.rawOutput?.permission?.outcome, "cancelled", JSON.stringify(updates[0].update.rawOutput));
      assert.equal(updates[0].update.rawOutput.dispatched, false);
      // (The cancel's `control_outcome` receipt is journaled by the session
      // actor and may land anywhere after the request, so it is left out.)
      assert.deepEqual(
        turnEvents.filter((e) => e.eventId >= w.requested.params.eventId && e.kind !== "agent:control_outcome").map((e) => e.kind),
        ["agent:permission_requested", "agent:permission_resolved", "tool_call_update", "agent:turn_ended"],
        "the turn after the request: the model was not called again",
      );
      step(`cancel: prompt cancelled, permission_resolved cancelled, call updates ${JSON.stringify(updates.map((e) => e.update.status))}`);

      // ACP: after session/cancel the client answers its pending permission
      // requests `cancelled`. Here the turn is already over.
      const wireBefore = server.wire.items.length;
      await answer(w.req, { outcome: { outcome: "cancelled" } }, "late cancelled answer");
      // Frames are read in order: once this request is answered, the late answer was read.
      const later = await view(w.sessionId, "after the late answer");
      assert.equal(later.lastEventId, idle.lastEventId, "the late answer journaled nothing");
      assert.deepEqual(later.pending.approvals, []);
      assert.equal(later.run.status, "idle");
      const newFrames = server.wire.items.slice(wireBefore);
      assert.deepEqual(
        newFrames.filter((m) => "error" in m || NOTIFICATION_METHODS.has(m.method)),
        [],
        "berth wrote no error and no event for the late answer",
      );
      assert.ok(!fs.existsSync(w.note));
      assert.equal(server.child.exitCode, null, "berth is still running");

      // The session goes on: the next turn asks again (a new request) and runs once allowed.
      const again = await askedWrite("cancel, next turn", { sessionId: w.sessionId, cwd: w.cwd });
      assert.notEqual(again.req.requestId, w.req.requestId);
      assert.notEqual(again.toolCallId, w.toolCallId);
      await answer(again.req, { outcome: { outcome: "selected", optionId: "allow" } }, "cancel, next turn");
      const next = await finishTurn(w.sessionId, again.pending, again.mark, "cancel, next turn");
      assert.equal(next.response.stopReason, "end_turn", JSON.stringify(next.response));
      assert.equal(fs.readFileSync(w.note, "utf8"), NOTE_CONTENT);
      assert.deepEqual(callUpdates(next.turnEvents, again.toolCallId).map((e) => e.update.status), ["in_progress", "completed"]);
      step("cancel: late `cancelled` answer ignored quietly; the next turn asked again and wrote the note");
    });

    // ------------------------------------------------------------ 6. journaled
    await subtest("6. permission events are journaled and replayed by session/load", async () => {
      // Every request berth made was answered exactly once by the SDK.
      const requests = server.wire.items.filter((m) => m.method === REQUEST_PERMISSION);
      assert.equal(requests.length, 4, "reject, allow, cancel, cancel's next turn");
      assert.deepEqual(
        requests.map((m) => server.sent.filter((s) => !("method" in s) && s.id === m.id).length),
        [1, 1, 1, 1],
        "one answer per request",
      );
      let total = 0;
      for (const { sessionId, cwd, label } of sessions) {
        const isPermission = (e) => e.kind.startsWith("agent:") && PERMISSION_EVENTS.has(e.params.type);
        const live = events(sessionId).filter(isPermission);
        // On the wire, every permission event of the session carries its journal id.
        const onWire = server.wire.items.filter(
          (m) => m.method === AGENT_EVENT && m.params.sessionId === sessionId && PERMISSION_EVENTS.has(m.params.type),
        );
        for (const m of onWire) {
          assert.equal(typeof eventIdOf(m.params), "number", `${label}: ${JSON.stringify(m).slice(0, 300)}`);
          assert.equal(m.params.eventId, eventIdOf(m.params));
        }
        assert.equal(live.length, onWire.length);
        assert.equal(live.length, label === "cancel" ? 4 : 2, `${label}: ${JSON.stringify(live.map((e) => e.kind))}`);
        total += live.length;

        const loaded = await loadReplayed(sessionId, cwd, label);
        const last = loaded._meta.berth.lastEventId;
        const replayed = events(sessionId, 0, Infinity, { replayed: true }).filter(isPermission);
        assert.deepEqual(
          replayed.map((e) => [e.eventId, e.params.type, e.params.event]),
          live.map((e) => [e.eventId, e.params.type, e.params.event]),
          `${label}: replayed permission events equal the live ones`,
        );
      }
      // A replay re-sends no permission request.
      assert.equal(server.wire.items.filter((m) => m.method === REQUEST_PERMISSION).length, 4, "no request during the replays");
      step(`6. ${total} permission events in ${sessions.length} sessions, each journaled and replayed`);
    });

    // Every notification on the wire reached the SDK handlers, none rejected by zod.
    const onWire = () => server.wire.items.filter((m) => NOTIFICATION_METHODS.has(m.method)).length;
    await seen.waitFor(() => seen.items.length >= onWire(), 5_000, "the SDK delivered every notification on the wire");
    assertSdkDeliveredAll(server, seen);

    // Only after a failed subtest can a request still be held: answer it, since
    // berth does not exit on stdin EOF while a permission request is unanswered.
    for (const req of asked.items.filter((r) => !r.answered)) req.answer({ outcome: { outcome: "cancelled" } });
    await server.shutdown();
    conn.close();
  } catch (error) {
    reportServer(t, server);
    throw error;
  } finally {
    killEverything();
  }
});
