//! Task and context ids.
//!
//! A context is a berth session: `contextId` *is* the session id (a
//! client-provided `contextId` names a new session created with that id). A
//! task is one prompt turn of it: `taskId` is `<turn id>.<session id>`, so the
//! adapter finds a task's session from the id alone, with no index of its own.
//! Turn ids (`turn_<hex>`) never contain a `.`, so the first `.` splits.

use berth_runtime::ids::{SessionId, TurnId};

/// The A2A task id of `turn` in `session`.
pub fn task_id(session: &SessionId, turn: &TurnId) -> String {
    format!("{}.{}", turn.0, session.0)
}

/// Splits a task id into (session, turn); `None` when it is not one berth
/// made (which the caller answers with TaskNotFoundError).
pub fn parse_task_id(id: &str) -> Option<(SessionId, TurnId)> {
    let (turn, session) = id.split_once('.')?;
    if turn.is_empty() || session.is_empty() || !turn.starts_with("turn_") {
        return None;
    }
    Some((SessionId(session.to_owned()), TurnId(turn.to_owned())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_round_trip_with_dotted_context_ids() {
        let session = SessionId("ctx.with.dots".into());
        let turn = TurnId("turn_abc".into());
        let id = task_id(&session, &turn);
        assert_eq!(parse_task_id(&id), Some((session, turn)));
        assert_eq!(parse_task_id("nonsense"), None);
        assert_eq!(parse_task_id("x.y"), None);
        assert_eq!(parse_task_id(".y"), None);
    }
}
