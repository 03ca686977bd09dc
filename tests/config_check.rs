//! `berth config check FILE` against the real binary: the example file in
//! `deploy/` is valid, and a broken file gets one line per problem naming
//! the file, the key and what is wrong, with exit status 1.

use std::process::Command;

fn check(path: &std::path::Path) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["config", "check"])
        .arg(path)
        .output()
        .expect("run berth");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_example_config_is_valid() {
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/berth.example.toml");
    let (ok, stdout, stderr) = check(&example);
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stdout.contains(": ok: model scripted, HTTP listener on 127.0.0.1:8080 with 3 token(s)"),
        "{stdout}"
    );
}

#[test]
fn problems_name_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[http]\nlisten = \"example.com:80\"\nallowed_origins = [\"https://ok.example/\"]\n\n[[http.tokens]]\nactor = \"a b\"\nrole = \"root\"\ntoken = \"0123456789abcdef\"\n",
    )
    .unwrap();
    let (ok, stdout, stderr) = check(&bad);
    assert!(!ok);
    let name = bad.display().to_string();
    for line in [
        format!("{name}: key `http.listen`: \"example.com:80\" is not IP:PORT or PORT"),
        format!("{name}: key `http.allowed_origins[0]`:"),
        format!("{name}: key `http.tokens[0].actor`: contains ' '"),
        format!("{name}: key `http.tokens[0].role`: unknown role \"root\""),
    ] {
        assert!(
            stdout.lines().any(|l| l.starts_with(&line)),
            "{line:?} missing from:\n{stdout}"
        );
    }
    assert!(stderr.contains("has 4 problem(s)"), "{stderr}");

    std::fs::write(&bad, "[acp]\nmax_in_flight = \"lots\"\n").unwrap();
    let (ok, stdout, _) = check(&bad);
    assert!(!ok);
    assert!(
        stdout.contains("key `acp.max_in_flight`") && stdout.contains("line 2"),
        "{stdout}"
    );
}
