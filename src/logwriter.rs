//! Log lines, an access-log line per request among them, written in batches: a request's
//! thread appends its line to a shared buffer (an uncontended lock, no system call), and a
//! writer thread of its own writes the buffer to stderr every `FLUSH_EVERY`, or at once when
//! it holds `FLUSH_AT` bytes. A line-per-write logger costs a `write` per request; a
//! channel-per-line one (tracing-appender) costs a wake-up of its thread per request, which
//! on a gateway pinned to one core competes with the requests themselves.
//!
//! When stderr stalls (a log collector that stopped reading) and the buffer reaches
//! `DROP_AT`, further lines are dropped and counted, never waited for: a thread that waited
//! on stderr would hold every request on it, health probes and /metrics included, and a
//! stalled log pipeline would take every replica down. Once stderr drains, the next batch
//! starts with a line that says how many were dropped (and `tensorgate_log_lines_dropped_total`
//! counts them). What the buffer holds is written when the guard is dropped (the end of
//! `main`), and at most one `FLUSH_EVERY` of lines is lost if the process is killed.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub const FLUSH_EVERY: Duration = Duration::from_millis(100);
const FLUSH_AT: usize = 64 << 10;
const DROP_AT: usize = 8 << 20;

/// Lines dropped since the process started, for the metrics.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Log lines dropped so far because stderr did not keep up.
pub fn dropped_lines() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

#[derive(Default)]
struct State {
    buf: Vec<u8>,
    stopping: bool,
    /// Dropped since the last line that said so.
    unreported: u64,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

/// The `MakeWriter` for tracing-subscriber.
#[derive(Clone)]
pub struct BatchedStderr {
    shared: Arc<Shared>,
}

/// Flushes and stops the writer thread when dropped.
pub struct FlushGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

pub fn batched_stderr() -> (BatchedStderr, FlushGuard) {
    batched(std::io::stderr())
}

fn batched<W: Write + Send + 'static>(mut out: W) -> (BatchedStderr, FlushGuard) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State::default()),
        wake: Condvar::new(),
    });
    let worker = shared.clone();
    let thread = std::thread::Builder::new()
        .name("tensorgate-log".into())
        .spawn(move || loop {
            let (chunk, stopping) = {
                let state = worker.state.lock().unwrap_or_else(|e| e.into_inner());
                let (mut state, _) = worker
                    .wake
                    .wait_timeout_while(state, FLUSH_EVERY, |s| {
                        !s.stopping && s.buf.len() < FLUSH_AT
                    })
                    .unwrap_or_else(|e| e.into_inner());
                let mut chunk = std::mem::take(&mut state.buf);
                if state.unreported > 0 {
                    let note = format!(
                        "tensorgate: {} log lines were dropped: stderr did not keep up\n",
                        std::mem::take(&mut state.unreported)
                    );
                    chunk.splice(0..0, note.into_bytes());
                }
                (chunk, state.stopping)
            };
            if !chunk.is_empty() {
                let _ = out.write_all(&chunk);
                let _ = out.flush();
            }
            if stopping {
                return;
            }
        })
        .expect("spawn the log writer thread");
    (
        BatchedStderr {
            shared: shared.clone(),
        },
        FlushGuard {
            shared,
            thread: Some(thread),
        },
    )
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stopping = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One event's text, handed to the shared buffer when the event is done.
pub struct Line {
    shared: Arc<Shared>,
    text: Vec<u8>,
}

impl Write for Line {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.text.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        self.shared.push(&self.text);
    }
}

impl Shared {
    /// Adds one line (or several, whole) to what the writer thread writes next.
    fn push(&self, text: &[u8]) {
        if text.is_empty() {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.stopping {
            // The writer is gone (the process is ending): write here.
            drop(state);
            let _ = std::io::stderr().write_all(text);
            return;
        }
        if state.buf.len() >= DROP_AT {
            state.unreported += 1;
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        state.buf.extend_from_slice(text);
        let full = state.buf.len() >= FLUSH_AT;
        drop(state);
        if full {
            self.wake.notify_one();
        }
    }
}

impl BatchedStderr {
    /// A line built elsewhere (the access line, `logformat::write_access`), copied once into
    /// the batch: no `Line` and its buffer per event.
    pub fn write_line(&self, text: &[u8]) {
        self.shared.push(text);
    }

    /// Writes what is batched to stderr now, from the calling thread: for a panic's line,
    /// which must not wait for the writer thread (an abort may follow it). Skipped if the
    /// batch is locked (the writer thread itself panicking with it held).
    pub fn flush_now(&self) {
        let Ok(mut state) = self.shared.state.try_lock() else {
            return;
        };
        let chunk = std::mem::take(&mut state.buf);
        drop(state);
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(&chunk);
        let _ = err.flush();
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for BatchedStderr {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line {
            shared: self.shared.clone(),
            text: Vec::with_capacity(256),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn line(w: &BatchedStderr, text: &str) {
        use tracing_subscriber::fmt::MakeWriter;
        let mut l = w.make_writer();
        l.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn lines_arrive_in_order_within_a_flush_interval_and_all_at_the_end() {
        let sink = Sink::default();
        let (w, guard) = batched(sink.clone());
        line(&w, "a\n");
        line(&w, "b\n");
        let deadline = std::time::Instant::now() + FLUSH_EVERY * 20;
        while sink.0.lock().unwrap().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(FLUSH_EVERY / 4);
        }
        assert_eq!(&*sink.0.lock().unwrap(), b"a\nb\n");
        for i in 0..1000 {
            line(&w, &format!("{i}\n"));
        }
        drop(guard);
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let expected: String = ["a\n", "b\n"]
            .into_iter()
            .map(String::from)
            .chain((0..1000).map(|i| format!("{i}\n")))
            .collect();
        assert_eq!(text, expected);
    }

    /// A stderr that stops draining costs lines, not waits: the thread that logs never
    /// blocks, and once stderr drains the first line says how many were dropped.
    #[test]
    fn a_stalled_stderr_drops_lines_and_says_so() {
        /// Blocks every write until opened; says when a write is waiting.
        #[derive(Clone)]
        struct Stalled(Sink, Arc<(Mutex<(bool, bool)>, Condvar)>);
        impl Write for Stalled {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                let (state, cv) = &*self.1;
                let mut state = state.lock().unwrap();
                state.1 = true;
                cv.notify_all();
                while !state.0 {
                    state = cv.wait(state).unwrap();
                }
                self.0.write(b)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let gate = Arc::new((Mutex::new((false, false)), Condvar::new()));
        let (w, guard) = batched(Stalled(sink.clone(), gate.clone()));
        // First the writer gets stuck on one line.
        line(&w, "first\n");
        {
            let (state, cv) = &*gate;
            let state = state.lock().unwrap();
            let (state, _) = cv
                .wait_timeout_while(state, Duration::from_secs(20), |s| !s.1)
                .unwrap();
            assert!(state.1, "the writer is stuck in a write");
        }
        let before = dropped_lines();
        let text = "x".repeat(1023) + "\n";
        // 12 MiB of lines against a buffer that keeps 8 MiB.
        for _ in 0..12 * 1024 {
            line(&w, &text);
        }
        let dropped = dropped_lines() - before;
        assert_eq!(dropped, 4 * 1024);
        gate.0.lock().unwrap().0 = true;
        gate.1.notify_all();
        // Once the writer has taken the buffer, lines are kept again.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while w.shared.state.lock().unwrap().buf.len() >= DROP_AT
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(FLUSH_EVERY / 4);
        }
        line(&w, "after\n");
        drop(guard);
        let out = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let note = format!(
            "first\ntensorgate: {dropped} log lines were dropped: stderr did not keep up\n"
        );
        assert!(out.starts_with(&note), "{}", &out[..100.min(out.len())]);
        assert!(out.ends_with("after\n"));
        assert_eq!(out.matches(&text).count(), 8 * 1024);
    }
}
