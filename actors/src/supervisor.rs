//! The supervisor of session actors.
//!
//! A session actor that fails (a handler returned an error or panicked) is
//! forgotten and immediately respawned from the journal; rehydration seals the
//! turn it was running (never re-runs it). One that stops normally (closed) is
//! just forgotten; the next control for it rehydrates it on demand.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};

use crate::registry::Registry;

/// The supervisor actor. It has no messages of its own.
pub struct Supervisor;

#[ractor::async_trait]
impl Actor for Supervisor {
    type Msg = ();
    type State = Arc<Registry>;
    type Arguments = Arc<Registry>;

    async fn pre_start(
        &self,
        _myself: ActorRef<()>,
        registry: Arc<Registry>,
    ) -> Result<Arc<Registry>, ActorProcessingErr> {
        Ok(registry)
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<()>,
        event: SupervisionEvent,
        registry: &mut Arc<Registry>,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, error) => {
                if let Some(session_id) = registry.forget(cell.get_id()).await {
                    tracing::error!(session_id = %session_id, %error, "session actor failed; restarting from the journal");
                    if let Err(e) = registry.get_or_spawn(&session_id).await {
                        tracing::error!(session_id = %session_id, error = %e, "restart failed; the session rehydrates on its next control");
                    }
                }
            }
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                registry.forget(cell.get_id()).await;
            }
            _ => {}
        }
        Ok(())
    }
}
