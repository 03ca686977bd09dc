//! The environment of every process berth starts for a session.
//!
//! A tool process never inherits berth's environment: berth holds bearer
//! tokens, receipt keys and model API keys there, and a prompt-injected model
//! could read them with `env`. A [`ToolEnvironment`] is built once at start-up
//! from a small allow-list ([`ALLOWED`], [`ALLOWED_PREFIXES`]) of berth's own
//! variables, the variables the operator passes through by name
//! (`[tools] pass_env`), and the ones the operator sets (`[tools] env`); a
//! process gets exactly those ([`ToolEnvironment::apply`] clears the rest).
//! A name berth reads a secret from ([`SECRET_NAMES`], plus the variables the
//! config names for tokens and API keys) can never be passed or set: see
//! [`check_name`].

use std::collections::BTreeMap;
use std::ffi::OsString;

/// Variables passed from berth's environment to every tool process, when set.
pub const ALLOWED: &[&str] = &[
    "PATH", "HOME", "LANG", "LANGUAGE", "TERM", "TZ", "USER", "LOGNAME", "TMPDIR", "SHELL",
];

/// Prefixes of variables passed like [`ALLOWED`] (the locale's `LC_*`).
pub const ALLOWED_PREFIXES: &[&str] = &["LC_"];

/// Variables berth reads secrets from: never given to a tool process, and
/// refused in `[tools] pass_env` / `[tools] env`. The variables a config names
/// for secrets (`[[http.tokens]] token_env`, `[openai] api_key_env`) are
/// refused as well ([`check_name`]'s `also_secret`).
pub const SECRET_NAMES: &[&str] = &[
    "BERTH_API_KEYS",
    "BERTH_RECEIPT_KEYS",
    "BERTH_TOKEN",
    "OPENAI_API_KEY",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
];

/// Whether `name` is a valid variable name for a tool process and not a
/// secret: `Ok`, or what is wrong with it. `also_secret`: further names the
/// configuration reads secrets from.
///
/// # Errors
/// An empty name, one holding `=` or NUL, or a secret's name.
pub fn check_name(name: &str, also_secret: &[&str]) -> Result<(), String> {
    if name.is_empty() || name.contains(['=', '\0']) {
        return Err(format!(
            "{name:?} is not an environment variable name (non-empty, no `=` or NUL)"
        ));
    }
    if SECRET_NAMES.contains(&name) || also_secret.contains(&name) {
        return Err(format!(
            "{name} holds a secret berth reads; tool processes never see it"
        ));
    }
    Ok(())
}

/// The exact environment of a tool process (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolEnvironment {
    vars: BTreeMap<OsString, OsString>,
}

impl Default for ToolEnvironment {
    /// The allow-list alone ([`ToolEnvironment::allowed`]).
    fn default() -> Self {
        Self::allowed()
    }
}

impl ToolEnvironment {
    /// The [`ALLOWED`] and [`ALLOWED_PREFIXES`] variables berth has now.
    pub fn allowed() -> Self {
        let vars = std::env::vars_os()
            .filter(|(name, _)| {
                name.to_str().is_some_and(|n| {
                    ALLOWED.contains(&n) || ALLOWED_PREFIXES.iter().any(|p| n.starts_with(p))
                })
            })
            .collect();
        Self { vars }
    }

    /// The allow-list, plus the variables named in `pass_env` that berth has
    /// now (an unset one is left out), plus `set` (winning over both).
    /// Names are not checked here: the configuration checks them with
    /// [`check_name`] first; a secret's name is dropped regardless.
    pub fn new<'a>(
        pass_env: impl IntoIterator<Item = &'a str>,
        set: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Self {
        let mut env = Self::allowed();
        for name in pass_env {
            if check_name(name, &[]).is_ok() {
                if let Some(value) = std::env::var_os(name) {
                    env.vars.insert(name.into(), value);
                }
            }
        }
        for (name, value) in set {
            if check_name(name, &[]).is_ok() {
                env.vars.insert(name.into(), value.into());
            }
        }
        env
    }

    /// The variables, by name.
    pub fn vars(&self) -> &BTreeMap<OsString, OsString> {
        &self.vars
    }

    /// Gives `command` exactly this environment (clearing what it would
    /// inherit from berth).
    pub fn apply(&self, command: &mut tokio::process::Command) {
        command.env_clear().envs(&self.vars);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_and_bad_names_are_refused() {
        for name in SECRET_NAMES {
            assert!(check_name(name, &[]).is_err(), "{name}");
        }
        assert!(check_name("MY_TOKEN", &["MY_TOKEN"]).is_err());
        assert!(check_name("A=B", &[]).is_err());
        assert!(check_name("", &[]).is_err());
        assert!(check_name("GOPATH", &[]).is_ok());
    }

    #[test]
    fn set_wins_and_secrets_never_get_in() {
        let env = ToolEnvironment::new(["OPENAI_API_KEY"], [("X_SET", "1"), ("BERTH_TOKEN", "t")]);
        assert_eq!(env.vars().get(&OsString::from("X_SET")), Some(&"1".into()));
        assert!(!env.vars().contains_key(&OsString::from("OPENAI_API_KEY")));
        assert!(!env.vars().contains_key(&OsString::from("BERTH_TOKEN")));
    }
}
