#!/usr/bin/env python3
"""A guided tour of berth over ACP (stdio), with nothing but the standard library.

Starts `berth serve` on a fresh data dir with the built-in demo model, creates a
session in a temp directory, and walks through prompt, tool calls, cancel, list,
SIGKILL + restart, and load. Run from the repo root after `cargo build --release`:

    python3 scripts/tour.py [--bin target/release/berth]
"""
import argparse, json, os, signal, subprocess, sys, tempfile, threading, queue, time

def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    # Cargo's own rule: CARGO_TARGET_DIR, else target/ in the checkout.
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(here, "..", "target")
    default = os.path.join(target, "release", "berth")
    if not os.path.exists(default):
        default = os.path.join(target, "debug", "berth")
    ap.add_argument("--bin", default=default)
    args = ap.parse_args()
    if not os.path.exists(args.bin):
        sys.exit(f"no berth binary at {args.bin}: run `cargo build --release` first")
    root = tempfile.mkdtemp(prefix="berth-tour-")
    data, work = os.path.join(root, "data"), os.path.join(root, "work")
    os.makedirs(work)
    print(f"data dir {data}\nsession cwd {work}\n")

    server = Server(args.bin, data)
    server.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}}, show=True)
    sid = server.call("session/new", {"cwd": work, "mcpServers": []}, show=True)["result"]["sessionId"]

    for text in ["write a note", "read the note"]:
        server.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}, show=True)

    print("\n-- a long command, cancelled mid-flight --")
    pid = server.send("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "run a long command"}]})
    server.wait_for(lambda m: m.get("params", {}).get("update", {}).get("status") == "in_progress")
    server.call("session/cancel", {"sessionId": sid}, show=True)
    server.wait_response(pid, show=True)
    server.call("session/cancel", {"sessionId": sid}, show=True)
    server.call("session/list", {}, show=True)

    print("\n-- SIGKILL in the middle of a turn, then restart --")
    server.send("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "think slowly"}]})
    server.wait_for(lambda m: m.get("params", {}).get("update", {}).get("sessionUpdate") == "agent_thought_chunk")
    server.kill()
    server = Server(args.bin, data)
    server.call("initialize", {"protocolVersion": 1}, show=False)
    load = server.call("session/load", {"sessionId": sid}, show=False)
    print(f"replayed {len(load['result']['_meta']['berth']['replayed'])} events; the last one:")
    print("  ", json.dumps(server.notes[-1]["params"])[:400])
    server.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "hello"}]}, show=True)

    print("\n-- suspend mid-wait, SIGKILL while suspended, restart, resume --")
    pid = server.send("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "wait for the flag file"}]})
    server.wait_for(lambda m: m.get("params", {}).get("update", {}).get("status") == "in_progress")
    server.call("session/suspend", {"sessionId": sid, "reason": "waiting on a flag"}, show=True)
    server.wait_response(pid, show=True)
    server.kill()
    server = Server(args.bin, data)
    server.call("initialize", {"protocolVersion": 1}, show=False)
    server.call("berth.session_view.query", {"sessionId": sid}, show=True)
    open(os.path.join(work, "flag"), "w").close()
    server.call("session/resume", {"sessionId": sid}, show=True)
    server.wait_for(lambda m: m.get("params", {}).get("type") == "turn_ended")

    print("\n-- the agent parks itself; resume it with input --")
    server.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "park until resumed"}]}, show=True)
    server.call("session/resume", {"sessionId": sid, "input": "the build passed"}, show=True)
    server.wait_for(lambda m: m.get("params", {}).get("type") == "turn_ended")
    server.kill()
    print(f"\ndone; remove {root} when finished")

class Server:
    def __init__(self, binary, data):
        self.p = subprocess.Popen([binary, "serve", "--data-dir", data], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.q, self.next_id, self.notes = queue.Queue(), 0, []
        self.answers = {}  # responses that arrived while another one was awaited
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.q.put(json.loads(line))

    def send(self, method, params):
        self.next_id += 1
        self.p.stdin.write(json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}) + "\n")
        self.p.stdin.flush()
        print(f">> {method} {json.dumps(params)[:120]}")
        return self.next_id

    def next(self):
        m = self.q.get(timeout=30)
        if "method" in m:
            self.notes.append(m)
        return m

    def wait_for(self, pred):
        while True:
            m = self.next()
            show_note(m)
            if pred(m):
                return m

    def wait_response(self, rid, show):
        while True:
            m = self.answers.pop(rid, None) or self.next()
            if "method" not in m and m.get("id") is not None and m.get("id") != rid:
                self.answers[m["id"]] = m  # e.g. a prompt that answers before the suspend does
                continue
            if m.get("id") == rid:
                if show:
                    print("<<", json.dumps(m.get("result", m.get("error")))[:300])
                return m
            if show:
                show_note(m)

    def call(self, method, params, show):
        return self.wait_response(self.send(method, params), show)

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()
        print("   (server killed with SIGKILL)")

def show_note(m):
    if m.get("method") == "session/update":
        u = m["params"]["update"]
        kind = u["sessionUpdate"]
        detail = u.get("content", {}).get("text") if isinstance(u.get("content"), dict) else u.get("title") or u.get("status")
        print(f"   update {kind}: {str(detail)[:100]}")
    elif m.get("method"):
        print(f"   {m['method']} {m['params'].get('type')}: {json.dumps(m['params'].get('event', {}).get('terminal'))}")

if __name__ == "__main__":
    main()
