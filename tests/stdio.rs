//! ACP over stdio beyond the pipes every other end-to-end test uses: a file
//! of frames on stdin answered into a file, and pipes shared with other
//! programs left as berth found them (`adapters/acp/src/transport/stdio.rs`).

mod common;

use std::process::Stdio;
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
