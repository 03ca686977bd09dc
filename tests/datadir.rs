//! The data dir as a boundary: it is absolute from the start whatever
//! `--data-dir` says, no session root reaches into it (its journal and key
//! file are not readable through the file tools), and it and its files are
//! private to berth's user.

mod common;

use std::path::Path;

use serde_json::{json, Value};

/// `session/list`'s session ids.
fn listed(server: &mut common::StdioServer, id: u64) -> Vec<String> {
    server.send(id, "session/list", json!({}));
    let answer = server.until(id).1;
    answer["result"]["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("session/list answers sessions: {answer}"))
        .iter()
        .map(|s| s["sessionId"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn a_relative_data_dir_is_made_absolute_at_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = common::cli_command(&["verify"], Path::new("rel-data"))
        .current_dir(dir.path())
        .output()
        .expect("run berth");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let absolute = dir.path().join("rel-data");
    assert!(
        stderr.contains(&format!("no data dir at {}", absolute.display())),
        "{stderr}"
    );
}

#[test]
fn no_session_root_reaches_into_the_data_dir() {
    let (dir, data, cwd, script) = common::workspace("fallback = \"ok\"\n");
    let mut server = common::StdioServer::start(common::serve_command(&data, &script));
    let kept = server.new_session(2, &cwd);
    assert!(data.join("receipt-keys.json").is_file());
    let before = listed(&mut server, 3);
    assert_eq!(before, std::slice::from_ref(&kept));
    let sub = data.join("sub");
    std::fs::create_dir_all(&sub).expect("a dir inside the data dir");
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&data, &link).expect("a symlink to the data dir");
    let dotted = cwd.join("..").join("data");
    let cases: Vec<(&str, Value)> = vec![
        ("cwd", json!({"cwd": data, "mcpServers": []})),
        ("cwd", json!({"cwd": sub, "mcpServers": []})),
        ("cwd", json!({"cwd": dir.path(), "mcpServers": []})),
        ("cwd", json!({"cwd": link, "mcpServers": []})),
        ("cwd", json!({"cwd": dotted, "mcpServers": []})),
        (
            "additionalDirectories",
            json!({"cwd": cwd, "additionalDirectories": [dir.path()], "mcpServers": []}),
        ),
        (
            "additionalDirectories",
            json!({"cwd": cwd, "additionalDirectories": [link], "mcpServers": []}),
        ),
        (
            "additionalDirectories",
            json!({"cwd": cwd, "additionalDirectories": [data.join("not-yet").join("..").join("sub")], "mcpServers": []}),
        ),
        (
            "additionalDirectories",
            json!({"cwd": cwd, "additionalDirectories": [link.join("not-yet")], "mcpServers": []}),
        ),
    ];
    for (n, (field, params)) in cases.into_iter().enumerate() {
        let id = 10 + n as u64;
        server.send(id, "session/new", params.clone());
        let answer = server.until(id).1;
        assert_eq!(answer["error"]["code"], -32602, "{params}: {answer}");
        assert_eq!(
            answer["error"]["data"]["field"], field,
            "{params}: {answer}"
        );
        assert!(
            answer["error"]["data"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("data dir")),
            "{params}: {answer}"
        );
    }
    assert_eq!(listed(&mut server, 99), before);
    // A sibling of the data dir is fine.
    let sibling = dir.path().join("data-sibling");
    std::fs::create_dir_all(&sibling).expect("a sibling dir");
    server.send(
        100,
        "session/new",
        json!({"cwd": sibling, "mcpServers": []}),
    );
    let answer = server.until(100).1;
    assert!(answer["result"]["sessionId"].is_string(), "{answer}");
    server.stop();
}

/// Every directory and file under `dir`: (path, mode bits, is dir).
fn modes(dir: &Path) -> Vec<(std::path::PathBuf, u32, bool)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(next) = todo.pop() {
        let meta = std::fs::symlink_metadata(&next).expect("stat");
        out.push((
            next.clone(),
            meta.permissions().mode() & 0o777,
            meta.is_dir(),
        ));
        if meta.is_dir() {
            for entry in std::fs::read_dir(&next).expect("read dir") {
                todo.push(entry.expect("dir entry").path());
            }
        }
    }
    out
}

/// `berth serve` on `data` with stdin closed (it starts, then stops at
/// the end of its input): its output.
fn serve_once(data: &Path, script: &Path) -> std::process::Output {
    common::serve_command(data, script)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run berth serve")
}

#[test]
fn the_data_dir_is_0700_and_its_files_0600() {
    use std::os::unix::fs::PermissionsExt;
    let (_dir, data, cwd, script) = common::workspace("fallback = \"ok\"\n");
    let mut server = common::StdioServer::start(common::serve_command(&data, &script));
    let sid = server.new_session(2, &cwd);
    server.send(
        3,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}),
    );
    server.until(3);
    let socket = data.join("berth.sock");
    let mode = std::fs::symlink_metadata(&socket)
        .expect("the control socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "berth.sock");
    assert!(server.stop().success());
    let all = modes(&data);
    assert!(all.len() >= 4, "{all:?}");
    for (path, mode, is_dir) in all {
        let want = if is_dir { 0o700 } else { 0o600 };
        assert_eq!(mode, want, "{}: {mode:03o}", path.display());
    }
}

#[test]
fn a_symlink_planted_as_the_commit_log_is_refused_and_its_target_untouched() {
    use std::os::unix::fs::DirBuilderExt;
    let (dir, data, _cwd, script) = common::workspace("fallback = \"ok\"\n");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&data)
        .unwrap();
    let target = dir.path().join("precious");
    std::fs::write(&target, "do not truncate me").unwrap();
    std::os::unix::fs::symlink(&target, data.join("journal.log")).unwrap();
    let out = serve_once(&data, &script);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("symlink"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "do not truncate me"
    );
}

#[test]
fn a_data_dir_others_can_write_is_refused_with_the_fix() {
    use std::os::unix::fs::PermissionsExt;
    let (_dir, data, _cwd, script) = common::workspace("fallback = \"ok\"\n");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = serve_once(&data, &script);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("chmod 700 {}", data.display())),
        "{stderr}"
    );
    assert!(!data.join("journal.redb").exists());
}

/// Root can hand files to another uid; elsewhere this test has nothing to
/// plant and passes without checking.
#[test]
fn files_and_sockets_of_another_user_are_refused() {
    const NOBODY: u32 = 65534;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: chown to another uid needs root");
        return;
    }
    let (_dir, data, _cwd, script) = common::workspace("fallback = \"ok\"\n");
    assert!(serve_once(&data, &script).status.success());
    let journal = data.join("journal.redb");
    std::os::unix::fs::chown(&journal, Some(NOBODY), None).unwrap();
    let out = serve_once(&data, &script);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("belongs to uid 65534"), "{stderr}");
    std::os::unix::fs::chown(&journal, Some(0), None).unwrap();
    // A socket another user left is neither replaced by serve nor used by
    // a client.
    let socket = data.join("berth.sock");
    let planted = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    std::os::unix::fs::lchown(&socket, Some(NOBODY), None).unwrap();
    let out = common::cli_command(&["ctl", "ps"], &data).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("belongs to uid 65534"), "{stderr}");
    assert!(serve_once(&data, &script).status.success());
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::symlink_metadata(&socket).unwrap().uid(), NOBODY);
    drop(planted);
}

#[test]
fn a_data_dir_path_that_is_a_symlink_is_refused_naming_the_real_path() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, data, _cwd, script) = common::workspace("fallback = \"ok\"\n");
    let victim = dir.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink(&victim, &data).unwrap();
    let out = serve_once(&data, &script);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("symlink"), "{stderr}");
    let real = victim.canonicalize().unwrap();
    assert!(stderr.contains(&real.display().to_string()), "{stderr}");
    let mode = std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o755, "the target's mode is untouched");
    assert_eq!(
        std::fs::read_dir(&victim).unwrap().count(),
        0,
        "nothing written"
    );
}
