//! # berth-runtime
//!
//! The domain model of berth and its agent turn engine, with no actors and no
//! storage engine (see `DESIGN.md`, "Layout").
//!
//! - [`ids`] and [`clock`]: session/turn/tool-call ids and the injected id source
//!   and clock, so that tests and replay are deterministic.
//! - [`event`]: [`event::SessionEvent`], the facts journaled per session, each of
//!   which renders to one ACP `session/update` or `_berth/agentEvent`.
//! - [`terminal`]: how a turn ended ([`terminal::Terminal`] = kind + owner + reason,
//!   from `seeds/remote-session-control.md`, "Receipts").
//! - [`history`]: the canonical transcript a model reads.
//! - [`frame`]: the explicit, serializable turn state (`seeds/execution-suspension.md`).
//! - [`model`]: the [`model::ModelProvider`] trait and the `scripted` and `openai`
//!   providers.
//! - [`tools`]: the [`tools::Tool`] trait and the `shell`, `read_file`, `write_file` tools.
//! - [`directives`]: the authority ladder and the completion judge.
//! - [`steering`]: injected messages (`session/inject`) and the seams that drain them.
//! - [`suspension`]: resume conditions, the suspension envelope and the resume claim.
//! - [`receipt`]: the signed receipts (suspension, resumption, drain decision,
//!   control outcome), their canonical signing bytes and the input hash.
//! - [`budget`]: per-session spend against budget policies.
//! - [`engine`]: [`engine::run_turn`], the turn loop (model call → tool batch → …).
//! - [`tape`]: the replay tape, every non-deterministic input a turn run
//!   consumed (model responses, tool outcomes, clock readings), journaled
//!   for `berth replay`.

#![warn(missing_docs)]

pub mod budget;
pub mod canonical;
pub mod clock;
pub mod content;
pub mod directives;
pub mod engine;
pub mod event;
pub mod frame;
pub mod hexstr;
pub mod history;
pub mod ids;
pub mod model;
pub mod receipt;
pub mod steering;
pub mod suspension;
pub mod tape;
pub mod terminal;
pub mod tools;
pub mod unique_json;
