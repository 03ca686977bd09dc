//! The `scripted` model: deterministic responses from a script file.
//!
//! The embedded default provider, and what tests, benchmarks and conformance
//! runs use. A script is a TOML (`.toml`) or JSON (`.json`) file:
//!
//! ```toml
//! # Played when no rule matches (optional; default: a short notice).
//! fallback = "I have no script for that."
//!
//! [[rules]]
//! # Matches when the latest user message contains this (case-insensitive)…
//! match = "list files"
//! # …or matches this regex (give one of `match` / `regex`).
//! # regex = "^list (?P<dir>.+)$"
//! steps = [
//!   { thought = "The user wants a listing." },
//!   { text = "Listing {cwd}." },
//!   { delay_ms = 250 },                                   # simulated latency
//!   { tool_call = { name = "shell", arguments = { command = "ls" } } },
//!   { tool_calls = [                                      # one parallel batch
//!       { name = "read_file", arguments = { path = "{cwd}/a.txt" } },
//!       { name = "read_file", arguments = { path = "{cwd}/b.txt" } } ] },
//!   { text = "Done." },
//!   { usage = { input_tokens = 120, output_tokens = 40 } },
//!   { stop = "end_turn" },                                # or max_tokens, refusal
//! ]
//! ```
//!
//! With `resume_input_is_input = true` (top level), the result of a resumed
//! `await_resumption` call counts as the latest user message: rules match the
//! resume input (`resumed (…) with input: …`) and the positions count from
//! it, so a script can branch on what a client resumed the agent with (the
//! A2A TCK profile `conformance/a2a/tck-profile.toml` does).
//!
//! Rules are tried in file order; the first match plays. A rule's steps are cut
//! into model responses after each `tool_call`/`tool_calls` step (a `usage` or
//! `stop` step right after one still belongs to it): the *n*-th model call
//! since the latest user message (a prompt, or a steer delivered mid-turn)
//! plays the *n*-th piece, so the script position is derived from the request
//! alone (deterministic, and resumable from a frame). A piece ends with
//! `end_turn` unless it ends in tool calls or a `stop` step. Strings in `text`,
//! `thought` and tool arguments expand `{cwd}` (the session directory),
//! `{input}` (the latest user message) and `{last_tool_result}` (the content of
//! the latest tool result the model reads). Tool call ids are
//! `<turn id>_<model call>_<index>`. Without a `usage` step, usage is estimated
//! as characters / 4.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use regex::Regex;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::mpsc;

use super::{ModelDelta, ModelError, ModelProvider, ModelRequest, ModelResponse, ModelStop, Usage};
use crate::history::{Message, ToolCallRequest};
use crate::ids::ToolCallId;

/// The demo script shipped with berth (`runtime/scripts/demo.toml`).
pub const DEMO_SCRIPT: &str = include_str!("../../scripts/demo.toml");

/// A scripted tool call.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedCall {
    /// Tool name.
    pub name: String,
    /// Arguments object (strings expand `{cwd}`, `{input}`).
    #[serde(default = "empty_object")]
    pub arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// Stop reasons a script may give.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScriptedStop {
    /// `end_turn`
    EndTurn,
    /// `max_tokens`
    MaxTokens,
    /// `refusal`
    Refusal,
}

/// One step of a rule.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// Stream answer text.
    Text(String),
    /// Stream reasoning text.
    Thought(String),
    /// Wait this many milliseconds (simulated model latency).
    DelayMs(u64),
    /// Call one tool; ends this model response.
    ToolCall(ScriptedCall),
    /// Call several tools as one parallel batch; ends this model response.
    ToolCalls(Vec<ScriptedCall>),
    /// Report this usage for the response (tokens).
    Usage(Usage),
    /// End the response with this stop reason.
    Stop(ScriptedStop),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    #[serde(rename = "match", default)]
    contains: Option<String>,
    #[serde(default)]
    regex: Option<String>,
    #[serde(default)]
    steps: Vec<Step>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptFile {
    #[serde(default)]
    fallback: Option<String>,
    #[serde(default)]
    resume_input_is_input: bool,
    #[serde(default)]
    rules: Vec<RuleFile>,
}

#[derive(Debug)]
enum Matcher {
    Contains(String),
    Regex(Regex),
}

#[derive(Debug)]
struct Rule {
    matcher: Matcher,
    /// Steps cut into model responses (see module docs).
    pieces: Vec<Vec<Step>>,
}

/// The scripted provider.
#[derive(Debug)]
pub struct ScriptedModel {
    name: String,
    fallback: String,
    rules: Vec<Rule>,
    /// `resume_input_is_input = true`: a resumed `await_resumption` result
    /// counts as the latest input (see the module docs).
    resume_input_is_input: bool,
}

impl ScriptedModel {
    /// The built-in demo script ([`DEMO_SCRIPT`]).
    pub fn demo() -> Self {
        Self::parse(DEMO_SCRIPT, "toml", "scripted:demo")
            .expect("the built-in demo script parses (checked by a unit test)")
    }

    /// Loads a script file; `.json` files are JSON, anything else TOML.
    ///
    /// # Errors
    /// [`ModelError::Config`] naming the file and what is wrong with it.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ModelError::Config(format!("cannot read script {}: {e}", path.display()))
        })?;
        let format = match path.extension().and_then(|e| e.to_str()) {
            Some("json") => "json",
            _ => "toml",
        };
        Self::parse(&text, format, &format!("scripted:{}", path.display()))
            .map_err(|e| ModelError::Config(format!("script {}: {e}", path.display())))
    }

    /// Parses a script from text in `format` (`"toml"` or `"json"`).
    ///
    /// # Errors
    /// A message naming the bad rule or field.
    pub fn parse(text: &str, format: &str, name: &str) -> Result<Self, String> {
        let file: ScriptFile = match format {
            "json" => serde_json::from_str(text).map_err(|e| e.to_string())?,
            _ => toml::from_str(text).map_err(|e| e.to_string())?,
        };
        let mut rules = Vec::with_capacity(file.rules.len());
        for (i, rule) in file.rules.into_iter().enumerate() {
            let matcher = match (rule.contains, rule.regex) {
                (Some(s), None) => Matcher::Contains(s.to_lowercase()),
                (None, Some(r)) => Matcher::Regex(
                    Regex::new(&r).map_err(|e| format!("rule {}: bad regex: {e}", i + 1))?,
                ),
                _ => {
                    return Err(format!(
                        "rule {}: give exactly one of `match` or `regex`",
                        i + 1
                    ))
                }
            };
            rules.push(Rule {
                matcher,
                pieces: cut_into_responses(rule.steps),
            });
        }
        Ok(Self {
            name: name.to_owned(),
            fallback: file
                .fallback
                .unwrap_or_else(|| "(scripted model) no rule matches: {input}".to_owned()),
            rules,
            resume_input_is_input: file.resume_input_is_input,
        })
    }

    /// The input the script answers and how many model calls answered it so
    /// far: the latest user message — or, with `resume_input_is_input`, a
    /// later result of an `await_resumption` call (the resume input).
    fn latest_input<'a>(&self, request: &'a ModelRequest) -> (&'a str, u32) {
        if !self.resume_input_is_input {
            return (request.latest_user_text(), request.calls_since_user());
        }
        let parks: std::collections::HashSet<&ToolCallId> = request
            .messages()
            .filter_map(|m| match m {
                Message::Assistant { tool_calls, .. } => Some(tool_calls),
                _ => None,
            })
            .flatten()
            .filter(|c| c.name == crate::tools::await_resumption::NAME)
            .map(|c| &c.id)
            .collect();
        let mut answered = 0;
        for message in request.messages().rev() {
            match message {
                Message::User { text } => return (text, answered),
                Message::Tool {
                    tool_call_id,
                    content,
                    is_error: false,
                } if parks.contains(tool_call_id) => return (content, answered),
                Message::Assistant { .. } => answered += 1,
                _ => {}
            }
        }
        ("", answered)
    }

    fn piece_for(&self, input: &str, iteration: u32) -> Vec<Step> {
        let lowered = input.to_lowercase();
        let rule = self.rules.iter().find(|r| match &r.matcher {
            Matcher::Contains(s) => lowered.contains(s.as_str()),
            Matcher::Regex(re) => re.is_match(input),
        });
        match rule {
            Some(rule) => rule
                .pieces
                .get(iteration as usize)
                .cloned()
                .unwrap_or_default(),
            None if iteration == 0 => vec![Step::Text(self.fallback.clone())],
            None => Vec::new(),
        }
    }
}

/// Cuts a rule's steps after every tool call step.
fn cut_into_responses(steps: Vec<Step>) -> Vec<Vec<Step>> {
    let mut pieces: Vec<Vec<Step>> = vec![Vec::new()];
    for step in steps {
        let ends = matches!(step, Step::ToolCall(_) | Step::ToolCalls(_));
        // `usage`/`stop` right after a tool call still describe that response.
        let trailer = matches!(step, Step::Usage(_) | Step::Stop(_));
        let n = pieces.len();
        if trailer && n > 1 && pieces[n - 1].is_empty() {
            pieces[n - 2].push(step);
            continue;
        }
        pieces.last_mut().expect("never empty").push(step);
        if ends {
            pieces.push(Vec::new());
        }
    }
    if pieces.len() > 1 && pieces.last().is_some_and(Vec::is_empty) {
        pieces.pop();
    }
    pieces
}

fn expand(s: &str, request: &ModelRequest) -> String {
    let last_tool = request
        .messages()
        .rev()
        .find_map(|m| match m {
            crate::history::Message::Tool { content, .. } => Some(content.as_str()),
            _ => None,
        })
        .unwrap_or("");
    s.replace("{cwd}", &request.cwd.to_string_lossy())
        .replace("{input}", request.latest_user_text())
        .replace("{last_tool_result}", last_tool)
}

fn expand_value(v: &Value, request: &ModelRequest) -> Value {
    match v {
        Value::String(s) => Value::String(expand(s, request)),
        Value::Array(a) => Value::Array(a.iter().map(|x| expand_value(x, request)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| (k.clone(), expand_value(x, request)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn estimate_tokens(chars: usize) -> u64 {
    chars.div_ceil(4) as u64
}

#[async_trait]
impl ModelProvider for ScriptedModel {
    fn name(&self) -> &str {
        &self.name
    }

    async fn complete(
        &self,
        request: &ModelRequest,
        deltas: mpsc::UnboundedSender<ModelDelta>,
    ) -> Result<ModelResponse, ModelError> {
        let mut text = String::new();
        let mut tool_calls = Vec::new();
        let mut usage = None;
        let mut stop = ModelStop::EndTurn;
        let calls = |list: &[ScriptedCall], out: &mut Vec<ToolCallRequest>| {
            for call in list {
                let index = out.len();
                out.push(ToolCallRequest {
                    id: ToolCallId(format!("{}_{}_{index}", request.turn_id, request.iteration)),
                    name: call.name.clone(),
                    arguments: expand_value(&call.arguments, request),
                });
            }
        };
        let (input, answered) = self.latest_input(request);
        for step in self.piece_for(input, answered) {
            match step {
                Step::Text(t) => {
                    let t = expand(&t, request);
                    text.push_str(&t);
                    let _ = deltas.send(ModelDelta::Text(t));
                }
                Step::Thought(t) => {
                    let _ = deltas.send(ModelDelta::Thought(expand(&t, request)));
                }
                Step::DelayMs(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                Step::ToolCall(call) => {
                    calls(std::slice::from_ref(&call), &mut tool_calls);
                    stop = ModelStop::ToolUse;
                }
                Step::ToolCalls(list) => {
                    calls(&list, &mut tool_calls);
                    stop = ModelStop::ToolUse;
                }
                Step::Usage(u) => usage = Some(u),
                Step::Stop(s) => {
                    stop = match s {
                        ScriptedStop::EndTurn => ModelStop::EndTurn,
                        ScriptedStop::MaxTokens => ModelStop::MaxTokens,
                        ScriptedStop::Refusal => ModelStop::Refusal,
                    }
                }
            }
        }
        let usage = usage.unwrap_or_else(|| {
            let input_chars: usize = request
                .messages()
                .map(|m| match m {
                    Message::User { text } | Message::Assistant { text, .. } => text.len(),
                    Message::Tool { content, .. } => content.len(),
                    Message::Queued { .. } => 0,
                })
                .sum();
            Usage {
                input_tokens: estimate_tokens(input_chars),
                output_tokens: estimate_tokens(text.len()),
            }
        });
        Ok(ModelResponse {
            text,
            tool_calls,
            usage,
            stop,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{SessionId, TurnId};

    fn request(input: &str, iteration: u32) -> ModelRequest {
        ModelRequest {
            session_id: SessionId::from("sess_1"),
            turn_id: TurnId::from("turn_1"),
            iteration,
            cwd: "/tmp/work".into(),
            history: Default::default(),
            history_fingerprint: String::new(),
            // `iteration` earlier answers to the prompt select the piece.
            turn_messages: std::iter::once(Message::User { text: input.into() })
                .chain((0..iteration).map(|_| Message::Assistant {
                    text: String::new(),
                    tool_calls: vec![],
                }))
                .collect(),
            tools: Default::default(),
        }
    }

    const SCRIPT: &str = r#"
        [[rules]]
        match = "write"
        steps = [
          { text = "writing in {cwd}" },
          { tool_call = { name = "write_file", arguments = { path = "{cwd}/a.txt", content = "{input}" } } },
          { text = "done" },
          { usage = { input_tokens = 7, output_tokens = 3 } },
        ]
        [[rules]]
        regex = "^refuse"
        steps = [ { stop = "refusal" } ]
    "#;

    async fn play(model: &ScriptedModel, input: &str, it: u32) -> (ModelResponse, Vec<ModelDelta>) {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let resp = model.complete(&request(input, it), tx).await.unwrap();
        let mut deltas = Vec::new();
        while let Ok(d) = rx.try_recv() {
            deltas.push(d);
        }
        (resp, deltas)
    }

    #[tokio::test]
    async fn rule_plays_piece_per_model_call() {
        let model = ScriptedModel::parse(SCRIPT, "toml", "t").unwrap();
        let (first, deltas) = play(&model, "please WRITE it", 0).await;
        assert_eq!(first.stop, ModelStop::ToolUse);
        assert_eq!(
            deltas,
            vec![ModelDelta::Text("writing in /tmp/work".into())]
        );
        assert_eq!(first.tool_calls[0].id.as_str(), "turn_1_0_0");
        assert_eq!(first.tool_calls[0].arguments["path"], "/tmp/work/a.txt");
        assert_eq!(first.tool_calls[0].arguments["content"], "please WRITE it");
        let (second, _) = play(&model, "please WRITE it", 1).await;
        assert_eq!(second.stop, ModelStop::EndTurn);
        assert_eq!(second.text, "done");
        assert_eq!(
            second.usage,
            Usage {
                input_tokens: 7,
                output_tokens: 3
            }
        );
    }

    #[tokio::test]
    async fn regex_stop_and_fallback() {
        let model = ScriptedModel::parse(SCRIPT, "toml", "t").unwrap();
        assert_eq!(
            play(&model, "refuse this", 0).await.0.stop,
            ModelStop::Refusal
        );
        let (fb, _) = play(&model, "hello", 0).await;
        assert!(fb.text.contains("no rule matches: hello"));
        assert_eq!(fb.stop, ModelStop::EndTurn);
    }

    #[test]
    fn bad_scripts_name_the_problem() {
        let err = ScriptedModel::parse("[[rules]]\nsteps=[]", "toml", "t").unwrap_err();
        assert!(err.contains("rule 1"), "{err}");
        let err = ScriptedModel::parse(r#"{"rules":[{"regex":"("}]}"#, "json", "t").unwrap_err();
        assert!(err.contains("bad regex"), "{err}");
        let err = ScriptedModel::parse("[[rules]]\nmatch='x'\nsteps=[{jump=1}]", "toml", "t")
            .unwrap_err();
        assert!(err.contains("jump") || err.contains("variant"), "{err}");
    }

    #[tokio::test]
    async fn resume_input_is_input_matches_the_resumed_park_result() {
        let script = r#"
            resume_input_is_input = true
            [[rules]]
            match = "park"
            steps = [
              { tool_call = { name = "await_resumption", arguments = { reason = "r" } } },
              { text = "after the park" },
            ]
            [[rules]]
            match = "blue"
            steps = [{ text = "blue it is" }]
        "#;
        let park = ToolCallRequest {
            id: ToolCallId("c1".into()),
            name: crate::tools::await_resumption::NAME.into(),
            arguments: serde_json::json!({"reason": "r"}),
        };
        let resumed = |content: &str| {
            let mut r = request("park", 0);
            r.turn_messages.push(Message::Assistant {
                text: String::new(),
                tool_calls: vec![park.clone()],
            });
            r.turn_messages.push(Message::Tool {
                tool_call_id: park.id.clone(),
                content: content.into(),
                is_error: false,
            });
            r
        };
        let with = |flag: bool| {
            ScriptedModel::parse(&script.replace("= true", &format!("= {flag}")), "toml", "t")
                .unwrap()
        };
        let answer = |model: ScriptedModel, r: ModelRequest| async move {
            let (tx, _rx) = mpsc::unbounded_channel();
            model.complete(&r, tx).await.unwrap().text
        };
        // The resume input picks the rule and restarts its pieces…
        let text = answer(with(true), resumed("resumed (x) with input: blue")).await;
        assert_eq!(text, "blue it is");
        // …or, with no rule for it, the fallback answers it.
        let text = answer(with(true), resumed("resumed (x) with input: green")).await;
        assert!(text.contains("no rule matches"), "{text}");
        // Without the flag the park's rule plays on.
        let text = answer(with(false), resumed("resumed (x) with input: blue")).await;
        assert_eq!(text, "after the park");
    }

    #[test]
    fn demo_script_parses() {
        let demo = ScriptedModel::demo();
        assert!(!demo.rules.is_empty());
    }
}
