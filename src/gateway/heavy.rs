//! CPU-bound work of one request (decoding a large body or message, inflating one) goes to
//! the blocking pool when it is large, so that the requests sharing its async thread, health
//! probes among them, do not wait behind it; small work runs in place, where the hop would
//! cost more than the work.

use crate::body_budget::Reservation;
use crate::error::GatewayError;

/// Bytes of input past which work is done on the blocking pool.
pub const INLINE_UP_TO: usize = 256 << 10;

/// `work(held)`, in place unless `size` (what it reads) is past `INLINE_UP_TO`. `what` names
/// it should the blocking task fail (a panic in it). Work moved to the blocking pool keeps
/// the request's reservation (`Reservation::keep`) until it ends: it runs on if the request
/// is cancelled, and so does the memory it holds.
pub async fn run<T: Send + 'static>(
    size: usize,
    what: &'static str,
    held: &mut Reservation,
    work: impl FnOnce(&mut Reservation) -> T + Send + 'static,
) -> Result<T, GatewayError> {
    if size <= INLINE_UP_TO {
        return Ok(work(held));
    }
    let mut kept = held.keep();
    tokio::task::spawn_blocking(move || work(&mut kept))
        .await
        .map_err(|e| GatewayError::Internal(format!("{what} failed: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn small_work_runs_in_place_and_large_work_elsewhere() {
        let here = std::thread::current().id();
        let held = &mut Reservation::default();
        let small = run(10, "small", held, move |_| std::thread::current().id()).await;
        assert_eq!(small.unwrap(), here);
        let large = run(INLINE_UP_TO + 1, "large", held, move |_| {
            std::thread::current().id()
        })
        .await;
        assert_ne!(large.unwrap(), here);
        let failed = run(INLINE_UP_TO + 1, "decoding", held, |_| panic!("a bug")).await;
        assert!(
            matches!(failed, Err(GatewayError::Internal(m)) if m.starts_with("decoding failed: "))
        );
    }

    /// A request cancelled while its work runs on the blocking pool gives its budget back
    /// only when that work ends.
    #[tokio::test(flavor = "current_thread")]
    async fn cancelled_work_holds_its_reservation_until_it_ends() {
        use crate::body_budget::BodyBudget;
        let gauge = prometheus::IntGauge::new("held", "held").unwrap();
        let budget = BodyBudget::new(100, gauge.clone());
        let (started_tx, started) = std::sync::mpsc::channel();
        let (finish, finish_rx) = std::sync::mpsc::channel::<()>();
        let mut held = budget.reserve();
        held.hold(70).unwrap();
        let work = run(INLINE_UP_TO + 1, "decoding", &mut held, move |held| {
            started_tx.send(()).unwrap();
            finish_rx.recv().unwrap();
            held.hold(90).unwrap();
        });
        // The request is cancelled once its work has begun: its future and its own
        // reservation are dropped.
        tokio::select! {
            _ = work => unreachable!("the work waits for `finish`"),
            _ = tokio::task::spawn_blocking(move || started.recv().unwrap()) => {}
        }
        drop(held);
        assert_eq!(gauge.get(), 70);
        assert!(matches!(
            budget.reserve().hold(31),
            Err(GatewayError::BodiesFull(_))
        ));
        finish.send(()).unwrap();
        // Given back once the work has ended (bounded: 10 s).
        for _ in 0..1000 {
            if gauge.get() == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(gauge.get(), 0);
    }
}
