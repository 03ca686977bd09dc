//! The processes a session's tools start, driven through `berth serve`: what
//! environment they see, and that a stop kills every one of them.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{serve_command, workspace, StdioServer};
use serde_json::json;

/// Secrets berth itself reads; none may reach a tool process.
const SECRETS: [(&str, &str); 3] = [
    ("BERTH_API_KEYS", "tok-secret-api=alice:controller"),
    (
        "BERTH_RECEIPT_KEYS",
        "k1:5ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7",
    ),
    ("OPENAI_API_KEY", "sk-secret-openai"),
];

fn env_script() -> &'static str {
    r#"
[[rules]]
match = "env"
steps = [
  { tool_call = { name = "shell", arguments = { command = "env" } } },
  { text = "{last_tool_result}" },
]
"#
}

/// `env` in the shell tool shows the allow-list and the `[tools]` variables,
/// none of berth's secrets.
#[test]
fn the_shell_sees_no_secret_only_the_allow_list_and_tools_env() {
    let (dir, data, cwd, script) = workspace(env_script());
    let config = dir.path().join("berth.toml");
    std::fs::write(
        &config,
        "[tools]\npass_env = [\"BERTH_TEST_PASSED\"]\nenv = { BERTH_TEST_SET = \"set-by-config\" }\n",
    )
    .expect("write the config");
    let mut command = serve_command(&data, &script);
    command
        .arg("--config")
        .arg(&config)
        .env("BERTH_TEST_PASSED", "passed-through")
        .env("BERTH_TEST_NOT_PASSED", "not-for-tools")
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    for (name, value) in SECRETS {
        command.env(name, value);
    }
    let mut server = StdioServer::start(command);
    let session = server.new_session(2, &cwd);
    server.send(
        3,
        "session/prompt",
        json!({"sessionId": session, "prompt": [{"type": "text", "text": "env"}]}),
    );
    let (notes, answer) = server.until(3);
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let output = notes
        .iter()
        .filter(|n| n["params"]["update"]["sessionUpdate"] == "tool_call_update")
        .filter_map(|n| n["params"]["update"]["rawOutput"]["stdout"].as_str())
        .next()
        .unwrap_or_else(|| panic!("no shell output in {notes:?}"))
        .to_owned();
    for (name, value) in SECRETS {
        assert!(
            !output.contains(name) && !output.contains(value),
            "{name} reached the tool:\n{output}"
        );
    }
    assert!(
        !output.contains("BERTH_TEST_NOT_PASSED"),
        "an unlisted variable reached the tool:\n{output}"
    );
    let lines: Vec<&str> = output.lines().collect();
    assert!(
        lines.contains(&"BERTH_TEST_PASSED=passed-through"),
        "{output}"
    );
    assert!(lines.contains(&"BERTH_TEST_SET=set-by-config"), "{output}");
    assert!(lines.iter().any(|l| l.starts_with("PATH=")), "{output}");
}

/// A config that hands a secret to tools is refused by `config check` and
/// by `serve`, naming the key.
#[test]
fn a_config_passing_a_secret_to_tools_is_refused() {
    let (dir, data, _cwd, script) = workspace(env_script());
    for (text, key) in [
        (
            "[tools]\npass_env = [\"BERTH_API_KEYS\"]\n",
            "tools.pass_env[0]",
        ),
        (
            "[tools]\npass_env = [\"PATH\", \"OPENAI_API_KEY\"]\n",
            "tools.pass_env[1]",
        ),
        (
            "[tools]\nenv = { BERTH_RECEIPT_KEYS = \"x\" }\n",
            "tools.env.BERTH_RECEIPT_KEYS",
        ),
        (
            "[openai]\napi_key_env = \"MY_KEY\"\n[tools]\npass_env = [\"MY_KEY\"]\n",
            "tools.pass_env[0]",
        ),
        ("[tools]\npass_env = [\"A=B\"]\n", "tools.pass_env[0]"),
    ] {
        let config = dir.path().join("bad.toml");
        std::fs::write(&config, text).expect("write the config");
        let check = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["config", "check"])
            .arg(&config)
            .output()
            .expect("run berth config check");
        let stdout = String::from_utf8_lossy(&check.stdout);
        assert!(!check.status.success(), "{text}: {stdout}");
        assert!(stdout.contains(&format!("key `{key}`")), "{text}: {stdout}");
        let serve = serve_command(&data, &script)
            .arg("--config")
            .arg(&config)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run berth serve");
        let stderr = String::from_utf8_lossy(&serve.stderr);
        assert!(!serve.status.success(), "{text}: {stderr}");
        assert!(stderr.contains(&format!("key `{key}`")), "{text}: {stderr}");
    }
}

fn alive(pid: i32) -> bool {
    // A zombie is dead (its parent has yet to reap it).
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

/// Polls (bounded) until none of `pids` is alive; the ones still alive.
fn survivors(pids: &[i32]) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (bounded) for `file` to list `n` pids.
fn pids_in(file: &Path, n: usize) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pids: Vec<i32> = std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if pids.len() >= n {
            return pids;
        }
        assert!(
            Instant::now() < deadline,
            "the shell never wrote {n} pids to {}",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A shell command that leaves the process group three ways (a `setsid`
/// child, a double-forked `setsid` grandchild, a plain double fork) and then
/// waits in the foreground; each writes its pid to `pids`.
fn escaping_script() -> &'static str {
    r#"
[[rules]]
match = "escape"
steps = [
  { tool_call = { name = "shell", arguments = { command = "setsid sh -c 'echo $$ >> pids; exec sleep 1000' & (setsid sh -c 'echo $$ >> pids; exec sleep 1000' &) ; (sh -c 'echo $$ >> pids; exec sleep 1000' &) ; echo $$ >> pids; sleep 1000" } } },
  { text = "done" },
]
"#
}

fn stop_kills_everything(how: &str) {
    let (_dir, data, cwd, script) = workspace(escaping_script());
    let mut server = StdioServer::start(serve_command(&data, &script));
    let session = server.new_session(2, &cwd);
    server.send(
        3,
        "session/prompt",
        json!({"sessionId": session, "prompt": [{"type": "text", "text": "escape"}]}),
    );
    let notes = server.until_note(|n| n["params"]["update"]["sessionUpdate"] == "tool_call");
    let call = notes
        .last()
        .and_then(|n| n["params"]["update"]["toolCallId"].as_str())
        .expect("a tool call id")
        .to_owned();
    let pids = pids_in(&cwd.join("pids"), 4);
    for &pid in &pids {
        assert!(alive(pid), "{pid} should run until the stop");
    }
    match how {
        "cancel" => {
            server.send(4, "session/cancel", json!({"sessionId": session}));
            let (_, answer) = server.until(4);
            assert!(answer.get("error").is_none(), "{answer}");
        }
        _ => {
            server.send(
                4,
                "session/cancel_tool_call",
                json!({"sessionId": session, "toolCallId": call}),
            );
            let (_, answer) = server.until(4);
            assert!(answer.get("error").is_none(), "{answer}");
        }
    }
    let left = survivors(&pids);
    // Clean up whatever survived before failing.
    for &pid in &left {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(
        left.is_empty(),
        "{how}: still running after the stop: {left:?} of {pids:?}"
    );
}

/// `session/cancel` kills the processes that left the call's process group.
#[test]
fn cancel_kills_processes_that_left_the_group() {
    stop_kills_everything("cancel");
}

/// `session/cancel_tool_call` kills them too.
#[test]
fn cancel_tool_call_kills_processes_that_left_the_group() {
    stop_kills_everything("cancel_tool_call");
}
