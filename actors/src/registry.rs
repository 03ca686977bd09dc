//! The session registry: routes by session id, spawns (rehydrates) on demand.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use berth_runtime::ids::SessionId;
use ractor::{Actor, ActorCell, ActorId, ActorRef};

use crate::error::ControlError;
use crate::session::{SessionActor, SessionArgs, SessionEnv, SessionMsg};

/// Live session actors by session id.
pub struct Registry {
    env: Arc<SessionEnv>,
    live: tokio::sync::Mutex<HashMap<SessionId, ActorRef<SessionMsg>>>,
    by_actor: Mutex<HashMap<ActorId, SessionId>>,
    supervisor: OnceLock<ActorCell>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

impl Registry {
    /// An empty registry over `env`.
    pub fn new(env: Arc<SessionEnv>) -> Self {
        Self {
            env,
            live: tokio::sync::Mutex::default(),
            by_actor: Mutex::default(),
            supervisor: OnceLock::new(),
        }
    }

    /// Sets the supervisor new session actors are linked to (once, at start-up).
    pub fn set_supervisor(&self, supervisor: ActorCell) {
        let _ = self.supervisor.set(supervisor);
    }

    /// The live actor of a session, if there is one.
    pub async fn get_live(&self, id: &SessionId) -> Option<ActorRef<SessionMsg>> {
        self.live.lock().await.get(id).cloned()
    }

    /// Ids of every live session.
    pub async fn live_ids(&self) -> Vec<SessionId> {
        self.live.lock().await.keys().cloned().collect()
    }

    /// The session's actor, spawning it from the journal when it is not live.
    ///
    /// # Errors
    /// [`ControlError::UnknownSession`] when the journal has no such session;
    /// [`ControlError::ActorFailed`] when rehydration failed.
    pub async fn get_or_spawn(&self, id: &SessionId) -> Result<ActorRef<SessionMsg>, ControlError> {
        let mut live = self.live.lock().await;
        if let Some(actor) = live.get(id) {
            return Ok(actor.clone());
        }
        if self.env.journal.session(id)?.is_none() {
            return Err(ControlError::UnknownSession {
                session_id: id.clone(),
            });
        }
        let args = SessionArgs {
            env: Arc::clone(&self.env),
            session_id: id.clone(),
        };
        let spawned = match self.supervisor.get() {
            Some(sup) => Actor::spawn_linked(None, SessionActor, args, sup.clone()).await,
            None => Actor::spawn(None, SessionActor, args).await,
        };
        let (actor, _join) = spawned.map_err(|e| ControlError::ActorFailed(e.to_string()))?;
        self.by_actor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(actor.get_id(), id.clone());
        live.insert(id.clone(), actor.clone());
        Ok(actor)
    }

    /// Forgets a stopped or failed actor; returns its session id if it was the
    /// session's current actor.
    pub async fn forget(&self, actor: ActorId) -> Option<SessionId> {
        let id = self
            .by_actor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&actor)?;
        let mut live = self.live.lock().await;
        if live.get(&id).is_some_and(|a| a.get_id() == actor) {
            live.remove(&id);
            Some(id)
        } else {
            None
        }
    }
}
