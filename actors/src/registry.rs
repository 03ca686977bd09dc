//! The session registry: routes by session id, spawns (rehydrates) on demand.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use berth_runtime::ids::SessionId;
use ractor::{Actor, ActorCell, ActorId, ActorRef};

use crate::error::ControlError;
use crate::session::{SessionActor, SessionArgs, SessionEnv, SessionMsg};

/// A session's actor, once spawned: concurrent callers of a session that is
/// not live wait on the one spawn, and spawns of different sessions run in
/// parallel (no lock is held across a rehydration).
type Slot = Arc<tokio::sync::OnceCell<ActorRef<SessionMsg>>>;

/// Smallest capacity a map of this module is shrunk from (below it the
/// memory is not worth a rehash).
const SHRINK_FLOOR: usize = 1024;

/// Gives back a map's memory once it is mostly empty: a `HashMap` keeps the
/// capacity of its largest size, so 100,000 sessions that passivated would
/// leave about 4 MiB per map for no entry. Shrinks to twice the length once
/// fewer than a quarter of the slots are used, so each shrink follows at
/// least as many removals as it moves entries (amortized O(1) per removal).
pub(crate) fn shrink_if_sparse<K: Eq + std::hash::Hash, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > SHRINK_FLOOR && map.len() * 4 < map.capacity() {
        map.shrink_to((map.len() * 2).max(SHRINK_FLOOR / 2));
    }
}

/// Live session actors by session id.
pub struct Registry {
    env: Arc<SessionEnv>,
    live: Mutex<HashMap<SessionId, Slot>>,
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
            live: Mutex::default(),
            by_actor: Mutex::default(),
            supervisor: OnceLock::new(),
        }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Slot>> {
        // A poisoned map is still a correct map.
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the supervisor new session actors are linked to (once, at start-up).
    pub fn set_supervisor(&self, supervisor: ActorCell) {
        let _ = self.supervisor.set(supervisor);
    }

    /// The live actor of a session, if there is one.
    pub async fn get_live(&self, id: &SessionId) -> Option<ActorRef<SessionMsg>> {
        self.live().get(id).and_then(|slot| slot.get().cloned())
    }

    /// Ids of every live session.
    pub async fn live_ids(&self) -> Vec<SessionId> {
        self.live()
            .iter()
            .filter(|(_, slot)| slot.initialized())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The session's actor, spawning it from the journal when it is not live.
    ///
    /// # Errors
    /// [`ControlError::UnknownSession`] when the journal has no such session;
    /// [`ControlError::Storage`] when rehydration failed on the journal (a
    /// row refused as unreadable or tampered, an I/O error);
    /// [`ControlError::ActorFailed`] when it failed otherwise.
    pub async fn get_or_spawn(&self, id: &SessionId) -> Result<ActorRef<SessionMsg>, ControlError> {
        let slot = Arc::clone(self.live().entry(id.clone()).or_default());
        let spawned = slot.get_or_try_init(|| self.spawn(id)).await.cloned();
        if spawned.is_err() {
            // Leave no empty slot behind (unless a later caller filled it).
            let mut live = self.live();
            if live
                .get(id)
                .is_some_and(|s| Arc::ptr_eq(s, &slot) && !s.initialized())
            {
                live.remove(id);
                shrink_if_sparse(&mut live);
            }
        }
        spawned
    }

    async fn spawn(&self, id: &SessionId) -> Result<ActorRef<SessionMsg>, ControlError> {
        let Some(record) = self.env.journal.session(id)? else {
            return Err(ControlError::UnknownSession {
                session_id: id.clone(),
            });
        };
        let args = SessionArgs {
            env: Arc::clone(&self.env),
            session_id: id.clone(),
            record: Some(record),
        };
        let spawned = match self.supervisor.get() {
            Some(sup) => Actor::spawn_linked(None, SessionActor, args, sup.clone()).await,
            None => Actor::spawn(None, SessionActor, args).await,
        };
        let (actor, _join) = spawned.map_err(|e| match &e {
            // Rehydration refused a journal row (a tampered transcript,
            // checkpoint, frame or suspension): say which, as the journal's
            // own error.
            ractor::SpawnErr::StartupFailed(inner) => {
                match inner.downcast_ref::<berth_storage::StorageError>() {
                    Some(storage) => ControlError::Storage(storage.clone()),
                    None => ControlError::ActorFailed(e.to_string()),
                }
            }
            _ => ControlError::ActorFailed(e.to_string()),
        })?;
        self.by_actor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(actor.get_id(), id.clone());
        self.env.passivated.actor_spawned();
        Ok(actor)
    }

    /// Forgets a stopped or failed actor; returns its session id if it was the
    /// session's current actor.
    pub async fn forget(&self, actor: ActorId) -> Option<SessionId> {
        // Both maps change under the `live` lock, so that a caller that finds
        // the actor already forgotten never finds it still live.
        let mut live = self.live();
        let id = {
            let mut by_actor = self.by_actor.lock().unwrap_or_else(|e| e.into_inner());
            let id = by_actor.remove(&actor)?;
            self.env.passivated.actor_forgotten();
            shrink_if_sparse(&mut by_actor);
            id
        };
        if live
            .get(&id)
            .and_then(|slot| slot.get())
            .is_some_and(|a| a.get_id() == actor)
        {
            live.remove(&id);
            shrink_if_sparse(&mut live);
            Some(id)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_emptied_by_passivation_gives_its_memory_back() {
        let mut map: HashMap<u64, u64> = (0..100_000).map(|i| (i, i)).collect();
        let full = map.capacity();
        for i in 0..100_000 {
            map.remove(&i);
            shrink_if_sparse(&mut map);
        }
        assert!(map.is_empty());
        assert!(
            map.capacity() <= SHRINK_FLOOR,
            "{} slots left of {full}",
            map.capacity()
        );
    }

    #[test]
    fn a_busy_map_is_not_shrunk() {
        let mut map: HashMap<u64, u64> = (0..10_000).map(|i| (i, i)).collect();
        for i in 0..6_000 {
            map.remove(&i);
            shrink_if_sparse(&mut map);
        }
        // 4,000 of about 14,000 slots used: more than a quarter, so not
        // shrunk (which would leave about 7,000).
        assert!(map.capacity() > 12_000, "{} slots", map.capacity());
        assert_eq!(map.len(), 4_000);
    }
}
