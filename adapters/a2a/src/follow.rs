//! Following a session: a watcher that replays its durable log and then
//! hears every new event exactly once ([`berth_actors::Watcher`] semantics),
//! folded into a [`SessionProjection`] as it arrives.
//!
//! Every A2A operation that waits on or streams a task attaches a
//! [`Follower`] *before* it acts, so nothing the action causes can be missed.
//! Dropping a follower detaches its watcher.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use berth_actors::{ControlError, Node, SessionNotice, Watcher};
use berth_runtime::ids::{SessionId, TurnId};
use tokio::sync::mpsc;

use crate::project::{Change, SessionProjection};

/// Watcher ids of A2A followers: the top quarter of the id space, apart from
/// the ACP connection ids (counted from 1), since attaching a second watcher
/// under an id replaces the first.
static NEXT_WATCHER_ID: AtomicU64 = AtomicU64::new(3 << 62);

struct ChannelWatcher {
    id: u64,
    tx: mpsc::UnboundedSender<SessionNotice>,
}

impl Watcher for ChannelWatcher {
    fn watcher_id(&self) -> u64 {
        self.id
    }

    fn notify(&self, notice: &SessionNotice) -> bool {
        self.tx.send(notice.clone()).is_ok()
    }
}

/// A session's projection kept current by a watcher.
pub struct Follower {
    node: Node,
    session_id: SessionId,
    watcher_id: u64,
    rx: mpsc::UnboundedReceiver<SessionNotice>,
    live: VecDeque<SessionNotice>,
    /// The tasks as folded so far.
    pub projection: SessionProjection,
}

impl Follower {
    /// Attaches to `session_id`, folding its whole log before returning;
    /// later events are waiting in [`Follower::next`].
    ///
    /// # Errors
    /// As [`Node::attach`]: `UnknownSession`, `Storage`, `ActorFailed`.
    pub async fn attach(node: &Node, session_id: &SessionId) -> Result<Self, ControlError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let watcher_id = NEXT_WATCHER_ID.fetch_add(1, Ordering::Relaxed);
        let watcher: Arc<dyn Watcher> = Arc::new(ChannelWatcher { id: watcher_id, tx });
        node.attach(session_id, watcher, true).await?;
        let mut follower = Self {
            node: node.clone(),
            session_id: session_id.clone(),
            watcher_id,
            rx,
            live: VecDeque::new(),
            projection: SessionProjection::new(session_id.clone()),
        };
        // The replay was delivered before `attach` returned; live events
        // may already follow it.
        while let Ok(notice) = follower.rx.try_recv() {
            if notice.replayed && follower.live.is_empty() {
                follower.projection.apply(notice.event_id, &notice.record);
            } else {
                follower.live.push_back(notice);
            }
        }
        Ok(follower)
    }

    /// The next live change (folded into the projection first); `None` when
    /// the session's watchers were dropped (the session actor stopped).
    pub async fn next(&mut self) -> Option<Vec<(TurnId, Change)>> {
        let notice = match self.live.pop_front() {
            Some(notice) => notice,
            None => self.rx.recv().await?,
        };
        Some(self.projection.apply(notice.event_id, &notice.record))
    }

    /// Folds every live event already received, without waiting.
    pub fn catch_up(&mut self) -> Vec<(TurnId, Change)> {
        while let Ok(notice) = self.rx.try_recv() {
            self.live.push_back(notice);
        }
        let mut out = Vec::new();
        while let Some(notice) = self.live.pop_front() {
            out.extend(self.projection.apply(notice.event_id, &notice.record));
        }
        out
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let (node, session_id, id) = (self.node.clone(), self.session_id.clone(), self.watcher_id);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { node.detach(&session_id, id).await });
        }
    }
}
