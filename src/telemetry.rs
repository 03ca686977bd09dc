//! Logs on stderr, and OpenTelemetry trace export over OTLP/HTTP.
//!
//! berth's spans are plain `tracing` spans (turns, model calls, tool calls,
//! suspend/resume, ACP requests: see `berth_actors::telemetry`). This module
//! installs the subscriber that decides what becomes of them:
//!
//! - Logs (events) go to stderr, filtered by `BERTH_LOG` (default `info`).
//!   Spans are not printed.
//! - When an OTLP endpoint is configured with the standard variables, the
//!   spans of berth's crates (level INFO and up) are exported as
//!   OpenTelemetry spans through a batch processor. Otherwise no span is even
//!   created (every span callsite is disabled), so the hot path pays nothing.
//!
//! Variables (OpenTelemetry specification, "OTLP Exporter Configuration" and
//! "Environment Variable Specification"):
//!
//! | variable | effect |
//! |---|---|
//! | `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` | full URL spans are POSTed to (e.g. `http://collector:4318/v1/traces`) |
//! | `OTEL_EXPORTER_OTLP_ENDPOINT` | base URL; `/v1/traces` is appended |
//! | `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, `OTEL_EXPORTER_OTLP_PROTOCOL` | `http/protobuf` (default) or `http/json`; `grpc` is refused at start (not built in) |
//! | `OTEL_EXPORTER_OTLP_(TRACES_)HEADERS`, `…_TIMEOUT` (ms, default 10000) | as specified |
//! | `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES` | resource; `service.name` defaults to `berth` |
//! | `OTEL_TRACES_SAMPLER(_ARG)`, `OTEL_BSP_*` | sampler and batch processor, as specified |
//! | `OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none` | export off |
//!
//! Export is off when neither endpoint variable is set. Spans still queued
//! when berth stops are flushed by [`Otlp::shutdown`] (a SIGKILL loses them).

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{bail, Context};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::resource::{EnvResourceDetector, TelemetryResourceDetector};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::filter::{filter_fn, FilterExt, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The instrumentation scope name of berth's tracer.
const SCOPE: &str = "berth";
/// Default export timeout (ms; OTLP spec default).
const DEFAULT_TIMEOUT_MS: u64 = 10_000;
/// Largest collector response body read (bytes); the rest is discarded.
const MAX_RESPONSE_BYTES: u64 = 4 * 1024 * 1024;

/// The OTLP/HTTP encodings berth can export with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// `http/protobuf` (the specification's default).
    HttpProtobuf,
    /// `http/json`.
    HttpJson,
}

/// What the OTLP variables ask for; read by [`OtlpSettings::from_env`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpSettings {
    /// The encoding.
    pub protocol: OtlpProtocol,
    /// Export request timeout.
    pub timeout: Duration,
}

impl OtlpSettings {
    /// Reads the standard variables through `var` (the process environment in
    /// [`OtlpSettings::from_env`]). `Ok(None)`: export is off (no endpoint,
    /// `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`).
    ///
    /// # Errors
    /// A variable berth cannot honour, naming it and what to set instead:
    /// protocol `grpc` or an unknown protocol, an exporter other than `otlp`
    /// or `none`, a timeout that is not a whole number of milliseconds, a
    /// compression other than `none`, a sampler the SDK does not know.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> anyhow::Result<Option<Self>> {
        let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        match var("OTEL_TRACES_EXPORTER").map(|v| v.trim().to_ascii_lowercase()) {
            None => {}
            Some(v) if v == "otlp" => {}
            Some(v) if v == "none" => return Ok(None),
            Some(v) => bail!(
                "OTEL_TRACES_EXPORTER={v}: berth exports traces with `otlp` only (or `none` to turn export off)"
            ),
        }
        if var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
            && var("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
        {
            return Ok(None);
        }
        let (name, protocol) = match var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") {
            Some(p) => ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", Some(p)),
            None => (
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                var("OTEL_EXPORTER_OTLP_PROTOCOL"),
            ),
        };
        let protocol = match protocol.map(|p| p.trim().to_ascii_lowercase()).as_deref() {
            None | Some("http/protobuf") => OtlpProtocol::HttpProtobuf,
            Some("http/json") => OtlpProtocol::HttpJson,
            Some("grpc") => bail!(
                "{name}=grpc: berth exports OTLP over HTTP only; point the endpoint at the collector's OTLP/HTTP port (4318) and set {name}=http/protobuf (or unset it)"
            ),
            Some(other) => bail!(
                "{name}={other}: unknown OTLP protocol; use http/protobuf (the default) or http/json"
            ),
        };
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
            "OTEL_EXPORTER_OTLP_COMPRESSION",
        ] {
            if let Some(v) = var(name).filter(|v| !v.trim().eq_ignore_ascii_case("none")) {
                bail!("{name}={v}: berth sends OTLP uncompressed; unset it or set {name}=none");
            }
        }
        if let Some(v) = var("OTEL_TRACES_SAMPLER") {
            const SAMPLERS: [&str; 6] = [
                "always_on",
                "always_off",
                "traceidratio",
                "parentbased_always_on",
                "parentbased_always_off",
                "parentbased_traceidratio",
            ];
            if !SAMPLERS.contains(&v.trim()) {
                bail!(
                    "OTEL_TRACES_SAMPLER={v}: unknown sampler; use one of {}",
                    SAMPLERS.join(", ")
                );
            }
        }
        let timeout_ms = match var("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
            .map(|v| ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", v))
            .or_else(|| {
                var("OTEL_EXPORTER_OTLP_TIMEOUT").map(|v| ("OTEL_EXPORTER_OTLP_TIMEOUT", v))
            }) {
            None => DEFAULT_TIMEOUT_MS,
            Some((name, v)) => v
                .trim()
                .parse::<u64>()
                .with_context(|| format!("{name}={v}: must be a whole number of milliseconds"))?,
        };
        Ok(Some(Self {
            protocol,
            timeout: Duration::from_millis(timeout_ms),
        }))
    }

    /// [`OtlpSettings::from_vars`] over the process environment.
    ///
    /// # Errors
    /// As [`OtlpSettings::from_vars`].
    pub fn from_env() -> anyhow::Result<Option<Self>> {
        Self::from_vars(|name| std::env::var(name).ok())
    }
}

/// A running OTLP trace pipeline: call [`Otlp::shutdown`] when berth stops.
pub struct Otlp {
    provider: SdkTracerProvider,
}

impl Otlp {
    /// Builds the exporter (endpoint, headers and compression from the
    /// environment, through `opentelemetry-otlp`) and the tracer provider
    /// with a batch processor. Must be called outside an async runtime (the
    /// HTTP client runs its own).
    ///
    /// # Errors
    /// An endpoint that is not a URL, a compression berth was not built with,
    /// or an HTTP client that cannot be built.
    pub fn start(settings: &OtlpSettings) -> anyhow::Result<Self> {
        let client = reqwest::blocking::Client::builder()
            .timeout(settings.timeout)
            .build()
            .context("cannot build the OTLP HTTP client")?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(BlockingHttp(client))
            .with_protocol(match settings.protocol {
                OtlpProtocol::HttpProtobuf => Protocol::HttpBinary,
                OtlpProtocol::HttpJson => Protocol::HttpJson,
            })
            .with_timeout(settings.timeout)
            .build()
            .context("cannot set up OTLP trace export (check OTEL_EXPORTER_OTLP_*)")?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource())
            .build();
        Ok(Self { provider })
    }

    /// Exports every span still queued and stops the pipeline (bounded by
    /// the export timeout). Call it once, outside the async runtime.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("berth: flushing OpenTelemetry spans failed: {e}");
        }
    }
}

/// `service.name = berth` (unless `OTEL_SERVICE_NAME` or
/// `OTEL_RESOURCE_ATTRIBUTES` name another), `service.version`, the SDK's
/// `telemetry.sdk.*`, and `OTEL_RESOURCE_ATTRIBUTES`.
fn resource() -> Resource {
    let mut builder = Resource::builder_empty()
        .with_service_name("berth")
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .with_detectors(&[
            Box::new(TelemetryResourceDetector),
            Box::new(EnvResourceDetector::new()),
        ]);
    if let Some(name) = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
    {
        builder = builder.with_service_name(name);
    }
    builder.build()
}

/// Installs the global subscriber: logs to stderr (`BERTH_LOG`), and — with
/// `otlp` — berth's spans to its tracer.
pub fn install(otlp: Option<&Otlp>) {
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(
            EnvFilter::try_from_env("BERTH_LOG")
                .unwrap_or_else(|_| EnvFilter::new("info"))
                .and(filter_fn(|meta| meta.is_event())),
        );
    let spans = otlp.map(|otlp| {
        tracing_opentelemetry::layer()
            .with_tracer(otlp.provider.tracer(SCOPE))
            .with_threads(false)
            .with_filter(Targets::new().with_target("berth", tracing::Level::INFO))
    });
    tracing_subscriber::registry().with(logs).with(spans).init();
}

/// The exporter's HTTP client: the workspace's reqwest (rustls), blocking.
/// The batch span processor exports from its own thread and drives this
/// future to completion there, so blocking inside it is what it expects.
#[derive(Debug)]
struct BlockingHttp(reqwest::blocking::Client);

#[async_trait::async_trait]
impl HttpClient for BlockingHttp {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        use std::io::Read;
        let request = reqwest::blocking::Request::try_from(request)?;
        let response = self.0.execute(request)?;
        let mut builder = Response::builder().status(response.status());
        for (name, value) in response.headers() {
            builder = builder.header(name, value);
        }
        let mut body = Vec::new();
        response.take(MAX_RESPONSE_BYTES).read_to_end(&mut body)?;
        Ok(builder.body(Bytes::from(body))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> anyhow::Result<Option<OtlpSettings>> {
        OtlpSettings::from_vars(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn export_is_off_without_an_endpoint_or_when_disabled() {
        assert_eq!(settings(&[]).unwrap(), None);
        assert_eq!(
            settings(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap(),
            None
        );
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        assert_eq!(
            settings(&[endpoint, ("OTEL_SDK_DISABLED", "true")]).unwrap(),
            None
        );
        assert_eq!(
            settings(&[endpoint, ("OTEL_TRACES_EXPORTER", "none")]).unwrap(),
            None
        );
        assert_eq!(
            settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]).unwrap(),
            None
        );
    }

    #[test]
    fn protocol_and_timeout_follow_the_signal_specific_variables_first() {
        let endpoint = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://h/v1/traces");
        let s = settings(&[endpoint]).unwrap().unwrap();
        assert_eq!(s.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(s.timeout, Duration::from_millis(DEFAULT_TIMEOUT_MS));
        let s = settings(&[
            endpoint,
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "HTTP/JSON"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "5"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "250"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(s.protocol, OtlpProtocol::HttpJson);
        assert_eq!(s.timeout, Duration::from_millis(250));
    }

    #[test]
    fn unsupported_settings_are_refused_with_the_variable_named() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        let err = settings(&[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap_err();
        assert!(err.to_string().contains("OTEL_EXPORTER_OTLP_PROTOCOL=grpc"));
        assert!(err.to_string().contains("4318"));
        let err =
            settings(&[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")]).unwrap_err();
        assert!(err.to_string().contains("http/protobuf"));
        let err = settings(&[endpoint, ("OTEL_TRACES_EXPORTER", "zipkin")]).unwrap_err();
        assert!(err.to_string().contains("OTEL_TRACES_EXPORTER=zipkin"));
        let err = settings(&[endpoint, ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")]).unwrap_err();
        assert!(format!("{err:#}").contains("OTEL_EXPORTER_OTLP_TIMEOUT=10s"));
        let err = settings(&[endpoint, ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")]).unwrap_err();
        assert!(err
            .to_string()
            .contains("OTEL_EXPORTER_OTLP_COMPRESSION=gzip"));
        assert!(settings(&[endpoint, ("OTEL_EXPORTER_OTLP_COMPRESSION", "none")]).is_ok());
        let err = settings(&[endpoint, ("OTEL_TRACES_SAMPLER", "bogus")]).unwrap_err();
        assert!(err.to_string().contains("parentbased_traceidratio"));
        assert!(settings(&[endpoint, ("OTEL_TRACES_SAMPLER", "traceidratio")]).is_ok());
    }
}
