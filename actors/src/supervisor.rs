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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use berth_runtime::content::Prompt;
    use berth_runtime::event::SessionEvent;
    use berth_runtime::model::scripted::ScriptedModel;
    use berth_runtime::terminal::{TerminalKind, TerminalOwner};

    use crate::node::NewSession;
    use crate::session::SessionMsg;
    use crate::{ControlError, Node, NodeConfig};

    const SCRIPT: &str = r#"
        [[rules]]
        match = "slow"
        steps = [ { text = "working" }, { delay_ms = 30000 }, { text = "never" } ]
        [[rules]]
        match = "hi"
        steps = [ { text = "hello" } ]
    "#;

    #[tokio::test]
    async fn a_failed_session_actor_is_restarted_from_the_journal_and_its_turn_sealed() {
        let dir = tempfile::tempdir().unwrap();
        let model = ScriptedModel::parse(SCRIPT, "toml", "scripted:sup").unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let node = Node::start(NodeConfig::new(
            dir.path().join("data"),
            std::sync::Arc::new(model),
        ))
        .await
        .unwrap();
        let record = node
            .new_session(NewSession::in_dir(work.clone()))
            .await
            .unwrap();
        let sid = record.session_id.clone();
        let running = {
            let (node, sid) = (node.clone(), sid.clone());
            tokio::spawn(async move { node.prompt(&sid, Prompt::text("slow")).await })
        };
        // Wait until the turn is running and has streamed something.
        while node.journal().last_event_id(&sid).unwrap() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let first = node.registry.get_live(&sid).await.unwrap();
        first.send_message(SessionMsg::InjectFault).unwrap();

        let answer = tokio::time::timeout(Duration::from_secs(10), running)
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(answer, Err(ControlError::ActorFailed(_))),
            "{answer:?}"
        );
        // The supervisor respawned the actor, which sealed the open turn.
        let second = loop {
            if let Some(actor) = node.registry.get_live(&sid).await {
                if actor.get_id() != first.get_id() {
                    break actor;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(node.journal().open_turns().unwrap().is_empty());
        let events = node.journal().events(&sid, 0).unwrap();
        let Some((_, last)) = events.last() else {
            panic!("no events")
        };
        let SessionEvent::TurnEnded { terminal, .. } = &last.event else {
            panic!("last event is {:?}", last.event)
        };
        assert_eq!(
            (terminal.kind, terminal.owner),
            (TerminalKind::InternalError, TerminalOwner::Harness)
        );
        assert!(!events.iter().any(
            |(_, e)| matches!(&e.event, SessionEvent::AgentMessageChunk { text } if text == "never")
        ));
        // The restarted session works.
        let outcome = node.prompt(&sid, Prompt::text("hi")).await.unwrap();
        assert_eq!(outcome.terminal.kind, TerminalKind::Completed);
        // The sealed turn kept its prompt; the new one added prompt and answer.
        let transcript = node.journal().transcript(&sid).unwrap();
        assert_eq!(transcript.len(), 3, "{transcript:?}");
        assert_eq!(
            node.registry.get_live(&sid).await.unwrap().get_id(),
            second.get_id()
        );
        node.shutdown().await;
    }
}
