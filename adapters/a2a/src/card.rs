//! The agent card at `/.well-known/agent-card.json` (A2A spec §8, §4.4.1),
//! served with `Cache-Control: public, max-age=N` and a strong `ETag` (the
//! SHA-256 of the card's bytes; spec §8.6.1) and `Last-Modified` (when the
//! card's content was configured: [`A2aOptions::card_modified`], stable
//! across requests). `If-None-Match` with that tag answers `304 Not
//! Modified`; without `If-None-Match`, so does an `If-Modified-Since` at or
//! after `Last-Modified` (RFC 9110 §13.1.3; an unparsable date is ignored).
//!
//! Capabilities are the honest ones: `streaming: true` (SendStreamingMessage
//! and SubscribeToTask), `pushNotifications: false` (the push methods answer
//! PushNotificationNotSupportedError), `extendedAgentCard: false`.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::content::{OUTPUT_MODES, SUPPORTED_INPUT_MODES};
use crate::{A2aOptions, PROTOCOL_VERSION};

/// The card as JSON, advertising the JSON-RPC interface at `url`.
pub fn card(options: &A2aOptions, url: &str) -> Value {
    let skills: Vec<Value> = options
        .skills
        .iter()
        .map(|s| serde_json::to_value(s).unwrap_or(Value::Null))
        .collect();
    json!({
        "name": options.name,
        "description": options.description,
        "supportedInterfaces": [{
            "url": url,
            "protocolBinding": "JSONRPC",
            "protocolVersion": PROTOCOL_VERSION,
        }],
        "version": options.version,
        "capabilities": {
            "streaming": true,
            "pushNotifications": false,
            "extendedAgentCard": false,
        },
        "defaultInputModes": SUPPORTED_INPUT_MODES,
        "defaultOutputModes": OUTPUT_MODES,
        "skills": skills,
    })
}

/// The JSON-RPC URL to advertise: the configured public URL, else
/// `http://<Host header><rpc path>` (loopback default when there is none).
pub fn rpc_url(options: &A2aOptions, headers: &HeaderMap) -> String {
    if let Some(url) = &options.public_url {
        return url.clone();
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".-:[]".contains(c))
        })
        .unwrap_or("127.0.0.1");
    format!("http://{host}/")
}

/// `GET /.well-known/agent-card.json`.
pub fn respond(options: &A2aOptions, headers: &HeaderMap) -> Response {
    let body = card(options, &rpc_url(options, headers)).to_string();
    let digest = Sha256::digest(body.as_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    let etag = format!("\"{hex}\"");
    let cache = format!("public, max-age={}", options.card_max_age_secs);
    let modified = options.card_modified;
    let not_modified = match headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
    {
        Some(tags) => tags.split(',').any(|t| t.trim() == etag || t.trim() == "*"),
        None => headers
            .get(header::IF_MODIFIED_SINCE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| chrono::DateTime::parse_from_rfc2822(v.trim()).ok())
            .is_some_and(|since| modified.timestamp() <= since.timestamp()),
    };
    let mut response = if not_modified {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response()
    };
    let h = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    if let Ok(v) = HeaderValue::from_str(&cache) {
        h.insert(header::CACHE_CONTROL, v);
    }
    let http_date = modified.format("%a, %d %b %Y %H:%M:%S GMT").to_string();
    if let Ok(v) = HeaderValue::from_str(&http_date) {
        h.insert(header::LAST_MODIFIED, v);
    }
    response
}
