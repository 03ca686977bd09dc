//! # berth-a2a
//!
//! A2A (Agent2Agent) protocol 1.0 for berth: JSON-RPC 2.0 over HTTP, SSE
//! streaming and the agent card, as an [`axum::Router`] ([`router`]) that a
//! listener mounts. A thin adapter: it decodes a request, calls the
//! [`berth_actors::Node`] and encodes the answer; every task it reports is
//! folded from the session's durable event log ([`project`]), so what a
//! client hears has been journaled first, and it survives restarts.
//!
//! The mapping (`DESIGN.md`, "Adapters"):
//! - a context (`contextId`) is a berth session; a client-provided
//!   `contextId` names a new session created with that id;
//! - a task is one prompt turn (`taskId` = `<turn id>.<session id>`,
//!   [`ids`]); task states come from the turn ([`project`]);
//! - a suspended turn is `TASK_STATE_INPUT_REQUIRED` with
//!   `metadata.berth.suspension`, and a message sent to it resumes it with the
//!   message as input (one-time claim, `explicit_resume`); a message to a
//!   working task is a `steer` injection; `CancelTask` is `session/cancel`;
//! - outputs: agent text is a text artifact; a `publish_artifact` call an
//!   artifact with a `text`, `data` or `url` part; a `write_file` a file
//!   artifact ([`project`]);
//! - a direct Message (spec §3.1.1): a blocking `SendMessage` that starts a
//!   task whose turn completes with exactly one `direct_reply` call and no
//!   artifact is answered `{"message": …}` instead of `{"task": …}`.
//!   Streaming and non-blocking sends commit to a Task before the agent has
//!   spoken, so there the reply is the completed task's status message.
//!
//! Methods ([`rpc`]): `SendMessage`, `SendStreamingMessage`, `GetTask`,
//! `ListTasks`, `CancelTask`, `SubscribeToTask`; the four push-notification
//! config methods answer PushNotificationNotSupportedError (`-32003`) and
//! `GetExtendedAgentCard` UnsupportedOperationError (`-32004`). Only protocol
//! 1.0 is served: the `A2A-Version` header (or query parameter) must name
//! 1.0; a missing one means 0.3 (spec §3.6.2), which is refused with
//! VersionNotSupportedError (`-32009`), and so are the 0.3 slash-style method
//! names (`message/send`, …) — 0.3 also differs in payload shapes, which a
//! thin alias could not honour.
//!
//! Bounds: request bodies over [`A2aOptions::max_body_bytes`] are refused
//! (`413`, `-32600`) without being buffered whole; at most
//! [`A2aOptions::max_in_flight`] unary requests and
//! [`A2aOptions::max_streams`] open streams at once (past that `503` with
//! `Retry-After`). Authentication and listener policy (TLS, bind address)
//! belong to the listener: its bearer-token layer sets the caller's
//! [`berth_actors::Principal`] as a request extension, whose actor is
//! recorded in receipts and whose role is checked per method (observers may
//! get, list and subscribe; sending and cancelling need a controller;
//! otherwise -32011 `role_not_authorized`); contexts it creates record that
//! actor as their creator. A request the listener admitted without a token
//! (marked [`berth_actors::auth::Anonymous`], actor [`ANONYMOUS_ACTOR`]) sees
//! and controls only contexts created by anonymous callers: others answer as
//! missing tasks (`-32001`), `ListTasks` leaves them out, and their
//! `contextId` cannot be taken (`-32602`). Without a principal (the router
//! served on its own, as in tests) the actor is `a2a` with every right and
//! no creator is recorded.

#![warn(missing_docs)]

pub mod card;
pub mod content;
pub mod error;
pub mod follow;
pub mod ids;
mod methods;
pub mod project;
pub mod rpc;
pub mod wire;

use std::path::PathBuf;
use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;
use berth_actors::Node;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

/// The A2A protocol version served.
pub const PROTOCOL_VERSION: &str = "1.0";

/// The actor recorded in receipts of A2A-originated controls (cancel,
/// resume, steer) when the request carries no [`berth_actors::Principal`].
pub const DEFAULT_ACTOR: &str = "a2a";

/// The actor of callers admitted without a token under a configured
/// anonymous role (`--a2a-anonymous-role`); such a request carries the
/// [`berth_actors::auth::Anonymous`] marker and sees and controls only the
/// contexts created by anonymous callers.
pub const ANONYMOUS_ACTOR: &str = "a2a-anonymous";

/// One skill on the agent card (A2A spec §4.4.5, `AgentSkill`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentSkill {
    /// Unique id.
    pub id: String,
    /// Display name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Keywords (the card requires the field).
    #[serde(default)]
    pub tags: Vec<String>,
    /// Example prompts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<String>,
}

/// Configuration of the A2A adapter.
#[derive(Debug, Clone)]
pub struct A2aOptions {
    /// Agent card `name` (default `berth`).
    pub name: String,
    /// Agent card `description`.
    pub description: String,
    /// Agent card `version` (the agent's version; default berth's).
    pub version: String,
    /// The JSON-RPC URL the card advertises; `None`: `http://<Host>/`.
    pub public_url: Option<String>,
    /// Card skills (at least one is shown: a default one when empty).
    pub skills: Vec<AgentSkill>,
    /// Sessions created over A2A get `<workspace_root>/<contextId>` as their
    /// working directory (created on demand, 0700 with any missing parent);
    /// must be absolute (a session's cwd is), and outside the data dir.
    pub workspace_root: PathBuf,
    /// Largest request body (bytes, default 8 MiB).
    pub max_body_bytes: usize,
    /// Unary requests handled at once (default 64).
    pub max_in_flight: usize,
    /// SSE streams open at once (default 256).
    pub max_streams: usize,
    /// `Cache-Control: max-age` of the card (seconds, default 300).
    pub card_max_age_secs: u64,
    /// The card's `Last-Modified`: when its content was configured (default:
    /// when these options were made, at whole seconds, as HTTP dates are).
    pub card_modified: chrono::DateTime<chrono::Utc>,
    /// How long `CancelTask` waits for the turn to stop before answering
    /// with its state at that moment (ms, default 10 000).
    pub cancel_wait_ms: u64,
    /// Put `[a2a messageId: …]` in front of each prompt the model reads (the
    /// TCK profile's in-band signal; off by default).
    pub message_ids_in_prompt: bool,
}

impl A2aOptions {
    /// Defaults, with sessions' working directories under `workspace_root`.
    pub fn new(workspace_root: PathBuf) -> Self {
        Self {
            name: "berth".into(),
            description: "A durable runtime for agent sessions: each context is a journaled berth session, each task one prompt turn; suspended turns wait as input-required and resume with the next message.".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            public_url: None,
            skills: vec![AgentSkill {
                id: "session".into(),
                name: "Agent session".into(),
                description: "Runs a prompt turn of a durable agent session (model calls and tools: shell, files, await_resumption, publish_artifact for text, data and URL artifacts, direct_reply for a direct message answer).".into(),
                tags: vec!["agent".into(), "durable".into()],
                examples: Vec::new(),
            }],
            workspace_root,
            max_body_bytes: 8 * 1024 * 1024,
            max_in_flight: 64,
            max_streams: 256,
            card_max_age_secs: 300,
            card_modified: chrono::DateTime::from_timestamp(chrono::Utc::now().timestamp(), 0)
                .unwrap_or_default(),
            cancel_wait_ms: 10_000,
            message_ids_in_prompt: false,
        }
    }
}

/// State shared by the handlers.
pub(crate) struct Shared {
    pub node: Node,
    pub options: A2aOptions,
    pub requests: Arc<Semaphore>,
    pub streams: Arc<Semaphore>,
}

/// The A2A routes: `GET /.well-known/agent-card.json` and the JSON-RPC
/// endpoint `POST /`.
pub fn router(node: Node, options: A2aOptions) -> Router {
    let (card, rpc) = routers(node, options);
    card.merge(rpc)
}

/// [`router`] in two parts: the agent card (`GET
/// /.well-known/agent-card.json`, public: clients read it before they hold
/// a token) and the JSON-RPC endpoint (`POST /`, for the listener's
/// authenticated routes).
pub fn routers(node: Node, mut options: A2aOptions) -> (Router, Router) {
    if options.skills.is_empty() {
        options.skills = A2aOptions::new(PathBuf::new()).skills;
    }
    let shared = Arc::new(Shared {
        requests: Arc::new(Semaphore::new(options.max_in_flight.max(1))),
        streams: Arc::new(Semaphore::new(options.max_streams.max(1))),
        node,
        options,
    });
    let card = Router::new()
        .route(
            "/.well-known/agent-card.json",
            get(
                |axum::extract::State(shared): axum::extract::State<Arc<Shared>>,
                 headers: axum::http::HeaderMap| async move {
                    card::respond(&shared.options, &headers)
                },
            ),
        )
        .with_state(Arc::clone(&shared));
    let rpc = Router::new()
        .route("/", post(rpc::handle))
        .with_state(shared);
    (card, rpc)
}
