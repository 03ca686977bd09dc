//! Passivation: a parked session needs no actor (DESIGN.md, "Scale": parked
//! sessions are passivated — no actor, no task, only rows and a timer).
//!
//! Once a session has been parked with nothing in flight (no turn, no
//! waiting suspend, no buffered scheduled run, no pending close, no live
//! process group) for `passivate_after_ms` (default 10 s, so that short waits
//! resume without a rehydration), its actor stops itself. Past
//! `max_live_sessions` live actors (a soft cap, default 10,000), a parked
//! *or idle* session stops its actor as soon as it has nothing in flight:
//! memory stays bounded by the cap however many sessions a burst creates or
//! parks, and the sessions beyond it cost only rows (an idle session keeps
//! nothing else in memory either: its transcript is in the journal). Everything it held is in the journal
//! except its watchers (the connections attached to it), which wait in
//! [`Passivated`] for the next actor: a timer, an event or a client
//! rehydrates the session on demand and the watchers hear of the resumption
//! as before.
//!
//! A control sent to the actor while it was stopping is never lost: messages
//! are handled in order, so a message queued behind the passivation is
//! dropped unhandled, and the node retries it on a fresh actor when the
//! dropped reply comes from a passivated actor ([`Passivated::was_passivated`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use berth_runtime::ids::SessionId;
use ractor::{ActorId, ActorRef};

use super::{SessionMsg, SessionState};
use crate::watch::Watchers;

/// How many recently passivated actor ids are remembered for retries.
const RECENT: usize = 65_536;

/// The node-wide state of passivated sessions.
#[derive(Debug, Default)]
pub struct Passivated {
    inner: Mutex<Inner>,
    /// Session actors spawned and not yet forgotten by the registry.
    live: AtomicUsize,
}

#[derive(Debug, Default)]
struct Inner {
    /// Watchers of passivated sessions that had any attached.
    watchers: HashMap<SessionId, Arc<Watchers>>,
    /// Recently passivated actors (a bounded window, oldest first).
    recent: VecDeque<ActorId>,
    recent_set: HashSet<ActorId>,
}

impl Passivated {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a session actor the registry spawned.
    pub(crate) fn actor_spawned(&self) {
        self.live.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a session actor the registry forgot (stopped or failed).
    pub(crate) fn actor_forgotten(&self) {
        self.live.fetch_sub(1, Ordering::Relaxed);
    }

    /// Session actors live right now (spawned, not yet forgotten).
    pub fn live_actors(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// Records that `actor` (of session `id`) stops for passivation, keeping
    /// its watchers if any are attached.
    fn stash(&self, id: &SessionId, actor: ActorId, watchers: &Arc<Watchers>) {
        let mut inner = self.lock();
        if !watchers.is_empty() {
            inner.watchers.insert(id.clone(), Arc::clone(watchers));
        }
        if inner.recent_set.insert(actor) {
            inner.recent.push_back(actor);
        }
        while inner.recent.len() > RECENT {
            if let Some(old) = inner.recent.pop_front() {
                inner.recent_set.remove(&old);
            }
        }
    }

    /// The watchers a passivated session left, for its new actor.
    pub(crate) fn take_watchers(&self, id: &SessionId) -> Option<Arc<Watchers>> {
        let mut inner = self.lock();
        let taken = inner.watchers.remove(id);
        crate::registry::shrink_if_sparse(&mut inner.watchers);
        taken
    }

    /// Whether `actor` stopped for passivation (a control it dropped
    /// unhandled may be sent again to the session's next actor).
    pub(crate) fn was_passivated(&self, actor: ActorId) -> bool {
        self.lock().recent_set.contains(&actor)
    }

    /// Detaches a watcher from a passivated session.
    pub(crate) fn detach(&self, id: &SessionId, watcher_id: u64) {
        let mut inner = self.lock();
        if let Some(watchers) = inner.watchers.get(id) {
            watchers.detach(id, watcher_id);
            if watchers.is_empty() {
                inner.watchers.remove(id);
                crate::registry::shrink_if_sparse(&mut inner.watchers);
            }
        }
    }
}

/// Whether the node holds more live actors than `max_live_sessions`.
fn over_cap(state: &SessionState) -> bool {
    state.env.passivated.live_actors() > state.env.config.max_live_sessions
}

/// How long the session waits before it gives up its actor, if it may:
/// `passivate_after_ms` when it is parked, at once when the node is over
/// its live-actor cap (parked or idle), `None` when it must stay live.
pub(crate) fn passivate_in_ms(state: &SessionState) -> Option<u64> {
    if !passivable(state) {
        None
    } else if over_cap(state) {
        Some(0)
    } else {
        Some(state.env.config.passivate_after_ms)
    }
}

/// Whether the session can give up its actor now: parked (or idle while
/// the node is over its live-actor cap), with nothing in flight that lives
/// only in memory.
pub(crate) fn passivable(state: &SessionState) -> bool {
    state.env.config.passivate_parked
        && (state.suspension.is_some() || over_cap(state))
        && state.turn.is_none()
        && state.suspend_waiters.is_empty()
        && state.scheduled.is_empty()
        && state.pending_close.is_empty()
        && state.processes.prune() == 0
}

/// Handles `SessionMsg::Passivate`: stops the actor if the session is (still)
/// passivable.
pub(crate) fn passivate(myself: &ActorRef<SessionMsg>, state: &mut SessionState) {
    state.passivation_asked = false;
    if !passivable(state) {
        return;
    }
    state
        .env
        .passivated
        .stash(&state.record.session_id, myself.get_id(), &state.watchers);
    myself.stop(Some("passivated".into()));
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use berth_runtime::event::SessionEvent;
    use berth_runtime::model::scripted::ScriptedModel;
    use berth_runtime::suspension::ResumeCause;

    use crate::node::{NewSession, ResumeParams, SuspendParams};
    use crate::watch::{SessionNotice, Watcher};
    use crate::{ControlError, Node, NodeConfig};

    use super::*;

    struct Recorder(Mutex<Vec<&'static str>>);

    impl Watcher for Recorder {
        fn watcher_id(&self) -> u64 {
            7
        }
        fn notify(&self, notice: &SessionNotice) -> bool {
            if let SessionEvent::Resumed { .. } = notice.record.event {
                self.0.lock().unwrap().push("resumed");
            }
            true
        }
    }

    async fn until_passivated(node: &Node, id: &SessionId) {
        for _ in 0..500 {
            if node.registry.get_live(id).await.is_none() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the parked session kept its actor");
    }

    /// A node on a fresh data dir whose model plays `script`, configured by
    /// `configure`; the sessions' cwd is `work` in the returned directory,
    /// beside the data dir.
    async fn node_with(
        script: &str,
        configure: impl FnOnce(&mut NodeConfig),
    ) -> (tempfile::TempDir, Node) {
        let dir = tempfile::tempdir().unwrap();
        let model = ScriptedModel::parse(script, "toml", "scripted:passivate").unwrap();
        std::fs::create_dir_all(dir.path().join("work")).unwrap();
        let mut config = NodeConfig::new(dir.path().join("data"), Arc::new(model));
        configure(&mut config);
        let node = Node::start(config).await.unwrap();
        (dir, node)
    }

    #[tokio::test]
    async fn past_the_live_cap_idle_sessions_give_up_their_actors_and_keep_working() {
        let (dir, node) = node_with(
            "[[rules]]\nmatch = \"hello\"\nsteps = [{ text = \"hi there\" }]\n",
            |config| {
                // Parked sessions would wait a minute: only the cap makes them go.
                config.passivate_after_ms = 60_000;
                config.max_live_sessions = 2;
            },
        )
        .await;
        let mut ids = Vec::new();
        for _ in 0..5 {
            let sid = node
                .new_session(NewSession::in_dir(dir.path().join("work")))
                .await
                .unwrap()
                .session_id;
            // Any handled message lets an idle actor notice the cap.
            node.attach(&sid, Arc::new(Recorder(Mutex::default())), false)
                .await
                .unwrap();
            ids.push(sid);
        }
        // The first two fit under the cap and stay; the rest passivate at
        // once although they are merely idle.
        for sid in &ids[2..] {
            until_passivated(&node, sid).await;
        }
        assert!(node.registry.get_live(&ids[0]).await.is_some());
        assert!(node.registry.get_live(&ids[1]).await.is_some());
        assert_eq!(node.env.passivated.live_actors(), 2);
        // A passivated idle session rehydrates for a prompt, answers from
        // its journaled transcript, and goes again.
        for round in 0..2 {
            let outcome = node
                .prompt(&ids[4], berth_runtime::content::Prompt::text("hello"))
                .await
                .unwrap();
            assert_eq!(
                outcome.terminal.kind,
                berth_runtime::terminal::TerminalKind::Completed,
                "round {round}"
            );
            until_passivated(&node, &ids[4]).await;
        }
        // Both turns are in the transcript (the second one was appended to
        // the first by a rehydrated actor).
        let transcript = node.journal().transcript(&ids[4]).unwrap();
        assert_eq!(transcript.len(), 4, "{transcript:?}");
        // Under the cap again, a parked session keeps its actor for
        // `passivate_after_ms` (short waits resume without a rehydration).
        for sid in &ids[..2] {
            node.close(sid, "test").await.unwrap();
        }
        node.prompt(&ids[3], berth_runtime::content::Prompt::text("hello"))
            .await
            .unwrap();
        node.suspend(&ids[3], SuspendParams::by_client("test"))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(node.registry.get_live(&ids[3]).await.is_some());
    }

    /// A message of a finished turn is answered the same whether or not the
    /// session kept its actor (the last turn's control block is memory only;
    /// the journal says what became of the message).
    #[tokio::test]
    async fn a_revoke_after_passivation_is_answered_from_the_journal() {
        let (dir, node) = node_with(
            "[[rules]]\nmatch = \"slow\"\nsteps = [{ delay_ms = 300 }, { text = \"a\" }, { tool_call = { name = \"read_file\", arguments = { path = \"/nonexistent\" } } }, { text = \"done\" }]\n",
            |config| config.max_live_sessions = 0,
        )
        .await;
        let sid = node
            .new_session(NewSession::in_dir(dir.path().join("work")))
            .await
            .unwrap()
            .session_id;
        let turn = {
            let (node, sid) = (node.clone(), sid.clone());
            tokio::spawn(async move {
                node.prompt(&sid, berth_runtime::content::Prompt::text("slow"))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let steered = node
            .inject(&sid, "steer", &serde_json::json!("hurry"), "client")
            .await
            .unwrap();
        turn.await.unwrap().unwrap();
        until_passivated(&node, &sid).await;
        for (content, what) in [(None, "revoke"), (Some(serde_json::json!("x")), "replace")] {
            let answer = node
                .retract_injection(&sid, &steered, content.as_ref(), "client")
                .await;
            assert!(
                matches!(
                    answer,
                    Err(ControlError::Injection {
                        conflict: berth_runtime::steering::InjectionConflict::AlreadyDelivered,
                        ..
                    })
                ),
                "{what}: {answer:?}"
            );
        }
        let unknown = node
            .retract_injection(&sid, "msg_never", None, "client")
            .await;
        assert!(
            matches!(
                unknown,
                Err(ControlError::Injection {
                    conflict: berth_runtime::steering::InjectionConflict::UnknownMessageId,
                    ..
                })
            ),
            "{unknown:?}"
        );
    }

    #[tokio::test]
    async fn a_parked_session_gives_up_its_actor_and_loses_no_control_or_watcher() {
        let (dir, node) = node_with("", |config| config.passivate_after_ms = 0).await;
        let sid = node
            .new_session(NewSession::in_dir(dir.path().join("work")))
            .await
            .unwrap()
            .session_id;
        let parked = node
            .suspend(&sid, SuspendParams::by_client("test"))
            .await
            .unwrap();
        until_passivated(&node, &sid).await;
        // Attaching rehydrates it; it passivates again and keeps the watcher.
        let recorder = Arc::new(Recorder(Mutex::default()));
        node.attach(&sid, recorder.clone(), false).await.unwrap();
        until_passivated(&node, &sid).await;
        // A handle that is not the current one is named as such.
        let wrong = node
            .resume(
                &sid,
                ResumeParams {
                    handle: Some("susp_nope".into()),
                    input: None,
                    continue_transcript: true,
                    cause: ResumeCause::ExplicitResume,
                    actor: "test".into(),
                    lateness_ms: None,
                    message_id: None,
                    trigger: None,
                },
            )
            .await;
        assert!(
            matches!(&wrong, Err(ControlError::ResumeConflict { reason: crate::error::ResumeConflict::HandleMismatch { current }, .. }) if *current == parked.handle),
            "{wrong:?}"
        );
        until_passivated(&node, &sid).await;
        // Resumes racing the rehydration: exactly one wins, none is lost.
        let resumes = (0..50).map(|i| {
            let (node, sid, handle) = (node.clone(), sid.clone(), parked.handle.clone());
            tokio::spawn(async move {
                node.resume(
                    &sid,
                    ResumeParams {
                        handle: Some(handle),
                        input: None,
                        continue_transcript: true,
                        cause: ResumeCause::ExplicitResume,
                        actor: format!("racer-{i}"),
                        lateness_ms: None,
                        message_id: None,
                        trigger: None,
                    },
                )
                .await
            })
        });
        let answers = futures::future::join_all(resumes).await;
        let won = answers.iter().filter(|a| matches!(a, Ok(Ok(_)))).count();
        let lost = answers
            .iter()
            .filter(|a| matches!(a, Ok(Err(ControlError::ResumeConflict { .. }))))
            .count();
        assert_eq!((won, lost), (1, 49), "{answers:?}");
        assert!(
            node.registry.get_live(&sid).await.is_some(),
            "a resumed session is live"
        );
        // The watcher attached while it was passivated heard the resumption.
        for _ in 0..200 {
            if !recorder.0.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(*recorder.0.lock().unwrap(), ["resumed"]);
    }
}
