//! # berth-conformance
//!
//! Black-box checks and measurements of a live `berth`: ACP scenarios driven
//! over the wire, end-to-end tests with third-party clients (`e2e/`), and the
//! benchmark binaries `bench-core` (`src/bin/bench-core.rs`: turn, journal,
//! inject and suspend/resume costs), `bench-sched` (`src/bin/bench-sched.rs`:
//! wake-up lateness, timer arming, a million pending timers) and `bench-ws`
//! (`src/bin/bench-ws.rs`: 1,000 WebSocket clients under a steer/cancel
//! storm, no acknowledged control lost, RSS over time).
//!
//! The library part holds helpers those binaries share: [`stats`] (the
//! latency summary the benchmarks print), [`host`] (finding the binary,
//! CPU and load readings), [`wire`] (classifying ACP frames) and
//! [`counting`] (a global allocator counting live heap bytes, also used by
//! footprint tests).

pub mod counting;

pub mod stats {
    //! Latency summaries: percentiles over a set of timed samples.
    //!
    //! Percentiles use the nearest-rank method (the smallest sample such that
    //! at least p% of all samples are ≤ it), so every figure reported is a
    //! latency that was actually observed, never an interpolation.

    use std::time::Duration;

    /// Percentiles, mean and maximum of a set of latency samples, in microseconds.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub struct LatencySummary {
        /// Number of samples.
        pub count: usize,
        /// Arithmetic mean (µs).
        pub mean_us: f64,
        /// Median (µs).
        pub p50_us: u64,
        /// 90th percentile (µs).
        pub p90_us: u64,
        /// 99th percentile (µs).
        pub p99_us: u64,
        /// Largest sample (µs).
        pub max_us: u64,
    }

    impl LatencySummary {
        /// Summarizes `samples` (sorted in place). `None` when there are none.
        pub fn from_samples(samples: &mut [Duration]) -> Option<Self> {
            if samples.is_empty() {
                return None;
            }
            samples.sort_unstable();
            let total: Duration = samples.iter().sum();
            Some(Self {
                count: samples.len(),
                mean_us: total.as_secs_f64() * 1e6 / samples.len() as f64,
                p50_us: micros(percentile(samples, 50)),
                p90_us: micros(percentile(samples, 90)),
                p99_us: micros(percentile(samples, 99)),
                max_us: micros(samples[samples.len() - 1]),
            })
        }
    }

    /// Nearest-rank percentile `p` (0..=100) of `sorted`, which must be
    /// non-empty and sorted ascending.
    pub fn percentile(sorted: &[Duration], p: u32) -> Duration {
        let n = sorted.len();
        // rank = ceil(p/100 · n), at least 1.
        let rank = (p as usize * n).div_ceil(100).max(1);
        sorted[rank.min(n) - 1]
    }

    fn micros(d: Duration) -> u64 {
        u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn us(v: &[u64]) -> Vec<Duration> {
            v.iter().map(|&u| Duration::from_micros(u)).collect()
        }

        #[test]
        fn nearest_rank_percentiles_of_one_to_a_hundred() {
            let mut samples = us(&(1..=100).rev().collect::<Vec<_>>());
            let s = LatencySummary::from_samples(&mut samples).unwrap();
            assert_eq!((s.p50_us, s.p90_us, s.p99_us, s.max_us), (50, 90, 99, 100));
            assert_eq!(s.count, 100);
            assert!((s.mean_us - 50.5).abs() < 1e-9);
        }

        #[test]
        fn a_single_sample_is_every_percentile() {
            let mut samples = us(&[7]);
            let s = LatencySummary::from_samples(&mut samples).unwrap();
            assert_eq!((s.p50_us, s.p90_us, s.p99_us, s.max_us), (7, 7, 7, 7));
        }

        #[test]
        fn no_samples_no_summary() {
            assert!(LatencySummary::from_samples(&mut []).is_none());
        }
    }
}

pub mod host {
    //! The machine and the berth process under measurement.

    use std::path::{Path, PathBuf};

    use anyhow::{bail, Context};

    pub fn cpus() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
    /// The 1-, 5- and 15-minute load averages, when the OS reports them.
    pub fn load_average() -> Option<String> {
        let text = std::fs::read_to_string("/proc/loadavg").ok()?;
        Some(
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
        )
    }
    /// CPU time (ns) the live threads of process `pid` have run, summed from
    /// `/proc/<pid>/task/*/schedstat`; `None` where /proc does not report it.
    /// Threads that already exited are not counted.
    pub fn cpu_ns(pid: u32) -> Option<u64> {
        let mut total = 0u64;
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
            let text = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            total += text.split_whitespace().next()?.parse::<u64>().ok()?;
        }
        Some(total)
    }
    /// The next message berth's stdout reader task sends on `rx`, waiting at
    /// most `timeout`.
    ///
    /// # Errors
    /// When berth sent nothing for `timeout`, or the reader ended (berth
    /// closed its stdout): the message quotes the tail of `stderr_path`.
    pub async fn next_from_berth<T>(
        rx: &mut tokio::sync::mpsc::UnboundedReceiver<T>,
        timeout: std::time::Duration,
        stderr_path: &Path,
    ) -> anyhow::Result<T> {
        match tokio::time::timeout(timeout, rx.recv()).await {
            Err(_) => bail!(
                "berth sent nothing for {} s\n{}",
                timeout.as_secs(),
                stderr_tail(stderr_path)
            ),
            Ok(None) => bail!(
                "berth closed its stdout (exited?)\n{}",
                stderr_tail(stderr_path)
            ),
            Ok(Some(message)) => Ok(message),
        }
    }

    /// The last lines berth wrote to its stderr file, for error messages.
    pub fn stderr_tail(stderr_path: &Path) -> String {
        let text = std::fs::read_to_string(stderr_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        if tail.is_empty() {
            "(berth wrote nothing to stderr)".into()
        } else {
            format!("berth stderr (last lines):\n{tail}")
        }
    }
    /// Starts `bin serve` on `data_dir` with the scripted model playing
    /// `script` plus `extra_args`: stdin/stdout piped (ACP over stdio),
    /// stderr to `stderr_path`, `BERTH_LOG=warn` unless set, killed on drop.
    ///
    /// # Errors
    /// The stderr file cannot be created or the process cannot start.
    pub fn spawn_berth(
        bin: &Path,
        data_dir: &Path,
        script: &Path,
        stderr_path: &Path,
        extra_args: &[&std::ffi::OsStr],
    ) -> anyhow::Result<(
        tokio::process::Child,
        tokio::process::ChildStdin,
        tokio::process::ChildStdout,
    )> {
        let stderr = std::fs::File::create(stderr_path)
            .with_context(|| format!("cannot create {}", stderr_path.display()))?;
        let mut cmd = tokio::process::Command::new(bin);
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--model")
            .arg(format!("scripted:{}", script.display()))
            .args(extra_args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::from(stderr))
            .kill_on_drop(true);
        if std::env::var_os("BERTH_LOG").is_none() {
            cmd.env("BERTH_LOG", "warn");
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {} serve", bin.display()))?;
        let stdin = child.stdin.take().context("child stdin was not piped")?;
        let stdout = child.stdout.take().context("child stdout was not piped")?;
        Ok((child, stdin, stdout))
    }

    /// Where the `berth` binary is: `$BERTH_BIN`, else the workspace's release build.
    pub fn berth_binary(skip_hint: &str) -> anyhow::Result<PathBuf> {
        if let Some(bin) = std::env::var_os("BERTH_BIN") {
            let path = PathBuf::from(bin);
            if !path.is_file() {
                bail!(
                    "BERTH_BIN points at {}, which is not a file: unset it to use the \
                     workspace build, or point it at a built `berth` binary",
                    path.display()
                );
            }
            return Ok(path);
        }
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .context("the conformance crate has no parent directory")?;
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace.join("target"));
        let path = target.join("release").join("berth");
        if !path.is_file() {
            bail!(
                "the berth binary is missing at {}: build it first with \
                 `cargo build --release --bin berth` (or set BERTH_BIN to a built binary, \
                 or pass {skip_hint})",
                path.display()
            );
        }
        Ok(path)
    }
}

pub mod wire {
    //! ACP frames as the benchmarks read them.

    use std::borrow::Cow;

    use anyhow::{bail, Context};
    use serde::Deserialize;
    use serde_json::value::RawValue;
    use serde_json::Value;

    /// A frame read without building a JSON tree: the fields a benchmark
    /// looks at in a notification, borrowed from the line (escaped strings
    /// are unescaped into owned ones). A benchmark that reads thousands of
    /// notifications a second on the machine it measures keeps its own CPU
    /// out of the figures this way (`bench-sched`: ≈ 5 ms less wall for
    /// 1,000 wake-ups, 6,000 notifications); responses, which it inspects
    /// more closely, are parsed in full ([`classify_frame`]).
    #[derive(Debug, Deserialize)]
    struct LeanFrame<'a> {
        id: Option<Value>,
        #[serde(borrow)]
        method: Option<Cow<'a, str>>,
        #[serde(borrow)]
        params: Option<LeanParams<'a>>,
    }

    #[derive(Debug, Deserialize)]
    struct LeanParams<'a> {
        #[serde(rename = "sessionId", borrow)]
        session_id: Option<Cow<'a, str>>,
        /// `_berth/agentEvent`: the event's type.
        #[serde(rename = "type", borrow)]
        kind: Option<Cow<'a, str>>,
        /// `session/update`: the update.
        #[serde(borrow)]
        update: Option<LeanUpdate<'a>>,
        /// `_berth/agentEvent`: the event, unparsed.
        #[serde(borrow)]
        event: Option<&'a RawValue>,
    }

    #[derive(Debug, Deserialize)]
    struct LeanUpdate<'a> {
        #[serde(rename = "sessionUpdate", borrow)]
        session_update: Option<Cow<'a, str>>,
    }

    /// A line classified by [`classify_line`].
    pub enum Lean<'a> {
        /// A notification: its session and kind (the `session/update`
        /// variant, or the agent event's `type`; empty when absent) and, for
        /// an agent event, the event unparsed.
        Note(Cow<'a, str>, Cow<'a, str>, Option<&'a RawValue>),
        /// A response (an id and no method): parse it with
        /// [`classify_frame`].
        Response,
    }

    /// Classifies `line` as [`classify_frame`] does, without building a tree.
    ///
    /// # Errors
    /// A line that is not a JSON object, a request from berth, or a frame
    /// that is neither notification nor response.
    pub fn classify_line(line: &str) -> anyhow::Result<Lean<'_>> {
        let frame: LeanFrame<'_> = serde_json::from_str(line)
            .with_context(|| format!("berth sent a line that is not a JSON-RPC frame: {line}"))?;
        match (frame.method, frame.id) {
            (Some(_), Some(_)) => {
                bail!("berth sent a request the benchmark cannot answer: {line}")
            }
            (Some(method), None) => {
                let (session, kind, event) = match frame.params {
                    Some(p) => {
                        let kind = if method == "session/update" {
                            p.update.and_then(|u| u.session_update)
                        } else {
                            p.kind
                        };
                        (p.session_id, kind, p.event)
                    }
                    None => (None, None, None),
                };
                Ok(Lean::Note(
                    session.unwrap_or_default(),
                    kind.unwrap_or_default(),
                    event,
                ))
            }
            (None, Some(_)) => Ok(Lean::Response),
            (None, None) => {
                bail!("berth sent a frame that is neither request nor response: {line}")
            }
        }
    }

    /// A frame from berth, classified.
    pub enum Frame<'a> {
        /// A response: its id and `result` (or `error`).
        Response(u64, Result<&'a Value, &'a Value>),
        /// A notification: its session and kind (the `session/update` variant,
        /// or the agent event's `type`).
        Note(&'a str, &'a str),
    }

    pub fn classify_frame(frame: &Value) -> anyhow::Result<Frame<'_>> {
        match (frame.get("method"), frame.get("id")) {
            (Some(_), Some(_)) => {
                bail!("berth sent a request the benchmark cannot answer: {frame}")
            }
            (Some(method), None) => {
                let params = &frame["params"];
                let kind = match method.as_str() {
                    Some("session/update") => params["update"]["sessionUpdate"].as_str(),
                    _ => params["type"].as_str(),
                };
                Ok(Frame::Note(
                    params["sessionId"].as_str().unwrap_or(""),
                    kind.unwrap_or(""),
                ))
            }
            (None, Some(id)) => {
                let id = id
                    .as_u64()
                    .with_context(|| format!("a response with a non-numeric id: {frame}"))?;
                Ok(Frame::Response(
                    id,
                    match frame.get("error") {
                        Some(error) => Err(error),
                        None => Ok(&frame["result"]),
                    },
                ))
            }
            (None, None) => {
                bail!("berth sent a frame that is neither request nor response: {frame}")
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// Both readers classify every kind of frame alike.
        #[test]
        fn the_lean_reader_classifies_as_the_full_one() {
            let lines = [
                r#"{"jsonrpc":"2.0","method":"_berth/agentEvent","params":{"sessionId":"sess_1","eventId":4,"type":"resumed","event":{"type":"resumed","cause":"timeout","lateness_ms":0,"terminal":{"kind":"x"}}}}"#,
                r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"sess_\u0032","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}}}"#,
                r#"{"jsonrpc":"2.0","method":"_berth/other","params":{}}"#,
            ];
            for line in lines {
                let full: Value = serde_json::from_str(line).unwrap();
                let (Frame::Note(session, kind), Lean::Note(lean_session, lean_kind, _)) =
                    (classify_frame(&full).unwrap(), classify_line(line).unwrap())
                else {
                    panic!("not a notification both ways: {line}");
                };
                assert_eq!((session, kind), (lean_session.as_ref(), lean_kind.as_ref()));
            }
            let Lean::Note(_, _, Some(event)) = classify_line(lines[0]).unwrap() else {
                panic!("the agent event was not kept");
            };
            let event: Value = serde_json::from_str(event.get()).unwrap();
            assert_eq!(event["cause"], "timeout");
            assert!(matches!(
                classify_line(r#"{"jsonrpc":"2.0","id":7,"result":{"a":1}}"#).unwrap(),
                Lean::Response
            ));
            for bad in [
                r#"{"jsonrpc":"2.0","id":1,"method":"fs/read_text_file","params":{}}"#,
                r#"{"jsonrpc":"2.0"}"#,
                "not json",
            ] {
                assert!(classify_line(bad).is_err(), "{bad}");
            }
        }
    }
}
