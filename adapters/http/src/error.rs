//! Typed JSON errors of the HTTP routes.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_actors::ControlError;
use serde_json::{json, Value};

/// An error answer: HTTP status plus `{"error": {"code", "message",
/// "data"}}`, where `code` is the JSON-RPC code berth uses for the same
/// failure over ACP (so clients handle both alike) and `data` says exactly
/// what was wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// JSON-RPC-style code (-32602, -32011, …; 0 for pure HTTP failures).
    pub code: i64,
    /// Short message.
    pub message: String,
    /// Details (always an object).
    pub data: Value,
}

impl ApiError {
    /// An error with every field given.
    pub fn new(status: StatusCode, code: i64, message: impl Into<String>, data: Value) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            data,
        }
    }

    /// 401: no or unknown bearer token.
    pub fn unauthenticated(reason: &str) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            0,
            "Unauthenticated",
            json!({"reason": reason, "hint": "send Authorization: Bearer <token> with a token from [http] tokens or BERTH_API_KEYS"}),
        )
    }

    /// 400 / -32602: a bad field.
    pub fn invalid_params(field: &str, reason: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            -32602,
            "Invalid params",
            json!({"field": field, "reason": reason.to_string()}),
        )
    }

    /// 500 / -32603.
    pub fn internal(reason: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            -32603,
            "Internal error",
            json!({"reason": reason.to_string()}),
        )
    }
}

impl From<ControlError> for ApiError {
    fn from(e: ControlError) -> Self {
        match &e {
            ControlError::UnknownSession { session_id } => Self::new(
                StatusCode::NOT_FOUND,
                -32004,
                "Session not found",
                json!({"sessionId": session_id, "reason": "unknown_session"}),
            ),
            ControlError::InvalidParams { field, reason } => Self::invalid_params(field, reason),
            _ => Self::internal(&e),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body =
            json!({"error": {"code": self.code, "message": self.message, "data": self.data}});
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"berth\""),
            );
        }
        response
    }
}
