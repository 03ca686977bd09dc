//! Bearer-token authentication (issue 8, "Auth and roles").
//!
//! Tokens are kept as SHA-256 digests: a lookup hashes the presented token
//! and finds its digest, so no secret is compared byte by byte (nothing to
//! time) and none stays in memory in the clear after start-up.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use berth_actors::{Principal, Role};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::config::ApiToken;
use crate::error::ApiError;

/// The configured tokens, by digest.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    by_digest: Arc<HashMap<[u8; 32], Principal>>,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Tokens {
    /// Indexes `tokens`.
    ///
    /// # Errors
    /// A message when two entries share a token (which principal would it
    /// be?), naming them by position.
    pub fn new(tokens: &[ApiToken]) -> Result<Self, String> {
        let mut by_digest = HashMap::new();
        for (i, t) in tokens.iter().enumerate() {
            if by_digest
                .insert(digest(&t.token), t.principal.clone())
                .is_some()
            {
                return Err(format!(
                    "token {} (actor {}) repeats an earlier token; each token must be unique",
                    i + 1,
                    t.principal.actor
                ));
            }
        }
        Ok(Self {
            by_digest: Arc::new(by_digest),
        })
    }

    /// How many tokens there are.
    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }

    /// The principal of a presented token.
    pub fn principal(&self, token: &str) -> Option<&Principal> {
        self.by_digest.get(&digest(token))
    }
}

/// The token of an `Authorization: Bearer TOKEN` header (scheme
/// case-insensitive, RFC 6750 §2.1).
fn bearer(request: &Request) -> Result<&str, &'static str> {
    let value = request
        .headers()
        .get(header::AUTHORIZATION)
        .ok_or("missing_token")?
        .to_str()
        .map_err(|_| "malformed_authorization")?;
    let (scheme, token) = value.split_once(' ').ok_or("malformed_authorization")?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err("malformed_authorization");
    }
    Ok(token.trim())
}

/// Middleware: resolves the bearer token to its [`Principal`] and inserts
/// it into the request's extensions; answers 401 (`missing_token`,
/// `malformed_authorization`, `unknown_token`) otherwise, before the route
/// (or a WebSocket upgrade) runs.
pub async fn authenticate(
    State(tokens): State<Tokens>,
    mut request: Request,
    next: Next,
) -> Response {
    let principal = match bearer(&request) {
        Ok(token) => match tokens.principal(token) {
            Some(p) => p.clone(),
            None => return ApiError::unauthenticated("unknown_token").into_response(),
        },
        Err(reason) => return ApiError::unauthenticated(reason).into_response(),
    };
    tracing::debug!(actor = %principal.actor, role = %principal.role, path = %request.uri().path(), "authenticated");
    request.extensions_mut().insert(principal);
    next.run(request).await
}

/// The JSON-RPC `error.code` of a 401 on a JSON-RPC route (a server error
/// of the implementation-defined range, JSON-RPC 2.0 §5.1).
pub const JSONRPC_UNAUTHENTICATED: i64 = -32000;

/// The 401 of a JSON-RPC route: a JSON-RPC error response
/// (`{"jsonrpc": "2.0", "id": null, "error": {code, message, data}}`, code
/// [`JSONRPC_UNAUTHENTICATED`]) with `WWW-Authenticate: Bearer`.
pub fn jsonrpc_unauthenticated(reason: &str) -> Response {
    let e = ApiError::unauthenticated(reason);
    let body = json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": JSONRPC_UNAUTHENTICATED, "message": e.message, "data": e.data},
    });
    let mut response = (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        axum::http::HeaderValue::from_static("Bearer realm=\"berth\""),
    );
    response
}

/// Who a JSON-RPC route admits: token holders, and without a token the
/// configured anonymous principal (none: a token is required).
#[derive(Debug, Clone)]
pub struct JsonRpcAuth {
    /// The configured tokens.
    pub tokens: Tokens,
    /// The principal of a request that presents no `Authorization` header.
    pub anonymous: Option<Principal>,
}

/// Middleware of a JSON-RPC route: a presented bearer token always decides
/// (its principal, or a 401 when it is unknown or malformed — never the
/// anonymous principal); a request with no `Authorization` header gets the
/// anonymous principal with the [`berth_actors::auth::Anonymous`] marker
/// when one is configured, a 401 otherwise. Every 401 is a JSON-RPC error
/// ([`jsonrpc_unauthenticated`]).
pub async fn authenticate_jsonrpc(
    State(auth): State<JsonRpcAuth>,
    mut request: Request,
    next: Next,
) -> Response {
    match bearer(&request) {
        Ok(token) => match auth.tokens.principal(token) {
            Some(p) => {
                let p = p.clone();
                request.extensions_mut().insert(p);
            }
            None => return jsonrpc_unauthenticated("unknown_token"),
        },
        Err("missing_token") if auth.anonymous.is_some() => {
            if let Some(p) = auth.anonymous.clone() {
                request.extensions_mut().insert(p);
                request
                    .extensions_mut()
                    .insert(berth_actors::auth::Anonymous);
            }
        }
        Err(reason) => return jsonrpc_unauthenticated(reason),
    }
    next.run(request).await
}

/// Middleware: the route needs `role` (or a higher one); 403 with -32011
/// `role_not_authorized` otherwise. Runs after [`authenticate`].
pub async fn require_role(State(role): State<Role>, request: Request, next: Next) -> Response {
    match request.extensions().get::<Principal>() {
        Some(p) if p.may(role) => next.run(request).await,
        Some(p) => {
            let method = format!("{} {}", request.method(), request.uri().path());
            berth_actors::metrics::count_control(
                &method,
                berth_runtime::event::ControlStatus::Rejected,
            );
            role_refused(p, &method, role).into_response()
        }
        None => ApiError::unauthenticated("missing_token").into_response(),
    }
}

/// The 403 of a role that may not call `method`.
pub fn role_refused(principal: &Principal, method: &str, needed: Role) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        -32011,
        "Role not authorized",
        json!({
            "reason": "role_not_authorized",
            "method": method,
            "actor": principal.actor,
            "role": principal.role,
            "requiredRole": needed,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_resolve_by_digest_and_must_be_unique() {
        let t = |token: &str, actor: &str| ApiToken {
            token: token.into(),
            principal: Principal::new(actor, Role::Observer),
        };
        let tokens =
            Tokens::new(&[t("aaaaaaaaaaaaaaaa", "a"), t("bbbbbbbbbbbbbbbb", "b")]).unwrap();
        assert_eq!(tokens.principal("bbbbbbbbbbbbbbbb").unwrap().actor, "b");
        assert!(tokens.principal("cccccccccccccccc").is_none());
        let e = Tokens::new(&[t("aaaaaaaaaaaaaaaa", "a"), t("aaaaaaaaaaaaaaaa", "b")]).unwrap_err();
        assert!(e.contains("token 2") && !e.contains("aaaa"), "{e}");
    }
}
