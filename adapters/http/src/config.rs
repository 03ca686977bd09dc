//! What the listener runs with. The binary fills this from the TOML config
//! (`[http]`), `BERTH_*` environment variables and flags; this crate only
//! validates and uses it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use berth_actors::{Principal, Role};

/// The listener's configuration.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Address to bind (`127.0.0.1:8080`; port 0 picks a free one).
    pub listen: SocketAddr,
    /// Serve TLS with this certificate chain and key (PEM files).
    pub tls: Option<TlsFiles>,
    /// Bearer tokens and who each one is. At least one is required.
    pub tokens: Vec<ApiToken>,
    /// Browser origins allowed (`https://console.example.com`, exact match
    /// of the `Origin` header; `*` allows any). Requests without an `Origin`
    /// header always pass.
    pub allowed_origins: Vec<String>,
    /// Largest request body (bytes, default 1 MiB).
    pub max_body_bytes: usize,
    /// Sockets served at once (default 1024). At the cap a new connection
    /// closes the one idle the longest (no request in flight, not a
    /// WebSocket); when all are busy it waits in the backlog.
    pub max_connections: usize,
    /// HTTP requests handled at once, upgraded WebSockets not counted
    /// (default 256); more get 503.
    pub max_requests_in_flight: usize,
    /// Longest TLS handshake before the socket is dropped (default 10 s).
    pub handshake_timeout: Duration,
    /// Longest wait for a request's head (request line and headers), from
    /// the moment the connection is ready for one — accepted, or done with
    /// its previous response — before it is closed (default 10 s). A client
    /// that sends nothing, or trickles its headers, is cut at this bound.
    pub header_read_timeout: Duration,
    /// Longest a connection may stay open with no request in flight (idle
    /// since it was accepted or since its last response was sent whole)
    /// before it is closed (default 30 s). Upgraded WebSockets are bounded
    /// by their own ping check instead.
    pub idle_timeout: Duration,
}

impl HttpConfig {
    /// Defaults (loopback `127.0.0.1:8080`, no TLS, no tokens, no origins).
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            tls: None,
            tokens: Vec::new(),
            allowed_origins: Vec::new(),
            max_body_bytes: 1024 * 1024,
            max_connections: 1024,
            max_requests_in_flight: 256,
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
        }
    }
}

/// PEM files of a TLS certificate chain and its private key.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// Certificate chain (leaf first).
    pub cert: PathBuf,
    /// Private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// One bearer token and the principal it authenticates as.
#[derive(Clone)]
pub struct ApiToken {
    /// The secret (never logged).
    pub token: String,
    /// Who it is.
    pub principal: Principal,
}

impl std::fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiToken")
            .field("token", &"<redacted>")
            .field("principal", &self.principal)
            .finish()
    }
}

/// Shortest token accepted (characters): guessing must be hopeless.
pub const MIN_TOKEN_CHARS: usize = 16;

/// Checks a token secret: at least [`MIN_TOKEN_CHARS`] characters, visible
/// ASCII only (it travels in an HTTP header), no `,` (the `BERTH_API_KEYS`
/// separator).
///
/// # Errors
/// A message saying what is wrong (never echoing the secret).
pub fn validate_token(token: &str) -> Result<(), String> {
    if token.chars().count() < MIN_TOKEN_CHARS {
        return Err(format!("must be at least {MIN_TOKEN_CHARS} characters"));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic() && b != b',') {
        return Err("must be visible ASCII without spaces or commas".into());
    }
    Ok(())
}

/// Parses `BERTH_API_KEYS`: comma-separated `TOKEN=ACTOR:ROLE` entries,
/// e.g. `s3cr3t-0123456789abcdef=alice:controller,abcdef0123456789=grafana:observer`
/// (ROLE: `host_owner | controller | observer`). Whitespace around entries is
/// ignored; an empty value means no tokens.
///
/// # Errors
/// A message naming the entry (by position, never by secret) and what is
/// wrong with it.
pub fn parse_api_keys(value: &str) -> Result<Vec<ApiToken>, String> {
    let mut out = Vec::new();
    for (i, entry) in value.split(',').map(str::trim).enumerate() {
        if entry.is_empty() {
            continue;
        }
        let n = i + 1;
        let (token, who) = entry
            .split_once('=')
            .ok_or_else(|| format!("BERTH_API_KEYS entry {n}: expected TOKEN=ACTOR:ROLE"))?;
        let (actor, role) = who
            .rsplit_once(':')
            .ok_or_else(|| format!("BERTH_API_KEYS entry {n}: expected TOKEN=ACTOR:ROLE"))?;
        validate_token(token).map_err(|e| format!("BERTH_API_KEYS entry {n}: token {e}"))?;
        berth_actors::auth::validate_actor_id(actor)
            .map_err(|e| format!("BERTH_API_KEYS entry {n}: actor {e}"))?;
        let role = Role::parse(role).map_err(|e| format!("BERTH_API_KEYS entry {n}: {e}"))?;
        out.push(ApiToken {
            token: token.to_owned(),
            principal: Principal::new(actor, role),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_keys_parse_with_precise_errors() {
        let keys = parse_api_keys(
            " aaaaaaaaaaaaaaaa=alice:controller , bbbbbbbbbbbbbbbb=ci:bot:observer,",
        )
        .unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].principal, Principal::new("alice", Role::Controller));
        assert_eq!(keys[1].principal, Principal::new("ci:bot", Role::Observer));
        assert!(parse_api_keys("").unwrap().is_empty());
        let e = parse_api_keys("aaaaaaaaaaaaaaaa=alice:admin").unwrap_err();
        assert!(e.contains("entry 1") && e.contains("unknown role"), "{e}");
        let e = parse_api_keys("short=alice:observer").unwrap_err();
        assert!(e.contains("at least 16") && !e.contains("short"), "{e}");
        let e = parse_api_keys("aaaaaaaaaaaaaaaa").unwrap_err();
        assert!(e.contains("TOKEN=ACTOR:ROLE"), "{e}");
    }
}
