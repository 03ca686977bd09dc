//! JSON-RPC 2.0 framing: classifying inbound messages and encoding outbound ones,
//! with the typed errors berth answers.
//!
//! Error codes (JSON-RPC 2.0 §5.1, ACP "Error", `remote-session-control.md`):
//!
//! | code | meaning | `data` |
//! |---|---|---|
//! | -32700 | not JSON | `{reason}` |
//! | -32600 | not a request object, a batch, a frame over the size bound, or an object that repeats a key (at any depth) | `{reason, …}` (`{reason: "duplicate_key", key, path}` with `path` a JSON Pointer) |
//! | -32601 | unknown method | `{method}` |
//! | -32602 | bad params | `{field, reason}`; a repeated `session/suspend` whose `resumeWhen` differs from the pending one's: `{field: "resumeWhen", reason: "suspend_pending", sessionId, handle, pendingResumeWhen}` |
//! | -32603 | internal failure (journal, actor) | `{reason}` |
//! | -32004 | session not held / no active prompt | `{sessionId}` (`reason: "no_active_prompt"` for the latter) |
//! | -32005 | session is closed | `{sessionId, reason: "session_closed"}` |
//! | -32006 | a prompt is already running | `{sessionId, turnId, reason: "prompt_active"}` |
//! | -32007 | too many requests in flight on this connection | `{limit, reason: "too_many_requests"}` |
//! | -32008 | an injected message cannot be revoked/replaced | `{messageId, reason: "already_delivered" \| "already_revoked" \| "unknown_message_id"}` |
//! | -32009 | a resume found nothing to claim | `{sessionId, handle, reason: "already_resumed" (with `claim: {kind, cause, actor, claimedAt}`) \| "not_suspended"}` |
//! | -32010 | the session is suspended (prompt, rollback) | `{sessionId, handle, reason: "session_suspended"}` |
//! | -32011 | the connection's role does not allow the method (`methods::authorize`) | `{reason: "role_not_authorized", method, actor, role, requiredRole, sessionId?, detail?}`; a control-socket connection from a tool process: `{reason: "tool_process"}` (id null), then closed |
//! | -32012 | a parked turn cannot continue under today's history/configuration | `{sessionId, handle, reason: "resume_refused", refusal: "history_changed" \| "configuration_changed" \| "frame_version" \| "completion_owner_missing"}` |

use berth_actors::error::ResumeConflict;
use berth_actors::ControlError;
use berth_runtime::engine::ResumeRefusal;
use berth_runtime::unique_json::JsonDecodeError;
use serde_json::{json, Map, Value};

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    /// Error code.
    pub code: i64,
    /// Short message.
    pub message: String,
    /// What exactly was wrong (always an object).
    pub data: Value,
}

impl RpcError {
    /// An error with `code`, `message` and `data`.
    pub fn new(code: i64, message: impl Into<String>, data: Value) -> Self {
        Self {
            code,
            message: message.into(),
            data,
        }
    }

    /// -32700: the frame is not JSON.
    pub fn parse_error(reason: impl std::fmt::Display) -> Self {
        Self::new(-32700, "Parse error", json!({"reason": reason.to_string()}))
    }

    /// -32600: not a valid request.
    pub fn invalid_request(reason: &str) -> Self {
        Self::new(-32600, "Invalid Request", json!({"reason": reason}))
    }

    /// -32601: unknown method.
    pub fn method_not_found(method: &str) -> Self {
        Self::new(-32601, "Method not found", json!({"method": method}))
    }

    /// -32602: a bad parameter, naming it.
    pub fn invalid_params(field: &str, reason: impl std::fmt::Display) -> Self {
        Self::new(
            -32602,
            "Invalid params",
            json!({"field": field, "reason": reason.to_string()}),
        )
    }

    /// -32603: internal failure.
    pub fn internal(reason: impl std::fmt::Display) -> Self {
        Self::new(
            -32603,
            "Internal error",
            json!({"reason": reason.to_string()}),
        )
    }

    /// -32004: the server holds no such session.
    pub fn unknown_session(session_id: &str) -> Self {
        Self::new(
            -32004,
            "Session not found",
            json!({"sessionId": session_id, "reason": "unknown_session"}),
        )
    }

    /// -32602 from a serde error on `params`, naming the field when serde does.
    pub fn from_serde(e: &serde_json::Error) -> Self {
        let msg = e.to_string();
        let field = msg
            .split('`')
            .nth(1)
            .filter(|_| msg.starts_with("missing field") || msg.starts_with("unknown field"))
            .unwrap_or("params")
            .to_owned();
        Self::invalid_params(&field, msg)
    }
}

impl From<ControlError> for RpcError {
    fn from(e: ControlError) -> Self {
        match &e {
            ControlError::UnknownSession { session_id } => {
                Self::unknown_session(session_id.as_str())
            }
            ControlError::SessionClosed { session_id } => Self::new(
                -32005,
                e.to_string(),
                json!({"sessionId": session_id, "reason": "session_closed"}),
            ),
            ControlError::PromptActive {
                session_id,
                turn_id,
            } => Self::new(
                -32006,
                e.to_string(),
                json!({"sessionId": session_id, "turnId": turn_id, "reason": "prompt_active"}),
            ),
            ControlError::InvalidParams { field, reason } => Self::invalid_params(field, reason),
            ControlError::NoActivePrompt { session_id } => Self::new(
                -32004,
                "Session has no active prompt",
                json!({"sessionId": session_id, "reason": "no_active_prompt"}),
            ),
            ControlError::Injection {
                message_id,
                conflict,
            } => Self::new(
                -32008,
                e.to_string(),
                json!({"messageId": message_id, "reason": conflict.reason()}),
            ),
            ControlError::SessionSuspended { session_id, handle } => Self::new(
                -32010,
                e.to_string(),
                json!({"sessionId": session_id, "handle": handle, "reason": "session_suspended"}),
            ),
            ControlError::ResumeConflict {
                session_id,
                handle,
                reason,
            } => {
                let mut data = json!({"sessionId": session_id, "handle": handle});
                match reason {
                    ResumeConflict::AlreadyResumed { claim } => {
                        data["reason"] = json!("already_resumed");
                        data["claim"] = json!({
                            "kind": claim.kind,
                            "cause": claim.cause,
                            "actor": claim.actor,
                            "claimedAt": claim.claimed_at,
                        });
                    }
                    ResumeConflict::NotSuspended => data["reason"] = json!("not_suspended"),
                    ResumeConflict::HandleMismatch { current } => {
                        data["reason"] = json!("handle_mismatch");
                        data["currentHandle"] = json!(current);
                    }
                }
                Self::new(-32009, e.to_string(), data)
            }
            ControlError::SuspendPending {
                session_id,
                handle,
                resume_when,
            } => Self::new(
                -32602,
                e.to_string(),
                json!({"field": "resumeWhen", "reason": "suspend_pending", "sessionId": session_id,
                       "handle": handle, "pendingResumeWhen": resume_when}),
            ),
            ControlError::ResumeRefused {
                session_id,
                handle,
                refusal,
            } => {
                let kind = match refusal {
                    ResumeRefusal::FrameVersion { .. } => "frame_version",
                    ResumeRefusal::HistoryChanged { .. } => "history_changed",
                    ResumeRefusal::ConfigurationChanged { .. } => "configuration_changed",
                    ResumeRefusal::CompletionOwnerMissing { .. } => "completion_owner_missing",
                };
                Self::new(
                    -32012,
                    e.to_string(),
                    json!({"sessionId": session_id, "handle": handle, "reason": "resume_refused", "refusal": kind}),
                )
            }
            ControlError::Storage(_) | ControlError::ActorFailed(_) => Self::internal(&e),
        }
    }
}

/// One classified inbound message.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// A request: answer it.
    Request {
        /// Request id (string, 64-bit integer or null).
        id: Value,
        /// Method name.
        method: String,
        /// Params (`{}` when absent).
        params: Value,
    },
    /// A notification: never answered.
    Notification {
        /// Method name.
        method: String,
        /// Params (`{}` when absent).
        params: Value,
    },
    /// A response to a request berth sent (`session/request_permission`).
    Response {
        /// The id berth gave its request.
        id: Value,
        /// `result`, or `{"error": …}` for an error response.
        payload: Value,
    },
}

/// A frame that is not a valid message: the id to answer with (null when it
/// could not be read) and the error.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    /// The request id, or null.
    pub id: Value,
    /// Why it was rejected.
    pub error: RpcError,
}

/// Classifies one frame.
///
/// # Errors
/// [`Rejected`] for anything that is not a JSON-RPC 2.0 message object.
pub fn classify(frame: &[u8]) -> Result<Incoming, Box<Rejected>> {
    classify_inner(frame).map_err(|(id, error)| Box::new(Rejected { id, error }))
}

// Boxed once by `classify`; the tuple keeps the early returns readable.
#[allow(clippy::result_large_err)]
fn classify_inner(frame: &[u8]) -> Result<Incoming, (Value, RpcError)> {
    let value = berth_runtime::unique_json::from_slice(frame).map_err(|e| {
        let error = match e {
            JsonDecodeError::Syntax(e) => RpcError::parse_error(e),
            JsonDecodeError::DuplicateKey { key, path } => RpcError::new(
                -32600,
                "Invalid Request",
                json!({"reason": "duplicate_key", "key": key, "path": path}),
            ),
        };
        (Value::Null, error)
    })?;
    let Value::Object(mut obj) = value else {
        let reason = if value.is_array() {
            "batch requests are not supported; send one message per line"
        } else {
            "a JSON-RPC message must be an object"
        };
        return Err((Value::Null, RpcError::invalid_request(reason)));
    };
    let id = obj.remove("id");
    let id_value = id.clone().unwrap_or(Value::Null);
    if let Some(id) = &id {
        // A number is echoed as parsed: one that is not a 64-bit integer
        // (fractional, or too large) would come back changed, so it is
        // refused (JSON-RPC 2.0 §4: ids SHOULD NOT have fractional parts;
        // the answer must carry the request's id).
        if !(id.is_string() || id.is_i64() || id.is_u64() || id.is_null()) {
            return Err((
                Value::Null,
                RpcError::invalid_request(
                    "`id` must be a string, an integer that fits in 64 bits, or null",
                ),
            ));
        }
    }
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err((
            id_value,
            RpcError::invalid_request("`jsonrpc` must be \"2.0\""),
        ));
    }
    let Some(method) = obj.remove("method") else {
        if let Some(result) = obj.remove("result") {
            return Ok(Incoming::Response {
                id: id_value,
                payload: result,
            });
        }
        if let Some(error) = obj.remove("error") {
            return Ok(Incoming::Response {
                id: id_value,
                payload: json!({ "error": error }),
            });
        }
        return Err((id_value, RpcError::invalid_request("`method` is missing")));
    };
    let Value::String(method) = method else {
        return Err((
            id_value,
            RpcError::invalid_request("`method` must be a string"),
        ));
    };
    let params = match obj.remove("params") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(p @ Value::Object(_)) => p,
        Some(_) => {
            return Err((
                id_value,
                RpcError::invalid_params("params", "must be an object"),
            ))
        }
    };
    Ok(match id {
        Some(id) => Incoming::Request { id, method, params },
        None => Incoming::Notification { method, params },
    })
}

/// Encodes a success response.
pub fn encode_result(id: &Value, result: Value) -> String {
    // The object `json!({"jsonrpc", "id", "result"})` builds, with `result`
    // moved in: `json!` serializes it into a copy of its whole tree first.
    let mut response = Map::new();
    response.insert("jsonrpc".into(), Value::from("2.0"));
    response.insert("id".into(), id.clone());
    response.insert("result".into(), result);
    Value::Object(response).to_string()
}

/// Encodes an error response.
pub fn encode_error(id: &Value, error: &RpcError) -> String {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": error.code, "message": error.message, "data": error.data},
    })
    .to_string()
}

/// Encodes a notification: `{"jsonrpc": "2.0", "method", "params"}`.
/// `params` is serialized straight into the frame (no intermediate
/// `Value` tree: rendering notifications was about a tenth of berth's CPU
/// in the wake-up bench); one that cannot be serialized becomes `null`.
pub fn encode_notification<P: serde::Serialize + ?Sized>(method: &str, params: &P) -> String {
    #[derive(serde::Serialize)]
    struct Notification<'a, P: ?Sized> {
        jsonrpc: &'static str,
        method: &'a str,
        params: &'a P,
    }
    // Sized for a typical frame (a few hundred bytes to ~1 KiB), so the
    // buffer is not regrown three or four times on the way there.
    let mut frame = Vec::with_capacity(FRAME_CAPACITY);
    match serde_json::to_writer(
        &mut frame,
        &Notification {
            jsonrpc: "2.0",
            method,
            params,
        },
    ) {
        // serde_json writes only UTF-8.
        Ok(()) => String::from_utf8(frame).unwrap_or_default(),
        Err(_) => json!({"jsonrpc": "2.0", "method": method, "params": null}).to_string(),
    }
}

/// Initial capacity (bytes) of an encoded notification.
const FRAME_CAPACITY: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_is_encoded_as_it_always_was() {
        let result = json!({"sessionId": "s", "modes": {"b": [1, 2.5, null], "a": "x\"y"}});
        for id in [json!(7), json!("req-1"), Value::Null] {
            assert_eq!(
                encode_result(&id, result.clone()),
                json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string()
            );
        }
    }

    fn err(frame: &str) -> (Value, RpcError) {
        let rejected = classify(frame.as_bytes()).unwrap_err();
        (rejected.id, rejected.error)
    }

    #[test]
    fn classifies_requests_and_notifications() {
        let r = classify(br#"{"jsonrpc":"2.0","id":7,"method":"initialize","params":{"a":1}}"#)
            .unwrap();
        assert_eq!(
            r,
            Incoming::Request {
                id: json!(7),
                method: "initialize".into(),
                params: json!({"a":1})
            }
        );
        let n = classify(br#"{"jsonrpc":"2.0","method":"session/cancel"}"#).unwrap();
        assert_eq!(
            n,
            Incoming::Notification {
                method: "session/cancel".into(),
                params: json!({})
            }
        );
        assert_eq!(
            classify(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#).unwrap(),
            Incoming::Response {
                id: json!(1),
                payload: json!({})
            }
        );
    }

    #[test]
    fn bad_frames_get_typed_errors() {
        assert_eq!(err("{nope").1.code, -32700);
        let (id, e) = err(r#"[{"jsonrpc":"2.0","id":1,"method":"x"}]"#);
        assert_eq!((id, e.code), (Value::Null, -32600));
        assert!(e.data["reason"].as_str().unwrap().contains("batch"));
        assert_eq!(err("42").1.code, -32600);
        let (id, e) = err(r#"{"jsonrpc":"1.0","id":"a","method":"x"}"#);
        assert_eq!((id, e.code), (json!("a"), -32600));
        assert_eq!(
            err(r#"{"jsonrpc":"2.0","id":{},"method":"x"}"#).1.code,
            -32600
        );
        assert_eq!(err(r#"{"jsonrpc":"2.0","id":1,"method":5}"#).1.code, -32600);
        // Ids that could not be echoed exactly are refused, not rounded.
        for id in ["18446744073709551616", "-9223372036854775809", "1.5", "1e3"] {
            let (echo, e) = err(&format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"x"}}"#));
            assert_eq!((echo, e.code), (Value::Null, -32600), "{id}");
        }
        let max = classify(br#"{"jsonrpc":"2.0","id":18446744073709551615,"method":"x"}"#);
        assert!(matches!(max, Ok(Incoming::Request { ref id, .. }) if id.is_u64()));
        let (_, e) = err(r#"{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}"#);
        assert_eq!((e.code, e.data["field"].as_str()), (-32602, Some("params")));
    }

    #[test]
    fn serde_errors_name_the_field() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct P {
            cwd: String,
        }
        let e = serde_json::from_value::<P>(json!({})).unwrap_err();
        let rpc = RpcError::from_serde(&e);
        assert_eq!(rpc.data["field"], "cwd");
    }
}
