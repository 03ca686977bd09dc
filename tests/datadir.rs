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
    assert_eq!(before, [kept.clone()]);
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
