//! One bound, across every request, on the request bodies held in memory
//! (`limits.max_buffered_body_bytes`). `max_body_bytes` bounds one body and
//! `max_concurrent_requests` how many are handled, but their product (256 GiB by default) is
//! no bound at all: many clients sending large tensors at once, or small compressed bodies
//! that inflate to the limit, would get the process killed for memory, and with it every
//! other request. With the budget spent, a body that needs more is refused with 503 and
//! `Retry-After` (UNAVAILABLE over gRPC), as shedding is, and the bodies already here finish.
//!
//! A body's bytes are counted as they arrive (a compressed one's inflated bytes beside its
//! compressed ones while it inflates), with the tensors it decodes to beside them once they
//! are known (`hold_decoded`), and stay counted until its request is answered and the work
//! done on them has ended (a decode or a model's run on the blocking pool, which goes on
//! when its client cancels); a gRPC stream's message, from when it is whole until its
//! answer. Lengths are counted, not the buffers' capacity, so that a budget of
//! `max_body_bytes` holds one largest binary body.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use prometheus::IntGauge;

use crate::error::GatewayError;

pub struct BodyBudget {
    limit: usize,
    held: AtomicUsize,
    gauge: IntGauge,
}

impl BodyBudget {
    pub fn new(limit: usize, gauge: IntGauge) -> Arc<Self> {
        gauge.set(0);
        Arc::new(BodyBudget {
            limit,
            held: AtomicUsize::new(0),
            gauge,
        })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A reservation of nothing yet, for one body.
    pub fn reserve(self: &Arc<Self>) -> Reservation {
        Reservation(Some(Arc::new(Held {
            budget: self.clone(),
            bytes: AtomicUsize::new(0),
        })))
    }

    fn take(&self, more: usize) -> bool {
        let taken = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(more).filter(|&total| total <= self.limit)
            })
            .is_ok();
        if taken {
            self.gauge.add(more as i64);
        }
        taken
    }

    fn give_back(&self, less: usize) {
        self.held.fetch_sub(less, Ordering::AcqRel);
        self.gauge.sub(less as i64);
    }
}

/// The part of the budget one body holds; given back when the last of its holders is
/// dropped (`keep`).
#[derive(Default)]
pub struct Reservation(
    /// `None`: counts nothing (a caller without a gateway, such as a unit test).
    Option<Arc<Held>>,
);

struct Held {
    budget: Arc<BodyBudget>,
    bytes: AtomicUsize,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.give_back(*self.bytes.get_mut());
    }
}

impl Reservation {
    /// The whole budget's size; `None` for a reservation without one.
    pub fn limit(&self) -> Option<usize> {
        self.0.as_ref().map(|h| h.budget.limit)
    }

    /// Another holder of the same bytes, for work that may outlive the request: a decode on
    /// the blocking pool or a model's run goes on after its client cancels or its deadline
    /// passes, and what it holds must stay counted until it ends, or cancelled requests
    /// could hold any multiple of the budget. One holder at a time changes the amount
    /// (`hold`): the request, or the work it waits for.
    pub fn keep(&self) -> Reservation {
        Reservation(self.0.clone())
    }

    /// Holds `total` bytes for this body from now on (more or fewer than before). Fails,
    /// holding what it held, when the budget has not the difference left: 503 while other
    /// bodies hold it, 413 for a body that the whole budget could never hold.
    pub fn hold(&mut self, total: usize) -> Result<(), GatewayError> {
        let Some(held) = &self.0 else {
            return Ok(());
        };
        let budget = &held.budget;
        if total > budget.limit {
            return Err(GatewayError::PayloadTooLarge(format!(
                "the request body is larger than the {} bytes all request bodies may hold at once (limits.max_buffered_body_bytes)",
                budget.limit
            )));
        }
        // One holder changes the amount at a time today; the exchange keeps the count
        // right should two ever race (each takes its difference, and a loser gives it back).
        loop {
            let now = held.bytes.load(Ordering::Acquire);
            if total > now && !budget.take(total - now) {
                return Err(GatewayError::BodiesFull(format!(
                    "tensorgate holds its limit of {} bytes of request bodies (limits.max_buffered_body_bytes); retry later",
                    budget.limit
                )));
            }
            match held
                .bytes
                .compare_exchange(now, total, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if total < now {
                        budget.give_back(now - total);
                    }
                    return Ok(());
                }
                Err(_) if total > now => budget.give_back(total - now),
                Err(_) => {}
            }
        }
    }

    /// `hold(total)` for `what` (the request, the request message) once decoded, with the
    /// 413 saying so: the body itself fitted, what it decodes to does not.
    pub fn hold_decoded(&mut self, total: usize, what: &str) -> Result<(), GatewayError> {
        if let Some(limit) = self.limit().filter(|&limit| total > limit) {
            return Err(GatewayError::PayloadTooLarge(format!(
                "the {what} decodes to {total} bytes, more than the {limit} bytes all request bodies may hold at once (limits.max_buffered_body_bytes)"
            )));
        }
        self.hold(total)
    }
}

/// `limits.max_buffered_body_bytes`, or (0) half the memory this process may use (its
/// cgroup's limit, else the machine's), and never less than one largest body.
pub fn budget_limit(configured: usize, max_body: usize) -> usize {
    if configured > 0 {
        return configured;
    }
    let half = memory_available().map_or(usize::MAX, |m| (m / 2) as usize);
    half.max(max_body)
}

fn memory_available() -> Option<u64> {
    let machine = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_total(&text));
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|text| cgroup_limit(&text, |path| std::fs::read_to_string(path).ok()));
    match (cgroup, machine) {
        (Some(c), Some(m)) => Some(c.min(m)),
        (c, m) => c.or(m),
    }
}

/// The smallest memory limit on the way from this process's cgroup up to the root: a
/// container's own, a systemd unit's `MemoryMax=`, or a parent slice's. cgroup v2 (the
/// `0::` line), else v1's memory controller; "max" (v2) and v1's huge "no limit" are none.
fn cgroup_limit(proc_self_cgroup: &str, read: impl Fn(&str) -> Option<String>) -> Option<u64> {
    let (root, file, path) = proc_self_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.is_empty() {
            Some(("/sys/fs/cgroup", "memory.max", path))
        } else if controllers.split(',').any(|c| c == "memory") {
            Some(("/sys/fs/cgroup/memory", "memory.limit_in_bytes", path))
        } else {
            None
        }
    })?;
    // "/a/b", "/a", "" (the root): every cgroup on the way up.
    let mut dir = path.trim_end_matches('/');
    let mut dirs = vec![dir];
    while let Some(cut) = dir.rfind('/') {
        dir = &dir[..cut];
        dirs.push(dir);
    }
    dirs.into_iter()
        .filter_map(|d| read(&format!("{root}{d}/{file}")))
        .filter_map(|text| text.trim().parse::<u64>().ok())
        .filter(|&n| n < (1 << 60))
        .min()
}

fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(limit: usize) -> Arc<BodyBudget> {
        BodyBudget::new(limit, IntGauge::new("held", "held").unwrap())
    }

    #[test]
    fn bodies_share_the_budget_and_give_it_back() {
        let b = budget(100);
        let mut one = b.reserve();
        let mut two = b.reserve();
        one.hold(60).unwrap();
        let refused = two.hold(41).unwrap_err();
        assert_eq!(
            refused,
            GatewayError::BodiesFull(
                "tensorgate holds its limit of 100 bytes of request bodies (limits.max_buffered_body_bytes); retry later".into()
            )
        );
        assert_eq!(refused.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        // A body the whole budget could never hold is the client's: 413, not a retry.
        assert_eq!(
            b.reserve().hold(101).unwrap_err(),
            GatewayError::PayloadTooLarge(
                "the request body is larger than the 100 bytes all request bodies may hold at once (limits.max_buffered_body_bytes)".into()
            )
        );
        two.hold(40).unwrap();
        assert_eq!(b.gauge.get(), 100);
        // A body that shrinks (a message handed on) gives back the difference.
        one.hold(10).unwrap();
        assert_eq!(b.gauge.get(), 50);
        drop(one);
        drop(two);
        assert_eq!(b.held.load(Ordering::Acquire), 0);
        assert_eq!(b.gauge.get(), 0);
        assert!(b.reserve().hold(100).is_ok());
    }

    #[test]
    fn work_that_keeps_a_reservation_holds_it_past_its_request() {
        let b = budget(100);
        let mut request = b.reserve();
        request.hold(60).unwrap();
        let mut work = request.keep();
        // The request is cancelled; its work goes on, and its bytes stay counted.
        drop(request);
        assert_eq!(b.gauge.get(), 60);
        assert!(matches!(
            b.reserve().hold(41),
            Err(GatewayError::BodiesFull(_))
        ));
        // What the work holds from then on is what is counted, until it ends too.
        work.hold(80).unwrap();
        assert_eq!(b.gauge.get(), 80);
        drop(work);
        assert_eq!(b.held.load(Ordering::Acquire), 0);
        assert_eq!(b.gauge.get(), 0);
    }

    #[test]
    fn a_reservation_without_a_budget_counts_nothing() {
        assert!(Reservation::default().hold(usize::MAX).is_ok());
    }

    #[test]
    fn the_cgroup_limit_is_the_smallest_on_the_way_up() {
        let files = |map: &'static [(&'static str, &'static str)]| {
            move |path: &str| {
                map.iter()
                    .find(|(p, _)| *p == path)
                    .map(|(_, v)| v.to_string())
            }
        };
        // A systemd unit under a slice with a tighter limit; the root has none.
        let v2 = files(&[
            (
                "/sys/fs/cgroup/system.slice/tg.service/memory.max",
                "2147483648\n",
            ),
            ("/sys/fs/cgroup/system.slice/memory.max", "1073741824\n"),
            ("/sys/fs/cgroup/memory.max", "max\n"),
        ]);
        assert_eq!(
            cgroup_limit("0::/system.slice/tg.service\n", v2),
            Some(1 << 30)
        );
        // Inside a container's namespace: the path is "/", the limit at the root.
        let container = files(&[("/sys/fs/cgroup/memory.max", "536870912\n")]);
        assert_eq!(cgroup_limit("0::/\n", container), Some(512 << 20));
        // v1: the memory controller's line; its "no limit" is a huge number.
        let v1 = files(&[
            (
                "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            (
                "/sys/fs/cgroup/memory/docker/memory.limit_in_bytes",
                "268435456\n",
            ),
        ]);
        assert_eq!(
            cgroup_limit("12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n", v1),
            Some(256 << 20)
        );
        assert_eq!(cgroup_limit("0::/\n", files(&[])), None);
    }

    #[test]
    fn the_default_is_half_the_memory_and_at_least_one_body() {
        assert_eq!(budget_limit(123, 1 << 30), 123);
        let auto = budget_limit(0, 1);
        let total = mem_total(&std::fs::read_to_string("/proc/meminfo").unwrap()).unwrap();
        assert!(auto as u64 <= total / 2 && auto > 0, "{auto}");
        assert_eq!(budget_limit(0, usize::MAX), usize::MAX);
        assert_eq!(
            mem_total("MemFree: 5 kB\nMemTotal:       16384 kB\n"),
            Some(16 << 20)
        );
    }
}
