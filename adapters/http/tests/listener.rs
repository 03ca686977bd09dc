//! The listener's layers in process, on an ephemeral loopback port: auth
//! (401 before any handler), roles on the ops routes (403 -32011), the
//! Origin check (403), the body bound (413), the bound on requests in flight
//! (503, never queued), readiness, and routers mounted public or behind
//! auth.

use std::sync::Arc;

use axum::routing::get;
use axum::{Extension, Router};
use berth_actors::{Node, NodeConfig, Principal, Role};
use berth_http::{ApiToken, HttpConfig, HttpServer};
use serde_json::{json, Value};
use tokio::sync::{oneshot, Mutex, Semaphore};

const OBSERVER: &str = "observer-token-0123456789";
const CONTROLLER: &str = "controller-token-0123456789";

async fn node(dir: &std::path::Path) -> Node {
    let model = berth_runtime::model::from_spec("scripted").unwrap();
    Node::start(NodeConfig::new(dir.join("data"), model))
        .await
        .unwrap()
}

fn config() -> HttpConfig {
    let mut config = HttpConfig::new("127.0.0.1:0".parse().unwrap());
    config.tokens = vec![
        ApiToken {
            token: OBSERVER.into(),
            principal: Principal::new("grafana", Role::Observer),
        },
        ApiToken {
            token: CONTROLLER.into(),
            principal: Principal::new("alice", Role::Controller),
        },
    ];
    config.allowed_origins = vec!["https://console.example".into()];
    config.max_body_bytes = 1024;
    config.max_requests_in_flight = 2;
    config
}

/// A route that reports it was entered, then waits to be released.
#[derive(Clone)]
struct Gate {
    entered: Arc<Mutex<Option<oneshot::Sender<()>>>>,
    release: Arc<Semaphore>,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            entered: Arc::default(),
            release: Arc::new(Semaphore::new(0)),
        }
    }
}

struct Running {
    base: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}

async fn start(node: Node, config: HttpConfig, gate: Gate) -> Running {
    let gated = Router::new().route(
        "/test/gate",
        get(|Extension(p): Extension<Principal>| async move {
            if let Some(entered) = gate.entered.lock().await.take() {
                let _ = entered.send(());
            }
            gate.release.acquire().await.unwrap().forget();
            p.actor
        }),
    );
    let public = Router::new().route("/test/public", get(|| async { "public" }));
    let server = HttpServer::builder(node, config)
        .mount(gated)
        .mount_public(public)
        .build()
        .unwrap()
        .bind()
        .await
        .unwrap();
    let base = format!("http://{}", server.local_addr());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        server
            .serve(async move {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    Running {
        base,
        stop: Some(stop),
        task,
    }
}

async fn error_of(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    (status, body["error"].clone())
}

#[tokio::test]
async fn layers_refuse_before_handlers_run() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(node(dir.path()).await, config(), Gate::default()).await;
    let base = &running.base;
    let http = reqwest::Client::new();

    // Probes and public routers need no token; the rest do.
    assert_eq!(
        http.get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let ready: Value = http
        .get(format!("{base}/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["journal"]["ok"], true);
    assert_eq!(
        http.get(format!("{base}/test/public"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    for auth in [
        None,
        Some("Bearer nope-nope-nope-nope"),
        Some("Basic abc"),
        Some("Bearer "),
    ] {
        let mut request = http.get(format!("{base}/v1/sessions"));
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        let response = request.send().await.unwrap();
        assert_eq!(
            response.headers()["www-authenticate"],
            "Bearer realm=\"berth\""
        );
        let (status, error) = error_of(response).await;
        assert_eq!(status, 401, "{auth:?}");
        assert_eq!(error["message"], "Unauthenticated");
    }
    // The scheme is case-insensitive.
    let ok = http
        .get(format!("{base}/v1/sessions"))
        .header("authorization", format!("bearer {OBSERVER}"))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);

    // Roles on the ops routes.
    let (status, error) = error_of(
        http.post(format!("{base}/v1/events"))
            .bearer_auth(OBSERVER)
            .json(&json!({"name": "x"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, error["code"].as_i64()), (403, Some(-32011)));
    assert_eq!(error["data"]["requiredRole"], "controller");
    assert_eq!(error["data"]["actor"], "grafana");

    // Origins: an allowed one passes, another is refused before auth.
    let allowed = http
        .get(format!("{base}/v1/sessions"))
        .bearer_auth(OBSERVER)
        .header("origin", "https://console.example")
        .send()
        .await
        .unwrap();
    assert_eq!(allowed.status(), 200);
    let (status, error) = error_of(
        http.get(format!("{base}/healthz"))
            .header("origin", "https://evil.example")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 403);
    assert_eq!(error["data"]["reason"], "origin_not_allowed");

    // The body bound: typed 413, nothing journaled.
    let (status, error) = error_of(
        http.post(format!("{base}/v1/events"))
            .bearer_auth(CONTROLLER)
            .json(&json!({"name": "big", "data": "x".repeat(4096)}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 413);
    assert_eq!(error["data"]["reason"], "body_too_large");
    let emitted: Value = http
        .post(format!("{base}/v1/events"))
        .bearer_auth(CONTROLLER)
        .json(&json!({"name": "small"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(emitted["seq"], 1, "the refused events were not journaled");
}

#[tokio::test]
async fn requests_past_the_bound_get_503_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::default();
    let (entered_tx, entered_rx) = oneshot::channel();
    *gate.entered.lock().await = Some(entered_tx);
    let (entered2_tx, entered2_rx) = oneshot::channel();
    let running = start(node(dir.path()).await, config(), gate.clone()).await;
    let base = running.base.clone();
    let http = reqwest::Client::new();
    let first = tokio::spawn({
        let (http, base) = (http.clone(), base.clone());
        async move {
            http.get(format!("{base}/test/gate"))
                .bearer_auth(CONTROLLER)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    });
    entered_rx.await.unwrap();
    *gate.entered.lock().await = Some(entered2_tx);
    let second = tokio::spawn({
        let (http, base) = (http.clone(), base.clone());
        async move {
            http.get(format!("{base}/test/gate"))
                .bearer_auth(OBSERVER)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    });
    entered2_rx.await.unwrap();
    // Two requests hold both slots: a third is refused, not queued.
    let (status, error) = error_of(
        http.get(format!("{base}/v1/sessions"))
            .bearer_auth(OBSERVER)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 503);
    assert_eq!(error["data"]["reason"], "too_many_requests");
    gate.release.add_permits(2);
    // The handlers saw the authenticated principals.
    assert_eq!(first.await.unwrap(), "alice");
    assert_eq!(second.await.unwrap(), "grafana");
    let after = http
        .get(format!("{base}/v1/sessions"))
        .bearer_auth(OBSERVER)
        .send()
        .await
        .unwrap();
    assert_eq!(after.status(), 200, "slots are released");
}

#[tokio::test]
async fn a_listener_without_tokens_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path()).await;
    let mut config = config();
    config.tokens.clear();
    let err = HttpServer::builder(node.clone(), config)
        .build()
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("BERTH_API_KEYS"), "{err}");
    let mut config = self::config();
    config.tokens.push(config.tokens[0].clone());
    let err = HttpServer::builder(node, config)
        .build()
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("repeats an earlier token"), "{err}");
}

/// Opens a TCP connection to the listener that sends nothing.
async fn silent(base: &str) -> tokio::net::TcpStream {
    let addr = base.trim_start_matches("http://");
    tokio::net::TcpStream::connect(addr).await.unwrap()
}

/// Reads until the server closes `stream` (EOF or reset), waiting at most
/// 20 s; returns whether it closed.
async fn closed_by_server(stream: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 1024];
    let wait = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(20), wait)
        .await
        .is_ok()
}

/// A connection that sends a request line, then one header line every
/// 50 ms and never ends the head (slowloris); the task ends when a write
/// fails.
fn trickle(mut stream: tokio::net::TcpStream) -> tokio::task::JoinHandle<()> {
    use tokio::io::AsyncWriteExt;
    tokio::spawn(async move {
        if stream
            .write_all(b"GET /healthz HTTP/1.1\r\n")
            .await
            .is_err()
        {
            return;
        }
        for i in 0u32.. {
            let line = format!("x-slow-{i}: 1\r\n");
            if stream.write_all(line.as_bytes()).await.is_err() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
}

#[tokio::test]
async fn silent_and_trickling_connections_are_closed_after_their_timeouts() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config();
    config.max_connections = 64;
    config.header_read_timeout = std::time::Duration::from_millis(300);
    config.idle_timeout = std::time::Duration::from_millis(600);
    let server = start(node(dir.path()).await, config, Gate::default()).await;
    let mut quiet = Vec::new();
    for _ in 0..3 {
        quiet.push(silent(&server.base).await);
    }
    let slow = trickle(silent(&server.base).await);
    for stream in &mut quiet {
        assert!(
            closed_by_server(stream).await,
            "a silent connection stayed open"
        );
    }
    tokio::time::timeout(std::time::Duration::from_secs(20), slow)
        .await
        .expect("a trickling connection stayed open")
        .unwrap();
    // A keep-alive connection idle after its request is closed too.
    let mut kept = silent(&server.base).await;
    {
        use tokio::io::AsyncWriteExt;
        kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
    }
    assert!(
        closed_by_server(&mut kept).await,
        "an idle keep-alive stayed open"
    );
    // The listener still serves.
    let health = reqwest::get(format!("{}/healthz", server.base))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test]
async fn health_and_metrics_answer_while_the_connection_cap_is_flooded() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config();
    config.max_connections = 8;
    let server = start(node(dir.path()).await, config, Gate::default()).await;
    let mut flood = Vec::new();
    for _ in 0..20 {
        flood.push(silent(&server.base).await);
    }
    let mut slow = Vec::new();
    for _ in 0..4 {
        slow.push(trickle(silent(&server.base).await));
    }
    let client = reqwest::Client::new();
    let bounded = std::time::Duration::from_secs(20);
    for _ in 0..3 {
        let health = tokio::time::timeout(
            bounded,
            client.get(format!("{}/healthz", server.base)).send(),
        )
        .await
        .expect("/healthz did not answer under a connection flood")
        .unwrap();
        assert_eq!(health.status(), 200);
        let metrics = tokio::time::timeout(
            bounded,
            client
                .get(format!("{}/metrics", server.base))
                .bearer_auth(OBSERVER)
                .send(),
        )
        .await
        .expect("/metrics did not answer under a connection flood")
        .unwrap();
        assert_eq!(metrics.status(), 200);
    }
    for task in slow {
        task.abort();
    }
}
