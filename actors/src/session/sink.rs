//! The turn's sink: journal first, then watchers.

use std::sync::Arc;

use async_trait::async_trait;
use berth_runtime::engine::{PermissionDecision, PermissionRequest, SinkError, TurnSink};
use berth_runtime::event::SessionEvent;
use berth_runtime::frame::Frame;
use berth_runtime::ids::{SessionId, TurnId};
use berth_storage::Batch;

use super::receipt::stamp;
use super::SessionEnv;
use crate::watch::Watchers;

/// Journals each event of a running turn, then publishes it to the session's
/// watchers. Nothing reaches a watcher before it is durable.
pub(crate) struct JournalSink {
    pub env: Arc<SessionEnv>,
    pub session_id: SessionId,
    /// Every write is fenced by this turn: once it is sealed, nothing lands.
    pub turn_id: TurnId,
    pub watchers: Arc<Watchers>,
}

#[async_trait]
impl TurnSink for JournalSink {
    async fn emit(&self, event: SessionEvent) -> Result<(), SinkError> {
        // A delivery or drop goes with its signed drain receipt.
        let records = stamp(
            &self.env,
            &self.session_id,
            Some(&self.turn_id),
            self.env.config.clock.now(),
            vec![event],
        );
        let batch = records.iter().fold(
            Batch::new().fenced_by_turn(&self.session_id, &self.turn_id),
            |b, r| b.append(&self.session_id, r),
        );
        let ids = self
            .env
            .journal
            .commit(batch)
            .await
            .map_err(|e| SinkError(e.to_string()))?;
        self.watchers.publish(
            &self.session_id,
            ids.into_iter().zip(records.into_iter().map(Arc::new)),
        );
        Ok(())
    }

    async fn request_permission(
        &self,
        request: &PermissionRequest,
    ) -> Result<PermissionDecision, SinkError> {
        let Some(answer) = self.watchers.ask(&self.session_id, request) else {
            return Ok(PermissionDecision::Rejected {
                reason: "no attached client can answer permission requests".into(),
            });
        };
        Ok(answer.await.unwrap_or(PermissionDecision::Rejected {
            reason: "the client went away before answering".into(),
        }))
    }

    async fn checkpoint(&self, frame: &Frame) -> Result<(), SinkError> {
        self.env
            .journal
            .commit(
                Batch::new()
                    .fenced_by_turn(&self.session_id, &self.turn_id)
                    .put_frame(frame),
            )
            .await
            .map(drop)
            .map_err(|e| SinkError(e.to_string()))
    }
}
