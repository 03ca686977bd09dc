//! `session/load` (replay) and `session/resume` (no replay)
//! (ACP "Loading Sessions", "Resuming Sessions"; `remote-session-control.md`, "Resume").
//!
//! Both take `sessionId`; ACP's `cwd` and `mcpServers` are accepted and not
//! required (the session keeps the ones it was created with), because the seed
//! defines both methods on `sessionId` alone.

use agent_client_protocol_schema::v1::{LoadSessionResponse, Meta, ResumeSessionResponse};
use serde_json::{json, Value};

use super::new::{config_options, modes};
use super::{session_id, suspend, to_value};
use crate::connection::Connection;
use crate::jsonrpc::RpcError;

fn meta(last_event_id: u64) -> Meta {
    let mut meta = Meta::new();
    meta.insert("berth".into(), json!({ "lastEventId": last_event_id }));
    meta
}

/// Journal events read per page of a streamed `session/load` replay.
const REPLAY_PAGE_EVENTS: usize = 64;

/// Attaches this connection and re-sends every persisted event as a
/// `session/update` (or `_berth/agentEvent`) marked `_meta.berth.replayed: true`
/// before answering; the answer lists them as `_meta.berth.replayed:
/// [{eventId, type}]` (the seed's `replayed` list; ACP forbids custom root
/// fields, so it rides in `_meta`).
/// Events after the replay arrive live, exactly once. A live session stays
/// promptable.
///
/// The replay is streamed under the connection's outbound bound: events are
/// read from the journal [`REPLAY_PAGE_EVENTS`] at a time and queued only
/// while at most half the bound waits for the client
/// ([`Connection::wait_for_room`]), so a client that reads loads a session
/// of any size, and one that stops reading is closed by its transport's
/// send deadline. Once the journal has nothing past the cursor, the session
/// actor attaches the connection with `Replay::After(cursor)`: it delivers
/// the events committed meanwhile and registers the watcher in one step, so
/// nothing between the replay's end and the live tail is lost or sent twice.
///
/// A client that reconnects passes the last event id it acknowledged as
/// `_meta.berth.lastEventId` (a non-negative integer; issue 8): only the
/// events after it are replayed, so it receives exactly what it missed.
/// The answer's `_meta.berth.lastEventId` is the cursor after the replay.
///
/// # Errors
/// -32602 (field `_meta.berth.lastEventId`) when it is not a non-negative
/// integer or is past the session's last event; -32004 unknown session;
/// -32603 when the connection closes during the replay (nobody reads the
/// answer then).
pub(crate) async fn load(conn: &Connection, params: Value) -> Result<Value, RpcError> {
    let id = session_id(&params)?;
    let after = match params.pointer("/_meta/berth/lastEventId") {
        None | Some(Value::Null) => 0,
        Some(v) => v.as_u64().ok_or_else(|| {
            RpcError::invalid_params("_meta.berth.lastEventId", "must be a non-negative integer")
        })?,
    };
    let journal = conn.node.journal();
    let storage = |e| RpcError::from(berth_actors::ControlError::Storage(e));
    if journal.session(&id).map_err(storage)?.is_none() {
        return Err(berth_actors::ControlError::UnknownSession { session_id: id }.into());
    }
    let last = journal.last_event_id(&id).map_err(storage)?;
    if after > last {
        return Err(RpcError::invalid_params(
            "_meta.berth.lastEventId",
            format!("{after} is past the session's last event id {last}"),
        ));
    }
    let watcher = conn.watcher();
    let mut cursor = after;
    let mut streamed: Vec<(u64, &'static str)> = Vec::new();
    loop {
        let page = journal
            .events_page(&id, cursor, REPLAY_PAGE_EVENTS)
            .map_err(storage)?;
        if page.is_empty() {
            break;
        }
        for (event_id, record) in page {
            if !conn.wait_for_room().await {
                return Err(RpcError::internal(
                    "the connection closed during the replay",
                ));
            }
            streamed.push((event_id, record.event.type_name()));
            let notice = berth_actors::SessionNotice {
                session_id: id.clone(),
                event_id,
                record: std::sync::Arc::new(record),
                replayed: true,
                origin: None,
            };
            if !watcher.notify(&notice) {
                return Err(RpcError::internal(
                    "the connection closed during the replay",
                ));
            }
            cursor = event_id;
        }
    }
    if !conn.wait_for_room().await {
        return Err(RpcError::internal(
            "the connection closed during the replay",
        ));
    }
    let outcome = conn
        .node
        .attach_with(&id, conn.watcher(), berth_actors::Replay::After(cursor))
        .await?;
    conn.mark_attached(&id);
    streamed.extend(outcome.replayed.iter().copied());
    let last = streamed.last().map_or(after, |(id, _)| *id);
    let replayed: Vec<Value> = streamed
        .iter()
        .map(|(event_id, kind)| json!({"eventId": event_id, "type": kind}))
        .collect();
    let mut meta = meta(last);
    meta["berth"]["replayed"] = Value::Array(replayed);
    to_value(
        LoadSessionResponse::new()
            .modes(modes())
            .config_options(config_options(&conn.node))
            .meta(meta),
    )
}

/// Attaches this connection without replaying anything; later events arrive
/// live. When the session is suspended — or the request carries the suspend
/// RFC's `input`, `continueTranscript` or a `handle` — it also claims the
/// suspension and wakes the session ([`suspend::claim`]); the answer then
/// carries `_meta.berth.resumed` and the resumed turn streams to this
/// connection, ending with `_berth/agentEvent` `turn_ended`. A bare resume
/// whose suspension another claim used up (another client, a wake-up, a
/// cancel) answers `_meta.berth.claim` naming that claim instead: it only
/// reattached.
///
/// # Errors
/// -32602 for a bad field; -32005 for a closed session (every resume); the
/// claim's errors (-32009, -32012).
pub(crate) async fn resume(conn: &Connection, params: Value) -> Result<Value, RpcError> {
    let id = session_id(&params)?;
    let request = suspend::resume_request(&params)?;
    if conn
        .node
        .session_status(&id)
        .await?
        .record
        .closed_at
        .is_some()
    {
        return Err(berth_actors::ControlError::SessionClosed { session_id: id }.into());
    }
    conn.node.attach(&id, conn.watcher(), false).await?;
    conn.mark_attached(&id);
    let last = conn
        .node
        .journal()
        .last_event_id(&id)
        .map_err(RpcError::internal)?;
    let mut meta = meta(last);
    match suspend::claim(conn, &id, request).await? {
        suspend::Claimed::Resumed(outcome) => {
            meta["berth"]["resumed"] = suspend::resumed_meta(&outcome);
        }
        suspend::Claimed::Lost(claim) => meta["berth"]["claim"] = suspend::claim_meta(&claim),
        suspend::Claimed::Nothing => {}
    }
    to_value(
        ResumeSessionResponse::new()
            .modes(modes())
            .config_options(config_options(&conn.node))
            .meta(meta),
    )
}
