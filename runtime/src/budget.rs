//! Budgets: per-session spend (tokens, cost, tool calls, wall time) against
//! the limits of the policies that apply to the session, plus what operators
//! granted on top. Limits are checked before the spend they bound: a model
//! call is not started once the tokens or the cost spent reach their limit,
//! and a limit of N tool calls dispatches at most N (a batch that would cross
//! it is cut there, the rest left unstarted in the parked frame). Wall time
//! is checked after each step. A turn that reaches a limit is suspended by
//! the engine with mode `interrupt_immediate`, initiator `policy` (terminal
//! kind `policy_budget`); an operator resumes it with `{"budget": {...}}` as
//! input, which raises the allowance.

use serde::{Deserialize, Serialize};

use crate::frame::Accounting;
use crate::model::Usage;

/// The key of a resume input that carries a budget top-up (`{"budget":
/// BudgetLimits}`): berth consumes it (the allowance grows) and it never
/// reaches the model.
pub const GRANT_KEY: &str = "budget";

/// The part of a resume `input` the model is shown: the input without its
/// [`GRANT_KEY`] top-up. An object that held only the top-up leaves nothing
/// (`None`: no message at all); any other input is shown whole. The
/// journaled input keeps the top-up (the grant is replayed from it).
pub fn model_input(input: Option<&serde_json::Value>) -> Option<serde_json::Value> {
    match input? {
        serde_json::Value::Object(fields) if fields.contains_key(GRANT_KEY) => {
            let rest: serde_json::Map<String, serde_json::Value> = fields
                .iter()
                .filter(|(k, _)| k.as_str() != GRANT_KEY)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            (!rest.is_empty()).then_some(serde_json::Value::Object(rest))
        }
        other => Some(other.clone()),
    }
}

/// Limits; `None` is unlimited.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetLimits {
    /// Input + output tokens over the session's turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Cost in USD, from the price table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// Tool calls dispatched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u64>,
    /// Wall time spent running turns (ms; time parked does not count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wall_ms: Option<u64>,
}

impl BudgetLimits {
    /// The tighter of two limit sets, field by field.
    pub fn tighter(&self, other: &Self) -> Self {
        fn min<T: PartialOrd + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(if b < a { b } else { a }),
                (a, b) => a.or(b),
            }
        }
        Self {
            max_tokens: min(self.max_tokens, other.max_tokens),
            max_cost_usd: min(self.max_cost_usd, other.max_cost_usd),
            max_tool_calls: min(self.max_tool_calls, other.max_tool_calls),
            max_wall_ms: min(self.max_wall_ms, other.max_wall_ms),
        }
    }

    /// These limits raised by `grant` (only where both are set: a grant never
    /// turns an unlimited field into a limited one).
    pub fn raised(&self, grant: &Self) -> Self {
        fn add_u(a: Option<u64>, b: Option<u64>) -> Option<u64> {
            a.map(|a| a.saturating_add(b.unwrap_or(0)))
        }
        Self {
            max_tokens: add_u(self.max_tokens, grant.max_tokens),
            max_cost_usd: self
                .max_cost_usd
                .map(|a| a + grant.max_cost_usd.unwrap_or(0.0)),
            max_tool_calls: add_u(self.max_tool_calls, grant.max_tool_calls),
            max_wall_ms: add_u(self.max_wall_ms, grant.max_wall_ms),
        }
    }

    /// Adds `grant` to these (accumulated grants).
    pub fn add(&mut self, grant: &Self) {
        fn add_u(a: &mut Option<u64>, b: Option<u64>) {
            if let Some(b) = b {
                *a = Some(a.unwrap_or(0).saturating_add(b));
            }
        }
        add_u(&mut self.max_tokens, grant.max_tokens);
        add_u(&mut self.max_tool_calls, grant.max_tool_calls);
        add_u(&mut self.max_wall_ms, grant.max_wall_ms);
        if let Some(b) = grant.max_cost_usd {
            self.max_cost_usd = Some(self.max_cost_usd.unwrap_or(0.0) + b);
        }
    }

    /// Whether no limit is set.
    pub fn is_unlimited(&self) -> bool {
        *self == Self::default()
    }
}

/// A budget policy from the config file (`[[budgets]]`): limits for every
/// session, or for sessions with `label`. In the file the limits sit beside
/// `label` (`max_tokens = 50000`); a wrong value is reported at its own key
/// (`budgets[0].max_tokens`), an unknown key is refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "PolicyFields")]
pub struct BudgetPolicy {
    /// Applies only to sessions with this label; all sessions when absent.
    #[serde(default)]
    pub label: Option<String>,
    /// The limits.
    #[serde(flatten)]
    pub limits: BudgetLimits,
}

/// How a [`BudgetPolicy`] is read: every key spelled out, because serde's
/// `flatten` reads the table as a whole, so a bad value would be reported at
/// the table (`budgets[0]`) instead of its key.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFields {
    #[serde(default)]
    label: Option<String>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_cost_usd: Option<f64>,
    #[serde(default)]
    max_tool_calls: Option<u64>,
    #[serde(default)]
    max_wall_ms: Option<u64>,
}

impl From<PolicyFields> for BudgetPolicy {
    fn from(f: PolicyFields) -> Self {
        Self {
            label: f.label,
            limits: BudgetLimits {
                max_tokens: f.max_tokens,
                max_cost_usd: f.max_cost_usd,
                max_tool_calls: f.max_tool_calls,
                max_wall_ms: f.max_wall_ms,
            },
        }
    }
}

/// A model's price (`[prices."MODEL NAME"]`), in USD per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// USD per 1,000,000 input tokens.
    pub input_per_mtok_usd: f64,
    /// USD per 1,000,000 output tokens.
    pub output_per_mtok_usd: f64,
}

impl Price {
    /// Cost of `usage` in micro-USD (rounded up).
    pub fn cost_micro_usd(&self, usage: Usage) -> u64 {
        let micro = usage.input_tokens as f64 * self.input_per_mtok_usd
            + usage.output_tokens as f64 * self.output_per_mtok_usd;
        if micro.is_finite() && micro > 0.0 {
            micro.ceil() as u64
        } else {
            0
        }
    }
}

/// What a session has spent over its sealed turns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spend {
    /// Input tokens.
    #[serde(default)]
    pub input_tokens: u64,
    /// Output tokens.
    #[serde(default)]
    pub output_tokens: u64,
    /// Tool calls dispatched.
    #[serde(default)]
    pub tool_calls: u64,
    /// Cost (micro-USD).
    #[serde(default)]
    pub cost_micro_usd: u64,
    /// Wall time running turns (ms).
    #[serde(default)]
    pub wall_ms: u64,
}

impl Spend {
    /// Adds one turn's accounting.
    pub fn add(&mut self, turn: &Accounting, price: Option<&Price>) {
        self.input_tokens += turn.usage.input_tokens;
        self.output_tokens += turn.usage.output_tokens;
        self.tool_calls += u64::from(turn.tool_calls);
        self.cost_micro_usd += price.map_or(0, |p| p.cost_micro_usd(turn.usage));
        self.wall_ms += turn.wall_ms;
    }
}

/// The budget a turn runs under (journaled with the turn's configuration on
/// its replay tape, see [`crate::tape::TurnConfig`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    /// The limits in force (policies, tightest first, raised by grants).
    pub limits: BudgetLimits,
    /// Spent before this turn.
    pub spent: Spend,
    /// The model's price, if known (cost limits need one).
    pub price: Option<Price>,
}

impl Budget {
    /// Why no model call may start with `turn` spent in the running turn:
    /// the tokens or the cost spent reached their limit (or any limit is
    /// over, see [`Budget::breach`]). `None`: it may start.
    pub fn model_call_refused(&self, turn: &Accounting) -> Option<String> {
        let mut total = self.spent;
        total.add(turn, self.price.as_ref());
        let tokens = total.input_tokens + total.output_tokens;
        let l = &self.limits;
        if let Some(max) = l.max_tokens.filter(|max| tokens >= *max) {
            return Some(format!(
                "tokens {tokens} reached the budget of {max}; no further model call"
            ));
        }
        if let Some(max) = l.max_cost_usd {
            let cost = total.cost_micro_usd as f64 / 1e6;
            if cost >= max {
                return Some(format!(
                    "cost ${cost:.6} reached the budget of ${max}; no further model call"
                ));
            }
        }
        self.breach(turn)
    }

    /// How many more tool calls may be dispatched with `turn` spent in the
    /// running turn; `None` is unlimited.
    pub fn tool_calls_left(&self, turn: &Accounting) -> Option<u64> {
        let used = self
            .spent
            .tool_calls
            .saturating_add(u64::from(turn.tool_calls));
        self.limits
            .max_tool_calls
            .map(|max| max.saturating_sub(used))
    }

    /// Why the session is over budget with `turn` spent in the running turn,
    /// or `None`.
    pub fn breach(&self, turn: &Accounting) -> Option<String> {
        let mut total = self.spent;
        total.add(turn, self.price.as_ref());
        let tokens = total.input_tokens + total.output_tokens;
        let l = &self.limits;
        if let Some(max) = l.max_tokens.filter(|max| tokens > *max) {
            return Some(format!("tokens {tokens} over the budget of {max}"));
        }
        if let Some(max) = l.max_cost_usd {
            let cost = total.cost_micro_usd as f64 / 1e6;
            if cost > max {
                return Some(format!("cost ${cost:.6} over the budget of ${max}"));
            }
        }
        if let Some(max) = l.max_tool_calls.filter(|max| total.tool_calls > *max) {
            return Some(format!(
                "tool calls {} over the budget of {max}",
                total.tool_calls
            ));
        }
        if let Some(max) = l.max_wall_ms.filter(|max| total.wall_ms > *max) {
            return Some(format!(
                "wall time {} ms over the budget of {max} ms",
                total.wall_ms
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_model_sees_a_resume_input_without_its_top_up() {
        use serde_json::json;
        let only = json!({"budget": {"max_tool_calls": 50}});
        assert_eq!(model_input(Some(&only)), None);
        let mixed = json!({"budget": {"max_tool_calls": 50}, "note": "go on"});
        assert_eq!(model_input(Some(&mixed)), Some(json!({"note": "go on"})));
        let text = json!("carry on");
        assert_eq!(model_input(Some(&text)), Some(text.clone()));
        let other = json!({"answer": 42});
        assert_eq!(model_input(Some(&other)), Some(other.clone()));
        assert_eq!(model_input(None), None);
    }

    use super::*;

    #[test]
    fn breaches_name_the_limit_and_grants_raise_it() {
        let budget = Budget {
            limits: BudgetLimits {
                max_tokens: Some(100),
                ..Default::default()
            },
            spent: Spend {
                input_tokens: 60,
                ..Default::default()
            },
            price: None,
        };
        let turn = Accounting {
            usage: Usage {
                input_tokens: 30,
                output_tokens: 20,
            },
            ..Default::default()
        };
        assert!(budget.breach(&turn).unwrap().contains("tokens 110"));
        // Reached, not over: no breach, but no further model call either.
        let reached = Accounting {
            usage: Usage {
                input_tokens: 20,
                output_tokens: 20,
            },
            ..Default::default()
        };
        assert_eq!(budget.breach(&reached), None);
        assert!(budget
            .model_call_refused(&reached)
            .is_some_and(|r| r.contains("tokens 100 reached the budget of 100")));
        assert_eq!(budget.model_call_refused(&Accounting::default()), None);
        let calls = Budget {
            limits: BudgetLimits {
                max_tool_calls: Some(2),
                ..Default::default()
            },
            spent: Spend {
                tool_calls: 1,
                ..Default::default()
            },
            price: None,
        };
        assert_eq!(calls.tool_calls_left(&Accounting::default()), Some(1));
        let one = Accounting {
            tool_calls: 1,
            ..Default::default()
        };
        assert_eq!(calls.tool_calls_left(&one), Some(0));
        assert_eq!(budget.tool_calls_left(&one), None, "unlimited");
        let raised = Budget {
            limits: budget.limits.raised(&BudgetLimits {
                max_tokens: Some(50),
                ..Default::default()
            }),
            ..budget.clone()
        };
        assert_eq!(raised.breach(&turn), None);
        let tight = BudgetLimits {
            max_tokens: Some(10),
            max_tool_calls: Some(3),
            ..Default::default()
        };
        assert_eq!(tight.tighter(&budget.limits).max_tokens, Some(10));
        assert_eq!(
            Price {
                input_per_mtok_usd: 3.0,
                output_per_mtok_usd: 15.0
            }
            .cost_micro_usd(turn.usage),
            390
        );
    }
}

#[cfg(test)]
mod parse_tests {
    use super::*;

    #[test]
    fn a_policy_reads_its_label_and_limits_and_refuses_unknown_keys() {
        let p: BudgetPolicy =
            serde_json::from_value(serde_json::json!({"label": "x", "max_tokens": 5})).unwrap();
        assert_eq!(p.label.as_deref(), Some("x"));
        assert_eq!(p.limits.max_tokens, Some(5));
        let bad = serde_json::from_value::<BudgetLimits>(serde_json::json!({"max_tokenz": 5}));
        assert!(bad.is_err());
        let bad = serde_json::from_value::<BudgetPolicy>(
            serde_json::json!({"label": "x", "max_tokenz": 5}),
        );
        assert!(bad.is_err(), "a typo in a policy is refused");
    }
}
