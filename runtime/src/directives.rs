//! The authority ladder (`seeds/remote-session-control.md`, "Steer" → "Authority").
//!
//! Every directive put before the model carries an authority: `contract` (3,
//! what the session must do), `corrective` (2, a correction to how it does it)
//! or `advisory` (1, a suggestion). Directives that collide — the same `key`,
//! e.g. `objective` — resolve structurally: the higher authority wins outright;
//! only at equal authority does the newer one win. Survivors render to the
//! model in contract, corrective, advisory order as
//! `<directive authority="…">…</directive>`.
//!
//! A delivered steer registers at `contract` authority on `objective`, so a
//! [`CompletionJudge`]'s `corrective` restatement of the original request can
//! never undo it.

use serde::{Deserialize, Serialize};

/// Directive authority, ordered: `Advisory < Corrective < Contract`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Authority {
    /// 1: a suggestion.
    Advisory = 1,
    /// 2: a correction to how the session pursues its goal.
    Corrective = 2,
    /// 3: what the session must do.
    Contract = 3,
}

impl Authority {
    /// The wire and prompt name (`contract`, `corrective`, `advisory`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Advisory => "advisory",
            Self::Corrective => "corrective",
            Self::Contract => "contract",
        }
    }
}

/// One directive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Directive {
    /// Its authority.
    pub authority: Authority,
    /// What it is about; directives with the same key collide (`objective`).
    pub key: String,
    /// The instruction.
    pub text: String,
    /// Who issued it (`steer`, `completion_judge`, …).
    pub source: String,
}

impl Directive {
    /// The directive as the model reads it.
    pub fn render(&self) -> String {
        format!(
            "<directive authority=\"{}\">{}</directive>",
            self.authority.name(),
            self.text
        )
    }
}

/// Result of registering a directive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registered {
    /// It is in force (it replaced `superseded`, if any).
    Applied {
        /// The directive it displaced (same key, lower or equal authority).
        superseded: Option<Directive>,
    },
    /// A directive of higher authority on the same key is in force.
    Overruled {
        /// The directive that outranks it.
        by: Directive,
    },
}

/// The directives in force for one turn.
#[derive(Debug, Clone, Default)]
pub struct DirectiveSet {
    /// In registration order (newest last).
    active: Vec<Directive>,
}

impl DirectiveSet {
    /// Registers a directive under the ladder's rule.
    pub fn register(&mut self, directive: Directive) -> Registered {
        match self.active.iter().position(|d| d.key == directive.key) {
            Some(i) if self.active[i].authority > directive.authority => Registered::Overruled {
                by: self.active[i].clone(),
            },
            Some(i) => {
                let superseded = self.active.remove(i);
                self.active.push(directive);
                Registered::Applied {
                    superseded: Some(superseded),
                }
            }
            None => {
                self.active.push(directive);
                Registered::Applied { superseded: None }
            }
        }
    }

    /// The directives in force, contract first, then corrective, then
    /// advisory; newer first within one authority.
    pub fn in_force(&self) -> Vec<&Directive> {
        let mut out: Vec<&Directive> = self.active.iter().rev().collect();
        out.sort_by_key(|d| std::cmp::Reverse(d.authority));
        out
    }

    /// The directive in force on `key`, if any.
    pub fn get(&self, key: &str) -> Option<&Directive> {
        self.active.iter().find(|d| d.key == key)
    }
}

/// A completion judge: an authority gate, not an advisory reviewer. When the
/// model ends its turn, it re-derives what the session owes from the original
/// request and may issue a `corrective` directive restating it.
pub trait CompletionJudge: Send + Sync + std::fmt::Debug {
    /// Judges a finished answer. `None`: the request is met.
    fn judge(&self, original_request: &str, final_answer: &str) -> Option<Directive>;
}

/// The built-in judge: the request is owed until the final answer mentions at
/// least half of the request's significant words (four letters or more); if
/// not, it issues a corrective directive on `objective` restating the request.
#[derive(Debug, Default, Clone, Copy)]
pub struct ObjectiveJudge;

impl CompletionJudge for ObjectiveJudge {
    fn judge(&self, original_request: &str, final_answer: &str) -> Option<Directive> {
        let answer = final_answer.to_lowercase();
        let words: Vec<String> = original_request
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| w.chars().count() >= 4)
            .map(str::to_lowercase)
            .collect();
        if words.is_empty() {
            return None;
        }
        let met = words.iter().filter(|w| answer.contains(w.as_str())).count();
        (met * 2 < words.len()).then(|| Directive {
            authority: Authority::Corrective,
            key: "objective".into(),
            text: format!("Complete the original request: {original_request}"),
            source: "completion_judge".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(authority: Authority, key: &str, text: &str) -> Directive {
        Directive {
            authority,
            key: key.into(),
            text: text.into(),
            source: "test".into(),
        }
    }

    #[test]
    fn higher_authority_wins_outright_and_equal_means_newer() {
        let mut set = DirectiveSet::default();
        assert!(matches!(
            set.register(d(Authority::Contract, "objective", "steer")),
            Registered::Applied { superseded: None }
        ));
        let judge = set.register(d(Authority::Corrective, "objective", "restate"));
        assert!(matches!(judge, Registered::Overruled { by } if by.text == "steer"));
        let newer = set.register(d(Authority::Contract, "objective", "steer again"));
        assert!(
            matches!(newer, Registered::Applied { superseded: Some(old) } if old.text == "steer")
        );
        set.register(d(Authority::Advisory, "style", "be brief"));
        set.register(d(Authority::Corrective, "tests", "run the tests"));
        let order: Vec<&str> = set.in_force().iter().map(|d| d.authority.name()).collect();
        assert_eq!(order, ["contract", "corrective", "advisory"]);
        assert_eq!(
            set.get("objective").unwrap().render(),
            "<directive authority=\"contract\">steer again</directive>"
        );
    }

    #[test]
    fn the_objective_judge_restates_an_unmet_request() {
        let j = ObjectiveJudge;
        assert!(j
            .judge("fix the parser bug", "I fixed the parser bug.")
            .is_none());
        let restated = j
            .judge("fix the parser bug", "I refactored the logger.")
            .unwrap();
        assert_eq!(restated.authority, Authority::Corrective);
        assert_eq!(restated.key, "objective");
        assert!(restated.text.contains("fix the parser bug"));
    }
}
