//! Typed errors and their JSON-RPC encoding (A2A spec §3.3.2, §5.4 "Error
//! Code Mappings", §9.5 "Error Handling").
//!
//! A2A errors (`-32001` … `-32009`) carry `error.data` as an array holding one
//! `google.rpc.ErrorInfo` (`@type`, `reason` in UPPER_SNAKE_CASE without the
//! `Error` suffix, `domain: "a2a-protocol.org"`, string `metadata` naming what
//! was wrong). The standard JSON-RPC errors (`-32700` … `-32603`) carry a
//! `data` object (`reason`, `field`, …) as berth's ACP adapter does.

use berth_actors::error::ResumeConflict;
use berth_actors::ControlError;
use serde_json::{json, Map, Value};

/// `google.rpc.ErrorInfo` type URL (A2A spec §9.5).
pub const ERROR_INFO_TYPE: &str = "type.googleapis.com/google.rpc.ErrorInfo";
/// `ErrorInfo.domain` of every A2A error.
pub const ERROR_DOMAIN: &str = "a2a-protocol.org";

/// The A2A error types of spec §3.3.2 with their JSON-RPC codes (§5.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum A2aErrorKind {
    /// `-32001` TaskNotFoundError.
    TaskNotFound,
    /// `-32002` TaskNotCancelableError.
    TaskNotCancelable,
    /// `-32003` PushNotificationNotSupportedError.
    PushNotificationNotSupported,
    /// `-32004` UnsupportedOperationError.
    UnsupportedOperation,
    /// `-32005` ContentTypeNotSupportedError.
    ContentTypeNotSupported,
    /// `-32006` InvalidAgentResponseError.
    InvalidAgentResponse,
    /// `-32007` ExtendedAgentCardNotConfiguredError.
    ExtendedAgentCardNotConfigured,
    /// `-32008` ExtensionSupportRequiredError.
    ExtensionSupportRequired,
    /// `-32009` VersionNotSupportedError.
    VersionNotSupported,
}

impl A2aErrorKind {
    /// The JSON-RPC code.
    pub fn code(self) -> i64 {
        match self {
            Self::TaskNotFound => -32001,
            Self::TaskNotCancelable => -32002,
            Self::PushNotificationNotSupported => -32003,
            Self::UnsupportedOperation => -32004,
            Self::ContentTypeNotSupported => -32005,
            Self::InvalidAgentResponse => -32006,
            Self::ExtendedAgentCardNotConfigured => -32007,
            Self::ExtensionSupportRequired => -32008,
            Self::VersionNotSupported => -32009,
        }
    }

    /// `ErrorInfo.reason`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::TaskNotFound => "TASK_NOT_FOUND",
            Self::TaskNotCancelable => "TASK_NOT_CANCELABLE",
            Self::PushNotificationNotSupported => "PUSH_NOTIFICATION_NOT_SUPPORTED",
            Self::UnsupportedOperation => "UNSUPPORTED_OPERATION",
            Self::ContentTypeNotSupported => "CONTENT_TYPE_NOT_SUPPORTED",
            Self::InvalidAgentResponse => "INVALID_AGENT_RESPONSE",
            Self::ExtendedAgentCardNotConfigured => "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
            Self::ExtensionSupportRequired => "EXTENSION_SUPPORT_REQUIRED",
            Self::VersionNotSupported => "VERSION_NOT_SUPPORTED",
        }
    }
}

/// A JSON-RPC error answer.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    /// JSON-RPC code.
    pub code: i64,
    /// Human-readable message.
    pub message: String,
    /// `error.data`: an array with an ErrorInfo for A2A errors, an object
    /// otherwise.
    pub data: Value,
}

impl RpcError {
    /// An A2A error with `metadata` (string values) in its ErrorInfo.
    pub fn a2a(
        kind: A2aErrorKind,
        message: impl Into<String>,
        metadata: &[(&str, String)],
    ) -> Self {
        let metadata: Map<String, Value> = metadata
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::String(v.clone())))
            .collect();
        Self {
            code: kind.code(),
            message: message.into(),
            data: json!([{
                "@type": ERROR_INFO_TYPE,
                "reason": kind.reason(),
                "domain": ERROR_DOMAIN,
                "metadata": metadata,
            }]),
        }
    }

    /// `-32001` for `task_id`.
    pub fn task_not_found(task_id: &str) -> Self {
        Self::a2a(
            A2aErrorKind::TaskNotFound,
            format!("Task not found: {task_id}"),
            &[("taskId", task_id.to_owned())],
        )
    }

    /// `-32004` with `reason` (a berth reason such as `task_terminal`).
    pub fn unsupported(message: impl Into<String>, reason: &str, extra: &[(&str, String)]) -> Self {
        let mut metadata = vec![("berthReason", reason.to_owned())];
        metadata.extend(extra.iter().cloned());
        Self::a2a(A2aErrorKind::UnsupportedOperation, message, &metadata)
    }

    /// `-32700`: the body is not JSON.
    pub fn parse_error(detail: impl std::fmt::Display) -> Self {
        Self {
            code: -32700,
            message: "Invalid JSON payload".into(),
            data: json!({"reason": "parse_error", "detail": detail.to_string()}),
        }
    }

    /// `-32600`: not a JSON-RPC 2.0 request.
    pub fn invalid_request(detail: impl Into<String>) -> Self {
        Self {
            code: -32600,
            message: "Request payload validation error".into(),
            data: json!({"reason": "invalid_request", "detail": detail.into()}),
        }
    }

    /// `-32601`.
    pub fn method_not_found(method: &str) -> Self {
        Self {
            code: -32601,
            message: "Method not found".into(),
            data: json!({"reason": "method_not_found", "method": method}),
        }
    }

    /// `-32602` naming the offending field (`message.parts[0]`, …).
    pub fn invalid_params(field: &str, detail: impl std::fmt::Display) -> Self {
        Self {
            code: -32602,
            message: format!("Invalid parameters: {field}: {detail}"),
            data: json!({"reason": "invalid_params", "field": field, "detail": detail.to_string()}),
        }
    }

    /// `-32603`.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        Self {
            code: -32603,
            message: "Internal error".into(),
            data: json!({"reason": "internal_error", "detail": detail.to_string()}),
        }
    }

    /// The `error` object of a JSON-RPC response.
    pub fn to_value(&self) -> Value {
        json!({"code": self.code, "message": self.message, "data": self.data})
    }
}

/// Maps a node error. Session-level refusals that A2A has no word for become
/// `-32004` with `berthReason`; unknown sessions are the caller's to map
/// (they mean "task not found" or "context not found" depending on the call).
impl From<ControlError> for RpcError {
    fn from(error: ControlError) -> Self {
        let message = error.to_string();
        match error {
            ControlError::UnknownSession { session_id } => Self::a2a(
                A2aErrorKind::TaskNotFound,
                message,
                &[("contextId", session_id.0)],
            ),
            ControlError::SessionClosed { session_id } => {
                Self::unsupported(message, "session_closed", &[("contextId", session_id.0)])
            }
            ControlError::PromptActive {
                session_id,
                turn_id,
            } => Self::unsupported(
                message,
                "task_active",
                &[
                    ("contextId", session_id.0.clone()),
                    ("activeTaskId", crate::ids::task_id(&session_id, &turn_id)),
                ],
            ),
            ControlError::SessionSuspended { session_id, handle } => Self::unsupported(
                message,
                "context_suspended",
                &[("contextId", session_id.0), ("handle", handle)],
            ),
            ControlError::NoActivePrompt { session_id } => {
                Self::unsupported(message, "no_active_task", &[("contextId", session_id.0)])
            }
            ControlError::ResumeConflict { reason, .. } => {
                let why = match reason {
                    ResumeConflict::AlreadyResumed { .. } => "already_resumed",
                    ResumeConflict::NotSuspended => "not_suspended",
                    ResumeConflict::HandleMismatch { .. } => "handle_mismatch",
                };
                Self::unsupported(message, why, &[])
            }
            ControlError::SuspendPending { handle, .. } => {
                Self::unsupported(message, "suspend_pending", &[("handle", handle)])
            }
            ControlError::ResumeRefused { handle, .. } => {
                Self::unsupported(message, "resume_refused", &[("handle", handle)])
            }
            ControlError::Injection { message_id, .. } => {
                Self::unsupported(message, "injection_conflict", &[("messageId", message_id)])
            }
            ControlError::InvalidParams { field, reason } => Self::invalid_params(&field, reason),
            ControlError::Storage(e) => Self::internal(e),
            ControlError::ActorFailed(e) => Self::internal(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a2a_errors_carry_error_info() {
        let e = RpcError::task_not_found("t1");
        assert_eq!(e.code, -32001);
        assert_eq!(e.data[0]["@type"], ERROR_INFO_TYPE);
        assert_eq!(e.data[0]["reason"], "TASK_NOT_FOUND");
        assert_eq!(e.data[0]["domain"], ERROR_DOMAIN);
        assert_eq!(e.data[0]["metadata"]["taskId"], "t1");
        let codes: Vec<i64> = [
            A2aErrorKind::TaskNotFound,
            A2aErrorKind::TaskNotCancelable,
            A2aErrorKind::PushNotificationNotSupported,
            A2aErrorKind::UnsupportedOperation,
            A2aErrorKind::ContentTypeNotSupported,
            A2aErrorKind::InvalidAgentResponse,
            A2aErrorKind::ExtendedAgentCardNotConfigured,
            A2aErrorKind::ExtensionSupportRequired,
            A2aErrorKind::VersionNotSupported,
        ]
        .iter()
        .map(|k| k.code())
        .collect();
        assert_eq!(codes, (-32009..=-32001).rev().collect::<Vec<_>>());
    }
}
