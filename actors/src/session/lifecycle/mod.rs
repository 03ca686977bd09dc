//! One file per control word: each is a small function from (state, command)
//! to (decision, effects), run inside the session actor's handler.

pub mod attach;
pub mod cancel;
pub mod cancel_tool_call;
pub mod close;
pub mod inject;
pub mod prompt;
pub mod refuse;
pub mod resume;
pub mod retract;
pub mod rollback;
pub mod scheduled;
pub mod status;
pub mod suspend;
pub mod view;
