//! What a tool process cannot reach, driven through `berth serve`: berth's
//! own memory and environment (`/proc/<berth>/environ`), the control socket,
//! the data dir.

mod common;

use std::path::Path;
use std::process::Command;

use common::{serve_command, workspace, StdioServer};
use serde_json::json;

/// A secret berth holds in its environment.
const SECRET: &str = "tok-sandbox-secret=alice:controller";

/// A scripted model that runs `command` in the shell tool on the prompt
/// "run" and answers with its output.
fn shell_script(command: &str) -> String {
    let command = serde_json::to_string(command).expect("a JSON string");
    format!(
        "[[rules]]\nmatch = \"run\"\nsteps = [\n  {{ tool_call = {{ name = \"shell\", arguments = {{ command = {command} }} }} }},\n  {{ text = \"done\" }},\n]\n"
    )
}

/// Runs the prompt "run" in a new session in `cwd`; the shell call's
/// (stdout, stderr).
fn run_shell(server: &mut StdioServer, cwd: &Path) -> (String, String) {
    let session = server.new_session(2, cwd);
    server.send(
        3,
        "session/prompt",
        json!({"sessionId": session, "prompt": [{"type": "text", "text": "run"}]}),
    );
    let (notes, answer) = server.until(3);
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let raw = notes
        .iter()
        .filter(|n| n["params"]["update"]["sessionUpdate"] == "tool_call_update")
        .map(|n| &n["params"]["update"]["rawOutput"])
        .find(|r| r.get("stdout").is_some())
        .unwrap_or_else(|| panic!("no shell output in {notes:?}"));
    (
        raw["stdout"].as_str().unwrap_or_default().to_owned(),
        raw["stderr"].as_str().unwrap_or_default().to_owned(),
    )
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// `berth serve` as a user that owns nothing it needs to read but the data
/// dir and the cwd: uid 65534 when the test runs as root (root reads any
/// process's `/proc` files, so the check would prove nothing), else the
/// test's own user.
fn unprivileged_serve(dir: &Path, data: &Path, cwd: &Path, script: &Path) -> Command {
    let inner = serve_command(data, script);
    if !is_root() {
        return inner;
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod the dir");
    std::fs::create_dir_all(data).expect("create the data dir");
    std::fs::set_permissions(data, std::fs::Permissions::from_mode(0o700))
        .expect("chmod the data dir");
    for path in [data, cwd] {
        std::os::unix::fs::chown(path, Some(65534), Some(65534)).expect("chown to 65534");
    }
    let mut command = Command::new("setpriv");
    command
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(inner.get_program())
        .args(inner.get_args());
    command
}

/// A shell command reads neither berth's `/proc/<pid>/environ` (berth is the
/// supervisor's parent) nor the supervisor's (a fork of berth: its
/// environment block is berth's), and cannot attach to berth.
#[test]
fn a_tool_process_cannot_read_berths_environment() {
    let (dir, data, cwd, script) = workspace(&shell_script(
        "b=$(cut -d' ' -f4 /proc/$PPID/stat); echo berth=$b supervisor=$PPID; \
         cat /proc/$b/environ; cat /proc/$PPID/environ; cat /proc/$b/cmdline >/dev/null && echo cmdline-ok",
    ));
    let mut command = unprivileged_serve(dir.path(), &data, &cwd, &script);
    command
        .env("BERTH_API_KEYS", SECRET)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    let mut server = StdioServer::start(command);
    let (stdout, stderr) = run_shell(&mut server, &cwd);
    assert!(stdout.contains("berth="), "{stdout}\n{stderr}");
    assert!(
        !stdout.contains(SECRET) && !stdout.contains("BERTH_API_KEYS"),
        "a tool process read berth's environment:\n{stdout}"
    );
    assert_eq!(
        stderr.matches("Permission denied").count(),
        2,
        "both environ reads are refused:\n{stdout}\n{stderr}"
    );
}

/// A control-socket client: sends `initialize` on the socket at argv[1] and
/// prints the first line it gets back (empty when the socket is closed;
/// berth may answer a refused connection before the request is written).
const SOCKET_CLIENT: &str = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
try:
    s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n')
except BrokenPipeError:
    pass  # refused and closed before the request: the answer is still there
print("reply:" + s.makefile().readline().strip())
"#;

/// The first line the control socket at `path` answers an `initialize` with.
fn initialize_over(path: &Path) -> String {
    use std::io::{BufRead, BufReader, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(path).expect("connect");
    stream
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}\n")
        .expect("write");
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).expect("read");
    line
}

/// A process inside a tool call's tree is refused on the control socket
/// (it would act as the host owner over every session); a process outside
/// any tool tree is served.
#[test]
fn the_control_socket_refuses_tool_processes() {
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        eprintln!("skipped: no /usr/bin/python3 for the socket client");
        return;
    }
    let (dir, data, cwd, _) = workspace("");
    let client = dir.path().join("client.py");
    std::fs::write(&client, SOCKET_CLIENT).expect("write the client");
    let socket = data.join("berth.sock");
    let script = dir.path().join("shell.toml");
    std::fs::write(
        &script,
        shell_script(&format!(
            "{} {} {}",
            python.display(),
            client.display(),
            socket.display()
        )),
    )
    .expect("write the script");
    let mut server = StdioServer::start(serve_command(&data, &script));
    let outside = initialize_over(&socket);
    assert!(outside.contains("\"result\""), "{outside}");
    let (stdout, stderr) = run_shell(&mut server, &cwd);
    assert!(stdout.starts_with("reply:"), "{stdout}\n{stderr}");
    assert!(
        !stdout.contains("\"result\""),
        "a tool process was served:\n{stdout}"
    );
    assert!(
        stdout.contains("\"error\"") && stdout.contains("tool process"),
        "the refusal says why:\n{stdout}"
    );
}

/// Whether this kernel enforces Landlock (its ABI version query answers).
fn landlock_available() -> bool {
    use nix::libc;
    // SAFETY: the version query (flag 1) reads no memory.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    abi >= 1
}

/// A tool process cannot read the data dir (the receipt keys, the journal),
/// while the session's cwd and the rest of the system stay reachable.
#[test]
fn a_tool_process_cannot_reach_the_data_dir() {
    if !landlock_available() {
        eprintln!("skipped: this kernel does not enforce Landlock");
        return;
    }
    let (dir, data, cwd, _) = workspace("");
    std::fs::write(cwd.join("file"), "in-the-cwd\n").expect("write a cwd file");
    let keys = data.join("receipt-keys.json");
    let script = dir.path().join("shell.toml");
    std::fs::write(
        &script,
        shell_script(&format!(
            "cat {}; echo keys=$?; ls {} ; echo list=$?; cat file; /usr/bin/env >/dev/null && echo env-ok",
            keys.display(),
            data.display()
        )),
    )
    .expect("write the script");
    let mut command = serve_command(&data, &script);
    command.env_remove("BERTH_RECEIPT_KEYS");
    let mut server = StdioServer::start(command);
    assert!(keys.exists(), "berth wrote its key file");
    let (stdout, stderr) = run_shell(&mut server, &cwd);
    assert!(
        stdout.contains("keys=1"),
        "the key file was read:\n{stdout}\n{stderr}"
    );
    assert!(
        !stdout.contains("list=0"),
        "the data dir was listed:\n{stdout}\n{stderr}"
    );
    assert!(stderr.contains("Permission denied"), "{stderr}");
    assert!(stdout.contains("in-the-cwd"), "{stdout}\n{stderr}");
    assert!(stdout.contains("env-ok"), "{stdout}\n{stderr}");
}
