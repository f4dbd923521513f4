//! The plain log format, with a fast path for the access-log line. tracing-subscriber's
//! `Full` format writes every field through `core::fmt` and, ANSI on or off, through
//! nu_ansi_term's painting; for the access line, one per request with a dozen fields, that
//! was about 17% of the gateway's instructions per small proxied request. This format writes
//! the access line itself, byte for byte as `Full` would, and hands every other line (and
//! any line inside a span, or with ANSI colours on) to `Full`.

use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{Format, Full, Writer};
use tracing_subscriber::fmt::time::SystemTime as FullTimer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The target whose lines take the fast path.
pub const ACCESS_TARGET: &str = "tensorgate::access";

/// `Full` for every line, except the access lines it writes itself.
#[derive(Default)]
pub struct PlainFormat {
    full: Format<Full, FullTimer>,
}

impl<S, N> FormatEvent<S, N> for PlainFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        if meta.target() != ACCESS_TARGET
            || writer.has_ansi_escapes()
            || ctx.lookup_current().is_some()
        {
            return self.full.format_event(ctx, writer, event);
        }
        // The line is built in a reused buffer and handed to the writer once: each of the
        // writer's `write_str` calls goes through `dyn fmt::Write`, some forty per line.
        LINE.with(|cell| {
            // Taken only if a field's Debug logged in turn; then that line goes to `Full`.
            let Ok(mut line) = cell.try_borrow_mut() else {
                return self.full.format_event(ctx, writer, event);
            };
            line.clear();
            write_timestamp(&mut *line, SystemTime::now())?;
            line.push_str(level_padded(*meta.level()));
            line.push_str(meta.target());
            line.push_str(": ");
            let mut fields = PlainFields {
                line: &mut line,
                first: true,
            };
            event.record(&mut fields);
            line.push('\n');
            writer.write_str(&line)
        })
    }
}

/// The level as `Full` writes it between the timestamp and the target: right-aligned in
/// five columns, with the separating spaces.
fn level_padded(level: Level) -> &'static str {
    match level {
        Level::TRACE => " TRACE ",
        Level::DEBUG => " DEBUG ",
        Level::INFO => "  INFO ",
        Level::WARN => "  WARN ",
        Level::ERROR => " ERROR ",
    }
}

thread_local! {
    /// The access line being built.
    static LINE: RefCell<String> = const { RefCell::new(String::new()) };
    /// The last second formatted on this thread, and its `YYYY-MM-DDTHH:MM:SS.`.
    static SECOND: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// RFC 3339 in UTC with microseconds, as tracing-subscriber's `SystemTime` timer writes it
/// (`2026-11-24T20:03:38.674332Z`). The date and time of day change once a second, so they
/// are formatted once a second.
fn write_timestamp(w: &mut impl fmt::Write, now: SystemTime) -> fmt::Result {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    SECOND.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != secs {
            let t = time::OffsetDateTime::from(UNIX_EPOCH + std::time::Duration::from_secs(secs));
            cached.1.clear();
            write!(
                cached.1,
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.",
                t.year(),
                u8::from(t.month()),
                t.day(),
                t.hour(),
                t.minute(),
                t.second()
            )?;
            cached.0 = secs;
        }
        w.write_str(&cached.1)
    })?;
    let micros = since.subsec_micros();
    let mut digits = [b'0'; 6];
    let mut rest = micros;
    for d in digits.iter_mut().rev() {
        *d = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    w.write_str(std::str::from_utf8(&digits).expect("ASCII digits"))?;
    w.write_str("Z")
}

/// Fields as `Full`'s visitor writes them: `name=value` separated by spaces, strings in
/// Rust's debug quoting, the message bare and first.
struct PlainFields<'l> {
    line: &'l mut String,
    first: bool,
}

impl PlainFields<'_> {
    /// The separator and `name=`, or `None` for a field `Full` leaves out.
    fn start(&mut self, field: &Field) -> Option<()> {
        if field.name().starts_with("log.") {
            return None;
        }
        let name = field.name();
        self.named(name.strip_prefix("r#").unwrap_or(name));
        Some(())
    }

    /// The separator and `name=` (the message has no name).
    fn named(&mut self, name: &str) {
        if !self.first {
            self.line.push(' ');
        }
        self.first = false;
        if name != "message" {
            self.line.push_str(name);
            self.line.push('=');
        }
    }

    /// A string as `Full` writes it: in quotes, escaped as Rust's Debug escapes.
    fn quoted(&mut self, value: &str) {
        if debug_is_plain(value) {
            self.line.push('"');
            self.line.push_str(value);
            self.line.push('"');
        } else {
            // Writing to a String cannot fail.
            let _ = write!(self.line, "{value:?}");
        }
    }

    fn str_field(&mut self, name: &str, value: &str) {
        self.named(name);
        self.quoted(value);
    }

    fn u64_field(&mut self, name: &str, value: u64) {
        self.named(name);
        self.line.push_str(itoa::Buffer::new().format(value));
    }
}

/// One access line's values, in the order the line gives them
/// (`gateway::observe::access_log`); `peer` is written bare, as its Display writes it.
pub struct AccessLine<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub protocol: &'a str,
    pub model: &'a str,
    pub status: u32,
    pub backend: &'a str,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub duration_us: u64,
    pub peer: &'a dyn fmt::Display,
    pub sequence_id: &'a str,
    pub traceparent: &'a str,
    pub request_id: &'a str,
    pub error: &'a str,
}

/// The writer access lines go to without tracing's dispatch, when the process logs plain
/// lines without colours: set once by `direct_access_lines`.
static DIRECT: std::sync::OnceLock<crate::logwriter::BatchedStderr> = std::sync::OnceLock::new();

/// From now on, access lines are written to `sink` by `write_access`, byte for byte as
/// `PlainFormat` writes them through tracing: the event's dispatch, its fields' visit and
/// a buffer per line were some 2.5k instructions of a small proxied request's 87k. Only for
/// the plain format without ANSI colours (where `PlainFormat` takes its fast path too).
pub fn direct_access_lines(sink: crate::logwriter::BatchedStderr) {
    let _ = DIRECT.set(sink);
}

/// Writes `line` at `level` to the direct sink, if there is one; `false` when the caller
/// must log it through tracing. The caller has checked that the level is enabled.
pub fn write_access(level: Level, line: &AccessLine<'_>) -> bool {
    let Some(sink) = DIRECT.get() else {
        return false;
    };
    LINE.with(|cell| {
        let Ok(mut text) = cell.try_borrow_mut() else {
            return false;
        };
        format_access(&mut text, level, line, SystemTime::now());
        sink.write_line(text.as_bytes());
        true
    })
}

/// The access line as a tracing event: the JSON format, colours, or a process without a
/// direct sink. The one list of its fields beside `format_access`'s, which a test holds to
/// the same line.
pub fn trace_access(level: Level, a: &AccessLine<'_>) {
    macro_rules! event {
        ($level:ident) => {
            tracing::$level!(
                target: "tensorgate::access",
                method = a.method,
                path = a.path,
                protocol = a.protocol,
                model = a.model,
                status = a.status,
                backend = a.backend,
                bytes_in = a.bytes_in,
                bytes_out = a.bytes_out,
                duration_us = a.duration_us,
                peer = %a.peer,
                sequence_id = a.sequence_id,
                traceparent = a.traceparent,
                request_id = a.request_id,
                error = a.error,
            )
        };
    }
    // The access line has two levels: debug for probes, info for the rest.
    if level == Level::DEBUG {
        event!(debug);
    } else {
        event!(info);
    }
}

/// The access line as `PlainFormat` writes it, newline included.
fn format_access(text: &mut String, level: Level, a: &AccessLine<'_>, now: SystemTime) {
    text.clear();
    // Writing to a String cannot fail.
    let _ = write_timestamp(&mut *text, now);
    text.push_str(level_padded(level));
    text.push_str(ACCESS_TARGET);
    text.push_str(": ");
    let mut f = PlainFields {
        line: text,
        first: true,
    };
    f.str_field("method", a.method);
    f.str_field("path", a.path);
    f.str_field("protocol", a.protocol);
    f.str_field("model", a.model);
    f.u64_field("status", u64::from(a.status));
    f.str_field("backend", a.backend);
    f.u64_field("bytes_in", a.bytes_in);
    f.u64_field("bytes_out", a.bytes_out);
    f.u64_field("duration_us", a.duration_us);
    f.named("peer");
    let _ = write!(f.line, "{}", a.peer);
    f.str_field("sequence_id", a.sequence_id);
    f.str_field("traceparent", a.traceparent);
    f.str_field("request_id", a.request_id);
    f.str_field("error", a.error);
    f.line.push('\n');
}

/// Whether `{:?}` of `s` is `s` in quotes: printable ASCII without quotes or backslashes.
fn debug_is_plain(s: &str) -> bool {
    // Every byte is looked at, without an early exit, so that the loop is vectorised: an
    // access line checks some hundred bytes this way, and a branch per byte cost more.
    s.bytes().fold(true, |plain, b| {
        plain & (0x20..0x7f).contains(&b) & (b != b'"') & (b != b'\\')
    })
}

impl Visit for PlainFields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.start(field).is_none() {
            return;
        }
        if field.name() == "message" {
            self.line.push_str(value);
        } else {
            self.quoted(value);
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if self.start(field).is_some() {
            self.line.push_str(itoa::Buffer::new().format(value));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if self.start(field).is_some() {
            self.line.push_str(itoa::Buffer::new().format(value));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.start(field).is_some() {
            let _ = write!(self.line, "{value:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::MakeWriter;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Buffer {
            self.clone()
        }
    }

    impl Buffer {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    fn access_event(path: &str, error: &str, duration_us: u64) {
        tracing::info!(
            target: "tensorgate::access",
            method = "POST",
            path,
            status = 200u32,
            duration_us,
            delta = -3i64,
            ok = true,
            error,
        );
    }

    /// Each line with its timestamp (up to the first space) cut off.
    fn without_timestamps(text: &str) -> Vec<String> {
        text.lines()
            .map(|l| l.split_once(' ').expect("a timestamp").1.to_string())
            .collect()
    }

    fn emit_all() {
        access_event("/v2/models/simple/infer", "-", 314);
        access_event("/v2/models/\"quoted\"\\back", "tab\there", 0);
        access_event(
            "/v2/models/caf\u{e9}/infer",
            "line\nbreak \u{200b}",
            u64::MAX,
        );
        tracing::warn!(target: "tensorgate::access", model = "m", "a message {}", 42);
        tracing::info!(target: "tensorgate::other", x = 1, "not an access line");
        let span = tracing::info_span!("outer", id = 7);
        let _in = span.enter();
        access_event("/in/a/span", "-", 1);
    }

    #[test]
    fn writes_what_the_full_format_writes() {
        let (ours, theirs) = (Buffer::default(), Buffer::default());
        let sub = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(ours.clone())
            .event_format(PlainFormat::default())
            .finish();
        tracing::subscriber::with_default(sub, emit_all);
        let sub = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(theirs.clone())
            .finish();
        tracing::subscriber::with_default(sub, emit_all);
        let (ours, theirs) = (ours.text(), theirs.text());
        assert_eq!(without_timestamps(&ours), without_timestamps(&theirs));
        assert_eq!(ours.lines().count(), 6, "{ours}");
        for line in ours.lines() {
            let ts = line.split(' ').next().unwrap();
            assert_eq!(ts.len(), "2026-11-24T20:03:38.674332Z".len(), "{line}");
            assert!(ts.ends_with('Z'), "{line}");
        }
    }

    /// A field whose Debug logs. tracing-core drops an event raised while its dispatcher is
    /// busy on the same thread, so the buffer is never taken twice; were it, the inner line
    /// would go to `Full` rather than panic.
    struct Logs;

    impl fmt::Debug for Logs {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            tracing::info!(target: "tensorgate::access", inner = 1u64);
            f.write_str("logged")
        }
    }

    #[test]
    fn a_line_logged_while_one_is_built_does_not_disturb_it() {
        let out = Buffer::default();
        let sub = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(out.clone())
            .event_format(PlainFormat::default())
            .finish();
        tracing::subscriber::with_default(sub, || {
            tracing::info!(target: "tensorgate::access", outer = ?Logs, after = 2u64);
        });
        let lines = without_timestamps(&out.text());
        assert_eq!(lines, [" INFO tensorgate::access: outer=logged after=2"]);
    }

    /// The access line written directly is the line tracing writes through `PlainFormat`
    /// for the same values, escapes and all.
    #[test]
    fn the_direct_access_line_is_the_traced_one() {
        let peer: std::net::SocketAddr = "127.0.0.1:50123".parse().unwrap();
        let cases: [(&str, &str, &dyn fmt::Display, Level); 3] = [
            ("/v2/models/simple/infer", "-", &peer, Level::INFO),
            (
                "/v2/models/\"q\"\\b",
                "tab\there \u{200b}",
                &"-",
                Level::DEBUG,
            ),
            (
                "/v2/models/caf\u{e9}/infer",
                "line\nbreak",
                &peer,
                Level::INFO,
            ),
        ];
        for (path, error, peer, level) in cases {
            let line = AccessLine {
                method: "POST",
                path,
                protocol: "rest",
                model: "simple",
                status: 400,
                backend: "w1",
                bytes_in: 512,
                bytes_out: 77,
                duration_us: 1234,
                peer,
                sequence_id: "42",
                traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                request_id: "req-\"7\"",
                error,
            };
            let traced = Buffer::default();
            let sub = tracing_subscriber::fmt()
                .with_ansi(false)
                .with_max_level(Level::TRACE)
                .with_writer(traced.clone())
                .event_format(PlainFormat::default())
                .finish();
            tracing::subscriber::with_default(sub, || trace_access(level, &line));
            let mut direct = String::new();
            format_access(&mut direct, level, &line, SystemTime::now());
            assert!(direct.ends_with('\n'), "{direct}");
            assert_eq!(
                without_timestamps(&direct),
                without_timestamps(&traced.text()),
                "{path}"
            );
        }
    }

    /// The quick check agrees with Debug's own quoting for ASCII, at any length (the
    /// vectorised loop handles a tail shorter than its lanes); anything else it leaves to
    /// Debug, which may find it plain too.
    #[test]
    fn plain_means_what_debug_writes_in_quotes() {
        let debug_plain = |s: &str| format!("{s:?}") == format!("\"{s}\"");
        for c in (0u8..=0x7f)
            .map(char::from)
            .chain(['é', '\u{2028}', '\u{feff}'])
        {
            for len in [0, 1, 15, 16, 17, 33, 64] {
                let s = format!("{}{c}", "a".repeat(len));
                if c.is_ascii() {
                    assert_eq!(debug_is_plain(&s), debug_plain(&s), "{s:?}");
                } else {
                    assert!(!debug_is_plain(&s), "{s:?}");
                }
            }
        }
    }

    #[test]
    fn timestamps_are_rfc3339_with_microseconds() {
        let at = |secs: u64, micros: u32| {
            let mut s = String::new();
            let t = UNIX_EPOCH + std::time::Duration::new(secs, micros * 1000 + 999);
            write_timestamp(&mut s, t).unwrap();
            s
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(1_700_000_000, 123_456), "2023-11-14T22:13:20.123456Z");
        assert_eq!(at(1_709_164_799, 7), "2024-02-28T23:59:59.000007Z");
        // The cached second is replaced when the second changes.
        assert_eq!(at(1_709_164_800, 999_999), "2024-02-29T00:00:00.999999Z");
        assert_eq!(at(1_709_164_800, 1), "2024-02-29T00:00:00.000001Z");
    }
}
