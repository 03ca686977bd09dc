// End-to-end test of berth's COMPLETION JUDGE against a steer, over a real
// `berth serve` process, driven by the OFFICIAL ACP TypeScript SDK
// (`@agentclientprotocol/sdk` 2.4.0, see package.json).
//
// How to run (Linux; Node >= 20):
//
//     cd <repo> && cargo build --bin berth
//     cd conformance/e2e && npm ci && node --test
//
// The berth binary is `$BERTH_BIN` (default `<repo>/target/debug/berth`). The
// server is `berth serve --config <temp dir>/berth.toml --data-dir <temp dir>
// --model scripted:<this dir>/completion-judge-script.toml`, the config file
// holding just `completion_judge = true`. BERTH_E2E_KEEP=1 keeps the temp dir
// and BERTH_E2E_DUMP=<dir> writes every frame (both directions) and the
// server's stderr there. Takes ~0.2 s. The server process, wire tap, SDK
// client and cleanup are in harness.mjs.
//
// The judge (`ObjectiveJudge`) runs once per turn, when the model ends it: if
// the final answer mentions fewer than half of the prompt's words of 4+
// letters, it registers a `corrective` directive on key `objective`
// restating the request ("Complete the original request: <prompt>"). A
// delivered steer registers a `contract` directive on the same key, which
// outranks it. Every registration is journaled and sent as a
// `_berth/agentEvent` `directive`: `params.event = {type: "directive",
// directive: {authority, key, text, source}, applied, overruled_by?}`.
//
//  a. No steer: a prompt whose answer meets it gets no directive; a prompt
//     whose answer does not gets one `completion_judge` / `corrective` /
//     `applied: true` directive between the two answers, the model answers the
//     restatement (the loop goes on exactly once), the turn ends `end_turn`.
//  b. Steer mid-turn (as in mid-turn-control.test.mjs scenario 2, but sent
//     while a shell call the test holds open runs, so no timer is raced): the
//     final answer follows the steer although it does not meet the prompt;
//     the turn's directives are `steer` / `contract` / applied, then
//     `completion_judge` / `corrective` / NOT applied, `overruled_by` the steer;
//     the model never sees the restatement; `end_turn`.
//  c. `session/load` replays exactly the directive events seen live (they are
//     journaled).
//
// Every wait is for a specific frame, under a hard timeout; every event id of
// a session must arrive live (checked against the session view after each
// turn). The server (and anything it left behind) is SIGKILLed at the end.

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
  eventIdOf,
  initialize,
  killEverything,
  reportServer,
  sessionHelpers,
  stepper,
  subtestRunner,
  tempRoot,
  within, sessionEvents } from "./harness.mjs";

const SCRIPT = path.join(E2E_DIR, "completion-judge-script.toml");
const CLIENT = "berth-e2e-completion-judge";

// ---------------------------------------------------------------- the test

test("berth completion judge vs steer end to end with @agentclientprotocol/sdk 2.4.0", { timeout: 60_000 }, async (t) => {
  assertBerthBin();
  const root = tempRoot("berth-e2e-judge-");
  const config = path.join(root, "berth.toml");
  fs.writeFileSync(config, "completion_judge = true\n");
  const step = stepper(t);

  const server = new BerthServer({
    label: "judge server",
    config,
    dataDir: path.join(root, "data"),
    script: SCRIPT,
    dumpPrefix: "completion-judge-",
  });
  try {
    const seen = new Recorder();
    const conn = clientApp(seen, CLIENT).connect(server.stream);
    const agent = conn.agent;
    await initialize(agent, CLIENT);

    // ------------------------------------------------------------ helpers

    const { sessions, newSession, lastEventId, waitUpdate, startPrompt, runningCall, loadReplayed } = sessionHelpers({ agent, seen, server, root });

    /** The session's events the SDK delivered (see `sessionEvents` in harness.mjs). */
    const events = (sessionId, after, upTo, options) => sessionEvents(seen, sessionId, after, upTo, options);

    /**
     * Awaits the prompt answer and its `turn_ended`, checks that every event
     * id of the session (per its view) arrived live, and returns the turn's
     * events.
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
      const view = await within(agent.request("berth.session_view.query", { sessionId }), 5_000, `${label}: session view`);
      assert.equal(view.lastEventId, eventIdOf(ended.params), `${label}: turn_ended is the session's last event`);
      const live = new Set(events(sessionId).map((e) => e.eventId));
      const missing = [];
      // A prompt's own user_message_chunk is not echoed to the connection
      // that sent it: it is the first event of its turn (after the previous
      // turn_ended, or the session's first).
      const echoes = new Set([1]);
      for (const e of events(sessionId)) if (e.kind === "agent:turn_ended") echoes.add(e.eventId + 1);
      for (let id = 1; id <= view.lastEventId; id++) if (!live.has(id) && !echoes.has(id)) missing.push(id);
      assert.deepEqual(missing, [], `${label}: event ids journaled but never sent live`);
      return { response, turnEvents: events(sessionId, mark, eventIdOf(ended.params)) };
    }

    async function runTurn(sessionId, text, label) {
      const mark = lastEventId(sessionId);
      return finishTurn(sessionId, startPrompt(sessionId, text), mark, label);
    }

    const textOf = (evs) => evs.filter((e) => e.kind === "agent_message_chunk").map((e) => e.update.content.text).join("");
    const directivesOf = (evs) => evs.filter((e) => e.kind === "agent:directive");
    const judgeDirective = (prompt) => ({
      authority: "corrective",
      key: "objective",
      text: `Complete the original request: ${prompt}`,
      source: "completion_judge",
    });
    /** The turn's event kinds from the first agent_message_chunk on. */
    const kindsFromAnswer = (evs) => evs.slice(evs.findIndex((e) => e.kind === "agent_message_chunk")).map((e) => e.kind);

    const subtest = subtestRunner(t, { timeout: 20_000, server: () => server });

    // ------------------------------------------------------------ a. judge alone
    await subtest("a. without a steer, the judge restates an unmet request once and the model completes it", async () => {
      const { sessionId } = await newSession("judge");

      // Control: an answer that meets the request (list / open / tickets) draws no directive.
      {
        const { response, turnEvents } = await runTurn(sessionId, "list the open tickets", "met request");
        assert.equal(response.stopReason, "end_turn", JSON.stringify(response));
        assert.deepEqual(directivesOf(turnEvents), [], "no directive for a met request");
        assert.equal(textOf(turnEvents), "Listed the open tickets: there are none.");
        assert.deepEqual(kindsFromAnswer(turnEvents), ["agent_message_chunk", "agent:turn_ended"]);
      }

      const prompt = "summarize the release notes";
      const { response, turnEvents } = await runTurn(sessionId, prompt, "unmet request");
      assert.equal(response.stopReason, "end_turn", JSON.stringify(response));
      assert.equal(response._meta.berth.terminal?.kind, "completed", JSON.stringify(response._meta.berth));
      const directives = directivesOf(turnEvents);
      assert.equal(directives.length, 1, `one directive: ${JSON.stringify(directives.map((e) => e.params.event))}`);
      const judged = directives[0];
      assert.deepEqual(judged.params.event, { type: "directive", directive: judgeDirective(prompt), applied: true });
      assert.equal(judged.params.eventId, judged.eventId);
      // The first answer ended the turn, the judge objected, the model read the
      // restatement (it matched its rule) and answered once more; the judge
      // does not run twice.
      assert.equal(textOf(turnEvents.filter((e) => e.eventId < judged.eventId)), "Read the changelog instead.");
      assert.equal(
        textOf(turnEvents.filter((e) => e.eventId > judged.eventId)),
        "Summarized the release notes: two fixes and one new flag.",
      );
      assert.deepEqual(kindsFromAnswer(turnEvents), [
        "agent_message_chunk",
        "agent:directive",
        "agent_message_chunk",
        "agent:turn_ended",
      ]);
      // A directive is not a user message: nothing is echoed for it (nor
      // the prompt, to the connection that sent it).
      assert.deepEqual(
        turnEvents.filter((e) => e.kind === "user_message_chunk").map((e) => e.update.content.text),
        [],
        "nothing is echoed",
      );
      step("a. met request: no directive; unmet request: completion_judge corrective applied, answered once, end_turn");
    });

    // ------------------------------------------------------------ b. steer vs judge
    await subtest("b. a steer overrules the judge: the final answer follows the steer", async () => {
      const { sessionId, cwd } = await newSession("steer");
      const prompt = "rewrite the whole parser module";
      const steerText = "prefer patching the tokenizer only";
      const mark = lastEventId(sessionId);
      const pending = startPrompt(sessionId, prompt);
      // The model said its first line and called a shell that waits for
      // `release`: the steer is sent while that call runs.
      const call = await runningCall(sessionId, mark, "release", "steer: the held shell call");
      const toolCallId = call.params.update.toolCallId;
      const steer = await within(
        agent.request("session/inject", { sessionId, mode: "steer", content: steerText }),
        5_000,
        "session/inject steer",
      );
      assert.equal(steer.status, "accepted", JSON.stringify(steer));
      assert.match(steer.messageId, /\S/);
      fs.writeFileSync(path.join(cwd, "release"), "");

      const { response, turnEvents } = await finishTurn(sessionId, pending, mark, "steer");
      assert.equal(response.stopReason, "end_turn", JSON.stringify(response));
      assert.equal(response._meta.berth.terminal?.kind, "completed", JSON.stringify(response._meta.berth));

      const echoes = turnEvents.filter((e) => e.kind === "user_message_chunk" && e.update.messageId === steer.messageId);
      assert.equal(echoes.length, 1, `one echo of the steer in ${JSON.stringify(turnEvents.map((e) => e.kind))}`);
      const echo = echoes[0];
      assert.deepEqual(echo.update.content, { type: "text", text: steerText });
      // Delivered once the running batch settled (post_tool_dispatch).
      const shellStatuses = turnEvents.filter((e) => e.kind === "tool_call_update" && e.update.toolCallId === toolCallId);
      assert.deepEqual(shellStatuses.map((e) => e.update.status), ["in_progress", "completed"], "the held call ran");
      assert.ok(shellStatuses.at(-1).eventId < echo.eventId, "the steer lands after the batch settled");

      // The directives: the steer's contract (applied), then the judge's
      // corrective on the same key, overruled by it.
      const steerDirective = { authority: "contract", key: "objective", text: steerText, source: "steer" };
      assert.deepEqual(
        directivesOf(turnEvents).map((e) => e.params.event),
        [
          { type: "directive", directive: steerDirective, applied: true },
          { type: "directive", directive: judgeDirective(prompt), applied: false, overruled_by: steerDirective },
        ],
        "the turn's directive events",
      );
      const [steered, overruled] = directivesOf(turnEvents);
      assert.equal(overruled.params.event.overruled_by.source, "steer");
      // After the echo: its signed drain receipt (delivered at
      // post_tool_dispatch), the steer's directive, the answer to it, the
      // judge's overruled objection, and the end; the model never saw the
      // restatement.
      const drain = turnEvents.find((e) => e.eventId === echo.eventId + 1);
      assert.equal(drain?.kind, "agent:drain_decision_receipt", "the echo's drain receipt follows it");
      assert.equal(drain.params.event.item.message_id, steer.messageId);
      assert.equal(drain.params.event.seam, "post_tool_dispatch");
      assert.equal(drain.params.event.action, "delivered");
      assert.equal(drain.params.event.signature.alg, "HMAC-SHA256");
      assert.deepEqual(
        turnEvents.filter((e) => e.eventId > echo.eventId + 1).map((e) => e.kind),
        ["agent:directive", "agent_message_chunk", "agent:directive", "agent:turn_ended"],
        "the turn's tail after the steer",
      );
      assert.ok(steered.eventId > echo.eventId && overruled.eventId > steered.eventId);
      assert.equal(textOf(turnEvents.filter((e) => e.eventId > steered.eventId)), "Patched only the tokenizer.");
      assert.equal(textOf(turnEvents), "Starting the parser rewrite.Patched only the tokenizer.");
      assert.ok(!textOf(turnEvents).includes("Rewrote the whole parser module."), "the unsteered answer never played");
      assert.ok(!textOf(turnEvents).includes("Went back to the original request."), "the restatement never reached the model");
      step(`b. steer ${steer.messageId}: contract applied, judge's corrective overruled, final answer "Patched only the tokenizer."`);
    });

    // ------------------------------------------------------------ c. journaled
    await subtest("c. session/load replays the same directive events", async () => {
      for (const { sessionId, cwd, label } of sessions) {
        const live = directivesOf(events(sessionId));
        const loaded = await loadReplayed(sessionId, cwd, label);
        const last = loaded._meta.berth.lastEventId;
        const replayed = directivesOf(events(sessionId, 0, Infinity, { replayed: true }));
        assert.deepEqual(
          replayed.map((e) => [e.eventId, e.params.event]),
          live.map((e) => [e.eventId, e.params.event]),
          `${label}: replayed directive events equal the live ones`,
        );
      }
      step(`c. ${sessions.length} sessions: directive events replayed as journaled`);
    });

    // Every notification on the wire reached the SDK handlers, none rejected by zod.
    const onWire = () => server.wire.items.filter((m) => NOTIFICATION_METHODS.has(m.method)).length;
    await seen.waitFor(() => seen.items.length >= onWire(), 5_000, "the SDK delivered every notification on the wire");
    assertSdkDeliveredAll(server, seen);

    await server.shutdown();
    conn.close();
  } catch (error) {
    reportServer(t, server);
    throw error;
  } finally {
    killEverything();
  }
});
