//! The spinner of operations that wait (a suspend waiting for its seam, a
//! prompt waiting for the model, a resume claim): one line on stderr, drawn
//! only when stderr is a terminal, so scripts and `--json` output never see
//! it.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// A spinner line on stderr (nothing when stderr is not a terminal). It is
/// cleared when dropped.
pub struct Spinner(Option<ProgressBar>);

impl Spinner {
    /// Starts a spinner saying `message` (a present participle: "waiting for
    /// the suspension to commit").
    pub fn start(message: impl Into<String>) -> Self {
        if !std::io::stderr().is_terminal() {
            return Self(None);
        }
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_message(message.into());
        bar.enable_steady_tick(Duration::from_millis(100));
        Self(Some(bar))
    }

    /// Changes the message.
    pub fn set(&self, message: impl Into<String>) {
        if let Some(bar) = &self.0 {
            bar.set_message(message.into());
        }
    }

    /// Runs `f` (which prints) with the spinner line out of the way.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.0 {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }

    /// Removes the spinner line for good.
    pub fn clear(&mut self) {
        if let Some(bar) = self.0.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.clear();
    }
}
