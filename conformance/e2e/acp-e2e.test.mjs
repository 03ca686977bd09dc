// End-to-end test of `berth serve` driven by the OFFICIAL ACP TypeScript SDK
// (`@agentclientprotocol/sdk`, pinned to 2.4.0 in package.json, with its `zod`
// peer dependency).
//
// How to run (Linux; Node >= 20; the test reads /proc):
//
//     cd <repo> && cargo build --bin berth
//     cd conformance/e2e && npm ci && node --test
//
// The berth binary is `$BERTH_BIN` (default `<repo>/target/debug/berth`). Each
// server is started as
//
//     berth serve --data-dir <temp dir> --model scripted:<this dir>/e2e-script.toml
//
// stdout carries only ACP frames (one JSON-RPC message per line), stderr logs.
// Set BERTH_E2E_KEEP=1 to keep the temp dirs and BERTH_E2E_DUMP=<dir> to write
// every frame (both directions, send order then receive order) and each
// server's stderr there. Takes ~1 s on a warm machine. The server process, wire
// tap, SDK client and cleanup are in harness.mjs.
//
// What it proves, in order, over a real process and the SDK's client app
// (`client({...}).onNotification(...)` + `connect`/`connectWith` over
// `ndJsonStream(Writable.toWeb(stdin), Readable.toWeb(stdout))`):
//
//  1. `initialize` advertises protocol 1, loadSession and list/resume/close.
//  2. `session/new` in a fresh temp dir.
//  3. "shell and write": `tool_call` (kind execute, then edit) and
//     `tool_call_update`s (in_progress → completed) arrive, and the file is on disk.
//  4. "long sleep": once the `sleep 60` tool call is in_progress, `session/cancel`
//     sent as a JSON-RPC *request* answers `{status: "cancelled"}`, the prompt
//     answers `cancelled` (terminal user_cancelled / user) within 2 s, the sleep's
//     `tool_call_update` goes in_progress → failed ("abandoned"), and the
//     `sleep 60` process is dead within 2 s (gone from /proc, or a killed zombie
//     its new parent has not reaped yet: berth's `sh` forks `sleep`, so after
//     the group kill the orphan belongs to pid 1); a second cancel answers
//     `already_cancelled`; an unknown session answers -32004. The SDK only
//     knows `session/cancel` as a notification (`methods.agent.session.cancel`
//     is in its notification table), so the request form goes through the SDK's
//     generic `ClientContext.request(method, params)` (which sends any method
//     name as a request and, having no response spec for it, returns the raw
//     result).
//     The same is then done with the SDK's own notification form
//     (`ctx.notify(methods.agent.session.cancel, …)`).
//  5. `session/list` shows the session with its `_meta.berth` fields.
//  6. "slow steps": after 2 `agent_message_chunk`s the server is SIGKILLed.
//  7. A new server on the same data dir: `session/load` replays every event
//     (eventIds 1..N, `_meta.berth.replayed: true`, all before the response,
//     covering everything the client saw before the kill); the last one is the
//     `turn_ended` `_berth/agentEvent` that seals the killed turn as
//     `process_restarted` / `harness`.
//  8. A third server: `session/resume` attaches without replay and a "hello"
//     prompt ends with `end_turn`.
//
// Besides the SDK's view (handlers that got zod-validated params), every frame
// is tapped on the wire before the SDK sees it: wire order is what proves
// "replayed before the response", and the tap proves the SDK dropped nothing
// (the SDK validates each `session/update` with zod and only logs, via
// console.error, one it rejects; that log is captured and must stay empty).

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
  assertBerthBin,
  assertSdkDeliveredAll,
  clientApp,
  descendants,
  eventIdOf,
  initialize,
  killEverything,
  maxEventId,
  pollUntil,
  procState,
  processTable,
  prompt,
  reportServer,
  stepper,
  strayPids,
  tempRoot,
  within,
} from "./harness.mjs";

const SCRIPT = path.join(E2E_DIR, "e2e-script.toml");
const CLIENT = "berth-e2e";
const startServer = (dataDir, label) => new BerthServer({ label, dataDir, script: SCRIPT });

// ---------------------------------------------------------------- helpers

function assertEndTurn(response, label) {
  assert.equal(response.stopReason, "end_turn", `${label}: ${JSON.stringify(response)}`);
  const berth = response._meta?.berth;
  assert.equal(berth?.terminal?.kind, "completed", label);
  assert.equal(berth?.terminal?.owner, "agent", label);
  assert.equal(typeof berth?.turnId, "string", label);
  assert.equal(typeof berth?.usage, "object", label);
}

/** Waits for the SDK to deliver the `turn_ended` of `turnId` and checks it against the prompt answer. */
async function assertTurnEnded(seen, sessionId, response, label) {
  const { turnId, terminal, usage } = response._meta.berth;
  const { params } = await seen.waitFor(
    (n) => n.method === AGENT_EVENT && n.params.type === "turn_ended" && n.params.event?.turn_id === turnId,
    5_000,
    `${label}: turn_ended ${AGENT_EVENT}`,
  );
  assert.equal(params.sessionId, sessionId);
  assert.equal(typeof params.eventId, "number");
  assert.equal(params.eventId, eventIdOf(params));
  assert.equal(typeof params.at, "string");
  assert.equal(params.event.type, "turn_ended");
  assert.equal(params.event.stop_reason, response.stopReason);
  assert.deepEqual(params.event.terminal, terminal);
  assert.deepEqual(params.event.usage, usage);
  return params;
}

/** Updates the SDK delivered for `sessionId` with eventId > `after`. */
function updatesAfter(seen, sessionId, after) {
  return seen.items
    .filter((n) => n.method === acp.methods.client.session.update)
    .map((n) => n.params)
    .filter((p) => p.sessionId === sessionId && eventIdOf(p) > after)
    .map((p) => ({ ...p.update, eventId: eventIdOf(p) }));
}

// ---------------------------------------------------------------- the test

test("berth serve end to end with @agentclientprotocol/sdk 2.4.0", { timeout: 120_000 }, async (t) => {
  assertBerthBin();
  const root = tempRoot("berth-e2e-");
  const dataDir = path.join(root, "data");
  const workDir = path.join(root, "work");
  fs.mkdirSync(workDir);
  const step = stepper(t);
  let current;

  try {
    // ------------------------------------------------ phase 1: first server
    const s1 = (current = startServer(dataDir, "server 1"));
    const seen1 = new Recorder();
    // `connect` (not `connectWith`) because this server gets SIGKILLed mid-turn:
    // `connectWith` would reject its whole operation when the stream closes.
    const conn1 = clientApp(seen1, CLIENT).connect(s1.stream);
    const agent = conn1.agent;

    await initialize(agent, CLIENT);
    step("initialized");

    const created = await within(
      agent.request(acp.methods.agent.session.new, { cwd: workDir, mcpServers: [] }),
      10_000,
      "session/new",
    );
    const sessionId = created.sessionId;
    assert.match(sessionId, /\S/);
    assert.ok(created.modes?.currentModeId, `modes: ${JSON.stringify(created)}`);
    assert.ok(Array.isArray(created.configOptions), "configOptions");
    assert.equal(created.session, undefined, "no custom root field");
    assert.equal(created._meta?.berth?.session?.sessionId, sessionId, "session/new answers the session entry in _meta.berth");
    step(`session ${sessionId}`);

    // ---- "shell and write": tool calls with kinds and statuses, file on disk
    const r1 = await within(prompt(agent, sessionId, "shell and write"), 20_000, "prompt 'shell and write'");
    assertEndTurn(r1, "shell and write");
    await assertTurnEnded(seen1, sessionId, r1, "shell and write");
    {
      const updates = updatesAfter(seen1, sessionId, 0);
      assert.ok(
        !updates.some((u) => u.sessionUpdate === "user_message_chunk"),
        "the prompt is not echoed to the connection that sent it",
      );
      assert.ok(updates.some((u) => u.sessionUpdate === "agent_thought_chunk"), "agent_thought_chunk");
      assert.ok(
        updates.some((u) => u.sessionUpdate === "agent_message_chunk" && u.content?.text?.includes("e2e-note.txt")),
        "agent_message_chunk",
      );
      const shell = updates.find((u) => u.sessionUpdate === "tool_call" && u.rawInput?.command === "echo hello-from-shell");
      assert.ok(shell, `shell tool_call in ${JSON.stringify(updates)}`);
      assert.equal(shell.kind, "execute");
      const write = updates.find((u) => u.sessionUpdate === "tool_call" && u.kind === "edit");
      assert.ok(write, "write_file tool_call");
      assert.equal(write.rawInput?.path, path.join(workDir, "e2e-note.txt"));
      assert.ok(shell.eventId < write.eventId, "shell runs before write_file");
      for (const call of [shell, write]) {
        const statuses = updates
          .filter((u) => u.sessionUpdate === "tool_call_update" && u.toolCallId === call.toolCallId)
          .map((u) => u.status);
        assert.deepEqual(statuses, ["in_progress", "completed"], `statuses of ${call.toolCallId}`);
      }
      const shellDone = updates.find(
        (u) => u.sessionUpdate === "tool_call_update" && u.toolCallId === shell.toolCallId && u.status === "completed",
      );
      assert.match(JSON.stringify([shellDone.rawOutput, shellDone.content]), /hello-from-shell/);
      const ids = updates.map((u) => u.eventId);
      assert.deepEqual(ids, [...ids].sort((a, b) => a - b), "eventIds increase");
    }
    assert.equal(fs.readFileSync(path.join(workDir, "e2e-note.txt"), "utf8"), "written by the berth e2e test\n");
    step("shell and write: tool calls seen, file on disk");

    // ---- "long sleep" + session/cancel as a REQUEST
    const turnIds = [r1._meta.berth.turnId];
    const cancelSleep = async (label, sendCancel) => {
      const mark = maxEventId(s1);
      const pending = prompt(agent, sessionId, "long sleep");
      pending.catch(() => {});
      const call = await seen1.waitFor(
        (n) => n.params.update?.sessionUpdate === "tool_call" && n.params.update.rawInput?.command === "sleep 60" && eventIdOf(n.params) > mark,
        10_000,
        `${label}: sleep tool_call`,
      );
      const toolCallId = call.params.update.toolCallId;
      assert.equal(call.params.update.kind, "execute");
      await seen1.waitFor(
        (n) => n.params.update?.sessionUpdate === "tool_call_update" && n.params.update.toolCallId === toolCallId && n.params.update.status === "in_progress",
        10_000,
        `${label}: sleep in_progress`,
      );
      const sleep = await pollUntil(
        () => descendants(s1.pid).find((p) => p.cmdline === "sleep 60" && p.state !== "Z"),
        5_000,
        `${label}: a 'sleep 60' process under berth (pid ${s1.pid})`,
      );
      strayPids.add(sleep.pid);
      step(`${label}: sleep 60 running as pid ${sleep.pid} (pgid ${sleep.pgid})`);

      const cancelledAt = Date.now();
      const answer = await sendCancel();
      const response = await within(pending, 2_000, `${label}: prompt answers within 2 s of the cancel`);
      const took = Date.now() - cancelledAt;
      assert.ok(took <= 2_000, `${label}: prompt answered ${took} ms after the cancel`);
      assert.equal(response.stopReason, "cancelled", JSON.stringify(response));
      assert.equal(response._meta?.berth?.terminal?.kind, "user_cancelled");
      assert.equal(response._meta?.berth?.terminal?.owner, "user");
      await assertTurnEnded(seen1, sessionId, response, label);
      turnIds.push(response._meta.berth.turnId);
      // The interrupted tool call is closed as failed ("abandoned"), with a reason.
      const sleepUpdates = updatesAfter(seen1, sessionId, mark).filter(
        (u) => u.sessionUpdate === "tool_call_update" && u.toolCallId === toolCallId,
      );
      assert.deepEqual(sleepUpdates.map((u) => u.status), ["in_progress", "failed"], `${label}: sleep tool call statuses`);
      assert.match(JSON.stringify([sleepUpdates[1].rawOutput, sleepUpdates[1].content]), /abandoned/);
      // Dead means gone from /proc or a zombie: berth kills the process group, the
      // shell it started dies and is reaped by berth, and the orphaned `sleep` is
      // reaped by whatever init the machine runs, whenever that gets to it.
      const final = await pollUntil(
        () => {
          const state = procState(sleep.pid);
          if (state === null) return "gone";
          if (state !== "Z") return null;
          const parent = processTable().find((p) => p.pid === sleep.pid)?.ppid;
          return `a zombie (killed; parent pid ${parent} has not reaped it yet)`;
        },
        2_000 - Math.min(Date.now() - cancelledAt, 1_900),
        `${label}: sleep pid ${sleep.pid} dead within 2 s of the cancel (state ${procState(sleep.pid)})`,
      );
      strayPids.delete(sleep.pid);
      step(`${label}: prompt cancelled after ${took} ms, sleep process ${final} ${Date.now() - cancelledAt} ms after the cancel`);
      return answer;
    };

    // The SDK has no request form of session/cancel (it is a notification in its
    // method tables), so use its generic request(method, params).
    const first = await cancelSleep("cancel request", () =>
      within(agent.request(acp.methods.agent.session.cancel, { sessionId }), 2_000, "session/cancel request"),
    );
    assert.deepEqual(first, { status: "cancelled" });
    const again = await within(agent.request(acp.methods.agent.session.cancel, { sessionId }), 2_000, "second cancel");
    assert.deepEqual(again, { status: "already_cancelled" });
    await assert.rejects(
      within(agent.request(acp.methods.agent.session.cancel, { sessionId: "sess_does_not_exist" }), 2_000, "cancel unknown"),
      (error) => {
        assert.ok(error instanceof acp.RequestError, String(error));
        assert.equal(error.code, -32004, `${error.code} ${error.message}`);
        return true;
      },
    );
    step("cancel: cancelled, already_cancelled, -32004");

    // The SDK's own (notification) form of session/cancel stops a turn too.
    await cancelSleep("cancel notification", () =>
      within(agent.notify(acp.methods.agent.session.cancel, { sessionId }), 2_000, "session/cancel notification"),
    );
    const afterNotify = await within(agent.request(acp.methods.agent.session.cancel, { sessionId }), 2_000, "cancel after notify");
    assert.deepEqual(afterNotify, { status: "already_cancelled" });

    // ---- session/list
    const listed = await within(agent.request(acp.methods.agent.session.list, {}), 5_000, "session/list");
    const entry = listed.sessions.find((s) => s.sessionId === sessionId);
    assert.ok(entry, `session in ${JSON.stringify(listed)}`);
    assert.equal(entry.cwd, workDir);
    assert.equal(entry.title, "shell and write");
    assert.ok(!Number.isNaN(Date.parse(entry.updatedAt)), `updatedAt ${entry.updatedAt}`);
    // Facts for operators (`berth ctl ps`): state word, labels, creation
    // (and the creating actor), and what the sealed turns spent.
    const { state, labels, createdAt, createdBy, spend, ...berthCore } = entry._meta?.berth ?? {};
    assert.equal(state, "idle");
    assert.equal(typeof createdBy, "string", `createdBy ${createdBy}`);
    assert.deepEqual(labels, []);
    assert.ok(!Number.isNaN(Date.parse(createdAt)), `createdAt ${createdAt}`);
    for (const key of ["inputTokens", "outputTokens", "toolCalls", "costMicroUsd", "wallMs"]) {
      assert.equal(typeof spend?.[key], "number", `spend.${key} in ${JSON.stringify(spend)}`);
    }
    assert.ok(spend.toolCalls > 0, `a turn with tool calls spent them: ${JSON.stringify(spend)}`);
    assert.deepEqual(berthCore, {
      liveState: "live",
      activePrompt: false,
      currentModeId: created.modes.currentModeId,
      lastEventId: maxEventId(s1),
      attachableRoles: entry._meta?.berth?.attachableRoles,
    });
    assert.ok(Array.isArray(entry._meta.berth.attachableRoles) && entry._meta.berth.attachableRoles.length > 0);
    step("session/list");
    assertSdkDeliveredAll(s1, seen1);

    // ---- "slow steps", SIGKILL after 2 agent_message_chunks
    const beforeSlow = maxEventId(s1);
    const slow = prompt(agent, sessionId, "slow steps");
    slow.catch(() => {});
    await seen1.waitFor(
      (_, all) =>
        all.filter((n) => n.params.update?.sessionUpdate === "agent_message_chunk" && eventIdOf(n.params) > beforeSlow).length >= 2,
      10_000,
      "2 agent_message_chunks of 'slow steps'",
    );
    // Everything the client saw (on the wire, whether or not the SDK handled it
    // yet) that is a journaled event. The receipt of a control naming an unknown
    // session has no session log to live in, so it carries no eventId.
    const seenBeforeKill = new Map(
      s1.wire.items
        .filter((m) => NOTIFICATION_METHODS.has(m.method) && eventIdOf(m.params) !== undefined)
        .map((m) => [eventIdOf(m.params), m]),
    );
    const highestSeen = maxEventId(s1);
    s1.kill();
    const exit1 = await within(s1.exited, 5_000, "server 1 dies on SIGKILL");
    assert.equal(exit1.signal, "SIGKILL");
    await assert.rejects(within(slow, 5_000, "the killed prompt rejects"));
    conn1.close();
    assert.ok(highestSeen > beforeSlow + 2, "saw the slow turn's events");
    step(`SIGKILLed server 1 mid-turn; highest eventId seen ${highestSeen}`);

    // ------------------------------------------------ phase 2: restart, load
    const s2 = (current = startServer(dataDir, "server 2"));
    const seen2 = new Recorder();
    let lastEventId;
    await clientApp(seen2, CLIENT).connectWith(s2.stream, async (agent2) => {
      await initialize(agent2, CLIENT);
      const loadStart = s2.wire.items.length;
      const loaded = await within(
        agent2.request(acp.methods.agent.session.load, { sessionId, cwd: workDir, mcpServers: [] }),
        10_000,
        "session/load",
      );
      const deliveredAtResponse = seen2.items.length;
      const responseAt = await s2.responseIndex(acp.methods.agent.session.load, 5_000);
      const replayed = s2.wire.items
        .slice(loadStart, responseAt)
        .filter((m) => NOTIFICATION_METHODS.has(m.method));
      // Nothing was sent for the session after the response (only live events would be).
      assert.deepEqual(
        s2.wire.items.slice(responseAt + 1).filter((m) => NOTIFICATION_METHODS.has(m.method)),
        [],
        "no replay after the load response",
      );
      lastEventId = loaded._meta?.berth?.lastEventId;
      assert.equal(typeof lastEventId, "number", JSON.stringify(loaded));
      assert.ok(loaded.modes, "load answers modes");
      assert.ok(Array.isArray(loaded.configOptions), "load answers configOptions");

      const ids = replayed.map((m) => eventIdOf(m.params));
      assert.deepEqual(ids, Array.from({ length: lastEventId }, (_, i) => i + 1), "replayed eventIds are 1..N in order");
      for (const m of replayed) {
        assert.equal(m.params.sessionId, sessionId);
        assert.equal(m.params._meta?.berth?.replayed, true, `replayed flag on ${JSON.stringify(m)}`);
      }
      // The load answer lists the replayed events in `_meta.berth.replayed`
      // (ACP forbids custom root fields).
      assert.equal(loaded.replayed, undefined, "no custom root field");
      const listedReplay = loaded._meta?.berth?.replayed;
      assert.deepEqual(
        listedReplay?.map((r) => r.eventId),
        ids,
        "the load answer lists the replayed events",
      );
      assert.deepEqual(
        listedReplay.map((r) => r.type),
        replayed.map((m) => (m.method === AGENT_EVENT ? m.params.type : m.params.update.sessionUpdate === "user_message_chunk" ? "turn_started" : m.params.update.sessionUpdate)),
      );

      // Everything seen before the kill was durable, and replays identically.
      assert.ok(lastEventId > highestSeen, `N=${lastEventId} covers the ${highestSeen} events seen before the kill`);
      for (const [eventId, live] of seenBeforeKill) {
        const again = replayed[eventId - 1];
        assert.equal(again.method, live.method, `event ${eventId}`);
        const strip = (params) => ({ ...params, _meta: { berth: { eventId: eventIdOf(params) } } });
        assert.deepEqual(strip(again.params), strip(live.params), `event ${eventId} replays as it was sent live`);
      }

      // The killed turn is sealed by the restart.
      const last = replayed.at(-1);
      assert.equal(last.method, AGENT_EVENT);
      assert.equal(last.params.type, "turn_ended");
      assert.equal(last.params.event.stop_reason, "cancelled");
      assert.equal(last.params.event.terminal.kind, "process_restarted");
      assert.equal(last.params.event.terminal.owner, "harness");
      assert.match(last.params.event.terminal.reason, /restart/i);
      assert.ok(!turnIds.includes(last.params.event.turn_id), "it seals the slow turn, not an earlier one");
      const ended = replayed.filter((m) => m.method === AGENT_EVENT && m.params.type === "turn_ended");
      assert.deepEqual(ended.map((m) => m.params.event.turn_id), [...turnIds, last.params.event.turn_id]);
      assert.ok(
        replayed.filter((m) => eventIdOf(m.params) > beforeSlow && m.params.update?.sessionUpdate === "agent_message_chunk").length >= 2,
      );

      // The SDK handed every replayed notification to the handlers too (wire
      // order is what counts; the SDK may resolve the response promise a few
      // microtasks before its last notification handler has run).
      t.diagnostic(`SDK handlers had run for ${deliveredAtResponse}/${replayed.length} replayed notifications when the load promise resolved`);
      await seen2.waitFor((_, all) => all.length >= replayed.length, 5_000, "SDK delivers the replay");
      assertSdkDeliveredAll(s2, seen2);
      assert.ok(seen2.items.every((n) => n.params._meta?.berth?.replayed === true));

      const relisted = await within(agent2.request(acp.methods.agent.session.list, {}), 5_000, "session/list after restart");
      const entry2 = relisted.sessions.find((s) => s.sessionId === sessionId);
      assert.equal(entry2?._meta?.berth?.activePrompt, false);
      assert.equal(entry2?._meta?.berth?.lastEventId, lastEventId);
    });
    step(`restarted, session/load replayed ${lastEventId} events`);
    await s2.shutdown();

    // ------------------------------------------------ phase 3: resume, prompt
    const s3 = (current = startServer(dataDir, "server 3"));
    const seen3 = new Recorder();
    await clientApp(seen3, CLIENT).connectWith(s3.stream, async (agent3) => {
      await initialize(agent3, CLIENT);
      const resumeStart = s3.wire.items.length;
      const resumed = await within(
        agent3.request(acp.methods.agent.session.resume, { sessionId, cwd: workDir, mcpServers: [] }),
        10_000,
        "session/resume",
      );
      const responseAt = await s3.responseIndex(acp.methods.agent.session.resume, 5_000);
      assert.deepEqual(
        s3.wire.items.slice(resumeStart, responseAt).filter((m) => NOTIFICATION_METHODS.has(m.method)),
        [],
        "resume replays nothing",
      );
      assert.equal(resumed._meta?.berth?.lastEventId, lastEventId);

      const hello = await within(prompt(agent3, sessionId, "hello"), 10_000, "prompt 'hello' after resume");
      assertEndTurn(hello, "hello");
      const ended = await assertTurnEnded(seen3, sessionId, hello, "hello");
      const updates = updatesAfter(seen3, sessionId, 0);
      // lastEventId + 1 is the prompt's own user_message_chunk, which is not
      // echoed to the connection that sent it.
      assert.equal(updates[0]?.eventId, lastEventId + 2, "live events continue after the replayed ones");
      assert.ok(updates.some((u) => u.sessionUpdate === "agent_message_chunk" && u.content?.text === "Hello from the e2e script."));
      assert.ok(seen3.items.every((n) => n.params._meta?.berth?.replayed !== true), "live events are not marked replayed");
      assert.equal(ended.eventId, maxEventId(s3));
      assertSdkDeliveredAll(s3, seen3);
    });
    step("session/resume + hello: end_turn");
    await s3.shutdown();
    current = undefined;
  } catch (error) {
    for (const server of [current].filter(Boolean)) reportServer(t, server, { frames: 15, frameChars: 400 });
    throw error;
  } finally {
    killEverything();
  }
});
