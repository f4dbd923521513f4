//! Parsing a config and checking it, with every error tied to its line.

use std::collections::HashSet;

use super::Config;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub line: Option<usize>,
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(l) => write!(f, "line {l}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())]
        .bytes()
        .filter(|b| *b == b'\n')
        .count()
        + 1
}

/// The line of the key that a message about a value starts with (`limits.max_json_depth
/// must be ...`, `fleet.pins.url: ...`); for a key the file leaves out (a required one, or a
/// default that another value conflicts with), the line of the table it belongs in, if any.
fn line_of_key(doc: &toml_edit::ImDocument<&str>, message: &str) -> Option<usize> {
    line_of_path(doc, message.split([' ', ':']).next()?)
}

/// The line of a dotted key path, deepest first; a number after an array of tables picks
/// one of its tables (`backends.1.models`).
fn line_of_path(doc: &toml_edit::ImDocument<&str>, path: &str) -> Option<usize> {
    let text = doc.raw();
    let mut table: &dyn toml_edit::TableLike = doc.as_table();
    let mut array: Option<&toml_edit::ArrayOfTables> = None;
    let mut line = None;
    for segment in path.split('.') {
        if let Some(tables) = array.take() {
            let Some(t) = segment.parse::<usize>().ok().and_then(|i| tables.get(i)) else {
                break;
            };
            line = t.span().map(|s| line_of(text, s.start)).or(line);
            table = t;
            continue;
        }
        let Some((key, item)) = table.get_key_value(segment) else {
            break;
        };
        line = key.span().map(|s| line_of(text, s.start)).or(line);
        if let Some(tables) = item.as_array_of_tables() {
            array = Some(tables);
            continue;
        }
        match item.as_table_like() {
            Some(t) => table = t,
            None => break,
        }
    }
    line
}

/// An error at the key `path` (which may index arrays of tables, `backends.1.models`),
/// with its line in `text`.
pub fn error_at_path(text: &str, path: &str, message: String) -> ConfigError {
    let line = toml_edit::ImDocument::parse(text)
        .ok()
        .and_then(|doc| line_of_path(&doc, path));
    ConfigError { line, message }
}

/// An error about the value of the key its message starts with (`server.tls: ...`), with
/// that key's line in `text`: for checks made outside this module (TLS files, which the
/// `tls` module reads).
pub fn error_at_key(text: &str, message: String) -> ConfigError {
    let line = toml_edit::ImDocument::parse(text)
        .ok()
        .and_then(|doc| line_of_key(&doc, &message));
    ConfigError { line, message }
}

/// At most this many schema errors are collected before giving up.
const MAX_SCHEMA_ERRORS: usize = 50;

/// Deserializes `text`, or returns every schema error (unknown keys, wrong types, bad
/// values), each with its line. serde stops at the first error, so each offending line is
/// blanked and the text parsed again: a user with three typos sees all three at once.
/// A syntax error, or an error without a place, ends the search: what follows it cannot be
/// read reliably.
/// What `deserialize` read: the config, the schema's errors, the text it was read from
/// (with the lines in error blanked, so its line numbers are the file's), and the keys and
/// tables of those lines, which now hold defaults the value checks must not judge.
struct Read {
    config: Config,
    errors: Vec<ConfigError>,
    text: String,
    set_aside: Vec<(Option<String>, String)>,
}

/// The config, or the schema's errors (a wrong type, an unknown key). A line in error is
/// blanked and the text read again, to find the next: if the rest then parses, that config
/// comes back with the errors, so that the value checks report theirs too, not only once
/// the first are fixed.
fn deserialize(text: &str) -> Result<Read, Vec<ConfigError>> {
    let mut lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut errors: Vec<ConfigError> = Vec::new();
    // Keys whose line was blanked: a later "missing field" for one of them is a consequence
    // of the blanking, not another error.
    let mut blanked_keys: Vec<String> = Vec::new();
    let mut set_aside: Vec<(Option<String>, String)> = Vec::new();
    let syntax_ok = text.parse::<toml::Table>().is_ok();
    for _ in 0..MAX_SCHEMA_ERRORS {
        let current: String = lines.concat();
        // A blanked line that began a value of several lines leaves the rest unreadable:
        // what follows would be errors of the blanking's making.
        if !errors.is_empty() && current.parse::<toml::Table>().is_err() {
            return Err(errors);
        }
        let e = match toml::from_str::<Config>(&current) {
            Ok(config) => {
                return Ok(Read {
                    config,
                    errors,
                    text: current,
                    set_aside,
                })
            }
            Err(e) => e,
        };
        let line = e.span().map(|s| line_of(&current, s.start));
        let message = with_key(&lines, line, &plain_types(e.message()));
        let consequence = blanked_keys
            .iter()
            .any(|k| message.ends_with(&format!("missing field `{k}`")));
        if !consequence {
            errors.push(ConfigError { line, message });
        }
        let Some(line) = line.filter(|_| syntax_ok && !consequence) else {
            return Err(errors);
        };
        let Some(&blanked) = lines.get(line - 1) else {
            return Err(errors);
        };
        if blanked.trim().is_empty() || blanked.trim_start().starts_with('[') {
            // Nothing to blank, or a table header, whose removal would move its keys.
            return Err(errors);
        }
        if let Some((key, _)) = blanked.split_once('=') {
            let key = key.trim().trim_matches('"').to_string();
            set_aside.push((table_above(&lines, line).map(str::to_string), key.clone()));
            blanked_keys.push(key);
        }
        lines[line - 1] = "\n";
    }
    Err(errors)
}

/// The table (`fleet.pins`, `backends`) whose header is the last above line `line`.
fn table_above<'a>(lines: &[&'a str], line: usize) -> Option<&'a str> {
    lines[..line.saturating_sub(1).min(lines.len())]
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| l.starts_with('['))
        .map(|h| h.trim_matches(|c| c == '[' || c == ']').trim())
}

/// serde's messages name Rust's types ("expected usize"); a config's reader knows numbers.
fn plain_types(message: &str) -> String {
    let mut plain = message.to_string();
    for (rust, words) in [
        ("expected usize", "expected a whole number, 0 or more"),
        ("expected u64", "expected a whole number, 0 or more"),
        ("expected u32", "expected a whole number, 0 or more"),
        ("expected u16", "expected a whole number from 0 to 65535"),
        ("expected u8", "expected a whole number from 0 to 255"),
        ("expected i64", "expected a whole number"),
        ("expected f64", "expected a number"),
        ("expected f32", "expected a number"),
    ] {
        if let Some(at) = plain.find(rust) {
            // Only the whole word: "expected u8" is not "expected u80".
            let end = at + rust.len();
            if !plain[end..].starts_with(|c: char| c.is_ascii_alphanumeric()) {
                plain.replace_range(at..end, words);
            }
        }
    }
    plain
}

/// Puts the key before a message that does not start with it (a wrong type or value names
/// only what it expected, an unknown key not its table): `limits.max_body_bytes: invalid
/// type: ...`, `server.lisen: unknown field ...`. The key is the one
/// assigned on the error's line, under the last table header above it.
fn with_key(lines: &[&str], line: Option<usize>, message: &str) -> String {
    // A missing field is reported at its table's header: name the table.
    let header = line
        .and_then(|l| lines.get(l - 1))
        .map(|text| text.trim())
        .filter(|text| text.starts_with('['));
    if let Some(header) = header {
        let table = header.trim_matches(|c| c == '[' || c == ']').trim();
        return format!("{table}: {message}");
    }
    let Some(key) = line
        .and_then(|l| lines.get(l - 1))
        .and_then(|text| text.split_once('='))
        .map(|(key, _)| key.trim().trim_matches('"'))
        .filter(|key| !key.is_empty())
    else {
        return message.to_string();
    };
    let table = table_above(lines, line.unwrap_or(1));
    // A message that starts with the key names it already, but not its table;
    // `unknown field `lisen`` names neither.
    let names_key = message
        .strip_prefix(key)
        .is_some_and(|rest| !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_'));
    match (table, names_key) {
        (Some(table), true) => format!("{table}.{message}"),
        (None, true) => message.to_string(),
        (Some(table), false) => format!("{table}.{key}: {message}"),
        (None, false) => format!("{key}: {message}"),
    }
}

/// Parses `text` and checks what serde cannot: backend URLs and unique names.
pub fn parse_and_check(text: &str) -> Result<Config, Vec<ConfigError>> {
    let Read {
        config,
        errors: schema_errors,
        text: checked,
        set_aside,
    } = deserialize(text)?;
    let text = checked.as_str();
    let mut errors = Vec::new();
    let mut names = HashSet::new();
    // Each server's first backend: its name and URL as written.
    let mut urls: std::collections::HashMap<String, (&str, &str)> =
        std::collections::HashMap::new();
    let doc = toml_edit::ImDocument::parse(text).ok();
    for (i, b) in config.backends.iter().enumerate() {
        if b.name.get_ref().trim().is_empty() {
            errors.push(ConfigError {
                line: Some(line_of(text, b.name.span().start)),
                message: "a backend's name must not be empty: logs, metrics and answers name it"
                    .into(),
            });
        }
        let new_name = names.insert(b.name.get_ref().clone());
        if !new_name {
            errors.push(ConfigError {
                line: Some(line_of(text, b.name.span().start)),
                message: format!("duplicate backend name '{}'", b.name.get_ref()),
            });
        }
        let url_line = Some(line_of(text, b.url.span().start));
        // A backend is known by its URL (health, pins, metrics): one server listed twice
        // would be two backends that share all of that, with twice its share of traffic.
        match urls.entry(server_of(b.url.get_ref())) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert((b.name.get_ref(), b.url.get_ref()));
            }
            // A duplicate name has its own error already.
            std::collections::hash_map::Entry::Occupied(first) if new_name => {
                let (first_name, first_url) = first.get();
                errors.push(ConfigError {
                    line: url_line,
                    message: format!(
                        "backend '{}' ({}) is the same server as backend '{first_name}' ({first_url}); list each server once, and give it a weight for a larger share",
                        b.name.get_ref(),
                        b.url.get_ref()
                    ),
                });
            }
            std::collections::hash_map::Entry::Occupied(_) => {}
        }
        if let Err(m) = check_url(b.url.get_ref()) {
            errors.push(ConfigError {
                line: url_line,
                message: m,
            });
        } else if b.discovery == super::Discovery::Dns && b.url.get_ref().starts_with("https://") {
            // The addresses found are dialled directly, and a certificate names the service,
            // not each address: verification would fail on every one.
            errors.push(ConfigError {
                line: url_line,
                message: format!(
                    "backend '{}': discovery = \"dns\" works with http:// only; for https://, list each backend by the name its certificate holds",
                    b.name.get_ref()
                ),
            });
        } else if b.discovery == super::Discovery::Dns && b.url.get_ref() == "builtin" {
            errors.push(ConfigError {
                line: url_line,
                message: format!(
                    "backend '{}': discovery = \"dns\" needs an http:// or https:// URL",
                    b.name.get_ref()
                ),
            });
        }
        if b.model_repository.is_some() && b.url.get_ref() != "builtin" {
            errors.push(ConfigError {
                line: url_line,
                message: format!(
                    "backend '{}': model_repository is for url = \"builtin\" (models run in-process); a remote server reads its own repository",
                    b.name.get_ref()
                ),
            });
        }
        if b.weight == 0 {
            let weight_line = doc
                .as_ref()
                .and_then(|d| d.get("backends")?.as_array_of_tables()?.get(i))
                .and_then(|t| t.get_key_value("weight")?.0.span())
                .map(|span| line_of(text, span.start));
            errors.push(ConfigError {
                line: weight_line.or(Some(line_of(text, b.name.span().start))),
                message: format!("backend '{}': weight must be at least 1", b.name.get_ref()),
            });
        }
    }
    // An [auth] table that names no token source would leave everything open while reading
    // as if auth were on (a templated tokens_file line dropped, say): refused, as a source
    // without tokens is.
    let auth_table = doc.as_ref().is_some_and(|d| d.contains_key("auth"));
    let open_auth = (auth_table && !config.auth.enabled()).then(|| {
        "auth: an [auth] table needs tokens_file or tokens_env; without either every request would be accepted (remove the table to serve without tokens)".to_string()
    });
    errors.extend(
        check_pins(&config.fleet.pins)
            .into_iter()
            .chain(open_auth)
            .chain(check_bounds(&config))
            .map(|message| ConfigError {
                line: doc.as_ref().and_then(|d| line_of_key(d, &message)),
                message,
            }),
    );
    // A value check that names a key set aside, or speaks of its whole table, judges a
    // default the file did not write (an [auth] table whose tokens_file had the wrong type
    // has no token source; an eject_base_ms in error is not the default it was read as).
    errors.retain(|e: &ConfigError| {
        !set_aside.iter().any(|(table, key)| {
            let qualified = match table {
                Some(t) => format!("{t}.{key}"),
                None => key.clone(),
            };
            let of_table = table.as_deref().is_some_and(|t| {
                e.message
                    .strip_prefix(t)
                    .is_some_and(|rest| rest.starts_with([':', ' ']))
            });
            e.message.contains(&qualified) || of_table
        })
    });
    errors.extend(schema_errors);
    if errors.is_empty() {
        Ok(config)
    } else {
        // In the file's order; errors without a line last.
        errors.sort_by_key(|e| e.line.unwrap_or(usize::MAX));
        Err(errors)
    }
}

/// Values that parse but cannot work: a zero timeout times out every request, a zero
/// refresh interval probes the backends in a loop, an unparsable log filter logs nothing.
fn check_bounds(config: &Config) -> Vec<String> {
    let mut errors = Vec::new();
    let mut at_least = |key: &str, value: u64, min: u64, why: &str| {
        if value < min {
            errors.push(format!("{key} must be at least {min}, not {value}: {why}"));
        }
    };
    let (l, f) = (&config.limits, &config.fleet);
    let never = "no request could be served";
    at_least("limits.max_body_bytes", l.max_body_bytes as u64, 1, never);
    at_least("limits.max_json_bytes", l.max_json_bytes as u64, 1, never);
    at_least("limits.max_json_depth", l.max_json_depth as u64, 1, never);
    at_least(
        "limits.max_tensor_elements",
        l.max_tensor_elements,
        1,
        never,
    );
    at_least(
        "limits.max_header_bytes",
        l.max_header_bytes as u64,
        8192,
        "hyper reads HTTP/1 heads into buffers of at least 8192 bytes, so a lower limit would hold for h2 alone",
    );
    at_least(
        "limits.send_timeout_ms",
        l.send_timeout_ms,
        1,
        "every answer would be cut off",
    );
    at_least(
        "limits.max_concurrent_requests",
        l.max_concurrent_requests as u64,
        1,
        "every request would be shed",
    );
    at_least(
        "limits.request_timeout_ms",
        l.request_timeout_ms,
        1,
        "every request would time out",
    );
    at_least(
        "limits.header_read_timeout_ms",
        l.header_read_timeout_ms,
        1,
        "no request head could arrive",
    );
    at_least(
        "limits.body_read_timeout_ms",
        l.body_read_timeout_ms,
        1,
        "no request body could arrive",
    );
    at_least(
        "fleet.refresh_interval_ms",
        f.refresh_interval_ms,
        100,
        "the backends would be probed in a loop",
    );
    at_least(
        "fleet.dns_interval_ms",
        f.dns_interval_ms,
        100,
        "names would be resolved in a loop",
    );
    at_least(
        "fleet.probe_timeout_ms",
        f.probe_timeout_ms,
        1,
        "every probe would time out",
    );
    at_least(
        "fleet.connect_timeout_ms",
        f.connect_timeout_ms,
        1,
        "no connection could be made",
    );
    at_least(
        "fleet.unhealthy_after_checks",
        u64::from(f.unhealthy_after_checks),
        1,
        "a backend would be unhealthy before any check",
    );
    at_least(
        "fleet.eject_after_failures",
        u64::from(f.eject_after_failures),
        1,
        "a backend would be ejected before it failed",
    );
    at_least(
        "fleet.sequence_idle_timeout_ms",
        f.sequence_idle_timeout_ms,
        1,
        "every pin would expire at once",
    );
    if f.eject_base_ms > f.eject_max_ms {
        errors.push(format!(
            "fleet.eject_base_ms ({}) must not exceed fleet.eject_max_ms ({})",
            f.eject_base_ms, f.eject_max_ms
        ));
    }
    for (name, m) in &config.models {
        if m.timeout_ms == Some(0) {
            errors.push(format!(
                "models.{name}.timeout_ms must be at least 1, not 0: every request would time out"
            ));
        }
        if m.sequence_idle_timeout_ms == Some(0) {
            errors.push(format!(
                "models.{name}.sequence_idle_timeout_ms must be at least 1, not 0: every pin would expire at once"
            ));
        }
    }
    errors.extend(shared_listener_ports(&config.server));
    if l.max_buffered_body_bytes > 0 && l.max_buffered_body_bytes < l.max_body_bytes {
        errors.push(format!(
            "limits.max_buffered_body_bytes must be 0 (half the memory) or at least limits.max_body_bytes ({}), not {}: a body of the largest size could never be read",
            l.max_body_bytes, l.max_buffered_body_bytes
        ));
    }
    if config.server.worker_threads > MAX_WORKER_THREADS {
        errors.push(format!(
            "server.worker_threads must be at most {MAX_WORKER_THREADS}, not {}",
            config.server.worker_threads
        ));
    }
    if let Err(why) = check_log_filter(&config.server.log_level) {
        errors.push(format!(
            "server.log_level '{}' is not a log filter: {why}; for example \"info\" or \"warn,tensorgate=debug\"",
            config.server.log_level
        ));
    }
    errors
}

/// Two listeners on one port (the same address, or one of them on every address) cannot
/// both bind: said here, with both keys, rather than as an "address in use" at startup.
/// Port 0 (any free port) never clashes.
fn shared_listener_ports(server: &super::ServerConfig) -> Vec<String> {
    let listeners = [
        ("server.listen", Some(server.listen)),
        ("server.metrics_listen", server.metrics_listen),
        ("server.grpc_listen", server.grpc_listen),
    ];
    let mut errors = Vec::new();
    for (i, (a_key, a)) in listeners.iter().enumerate() {
        for (b_key, b) in &listeners[i + 1..] {
            let (Some(a), Some(b)) = (a, b) else { continue };
            let overlap = a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified();
            if a.port() != 0 && a.port() == b.port() && overlap {
                errors.push(format!(
                    "{a_key} ({a}) and {b_key} ({b}) share a port: each listener needs its own"
                ));
            }
        }
    }
    errors
}

/// tracing's filter syntax, less one reading of it: a bare word that is not a level is a
/// target to log at every level, and then nothing else is logged. In a gateway's config that
/// is a misspelt level ("verbose", "warning"), so it is refused.
pub fn check_log_filter(filter: &str) -> Result<(), String> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    if filter.trim().is_empty() {
        return Err("it is empty, which logs nothing".into());
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(filter)
        .map_err(|e| e.to_string())?;
    for directive in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if !directive.contains('=') && !LEVELS.contains(&directive.to_ascii_lowercase().as_str()) {
            return Err(format!(
                "'{directive}' is neither a level (off, error, warn, info, debug, trace) nor target=level"
            ));
        }
    }
    Ok(())
}

/// More threads than this only cost memory and scheduling on any machine the gateway runs on.
/// Most threads `server.worker_threads` (and `--worker-threads`) may ask for.
pub const MAX_WORKER_THREADS: usize = 1024;

/// `[fleet.pins]`: a Redis store needs a URL the client accepts, and the bounds must be
/// usable. A URL given to the memory store is refused rather than ignored: it says the
/// operator meant to share pins.
fn check_pins(pins: &super::PinsConfig) -> Vec<String> {
    use super::PinStoreKind::{Memory, Redis};
    let mut errors = Vec::new();
    let given = pins.url.is_some() || pins.url_env.is_some();
    match pins.store {
        Redis if pins.url.is_some() && pins.url_env.is_some() => {
            errors.push("fleet.pins: set url or url_env, not both".into())
        }
        Redis if !given => errors.push(
            "fleet.pins.url (or url_env) is required with store = \"redis\" (redis://host:port/db or rediss://...)".into(),
        ),
        // A variable unset here may be set where the gateway runs: `serve` checks it.
        Redis => {
            if let Ok(Some(url)) = pins.resolve_url() {
                if let Err(e) = super::redis_url::check_url(&url) {
                    match &pins.url_env {
                        Some(var) => errors.push(format!("fleet.pins.url_env: ${var}: {e}")),
                        None => errors.push(format!("fleet.pins.url: {e}")),
                    }
                } else if pins.ca.is_some() && !url.starts_with("rediss://") {
                    errors.push("fleet.pins.ca applies to rediss:// URLs only".into());
                }
            }
        }
        Memory if given || pins.ca.is_some() => errors.push(
            "fleet.pins sets a Redis but fleet.pins.store is \"memory\"; set store = \"redis\" to use it".into(),
        ),
        Memory => {}
    }
    if pins.key_prefix.is_empty() {
        errors.push("fleet.pins.key_prefix must not be empty".into());
    }
    if !(1..=60_000).contains(&pins.timeout_ms) {
        errors.push(format!(
            "fleet.pins.timeout_ms must be from 1 to 60000, not {}",
            pins.timeout_ms
        ));
    }
    errors
}

/// The files a config names that cannot be read, one error each: what `serve` would refuse
/// to start with. Paths are relative to the working directory, as `serve` reads them. `text`
/// is the config's text, for the lines of the keys that name them.
pub fn unreadable_files(config: &Config, text: &str) -> Vec<ConfigError> {
    let mut errors_dirs = Vec::new();
    let mut named: Vec<(String, &std::path::Path)> = Vec::new();
    if let Some(tls) = &config.server.tls {
        named.push(("server.tls.cert".into(), &tls.cert));
        named.push(("server.tls.key".into(), &tls.key));
        if let Some(ca) = &tls.client_ca {
            named.push(("server.tls.client_ca".into(), ca));
        }
    }
    let backend_tls = &config.fleet.tls;
    for (key, path) in [
        ("fleet.tls.ca", &backend_tls.ca),
        ("fleet.tls.cert", &backend_tls.cert),
        ("fleet.tls.key", &backend_tls.key),
    ] {
        if let Some(p) = path {
            named.push((key.into(), p));
        }
    }
    if let Some(p) = &config.auth.tokens_file {
        named.push(("auth.tokens_file".into(), p));
    }
    // Tokens are read as `serve` reads them: a variable that is not set here, or sources that
    // hold no token, stop it from starting. (An unreadable file is reported below.)
    let file_readable = config
        .auth
        .tokens_file
        .as_ref()
        .is_none_or(|p| std::fs::File::open(p).is_ok());
    if config.auth.enabled() && file_readable {
        if let Err(e) = super::tokens::read(&config.auth) {
            errors_dirs.push(ConfigError {
                line: None,
                message: format!("{e} here (serve would refuse to start)"),
            });
        }
    }
    for (i, b) in config.backends.iter().enumerate() {
        if let Some(dir) = &b.model_repository {
            if !dir.is_dir() {
                errors_dirs.push(error_at_path(
                    text,
                    &format!("backends.{i}.model_repository"),
                    format!(
                        "backend '{}': model_repository {} is not a directory",
                        b.name.get_ref(),
                        dir.display()
                    ),
                ));
            }
        }
    }
    if let Some(ca) = &config.fleet.pins.ca {
        if let Err(message) = super::redis_url::read_ca(ca) {
            errors_dirs.push(ConfigError {
                line: None,
                message,
            });
        }
    }
    // Read where `serve` will run: an unset variable stops it from starting.
    if config.fleet.pins.store == super::PinStoreKind::Redis {
        if let Err(e) = config.fleet.pins.resolve_url() {
            errors_dirs.push(ConfigError {
                line: None,
                message: format!("{e} here (serve would refuse to start)"),
            });
        }
    }
    for (model, mc) in &config.models {
        for (output, p) in &mc.labels {
            named.push((format!("models.{model}.labels.{output}"), p));
        }
    }
    let mut errors: Vec<ConfigError> = named
        .into_iter()
        .filter_map(|(key, path)| {
            std::fs::File::open(path).err().map(|e| ConfigError {
                line: None,
                message: format!("{key}: cannot read {}: {e}", path.display()),
            })
        })
        .collect();
    errors.extend(errors_dirs);
    if let Ok(doc) = toml_edit::ImDocument::parse(text) {
        // An error that has its line keeps it: its message need not start with its key.
        for e in errors.iter_mut().filter(|e| e.line.is_none()) {
            e.line = line_of_key(&doc, &e.message);
        }
    }
    errors
}

/// The server a backend URL names, spelled one way: scheme and host in lower case, the port
/// given or the scheme's default (`http://h`, `HTTP://h:80/` and `http://h:080` are one).
fn server_of(url: &str) -> String {
    let Ok(uri) = url.parse::<http::Uri>() else {
        return url.to_ascii_lowercase();
    };
    let (Some(scheme), Some(host)) = (uri.scheme_str(), uri.host()) else {
        return url.to_ascii_lowercase();
    };
    let scheme = scheme.to_ascii_lowercase();
    let port = uri
        .port_u16()
        .unwrap_or(if scheme == "https" { 443 } else { 80 });
    format!("{scheme}://{}:{port}", host.to_ascii_lowercase())
}

fn check_url(url: &str) -> Result<(), String> {
    if url == "builtin" {
        return Ok(());
    }
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("backend url '{url}' is not a valid URL: {e}"))?;
    if !matches!(uri.scheme_str(), Some("http") | Some("https")) {
        return Err(format!(
            "backend url '{url}' must start with http:// or https:// (or be the word builtin)"
        ));
    }
    if uri.host().is_none() {
        return Err(format!("backend url '{url}' has no host"));
    }
    // http::Uri keeps any digits as the port, and without a u16 the connection would go to
    // the scheme's default port: a typo must not send traffic to whatever listens on 80.
    let host_port = uri
        .authority()
        .map_or("", |a| a.as_str().rsplit('@').next().unwrap_or(""));
    if let Some((_, port)) = host_port.rsplit_once(':').filter(|(_, p)| !p.contains(']')) {
        if !port.is_empty() && uri.port_u16().is_none_or(|p| p == 0) {
            return Err(format!(
                "backend url '{url}' has port {port}: a port is 1 to 65535"
            ));
        }
    }
    if !matches!(uri.path(), "" | "/") {
        return Err(format!("backend url '{url}' must not have a path"));
    }
    // The v2 paths are appended to the URL: a query would end up nowhere (every probe and
    // request of the backend would go to a path it does not serve).
    if uri.query().is_some() || url.contains('#') {
        return Err(format!(
            "backend url '{url}' must not have a query or fragment: the v2 paths are appended to it"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> Vec<String> {
        parse_and_check(text)
            .unwrap_err()
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    /// Listeners that would clash on one port are named together; port 0, distinct ports and
    /// distinct specific addresses are fine.
    #[test]
    fn listeners_need_ports_of_their_own() {
        let e = errors(
            "[server]\nlisten = \"0.0.0.0:8000\"\nmetrics_listen = \"127.0.0.1:8000\"\ngrpc_listen = \"0.0.0.0:8000\"\n",
        );
        assert_eq!(
            e,
            [
                "line 2: server.listen (0.0.0.0:8000) and server.metrics_listen (127.0.0.1:8000) share a port: each listener needs its own",
                "line 2: server.listen (0.0.0.0:8000) and server.grpc_listen (0.0.0.0:8000) share a port: each listener needs its own",
                "line 3: server.metrics_listen (127.0.0.1:8000) and server.grpc_listen (0.0.0.0:8000) share a port: each listener needs its own",
            ]
        );
        for fine in [
            "listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"\ngrpc_listen = \"127.0.0.1:0\"",
            "listen = \"127.0.0.1:8000\"\nmetrics_listen = \"127.0.0.2:8000\"\ngrpc_listen = \"\"",
            "listen = \"0.0.0.0:8000\"\nmetrics_listen = \"\"\ngrpc_listen = \"0.0.0.0:8001\"",
        ] {
            assert!(parse_and_check(&format!("[server]\n{fine}\n")).is_ok(), "{fine}");
        }
    }

    /// `[auth]` alone does not turn auth off silently: it is an error, at its line.
    #[test]
    fn an_auth_table_without_a_token_source_is_refused() {
        assert_eq!(
            errors("[server]\nlisten = \"127.0.0.1:0\"\n\n[auth]\n"),
            ["line 4: auth: an [auth] table needs tokens_file or tokens_env; without either every request would be accepted (remove the table to serve without tokens)"]
        );
        assert!(parse_and_check("[server]\nlisten = \"127.0.0.1:0\"\n").is_ok());
    }

    /// A budget for all bodies smaller than one body would refuse the largest ones forever.
    #[test]
    fn the_body_budget_holds_at_least_one_body() {
        assert_eq!(
            errors("[limits]\nmax_body_bytes = 1000\nmax_buffered_body_bytes = 999\n"),
            ["line 3: limits.max_buffered_body_bytes must be 0 (half the memory) or at least limits.max_body_bytes (1000), not 999: a body of the largest size could never be read"]
        );
        assert!(parse_and_check(
            "[limits]\nmax_body_bytes = 1000\nmax_buffered_body_bytes = 1000\n"
        )
        .is_ok());
    }

    /// Values that parse but could not work are refused, each naming its key and why.
    #[test]
    fn values_that_cannot_work_are_refused() {
        let e = errors(
            "[server]\nlog_level = \"verbose!!\"\nworker_threads = 100000\n\
             [limits]\nrequest_timeout_ms = 0\nmax_concurrent_requests = 0\nmax_json_depth = 0\nmax_header_bytes = 4096\n\
             [fleet]\nrefresh_interval_ms = 0\nunhealthy_after_checks = 0\neject_base_ms = 5000\neject_max_ms = 10\n\
             [models.m]\ntimeout_ms = 0\n",
        );
        // In the file's order.
        assert_eq!(
            e[1..],
            [
                "line 3: server.worker_threads must be at most 1024, not 100000",
                "line 5: limits.request_timeout_ms must be at least 1, not 0: every request would time out",
                "line 6: limits.max_concurrent_requests must be at least 1, not 0: every request would be shed",
                "line 7: limits.max_json_depth must be at least 1, not 0: no request could be served",
                "line 8: limits.max_header_bytes must be at least 8192, not 4096: hyper reads HTTP/1 heads into buffers of at least 8192 bytes, so a lower limit would hold for h2 alone",
                "line 10: fleet.refresh_interval_ms must be at least 100, not 0: the backends would be probed in a loop",
                "line 11: fleet.unhealthy_after_checks must be at least 1, not 0: a backend would be unhealthy before any check",
                "line 12: fleet.eject_base_ms (5000) must not exceed fleet.eject_max_ms (10)",
                "line 15: models.m.timeout_ms must be at least 1, not 0: every request would time out",
            ]
        );
        let first = &e[0];
        assert!(
            first == "line 2: server.log_level 'verbose!!' is not a log filter: 'verbose!!' is neither a level (off, error, warn, info, debug, trace) nor target=level; for example \"info\" or \"warn,tensorgate=debug\"",
            "{first}"
        );
        // The defaults, and the smallest values that work, pass.
        assert_eq!(
            errors("[server]\nlog_level = \" \"\n"),
            ["line 2: server.log_level ' ' is not a log filter: it is empty, which logs nothing; for example \"info\" or \"warn,tensorgate=debug\""]
        );
        assert!(parse_and_check("").is_ok());
        assert!(parse_and_check(
            "[server]\nlog_level = \"warn,tensorgate=debug\"\n[limits]\nrequest_timeout_ms = 1\n[fleet]\nrefresh_interval_ms = 100\n"
        )
        .is_ok());
    }

    #[test]
    fn every_schema_error_is_reported_with_its_line() {
        let e = errors(
            "[server]\nlisen = \"0.0.0.0:1\"\nlog_level = \"info\"\n\n[limits]\nmax_body_bytes = \"big\"\n\n[[backends]]\nname = \"a\"\nurl = 5\nwieght = 2\n",
        );
        assert_eq!(
            e,
            [
                "line 2: server.lisen: unknown field `lisen`, expected one of `listen`, `metrics_listen`, `grpc_listen`, `log_level`, `log_format`, `name`, `triton_metrics`, `tls`, `worker_threads`",
                "line 6: limits.max_body_bytes: invalid type: string \"big\", expected a whole number, 0 or more",
                "line 10: backends.url: invalid type: integer `5`, expected a string",
                "line 11: backends.wieght: unknown field `wieght`, expected one of `name`, `url`, `encoding`, `models`, `classification`, `discovery`, `weight`, `model_repository`",
            ]
        );
        // A syntax error ends the search: what follows cannot be read reliably.
        let e = errors("[server]\nlisen = \"x\"\nlog_level = \n");
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].starts_with("line 3: "), "{e:?}");
    }

    #[test]
    fn the_embedded_config_is_valid() {
        let c = parse_and_check(crate::config::DEFAULT_CONFIG).unwrap();
        assert_eq!(c.server.listen.to_string(), "0.0.0.0:8000");
        assert_eq!(
            c.server.metrics_listen,
            Some("0.0.0.0:8002".parse().unwrap())
        );
        assert_eq!(c.backends.len(), 1);
        assert_eq!(c.backends[0].url.get_ref(), "builtin");
    }

    /// A schema error (a value of the wrong kind) does not hide the value checks: the rest
    /// of the file is checked with that line set aside, and every error is reported at once.
    #[test]
    fn schema_errors_and_value_errors_are_reported_together() {
        let e = errors(
            "[server]\nlisten = \"bad\"\n[limits]\nrequest_timeout_ms = 0\nmax_body_bytes = \"big\"\nmax_header_bytes = 5\n",
        );
        assert_eq!(
            e,
            [
                "line 2: server.listen: 'bad' is not an address (IP:port, such as 0.0.0.0:8000 or [::]:8000; host names are not resolved): invalid socket address syntax",
                "line 4: limits.request_timeout_ms must be at least 1, not 0: every request would time out",
                "line 5: limits.max_body_bytes: invalid type: string \"big\", expected a whole number, 0 or more",
                "line 6: limits.max_header_bytes must be at least 8192, not 5: hyper reads HTTP/1 heads into buffers of at least 8192 bytes, so a lower limit would hold for h2 alone",
            ]
        );
    }

    /// A line set aside for its schema error holds a default in the config the value
    /// checks see: they say nothing of it, nor of its table as a whole.
    #[test]
    fn value_checks_do_not_judge_a_line_set_aside() {
        let only = |text: &str, expected: &str| {
            let e = errors(text);
            assert_eq!(e.len(), 1, "{e:?}");
            assert!(e[0].starts_with(expected), "{e:?}");
        };
        only(
            "[auth]\ntokens_file = 5\n",
            "line 2: auth.tokens_file: invalid type",
        );
        only(
            "[fleet.pins]\nstore = \"Redis\"\nurl = \"redis://127.0.0.1:6379/0\"\n",
            "line 2: fleet.pins.store: unknown variant",
        );
        only(
            "[fleet.pins]\nstore = \"redis\"\nurl = 6379\n",
            "line 3: fleet.pins.url: invalid type",
        );
        only(
            "[fleet]\neject_base_ms = \"5s\"\neject_max_ms = 10\n",
            "line 2: fleet.eject_base_ms: invalid type",
        );
        // A value over several lines: its first line set aside leaves the rest unreadable,
        // and the search stops there rather than report what the blanking made.
        let e = errors("[server]\nlisten = [\n  \"a\",\n]\n");
        assert_eq!(e.len(), 1, "{e:?}");
    }

    #[test]
    fn fleet_values_are_checked() {
        let e = errors("[fleet]\nhash_table_size = 1000\n");
        assert_eq!(
            e,
            ["line 2: fleet.hash_table_size must be from 1009 to 16777213, not 1000"]
        );
        let e = errors(
            "[[backends]]\nname = \"b\"\nurl = \"https://models.svc:8000\"\ndiscovery = \"dns\"\n",
        );
        assert_eq!(
            e,
            ["line 3: backend 'b': discovery = \"dns\" works with http:// only; for https://, list each backend by the name its certificate holds"]
        );
    }

    #[test]
    fn files_that_cannot_be_read_are_named() {
        let unreadable = |text: &str| -> Vec<String> {
            let c = parse_and_check(text).unwrap();
            unreadable_files(&c, text)
                .iter()
                .map(|e| e.to_string())
                .collect()
        };
        assert_eq!(
            unreadable("[auth]\ntokens_file = \"/nonexistent/tokens\"\n[models.m]\nlabels = { OUT = \"/nonexistent/labels.txt\" }\n"),
            [
                "line 2: auth.tokens_file: cannot read /nonexistent/tokens: No such file or directory (os error 2)",
                "line 4: models.m.labels.OUT: cannot read /nonexistent/labels.txt: No such file or directory (os error 2)"
            ]
        );
        // A directory's error has its line, which its message does not start with.
        assert_eq!(
            unreadable("[server]\nlisten = \"127.0.0.1:0\"\n\n[[backends]]\nname = \"x\"\nurl = \"builtin\"\nmodel_repository = \"/nonexistent\"\n"),
            ["line 7: backend 'x': model_repository /nonexistent is not a directory"]
        );
        let embedded = parse_and_check(crate::config::DEFAULT_CONFIG).unwrap();
        // The embedded config names label files relative to the repository root, where
        // cargo runs tests.
        assert_eq!(
            unreadable_files(&embedded, crate::config::DEFAULT_CONFIG),
            []
        );
    }

    #[test]
    fn a_listen_address_is_quoted_and_explained() {
        let e = errors("[server]\nlisten = \"localhost:8000\"\n");
        assert_eq!(
            e,
            ["line 2: server.listen: 'localhost:8000' is not an address (IP:port, such as 0.0.0.0:8000 or [::]:8000; host names are not resolved): invalid socket address syntax"]
        );
    }

    #[test]
    fn unknown_keys_are_errors_with_lines() {
        let e = errors("[server]\nlisten = \"0.0.0.0:1\"\nlisen = 3\n");
        assert_eq!(e.len(), 1);
        assert!(
            e[0].starts_with("line 3: server.lisen: unknown field `lisen`"),
            "{e:?}"
        );
        let e = errors("[limits]\nmax_body_bytes = \"x\"\n");
        assert!(
            e[0].starts_with("line 2: limits.max_body_bytes: invalid type: string \"x\""),
            "{e:?}"
        );
    }

    #[test]
    fn backend_checks() {
        let e = errors(
            "[[backends]]\nname = \"a\"\nurl = \"ftp://x:1\"\n\n[[backends]]\nname = \"a\"\nurl = \"http://h:1/v2\"\n",
        );
        assert_eq!(
            e,
            vec![
                "line 3: backend url 'ftp://x:1' must start with http:// or https:// (or be the word builtin)",
                "line 6: duplicate backend name 'a'",
                "line 7: backend url 'http://h:1/v2' must not have a path",
            ]
        );
        let e = errors(
            "[[backends]]\nname = \"a\"\nurl = \"http://h:1\"\n\n[[backends]]\nname = \"b\"\nurl = \"HTTP://H:1/\"\n",
        );
        assert_eq!(
            e,
            vec!["line 7: backend 'b' (HTTP://H:1/) is the same server as backend 'a' (http://h:1); list each server once, and give it a weight for a larger share"]
        );
        // A name listed twice has its own error; the server a later backend repeats is named
        // with the URL each wrote.
        let e = errors(
            "[[backends]]\nname = \"a\"\nurl = \"http://h:1\"\n\n[[backends]]\nname = \"a\"\nurl = \"http://h:2\"\n\n[[backends]]\nname = \"b\"\nurl = \"http://H:2\"\n",
        );
        assert_eq!(
            e,
            vec![
                "line 6: duplicate backend name 'a'",
                "line 11: backend 'b' (http://H:2) is the same server as backend 'a' (http://h:2); list each server once, and give it a weight for a larger share",
            ]
        );
        for (a, b) in [
            ("http://h", "http://h:80"),
            ("http://h:031001", "http://H:31001/"),
            ("https://h", "https://h:443"),
        ] {
            let e = errors(&format!(
                "[[backends]]\nname = \"a\"\nurl = \"{a}\"\n\n[[backends]]\nname = \"b\"\nurl = \"{b}\"\n"
            ));
            assert_eq!(e.len(), 1, "{a} {b}: {e:?}");
        }
        assert!(parse_and_check("[[backends]]\nname = \"a\"\nurl = \"http://h:80\"\n\n[[backends]]\nname = \"b\"\nurl = \"https://h:80\"\n").is_ok());
        let e = errors(
            "[[backends]]\nname = \"b\"\nurl = \"builtin\"\ndiscovery = \"dns\"\nweight = 0\n",
        );
        assert_eq!(
            e,
            vec![
                "line 3: backend 'b': discovery = \"dns\" needs an http:// or https:// URL",
                "line 5: backend 'b': weight must be at least 1",
            ]
        );
        // A missing field names its table; an empty name, and a URL with a query, are
        // refused (the v2 paths are appended to the URL).
        assert_eq!(
            errors("[[backends]]\nurl = \"http://h:1\"\n"),
            ["line 1: backends: missing field `name`"]
        );
        assert_eq!(
            errors("[server.tls]\ncert = \"c.pem\"\n"),
            ["line 1: server.tls: missing field `key`"]
        );
        assert_eq!(
            errors("[[backends]]\nname = \"\"\nurl = \"http://h:1/?x=1\"\n"),
            [
                "line 2: a backend's name must not be empty: logs, metrics and answers name it",
                "line 3: backend url 'http://h:1/?x=1' must not have a query or fragment: the v2 paths are appended to it",
            ]
        );
        // A port that no TCP port is, which the URL type keeps and a connection would
        // replace by the scheme's default.
        for (port, bad) in [("99999", true), ("0", true), ("65535", false), ("", false)] {
            let url = format!("http://h:{port}");
            let text = format!("[[backends]]\nname = \"b\"\nurl = \"{url}\"\n");
            let expected =
                format!("line 3: backend url '{url}' has port {port}: a port is 1 to 65535");
            match parse_and_check(&text) {
                Ok(_) => assert!(!bad, "{url} passes"),
                Err(_) => assert_eq!(errors(&text), [expected]),
            }
        }
        assert!(
            parse_and_check("[[backends]]\nname = \"b\"\nurl = \"http://[::1]:8000\"\n").is_ok()
        );
        // A wrong type blanked to find more errors is not also a missing field.
        assert_eq!(
            errors("[[backends]]\nname = 5\nurl = \"http://h:1\"\n"),
            ["line 2: backends.name: invalid type: integer `5`, expected a string"]
        );
        let e = errors("[[backends]]\nname = \"a\"\nurl = \"builtin\"\nencoding = \"xml\"\n");
        assert!(
            e[0].starts_with("line 4: backends.encoding: unknown variant `xml`"),
            "{e:?}"
        );
    }

    #[test]
    fn pin_store_settings_are_checked() {
        assert_eq!(
            errors("[fleet.pins]\nstore = \"redis\"\n"),
            ["line 1: fleet.pins.url (or url_env) is required with store = \"redis\" (redis://host:port/db or rediss://...)"]
        );
        assert_eq!(
            errors("[fleet.pins]\nstore = \"redis\"\nurl = \"http://:pw@h:1\"\ntimeout_ms = 0\nkey_prefix = \"\"\n"),
            [
                "line 3: fleet.pins.url: 'http://:***@h:1' is not a redis:// or rediss:// URL",
                "line 4: fleet.pins.timeout_ms must be from 1 to 60000, not 0",
                "line 5: fleet.pins.key_prefix must not be empty",
            ]
        );
        assert_eq!(
            errors("[fleet.pins]\nurl = \"redis://h:1\"\n"),
            ["line 1: fleet.pins sets a Redis but fleet.pins.store is \"memory\"; set store = \"redis\" to use it"]
        );
        // A URL from the environment is the variable's fault, on its line.
        std::env::set_var("TG_CHECK_TEST_BAD_REDIS_URL", "redis://:6379/0");
        assert_eq!(
            errors("[fleet.pins]\nstore = \"redis\"\nurl_env = \"TG_CHECK_TEST_BAD_REDIS_URL\"\n"),
            ["line 3: fleet.pins.url_env: $TG_CHECK_TEST_BAD_REDIS_URL: 'redis://:6379/0' is not a valid URL: empty host"]
        );
        assert_eq!(
            errors("[fleet.pins]\nstore = \"redis\"\nurl = \"redis://h:1\"\nurl_env = \"X\"\n"),
            ["line 1: fleet.pins: set url or url_env, not both"]
        );
        assert_eq!(
            errors("[fleet.pins]\nstore = \"redis\"\nurl = \"redis://h:1\"\nca = \"ca.pem\"\n"),
            ["line 4: fleet.pins.ca applies to rediss:// URLs only"]
        );
        // Unset here, perhaps set where the gateway runs: `serve` refuses it, not the check.
        let env =
            parse_and_check("[fleet.pins]\nstore = \"redis\"\nurl_env = \"TG_TEST_UNSET_REDIS\"\n")
                .unwrap();
        assert_eq!(
            env.fleet.pins.resolve_url(),
            Err("fleet.pins.url_env names TG_TEST_UNSET_REDIS, which is not set".into())
        );
        let ok =
            parse_and_check("[fleet.pins]\nstore = \"redis\"\nurl = \"rediss://:pw@h:6380/2\"\n")
                .unwrap();
        assert_eq!(ok.fleet.pins.key_prefix, "tensorgate:pin:");
        assert_eq!(ok.fleet.pins.timeout_ms, 50);
    }
}
