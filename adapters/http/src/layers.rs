//! Cross-cutting layers of the listener: the Origin check and the bound on
//! requests in flight. (Auth is in [`crate::auth`]; the body bound is
//! axum's `DefaultBodyLimit`.)

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::Semaphore;

use crate::error::ApiError;

/// The browser origins allowed (`*`: any).
#[derive(Debug, Clone, Default)]
pub struct Origins(pub Arc<Vec<String>>);

/// Middleware: a request with an `Origin` header not in the allowed list
/// gets 403 `{reason: "origin_not_allowed", origin}` before anything else
/// runs (browsers send `Origin` on cross-site requests and on every
/// WebSocket handshake; non-browser clients send none and pass).
pub async fn check_origin(
    State(origins): State<Origins>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("<not visible ASCII>");
        let allowed = origins.0.iter().any(|o| o == "*" || o == origin);
        if !allowed {
            tracing::info!(%origin, "refused a browser origin");
            return ApiError::new(
                StatusCode::FORBIDDEN,
                0,
                "Origin not allowed",
                json!({"reason": "origin_not_allowed", "origin": origin, "hint": "add it to [http] allowed_origins"}),
            )
            .into_response();
        }
    }
    next.run(request).await
}

/// Middleware: at most the semaphore's permits of requests are handled at
/// once; past that a request gets 503 `{reason: "too_many_requests"}` at
/// once (never queued). An upgraded WebSocket releases its permit when the
/// upgrade response is sent; its own bound is the WebSocket router's.
pub async fn limit_in_flight(
    State(slots): State<Arc<Semaphore>>,
    request: Request,
    next: Next,
) -> Response {
    let Ok(_permit) = slots.try_acquire() else {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            0,
            "Too many requests in flight",
            json!({"reason": "too_many_requests"}),
        )
        .into_response();
    };
    next.run(request).await
}
