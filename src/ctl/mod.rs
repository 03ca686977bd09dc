//! `berth ctl …`: the operator CLI (issue 8, "Operator CLI").
//!
//! Every command is one or a few ACP requests to a running server, over its
//! WebSocket (`--server ws://HOST:PORT/acp` + `--token`, or `BERTH_SERVER` +
//! `BERTH_TOKEN`) or, when no server is given, over the local control socket
//! of a data dir (`--data-dir`, `--socket`; the trusted local host owner).
//! See [`client`] for the transport and its errors.
//!
//! | command | ACP |
//! |---|---|
//! | `ps [--state S] [--label L]` | `session/list`, every page |
//! | `show ID` | `_berth/session.get` + `_berth/session_view` |
//! | `tail ID [--since N \| --from-start]` | `session/load` with `_meta.berth.lastEventId`, then live; reconnects from the last event it printed |
//! | `prompt ID TEXT…` | `session/prompt` (streams the turn; Ctrl-C sends `session/cancel`) |
//! | `steer ID TEXT… [--wait]` | `session/inject` mode `steer` |
//! | `suspend ID [--mode] [--reason] [--timeout MIN [--on-timeout A] [--timeout-input JSON]] [--on-event NAME]` | `session/suspend` |
//! | `suspend --all \| --label L \| ID ID… [--mode] [--reason]` | `_berth/suspend_many` (host owner) |
//! | `resume ID [--input JSON] [--fresh] [--wait]` | `session/resume` with `continueTranscript` (and `input`) |
//! | `cancel ID` | `session/cancel` (as a request, to read its status) |
//! | `close ID` | `session/close` |
//! | `event emit NAME [--data JSON]` | `_berth/event.emit` |
//!
//! Output is for humans by default; `--json` prints the server's answer (or
//! a documented projection of it) as JSON on stdout, and on failure
//! `{"error": {method?, code?, message, data?}}`. Operations that wait
//! show a spinner on stderr when stderr is a terminal. The exit status is
//! 0 on success, 1 on any failure (the server refused, or could not be
//! reached) and 2 on a usage error (clap's, and [`UsageError`]: checked
//! before connecting).

pub mod client;
mod progress;
mod render;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Subcommand;
use serde_json::{json, Value};

pub use client::Endpoint;
use client::{Client, Incoming, RpcFailure};
use progress::Spinner;

/// The notification method of berth facts ACP has no update for.
pub(crate) const AGENT_EVENT: &str = "_berth/agentEvent";
/// The notification announcing attaches and detaches.
pub(crate) const PRESENCE: &str = "_berth/presence";

/// `berth ctl [--server URL --token T | --data-dir D] [--json] COMMAND`.
#[derive(clap::Args, Debug)]
pub struct CtlArgs {
    #[command(flatten)]
    endpoint: Endpoint,
    /// Print JSON on stdout instead of text (errors too: `{"error": …}`).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: CtlCommand,
}

/// The operator commands.
#[derive(Subcommand, Debug)]
pub enum CtlCommand {
    /// Lists sessions: id, state, whether a prompt runs, suspended since,
    /// resume conditions, tokens and cost.
    Ps {
        /// Only sessions in this state (idle, running, requested,
        /// quiescing, suspended, closed).
        #[arg(long, value_parser = ["idle", "running", "requested", "quiescing", "suspended", "closed"])]
        state: Option<String>,
        /// Only sessions with this label.
        #[arg(long)]
        label: Option<String>,
    },
    /// One session in detail: state, spend, suspension, pending approvals
    /// and injections, transcript hash.
    Show {
        /// The session id.
        id: String,
    },
    /// Follows a session's events live until Ctrl-C or the session closes.
    Tail {
        /// The session id.
        id: String,
        /// Start after this event id (replays what came after it).
        #[arg(long, conflicts_with = "from_start")]
        since: Option<u64>,
        /// Replay the whole history first.
        #[arg(long)]
        from_start: bool,
    },
    /// Runs a prompt turn and streams it (Ctrl-C cancels the turn).
    Prompt {
        /// The session id.
        id: String,
        /// The prompt text (words are joined with spaces).
        #[arg(required = true, num_args = 1..)]
        text: Vec<String>,
    },
    /// Steers the running turn: the message lands at its next seam after the
    /// current tool batch (remote-session-control.md, "Steer").
    Steer {
        /// The session id.
        id: String,
        /// The instruction (words are joined with spaces).
        #[arg(required = true, num_args = 1..)]
        text: Vec<String>,
        /// Wait until the turn takes the message in (or drops it).
        #[arg(long)]
        wait: bool,
    },
    /// Suspends one session (answered once the suspension is durable), or —
    /// with --all, --label or several ids — every selected running session
    /// (the host owner's interrupt-and-suspend broadcast).
    Suspend {
        /// Every running session (broadcast).
        #[arg(long, conflicts_with_all = ["label", "ids"])]
        all: bool,
        /// Running sessions with this label (broadcast).
        #[arg(long, conflicts_with = "ids")]
        label: Option<String>,
        /// The session(s); more than one is a broadcast.
        ids: Vec<String>,
        /// finish_step | interrupt_immediate | wait_for_completion [default:
        /// finish_step for one session, interrupt_immediate for a broadcast].
        #[arg(long)]
        mode: Option<String>,
        /// Why (recorded with the suspension).
        #[arg(long)]
        reason: Option<String>,
        /// Resume by itself after this many minutes (fractions allowed).
        #[arg(long, value_name = "MINUTES")]
        timeout: Option<f64>,
        /// What the timeout does: resume_with_summary (default), fail,
        /// resume_with_input.
        #[arg(long, requires = "timeout", value_name = "ACTION")]
        on_timeout: Option<String>,
        /// The input a resume_with_input timeout resumes with (JSON).
        #[arg(long, requires = "timeout", value_name = "JSON")]
        timeout_input: Option<String>,
        /// Resume when this event is emitted (`ci.passed`; a trailing `*`
        /// matches any suffix).
        #[arg(long, value_name = "NAME")]
        on_event: Option<String>,
    },
    /// Resumes a suspended session (a one-time claim of its suspension).
    Resume {
        /// The session id.
        id: String,
        /// The value fed back to the parked turn (JSON; quote text:
        /// '"go on"').
        #[arg(long, value_name = "JSON")]
        input: Option<String>,
        /// Start a fresh context (a digest of what came before, then the
        /// input) instead of continuing the transcript.
        #[arg(long)]
        fresh: bool,
        /// Follow the resumed turn until it ends.
        #[arg(long)]
        wait: bool,
    },
    /// Cancels the running turn (idempotent).
    Cancel {
        /// The session id.
        id: String,
    },
    /// Closes a session (host owner or its creator only).
    Close {
        /// The session id.
        id: String,
    },
    /// External events.
    Event {
        #[command(subcommand)]
        command: EventCommand,
    },
}

/// `berth ctl event …`.
#[derive(Subcommand, Debug)]
pub enum EventCommand {
    /// Emits an event: every parked session waiting for it wakes with the
    /// data as input.
    Emit {
        /// The event name (`ci.passed`).
        name: String,
        /// The payload (JSON).
        #[arg(long, value_name = "JSON")]
        data: Option<String>,
    },
}

/// Runs one `berth ctl` command; prints its output and, on failure, the
/// error (stderr; and `{"error": …}` on stdout with `--json`).
pub async fn run(args: CtlArgs) -> ExitCode {
    let json = args.json;
    match execute(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if json {
                let error = match e.downcast_ref::<RpcFailure>() {
                    Some(failure) => failure.to_json(),
                    None => json!({"message": format!("{e:#}")}),
                };
                println!("{}", json!({ "error": error }));
            }
            eprintln!("berth: {e:#}");
            if e.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

async fn execute(args: CtlArgs) -> anyhow::Result<()> {
    let out = Output { json: args.json };
    let command = args.command;
    check_usage(&command, &args.endpoint)?;
    let client = Client::connect(&args.endpoint).await?;
    match command {
        CtlCommand::Ps { state, label } => ps(&client, out, state, label).await,
        CtlCommand::Show { id } => show(&client, out, &id).await,
        CtlCommand::Tail {
            id,
            since,
            from_start,
        } => {
            let start = if from_start { Some(0) } else { since };
            tail(client, &args.endpoint, out, &id, start).await
        }
        CtlCommand::Prompt { id, text } => prompt(&client, out, &id, &text.join(" ")).await,
        CtlCommand::Steer { id, text, wait } => {
            steer(&client, out, &id, &text.join(" "), wait).await
        }
        CtlCommand::Suspend {
            all,
            label,
            ids,
            mode,
            reason,
            timeout,
            on_timeout,
            timeout_input,
            on_event,
        } => {
            let broadcast = all || label.is_some() || ids.len() > 1;
            if broadcast {
                let mut params = json!({"mode": mode, "reason": reason});
                if all {
                    params["all"] = json!(true);
                } else if let Some(label) = label {
                    params["label"] = json!(label);
                } else {
                    params["sessionIds"] = json!(ids);
                }
                suspend_many(&client, out, params).await
            } else {
                let mut when = serde_json::Map::new();
                if let Some(name) = on_event {
                    when.insert("onEvent".into(), json!(name));
                }
                if let Some(minutes) = timeout {
                    let mut t = json!({"durationMinutes": minutes});
                    if let Some(action) = on_timeout {
                        t["onTimeout"] = json!(action);
                    }
                    if let Some(input) = timeout_input {
                        t["input"] = parse_json("--timeout-input", &input)?;
                    }
                    when.insert("timeout".into(), t);
                }
                let mut params = json!({"sessionId": ids[0]});
                if let Some(mode) = mode {
                    params["mode"] = json!(mode);
                }
                if let Some(reason) = reason {
                    params["reason"] = json!(reason);
                }
                if !when.is_empty() {
                    params["resumeWhen"] = Value::Object(when);
                }
                suspend(&client, out, &ids[0], params).await
            }
        }
        CtlCommand::Resume {
            id,
            input,
            fresh,
            wait,
        } => {
            let input = input.map(|text| parse_json("--input", &text)).transpose()?;
            resume(&client, out, &id, input, fresh, wait).await
        }
        CtlCommand::Cancel { id } => cancel(&client, out, &id).await,
        CtlCommand::Close { id } => close(&client, out, &id).await,
        CtlCommand::Event {
            command: EventCommand::Emit { name, data },
        } => {
            let data = data
                .map(|text| parse_json("--data", &text))
                .transpose()?
                .unwrap_or(Value::Null);
            emit(&client, out, &name, data).await
        }
    }
}

/// Human or JSON output.
#[derive(Clone, Copy)]
struct Output {
    json: bool,
}

impl Output {
    /// Prints `value` as JSON (with `--json`) or `text()` otherwise.
    fn print(self, value: &Value, text: impl FnOnce() -> String) {
        if self.json {
            println!("{value}");
        } else {
            println!("{}", text());
        }
    }
}

/// A command line that cannot be sent: exit status 2, like clap's own
/// usage errors, and reported before connecting.
#[derive(Debug)]
pub struct UsageError(String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Checks the endpoint flags of any command that talks to a running
/// `berth serve` (`ctl`, `event emit`, `schedule`): a `--server` URL must be
/// a WebSocket URL; `--token` / `--ca-cert` without `--server` are only
/// warned about (not an error: `BERTH_TOKEN` may be set for the times a
/// server is).
///
/// # Errors
/// [`UsageError`] for a bad `--server` URL.
pub(crate) fn check_endpoint(endpoint: &Endpoint) -> anyhow::Result<()> {
    if let Some(server) = &endpoint.server {
        client::ws_url(server).map_err(|e| anyhow::Error::new(UsageError(e.to_string())))?;
    } else if endpoint.token.as_deref().is_some_and(|t| !t.is_empty())
        || endpoint
            .ca_cert
            .as_ref()
            .is_some_and(|p| !p.as_os_str().is_empty())
    {
        eprintln!(
            "berth: warning: --token / --ca-cert (or BERTH_TOKEN / BERTH_CA_CERT) apply to \
             --server; the local control socket {} needs neither, so they are ignored",
            endpoint.socket_path().display()
        );
    }
    Ok(())
}

/// Usage problems clap cannot see (which sessions, flags that exclude each
/// other, JSON flag values, the `--server` URL), checked before anything is
/// sent.
///
/// # Errors
/// [`UsageError`] naming the problem.
fn check_usage(command: &CtlCommand, endpoint: &Endpoint) -> anyhow::Result<()> {
    let usage = |message: String| anyhow::Error::new(UsageError(message));
    check_endpoint(endpoint)?;
    match command {
        CtlCommand::Suspend {
            all,
            label,
            ids,
            timeout,
            on_event,
            timeout_input,
            ..
        } => {
            if !all && label.is_none() && ids.is_empty() {
                return Err(usage(
                    "say which sessions: a session id, several ids, --label L or --all".into(),
                ));
            }
            let broadcast = *all || label.is_some() || ids.len() > 1;
            if broadcast && (timeout.is_some() || on_event.is_some()) {
                return Err(usage(
                    "--timeout and --on-event apply to one session; a broadcast (--all, --label, \
                     several ids) parks until each is resumed"
                        .into(),
                ));
            }
            if let Some(minutes) = timeout {
                if !minutes.is_finite() {
                    return Err(usage(format!(
                        "--timeout {minutes}: give a number of minutes (fractions allowed)"
                    )));
                }
            }
            if let Some(text) = timeout_input {
                parse_json("--timeout-input", text)?;
            }
        }
        CtlCommand::Resume {
            input: Some(text), ..
        } => {
            parse_json("--input", text)?;
        }
        CtlCommand::Event {
            command: EventCommand::Emit {
                data: Some(text), ..
            },
        } => {
            parse_json("--data", text)?;
        }
        _ => {}
    }
    Ok(())
}

/// Parses a flag's JSON value, with a hint for plain text.
///
/// # Errors
/// [`UsageError`] when `text` is not JSON.
fn parse_json(flag: &str, text: &str) -> anyhow::Result<Value> {
    serde_json::from_str(text).map_err(|e| {
        anyhow::Error::new(UsageError(format!(
            "{flag} is not JSON ({e}; to pass text, quote it: {flag} '\"{text}\"')"
        )))
    })
}

fn text_prompt(text: &str) -> Value {
    json!([{"type": "text", "text": text}])
}

async fn ps(
    client: &Client,
    out: Output,
    state: Option<String>,
    label: Option<String>,
) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = client
            .request("session/list", json!({ "cursor": cursor }))
            .await?;
        for entry in page["sessions"].as_array().into_iter().flatten() {
            let row = render::ps_row(entry);
            if state.as_deref().is_some_and(|s| row["state"] != json!(s)) {
                continue;
            }
            if label.as_deref().is_some_and(|l| {
                !row["labels"]
                    .as_array()
                    .is_some_and(|ls| ls.iter().any(|x| x == l))
            }) {
                continue;
            }
            rows.push(row);
        }
        match page.get("nextCursor").and_then(Value::as_str) {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    let now = chrono::Utc::now();
    out.print(&json!({ "sessions": rows }), || {
        if rows.is_empty() {
            return "no sessions".into();
        }
        let cells: Vec<Vec<String>> = rows.iter().map(|r| render::ps_cells(r, now)).collect();
        render::table(&render::PS_HEADER, &cells)
    });
    Ok(())
}

async fn show(client: &Client, out: Output, id: &str) -> anyhow::Result<()> {
    let got = client
        .request("_berth/session.get", json!({"sessionId": id}))
        .await?;
    let entry = got["session"].clone();
    let closed = entry.pointer("/_meta/berth/state") == Some(&json!("closed"));
    // The live projection (pending approvals and injections, transcript
    // hash); a closed session has only its record.
    let view = if closed {
        Value::Null
    } else {
        client
            .request("_berth/session_view", json!({"sessionId": id}))
            .await
            .unwrap_or(Value::Null)
    };
    out.print(&json!({"session": entry, "view": view}), || {
        render::show(&entry, &view, chrono::Utc::now())
    });
    Ok(())
}

/// How a streaming command answers the server's `session/request_permission`:
/// on a terminal (and without `--json`) it asks the operator; otherwise it
/// rejects, saying so on stderr.
async fn answer_request(client: &Client, out: Output, id: Value, method: &str, params: Value) {
    if method != "session/request_permission" {
        client.answer_error(&id, -32601, &format!("berth ctl does not serve {method}"));
        return;
    }
    let title = params
        .pointer("/toolCall/title")
        .and_then(Value::as_str)
        .unwrap_or("a tool call")
        .to_owned();
    let interactive =
        !out.json && std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
    let allow = if interactive {
        let question = format!("berth: allow {title}? [y/N] ");
        tokio::task::spawn_blocking(move || {
            eprint!("{question}");
            let _ = std::io::stderr().flush();
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).is_ok()
                && matches!(line.trim(), "y" | "Y" | "yes")
        })
        .await
        .unwrap_or(false)
    } else {
        eprintln!(
            "berth: rejected approval of {title}: berth ctl approves tool calls only when asked on a terminal"
        );
        false
    };
    let option = if allow { "allow" } else { "reject" };
    client.answer(
        &id,
        json!({"outcome": {"outcome": "selected", "optionId": option}}),
    );
}

/// Whether a notification is about `session` (presence and agent events
/// name it in `sessionId`).
fn about(params: &Value, session: &str) -> bool {
    params.get("sessionId").and_then(Value::as_str) == Some(session)
}

async fn tail(
    client: Client,
    endpoint: &Endpoint,
    out: Output,
    id: &str,
    start: Option<u64>,
) -> anyhow::Result<()> {
    let got = client
        .request("_berth/session.get", json!({"sessionId": id}))
        .await?;
    let berth = &got["session"]["_meta"]["berth"];
    let mut last = start.unwrap_or_else(|| berth["lastEventId"].as_u64().unwrap_or(0));
    if start.is_none() && berth["state"] == json!("closed") {
        if out.json {
            println!("{}", json!({"sessionId": id, "closed": true}));
        } else {
            println!("session {id} is closed; `berth ctl tail {id} --from-start` replays it");
        }
        return Ok(());
    }
    if !out.json {
        eprintln!("berth: following {id} from event {last} (Ctrl-C to stop)");
    }
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let mut conn = client;
    let mut retries = 0u32;
    loop {
        let load = conn.request(
            "session/load",
            json!({"sessionId": id, "_meta": {"berth": {"lastEventId": last}}}),
        );
        let loaded = tokio::select! {
            loaded = load => loaded,
            _ = &mut interrupted => return Ok(()),
        };
        let lost: anyhow::Error = match loaded {
            // A refusal (unknown session, bad cursor) will not get better.
            Err(e) if e.downcast_ref::<RpcFailure>().is_some() => return Err(e),
            Err(e) => e,
            Ok(_) => {
                retries = 0;
                // Replayed events arrived before the answer; then live ones.
                loop {
                    let message = tokio::select! {
                        m = conn.next_message() => m,
                        _ = &mut interrupted => return Ok(()),
                    };
                    let Some(message) = message else {
                        break anyhow::anyhow!(
                            "{}",
                            conn.close_reason()
                                .unwrap_or_else(|| "connection ended".into())
                        );
                    };
                    match message {
                        Incoming::Request {
                            id: rid,
                            method,
                            params,
                        } => answer_request(&conn, out, rid, &method, params).await,
                        Incoming::Notification { method, params } => {
                            if !about(&params, id) {
                                continue;
                            }
                            if method != PRESENCE {
                                // The cursor counts journaled events only
                                // (presence carries the cursor it sat at).
                                if let Some(event) = render::event_id(&params) {
                                    if event <= last {
                                        continue;
                                    }
                                    last = event;
                                }
                            }
                            print_event(out, &method, &params);
                            if method == AGENT_EVENT && params["type"] == "session_closed" {
                                return Ok(());
                            }
                        }
                    }
                }
            }
        };
        // The connection dropped: reconnect and load from the last event
        // printed, so nothing is missed or printed twice.
        let mut why = format!("{lost:#}");
        loop {
            retries += 1;
            if retries > 5 {
                anyhow::bail!(
                    "lost the connection to {} and could not get it back: {why}",
                    endpoint.describe()
                );
            }
            let wait = std::time::Duration::from_millis(250 << retries);
            eprintln!(
                "berth: connection lost ({why}); reconnecting from event {last} in {} ms",
                wait.as_millis()
            );
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = &mut interrupted => return Ok(()),
            }
            match Client::connect(endpoint).await {
                Ok(c) => {
                    conn = c;
                    break;
                }
                Err(e) => why = format!("{e:#}"),
            }
        }
    }
}

/// Prints one session notification: its JSON (one line) with `--json`, a
/// human line otherwise.
fn print_event(out: Output, method: &str, params: &Value) {
    if out.json {
        println!("{}", json!({"method": method, "params": params}));
    } else if let Some(line) = render::event_line(method, params) {
        println!("{line}");
    }
}

/// Streams the notifications of `id` while `request` runs; answers
/// permission requests; returns the request's result.
async fn stream_while<F>(
    client: &Client,
    out: Output,
    id: &str,
    spinner: &mut Spinner,
    request: F,
    mut on_event: impl FnMut(&str, &Value, &mut Spinner),
    cancel_on_interrupt: bool,
) -> anyhow::Result<Value>
where
    F: std::future::Future<Output = anyhow::Result<Value>>,
{
    tokio::pin!(request);
    let mut interrupted = Box::pin(tokio::signal::ctrl_c());
    let mut interrupt_sent = false;
    let mut ended = false;
    let result = loop {
        tokio::select! {
            result = &mut request => break result,
            message = client.next_message(), if !ended => match message {
                Some(Incoming::Request { id: rid, method, params }) => {
                    spinner.clear();
                    answer_request(client, out, rid, &method, params).await;
                }
                Some(Incoming::Notification { method, params }) => {
                    if about(&params, id) {
                        on_event(&method, &params, spinner);
                    }
                }
                // The request fails with the close reason next.
                None => ended = true,
            },
            // The first Ctrl-C of a prompt cancels its turn (and waits for
            // the cancelled answer); any other stops waiting. A request
            // already sent stands either way.
            _ = &mut interrupted => {
                if !cancel_on_interrupt || interrupt_sent {
                    spinner.clear();
                    anyhow::bail!("interrupted; the request was sent and stands (`berth ctl show {id}`)");
                }
                interrupt_sent = true;
                interrupted = Box::pin(tokio::signal::ctrl_c());
                spinner.set("cancelling the turn (Ctrl-C again to stop waiting)");
                eprintln!("berth: cancelling the turn of {id}");
                client.notify("session/cancel", json!({"sessionId": id}))?;
            }
        }
    };
    // Updates precede their answer on the wire: print what already arrived.
    while let Some(message) = client.try_next_message() {
        if let Incoming::Notification { method, params } = message {
            if about(&params, id) {
                on_event(&method, &params, spinner);
            }
        }
    }
    result
}

async fn prompt(client: &Client, out: Output, id: &str, text: &str) -> anyhow::Result<()> {
    let mut spinner = Spinner::start(format!("{id}: waiting for the model"));
    let mut agent_text = String::new();
    let mut printed = false;
    let request = client.request(
        "session/prompt",
        json!({"sessionId": id, "prompt": text_prompt(text)}),
    );
    let result = stream_while(
        client,
        out,
        id,
        &mut spinner,
        request,
        |method, params, spinner| {
            let update = &params["update"];
            if method == "session/update" && update["sessionUpdate"] == "agent_message_chunk" {
                if let Some(chunk) = update.pointer("/content/text").and_then(Value::as_str) {
                    agent_text.push_str(chunk);
                    if !out.json {
                        spinner.clear();
                        print!("{chunk}");
                        let _ = std::io::stdout().flush();
                        printed = true;
                    }
                }
                return;
            }
            // The prompt's own echo and the turn's end (printed below as the
            // answer) are not repeated.
            if out.json
                || update["sessionUpdate"] == "user_message_chunk"
                    && update.get("messageId").is_none()
                || method == AGENT_EVENT && params["type"] == "turn_ended"
            {
                return;
            }
            if let Some(line) = render::event_line(method, params) {
                // Side facts (tool calls, steers, receipts) go to stderr so
                // stdout carries the answer.
                spinner.suspend(|| {
                    if printed {
                        println!();
                        printed = false;
                    }
                    eprintln!("  {line}");
                });
            }
        },
        true,
    )
    .await;
    spinner.clear();
    if printed {
        println!();
    }
    let result = result?;
    let berth = &result["_meta"]["berth"];
    out.print(&json!({"result": result, "agentText": agent_text}), || {
        let mut line = format!(
            "{} (turn {}, {} in / {} out tokens)",
            result["stopReason"].as_str().unwrap_or("?"),
            berth["turnId"].as_str().unwrap_or("?"),
            berth["usage"]["input_tokens"],
            berth["usage"]["output_tokens"],
        );
        if let Some(handle) = berth["handle"].as_str() {
            line.push_str(&format!(
                "; the session is suspended ({handle}): `berth ctl resume {id}` wakes it"
            ));
        }
        line
    });
    Ok(())
}

async fn steer(
    client: &Client,
    out: Output,
    id: &str,
    text: &str,
    wait: bool,
) -> anyhow::Result<()> {
    let answer = client
        .request(
            "session/inject",
            json!({"sessionId": id, "mode": "steer", "content": text_prompt(text)}),
        )
        .await?;
    let message_id = answer["messageId"].as_str().unwrap_or("").to_owned();
    if !wait {
        out.print(&answer, || {
            format!(
                "steer {message_id} accepted for {id}: the running turn takes it in at its next seam \
                 (after the current tool batch)"
            )
        });
        return Ok(());
    }
    let mut spinner = Spinner::start(format!(
        "{id}: waiting for the turn to take in {message_id}"
    ));
    let outcome = loop {
        let Some(message) = client.next_message().await else {
            anyhow::bail!(
                "the connection ended before steer {message_id} was delivered: {}",
                client.close_reason().unwrap_or_default()
            );
        };
        let Incoming::Notification { method, params } = message else {
            if let Incoming::Request {
                id: rid,
                method,
                params,
            } = message
            {
                spinner.clear();
                answer_request(client, out, rid, &method, params).await;
            }
            continue;
        };
        if !about(&params, id) {
            continue;
        }
        if method == "session/update"
            && params.pointer("/update/messageId").and_then(Value::as_str) == Some(&message_id)
        {
            break json!({"messageId": message_id, "status": "delivered", "eventId": render::event_id(&params)});
        }
        if method == AGENT_EVENT
            && params["type"] == "injection_dropped"
            && params.pointer("/event/message_id").and_then(Value::as_str) == Some(&message_id)
        {
            break json!({"messageId": message_id, "status": "dropped",
                         "reason": params["event"]["reason"], "eventId": render::event_id(&params)});
        }
    };
    spinner.clear();
    out.print(&outcome, || match outcome["status"].as_str() {
        Some("delivered") => format!("steer {message_id} delivered to {id}"),
        _ => format!(
            "steer {message_id} was dropped: {}",
            outcome["reason"].as_str().unwrap_or("?")
        ),
    });
    Ok(())
}

async fn suspend(client: &Client, out: Output, id: &str, params: Value) -> anyhow::Result<()> {
    let mode = params["mode"].as_str().unwrap_or("finish_step").to_owned();
    let mut spinner = Spinner::start(format!(
        "{id}: waiting for the suspension to commit (mode {mode})"
    ));
    let request = client.request("session/suspend", params);
    let answer = stream_while(
        client,
        out,
        id,
        &mut spinner,
        request,
        |method, params, spinner| {
            if method == AGENT_EVENT && params["type"] == "suspend_requested" {
                spinner.set(format!(
                    "{id}: suspend requested, waiting for the turn's seam (mode {mode})"
                ));
            }
        },
        false,
    )
    .await?;
    spinner.clear();
    out.print(&answer, || {
        let already = answer.pointer("/_meta/berth/alreadySuspended") == Some(&json!(true));
        format!(
            "{} {id}: handle {}, since {}; resume when: {}",
            if already {
                "already suspended"
            } else {
                "suspended"
            },
            answer["handle"].as_str().unwrap_or("?"),
            answer["suspendedAt"].as_str().unwrap_or("?"),
            render::conditions(answer.get("resumeWhen")),
        )
    });
    Ok(())
}

async fn suspend_many(client: &Client, out: Output, params: Value) -> anyhow::Result<()> {
    let spinner = Spinner::start("suspending the selected sessions");
    let answer = client.request("_berth/suspend_many", params).await?;
    drop(spinner);
    out.print(&answer, || {
        let rows: Vec<Vec<String>> = answer["results"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                vec![
                    r["sessionId"].as_str().unwrap_or("?").to_owned(),
                    r["outcome"].as_str().unwrap_or("?").to_owned(),
                    r["handle"].as_str().unwrap_or("-").to_owned(),
                ]
            })
            .collect();
        if rows.is_empty() {
            "no session selected".into()
        } else {
            render::table(&["ID", "OUTCOME", "HANDLE"], &rows)
        }
    });
    Ok(())
}

async fn resume(
    client: &Client,
    out: Output,
    id: &str,
    input: Option<Value>,
    fresh: bool,
    wait: bool,
) -> anyhow::Result<()> {
    // `continueTranscript` makes the request an explicit resume: a session
    // with nothing to claim answers -32009 not_suspended instead of a plain
    // reattach.
    let mut params = json!({"sessionId": id, "continueTranscript": !fresh});
    if let Some(input) = input {
        params["input"] = input;
    }
    let mut spinner = Spinner::start(format!("{id}: claiming the suspension"));
    let answer = client.request("session/resume", params).await?;
    let Some(resumed) = answer.pointer("/_meta/berth/resumed").cloned() else {
        anyhow::bail!("the server reattached {id} without resuming it (an older berth?)");
    };
    let turn = resumed["turnId"].as_str().map(str::to_owned);
    if !wait {
        spinner.clear();
        out.print(&resumed, || {
            format!(
                "resumed {id}: handle {} claimed at {}{}",
                resumed["handle"].as_str().unwrap_or("?"),
                resumed["resumedAt"].as_str().unwrap_or("?"),
                turn.as_deref()
                    .map(|t| format!("; turn {t} runs (`berth ctl tail {id}` follows it)"))
                    .unwrap_or_default()
            )
        });
        return Ok(());
    }
    spinner.set(format!("{id}: following the resumed turn"));
    let ended = loop {
        let Some(message) = client.next_message().await else {
            anyhow::bail!(
                "the connection ended before the resumed turn did: {}",
                client.close_reason().unwrap_or_default()
            );
        };
        match message {
            Incoming::Request {
                id: rid,
                method,
                params,
            } => {
                spinner.clear();
                answer_request(client, out, rid, &method, params).await;
            }
            Incoming::Notification { method, params } => {
                if !about(&params, id) {
                    continue;
                }
                spinner.suspend(|| print_event(out, &method, &params));
                if method == AGENT_EVENT
                    && (params["type"] == "turn_ended" || params["type"] == "suspended")
                    && (turn.is_none()
                        || params.pointer("/event/turn_id").and_then(Value::as_str)
                            == turn.as_deref())
                {
                    break params["event"].clone();
                }
            }
        }
    };
    spinner.clear();
    if out.json {
        println!("{}", json!({"resumed": resumed, "ended": ended}));
    }
    Ok(())
}

async fn cancel(client: &Client, out: Output, id: &str) -> anyhow::Result<()> {
    let answer = client
        .request("session/cancel", json!({"sessionId": id}))
        .await?;
    out.print(&answer, || match answer["status"].as_str() {
        Some("cancelled") => format!("cancelled the running turn of {id}"),
        Some("already_cancelled") => {
            format!("nothing to cancel: {id} has no running turn (already_cancelled)")
        }
        other => format!("{id}: {}", other.unwrap_or("?")),
    });
    Ok(())
}

async fn close(client: &Client, out: Output, id: &str) -> anyhow::Result<()> {
    let answer = client
        .request("session/close", json!({"sessionId": id}))
        .await?;
    out.print(
        &json!({"sessionId": id, "closed": true, "result": answer}),
        || format!("closed {id}"),
    );
    Ok(())
}

async fn emit(client: &Client, out: Output, name: &str, data: Value) -> anyhow::Result<()> {
    let answer = client
        .request("_berth/event.emit", json!({"name": name, "data": data}))
        .await?;
    out.print(&answer, || {
        let woke: Vec<String> = answer["woke"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|w| {
                format!(
                    "{} ({}{})",
                    w["sessionId"].as_str().unwrap_or("?"),
                    w["handle"].as_str().unwrap_or("?"),
                    if w["resumed"] == json!(true) {
                        ""
                    } else {
                        ", not resumed"
                    }
                )
            })
            .collect();
        format!(
            "event {name} #{} received at {}; woke {}{}",
            answer["seq"],
            answer["receivedAt"].as_str().unwrap_or("?"),
            woke.len(),
            if woke.is_empty() {
                String::new()
            } else {
                format!(": {}", woke.join(", "))
            }
        )
    });
    Ok(())
}

/// One request over `endpoint`, answered as JSON: what `berth event emit`
/// and `berth schedule …` print.
///
/// # Errors
/// As [`Client::connect`] and [`Client::request`].
pub async fn call(endpoint: &Endpoint, method: &str, params: Value) -> anyhow::Result<Value> {
    let client = Client::connect(endpoint).await?;
    client.request(method, params).await
}
