//! A2A on a real `berth serve --listen 127.0.0.1:0`, as an A2A client meets
//! it: who a request acts as (a presented bearer token always wins over
//! `--a2a-anonymous-role`; a bad one is a 401), what an anonymous caller may
//! see (only the contexts anonymous callers created), the JSON-RPC shape of
//! the 401, and A2A on the default relative data dir (`./berth-data`, the
//! server started in a temp dir).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

const CONTROLLER: &str = "ctl-token-0123456789";
const OBSERVER: &str = "obs-token-0123456789";

const SCRIPT: &str = r#"
[[rules]]
match = "hello"
steps = [{ text = "Hello from berth." }]
"#;

/// A running `berth serve` with the HTTP listener; its stdio is a trusted
/// local ACP client. Killed when dropped.
struct Server {
    child: Child,
    stdin: ChildStdin,
    frames: mpsc::Receiver<Value>,
    addr: String,
    dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// `berth serve --listen 127.0.0.1:0 ARGS`, run with its cwd in a fresh
    /// temp dir (so the default `./berth-data` lands there).
    fn start(args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("s.toml"), SCRIPT).unwrap();
        std::fs::create_dir_all(dir.path().join("work")).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
            .current_dir(dir.path())
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--model",
                "scripted:s.toml",
            ])
            .args(args)
            .env(
                "BERTH_API_KEYS",
                format!("{CONTROLLER}=alice:controller,{OBSERVER}=grafana:observer"),
            )
            .env("BERTH_LOG", "warn")
            .env_remove("BERTH_DATA_DIR")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn berth serve");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, frames) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    if tx.send(v).is_err() {
                        return;
                    }
                }
            }
        });
        let (addr_tx, addr_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut addr_tx = Some(addr_tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("berth: listening on http://") {
                    if let Some(tx) = addr_tx.take() {
                        let _ = tx.send(rest.trim().to_owned());
                    }
                }
            }
        });
        let addr = addr_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("berth serve announces its listener");
        let mut server = Self {
            child,
            stdin,
            frames,
            addr,
            dir,
        };
        server.acp(1, "initialize", json!({"protocolVersion": 1}));
        server
    }

    /// One ACP request on stdio (a local host-owner client); its response.
    fn acp(&mut self, id: u64, method: &str, params: Value) -> Value {
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(self.stdin, "{frame}").unwrap();
        self.stdin.flush().unwrap();
        loop {
            let v = self
                .frames
                .recv_timeout(Duration::from_secs(20))
                .expect("an ACP frame within 20 s");
            if v["id"].as_u64() == Some(id) {
                return v;
            }
        }
    }

    /// One HTTP/1.1 request; (status, headers lower-cased, body).
    fn http(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for (k, v) in headers {
            request.push_str(&format!("{k}: {v}\r\n"));
        }
        request.push_str("\r\n");
        request.push_str(body);
        stream.write_all(request.as_bytes()).unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).unwrap();
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
        let mut lines = head.lines();
        let status: u16 = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .expect("a status line");
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let chunked = text
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        let body = if chunked {
            dechunk(body)
        } else {
            body.to_owned()
        };
        Reply {
            status,
            headers,
            body,
        }
    }

    /// An A2A JSON-RPC call with `token` (or none); (status, body as JSON).
    fn a2a(&self, token: Option<&str>, method: &str, params: Value) -> (u16, Value) {
        let body = json!({"jsonrpc": "2.0", "id": 9, "method": method, "params": params});
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut headers = vec![("Content-Type", "application/json"), ("A2A-Version", "1.0")];
        if let Some(a) = &auth {
            headers.push(("Authorization", a.as_str()));
        }
        let reply = self.http("POST", "/", &headers, &body.to_string());
        let value = serde_json::from_str(&reply.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", reply.body));
        (reply.status, value)
    }

    fn send(&self, token: Option<&str>, message: Value) -> Value {
        let (status, answer) = self.a2a(token, "SendMessage", json!({"message": message}));
        assert_eq!(status, 200, "{answer}");
        answer
    }

    fn cwd(&self) -> &Path {
        self.dir.path()
    }
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn user(text: &str, id: &str) -> Value {
    json!({"role": "ROLE_USER", "messageId": id, "parts": [{"text": text}]})
}

/// A JSON-RPC error answer's code.
fn code(answer: &Value) -> i64 {
    answer["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("not an error: {answer}"))
}

#[test]
fn a_presented_token_wins_over_the_anonymous_role() {
    let s = Server::start(&["--a2a-anonymous-role", "observer"]);
    // Anonymous (observer) may not send …
    let anonymous = s.send(None, user("hello", "m-anon"));
    assert_eq!(code(&anonymous), -32011, "{anonymous}");
    assert_eq!(anonymous["error"]["data"]["actor"], "a2a-anonymous");
    // … but a controller token presented alongside acts as its controller.
    let answer = s.send(Some(CONTROLLER), user("hello", "m-ctl"));
    assert_eq!(
        answer["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{answer}"
    );
    // An observer token is that observer, not the anonymous principal.
    let observer = s.send(Some(OBSERVER), user("hello", "m-obs"));
    assert_eq!(observer["error"]["data"]["actor"], "grafana", "{observer}");
    // A presented token that is not valid is a 401, never anonymous.
    let (status, bad) = s.a2a(Some("not-a-real-token-0000"), "ListTasks", json!({}));
    assert_eq!(status, 401, "{bad}");
}

#[test]
fn anonymous_callers_see_and_control_only_anonymous_contexts() {
    let mut s = Server::start(&["--a2a-anonymous-role", "controller"]);
    // A session someone else created over ACP, with a turn in it.
    let work = s.cwd().join("work");
    let created = s.acp(2, "session/new", json!({"cwd": work, "mcpServers": []}));
    let session = created["result"]["sessionId"].as_str().unwrap().to_owned();
    let prompted = s.acp(
        3,
        "session/prompt",
        json!({"sessionId": session, "prompt": [{"type": "text", "text": "hello secret"}]}),
    );
    assert!(prompted.get("result").is_some(), "{prompted}");
    // The controller token sees its task.
    let (_, listed) = s.a2a(Some(CONTROLLER), "ListTasks", json!({}));
    let tasks = listed["result"]["tasks"].as_array().unwrap().clone();
    assert_eq!(tasks.len(), 1, "{listed}");
    let acp_task = tasks[0]["id"].as_str().unwrap().to_owned();

    // Anonymous: the ACP session is not there.
    let (_, listed) = s.a2a(None, "ListTasks", json!({}));
    assert_eq!(listed["result"]["tasks"], json!([]), "{listed}");
    assert_eq!(listed["result"]["totalSize"], 0, "{listed}");
    let (_, listed) = s.a2a(None, "ListTasks", json!({"contextId": session}));
    assert_eq!(listed["result"]["tasks"], json!([]), "{listed}");
    let (_, got) = s.a2a(None, "GetTask", json!({"id": acp_task}));
    assert_eq!(code(&got), -32001, "{got}");
    let (_, cancelled) = s.a2a(None, "CancelTask", json!({"id": acp_task}));
    assert_eq!(code(&cancelled), -32001, "{cancelled}");
    let (_, subscribed) = s.a2a(None, "SubscribeToTask", json!({"id": acp_task}));
    assert_eq!(code(&subscribed), -32001, "{subscribed}");
    let mut to_task = user("hello again", "m-into-task");
    to_task["taskId"] = json!(acp_task);
    assert_eq!(code(&s.send(None, to_task)), -32001);
    let mut to_context = user("hello again", "m-into-context");
    to_context["contextId"] = json!(session);
    let refused = s.send(None, to_context);
    assert_eq!(code(&refused), -32602, "{refused}");
    assert_eq!(refused["error"]["data"]["field"], "message.contextId");
    // Nothing reached the ACP session: still one turn.
    let (_, listed) = s.a2a(Some(CONTROLLER), "ListTasks", json!({}));
    assert_eq!(listed["result"]["totalSize"], 1, "{listed}");

    // Its own context: anonymous sees, gets and continues it.
    let mine = s.send(None, user("hello", "m-mine"));
    let task = &mine["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{mine}");
    let (task_id, context) = (
        task["id"].as_str().unwrap().to_owned(),
        task["contextId"].as_str().unwrap().to_owned(),
    );
    let (_, listed) = s.a2a(None, "ListTasks", json!({}));
    let ids: Vec<&str> = listed["result"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert_eq!(ids, [task_id.as_str()], "{listed}");
    let (_, got) = s.a2a(None, "GetTask", json!({"id": task_id}));
    assert_eq!(got["result"]["id"], task_id.as_str(), "{got}");
    let mut again = user("hello", "m-mine-2");
    again["contextId"] = json!(context);
    let second = s.send(None, again);
    assert_eq!(
        second["result"]["task"]["contextId"],
        context.as_str(),
        "{second}"
    );
    // The context records its creator, as ACP sessions do.
    let listed = s.acp(4, "session/list", json!({}));
    let creator = listed["result"]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["sessionId"] == context.as_str())
        .map(|x| x["_meta"]["berth"]["createdBy"].clone());
    assert_eq!(creator, Some(json!("a2a-anonymous")), "{listed}");
}

#[test]
fn the_a2a_401_is_a_json_rpc_error() {
    let s = Server::start(&[]);
    for token in [None, Some("not-a-real-token-0000")] {
        let (status, answer) = s.a2a(token, "ListTasks", json!({}));
        assert_eq!(status, 401, "{answer}");
        assert_eq!(answer["jsonrpc"], "2.0", "{answer}");
        assert_eq!(answer["id"], Value::Null, "{answer}");
        assert!(answer["error"]["code"].is_i64(), "{answer}");
        assert!(answer["error"]["message"].is_string(), "{answer}");
        assert!(answer["error"]["data"]["reason"].is_string(), "{answer}");
    }
    let reply = s.http(
        "POST",
        "/",
        &[("Content-Type", "application/json")],
        r#"{"jsonrpc":"2.0","id":1,"method":"ListTasks"}"#,
    );
    assert_eq!(reply.status, 401);
    assert!(reply
        .header("www-authenticate")
        .is_some_and(|v| v.starts_with("Bearer")));
    // A role refusal is a JSON-RPC error too (-32011, naming the role).
    let refused = s.send(Some(OBSERVER), user("hello", "m-obs"));
    assert_eq!(refused["jsonrpc"], "2.0");
    assert_eq!(code(&refused), -32011, "{refused}");
    assert_eq!(refused["error"]["data"]["requiredRole"], "controller");
}

#[test]
fn a2a_works_on_the_default_relative_data_dir() {
    let s = Server::start(&[]);
    let answer = s.send(Some(CONTROLLER), user("hello", "m-rel"));
    let task = &answer["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{answer}");
    let context = task["contextId"].as_str().unwrap();
    // The context's working dir lies beside the data dir, not inside it.
    let dir = s.cwd().join("berth-data-a2a-contexts").join(context);
    assert!(dir.is_dir(), "{} is not a directory", dir.display());
    assert!(!s.cwd().join("berth-data").join("a2a-contexts").exists());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(s.cwd().join("berth-data-a2a-contexts"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "{mode:o}");
}

#[test]
fn a2a_contexts_dir_is_configurable() {
    let s = Server::start(&["--a2a-contexts-dir", "elsewhere/ctx"]);
    let answer = s.send(Some(CONTROLLER), user("hello", "m-cfg"));
    let context = answer["result"]["task"]["contextId"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"));
    assert!(s.cwd().join("elsewhere/ctx").join(context).is_dir());
}
