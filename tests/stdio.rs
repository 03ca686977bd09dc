//! ACP over stdio beyond the pipes every other end-to-end test uses: a file
//! of frames on stdin answered into a file, and pipes shared with other
//! programs left as berth found them (`adapters/acp/src/transport/stdio.rs`).

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

#[test]
fn frames_from_a_file_are_answered_into_a_file() {
    let (dir, data, cwd, script) = common::workspace("fallback = \"ok\"\n");
    let requests = format!(
        "{}\n{}\n{}\n",
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}"#,
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "session/new",
            "params": {"cwd": cwd, "mcpServers": []}}),
        r#"{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"sess_none","prompt":[]}}"#,
    );
    let (input, output) = (dir.path().join("in.jsonl"), dir.path().join("out.jsonl"));
    std::fs::write(&input, requests).expect("write the requests");
    let mut child = common::serve_command(&data, &script)
        .stdin(std::fs::File::open(&input).expect("open the requests"))
        .stdout(std::fs::File::create(&output).expect("create the output"))
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn berth");
    // At the end of its input it answers what is in flight and exits.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll berth") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("berth did not exit at the end of a file on stdin");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    let written = std::fs::read_to_string(&output).expect("read the output");
    let frames: Vec<Value> = written
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON frame per line"))
        .collect();
    let answer = |id: u64| {
        frames
            .iter()
            .find(|f| f["id"] == id)
            .unwrap_or_else(|| panic!("no answer to {id} in {written}"))
    };
    assert_eq!(answer(1)["result"]["protocolVersion"], 1);
    assert!(answer(2)["result"]["sessionId"]
        .as_str()
        .is_some_and(|s| s.starts_with("sess_")));
    assert!(answer(3)["error"]["code"].is_i64(), "{}", answer(3));
}

/// berth's stdin and stdout pipes may be shared with other programs (a
/// shell pipeline): it must never leave them non-blocking, while it runs or
/// after it exits, or their writes fail with `EAGAIN`.
#[test]
fn shared_pipes_stay_blocking() {
    use std::io::{BufRead, BufReader, Write};
    use std::os::fd::AsFd;
    let nonblocking = |fd: std::os::fd::BorrowedFd<'_>| {
        let flags = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL).expect("F_GETFL");
        nix::fcntl::OFlag::from_bits_truncate(flags).contains(nix::fcntl::OFlag::O_NONBLOCK)
    };
    let (dir, data, _cwd, script) = common::workspace("fallback = \"ok\"\n");
    let (in_read, mut in_write) = std::io::pipe().expect("stdin pipe");
    let (out_read, out_write) = std::io::pipe().expect("stdout pipe");
    // Our own copies share the descriptions berth gets.
    let (in_shared, out_shared) = (
        in_read.try_clone().expect("dup"),
        out_write.try_clone().expect("dup"),
    );
    let mut child = common::serve_command(&data, &script)
        .stdin(in_read)
        .stdout(out_write)
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn berth");
    writeln!(
        in_write,
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":1}}}}"#
    )
    .expect("send initialize");
    let mut answer = String::new();
    BufReader::new(out_read.try_clone().expect("dup"))
        .read_line(&mut answer)
        .expect("read the answer");
    assert!(answer.contains("\"id\":1"), "{answer}");
    assert!(!nonblocking(in_shared.as_fd()), "stdin made non-blocking");
    assert!(!nonblocking(out_shared.as_fd()), "stdout made non-blocking");
    drop(in_write);
    assert!(child.wait().expect("wait for berth").success());
    assert!(!nonblocking(in_shared.as_fd()));
    assert!(!nonblocking(out_shared.as_fd()));
    drop(dir);
}

/// SIGTERM in the middle of a burst of output: berth stops reading and
/// decides nothing more, but what it had queued for its stdio client is
/// written, whole, before it exits (`serve_stdio`'s `stop`), so a client
/// reading to the end of stdout gets every answer decided before the signal
/// and never meets half a frame. Berth used to stop writing within 100 ms
/// of the signal: the rest of the queue was lost, and a write cut in the
/// middle left half a frame.
#[test]
fn sigterm_mid_burst_leaves_only_whole_frames_on_stdout() {
    use std::io::{Read, Write};

    // Each prompt's answer comes back as an `agent_message_chunk` of ~60 KB
    // (the sender is not shown its own prompt).
    let answer = "berth ".repeat(10_000);
    let (_dir, data, cwd, script) = common::workspace(&format!("fallback = \"{answer}\"\n"));
    let mut child = common::serve_command(&data, &script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn berth");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut send = |frame: Value| {
        stdin
            .write_all(format!("{frame}\n").as_bytes())
            .expect("write a frame");
    };
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": 1}}),
    );
    let text = "berth";
    let sessions = 40;
    for i in 0..sessions {
        send(
            serde_json::json!({"jsonrpc": "2.0", "id": 100 + i, "method": "session/new",
            "params": {"cwd": cwd, "mcpServers": []}}),
        );
    }
    // Read the session ids from the answers, then prompt them all at once.
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut ids = Vec::new();
    while ids.len() < sessions as usize {
        let n = stdout.read(&mut buf).expect("read stdout");
        assert!(n > 0, "berth closed stdout early");
        out.extend_from_slice(&buf[..n]);
        ids = out
            .split(|b| *b == b'\n')
            .filter_map(|line| serde_json::from_slice::<Value>(line).ok())
            .filter_map(|f| f["result"]["sessionId"].as_str().map(str::to_owned))
            .collect();
    }
    for (i, id) in ids.iter().enumerate() {
        send(
            serde_json::json!({"jsonrpc": "2.0", "id": 1000 + i, "method": "session/prompt",
            "params": {"sessionId": id, "prompt": [{"type": "text", "text": text}]}}),
        );
    }
    // A reader of ~800 KB/s: berth answers every prompt (a scripted turn
    // takes milliseconds) while most of the 2.4 MB it wrote is still
    // queued; once the control socket shows no turn running (each answer
    // decided) and a moment more has passed for the answers to reach the
    // connection's queue, berth is stopped. (A fixed one-second window was
    // not enough on a loaded machine: a prompt could still be undecided.)
    let mut slice = vec![0u8; 4 * 1024];
    let mut read_slowly = |out: &mut Vec<u8>, for_: Duration| {
        let until = Instant::now() + for_;
        while Instant::now() < until {
            let n = stdout.read(&mut slice).expect("read stdout");
            out.extend_from_slice(&slice[..n]);
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    read_slowly(&mut out, Duration::from_millis(500));
    let decided_by = Instant::now() + Duration::from_secs(30);
    loop {
        let ps = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["ctl", "ps", "--json", "--state", "running", "--data-dir"])
            .arg(&data)
            .output()
            .expect("run berth ctl ps");
        let ps: Value = serde_json::from_slice(&ps.stdout).expect("ctl ps --json");
        let running = ps["sessions"].as_array().expect("a session list").len();
        if running == 0 {
            break;
        }
        assert!(
            Instant::now() < decided_by,
            "{running} prompt turns still running after 30 s"
        );
        read_slowly(&mut out, Duration::from_millis(100));
    }
    // Not reading now: everything may already be read, and a read would
    // then wait for output that never comes.
    std::thread::sleep(Duration::from_millis(200));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let mut slice = vec![0u8; 4 * 1024];
    loop {
        let n = stdout.read(&mut slice).expect("read stdout");
        if n == 0 {
            break;
        }
        out.extend_from_slice(&slice[..n]);
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = child.wait().expect("wait for berth");
    assert!(status.success(), "berth exits cleanly on SIGTERM: {status}");
    assert!(
        out.len() > 300_000,
        "the burst was under way when berth stopped: {} bytes",
        out.len()
    );
    assert_eq!(
        out.last(),
        Some(&b'\n'),
        "stdout ends mid-frame: {:?}",
        String::from_utf8_lossy(&out[out.len().saturating_sub(200)..])
    );
    let frames: Vec<Value> = out
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|line| {
            serde_json::from_slice::<Value>(line).unwrap_or_else(|e| {
                panic!(
                    "a cut frame ({e}): {:?}",
                    String::from_utf8_lossy(&line[..line.len().min(200)])
                )
            })
        })
        .collect();
    // Every answer decided before the signal reached the client.
    for i in 0..ids.len() {
        let id = 1000 + i as u64;
        assert!(
            frames
                .iter()
                .any(|f| f["id"] == id && f["result"].is_object()),
            "the answer to prompt {id} was queued before SIGTERM and never written ({} bytes read)",
            out.len()
        );
    }
}
