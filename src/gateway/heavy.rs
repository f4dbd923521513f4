//! CPU-bound work of one request (decoding a large body or message, inflating one) goes to
//! the blocking pool when it is large, so that the requests sharing its async thread, health
//! probes among them, do not wait behind it; small work runs in place, where the hop would
//! cost more than the work.

use crate::error::GatewayError;

/// Bytes of input past which work is done on the blocking pool.
pub const INLINE_UP_TO: usize = 256 << 10;

/// `work()`, in place unless `size` (what it reads) is past `INLINE_UP_TO`. `what` names it
/// should the blocking task fail (a panic in it).
pub async fn run<T: Send + 'static>(
    size: usize,
    what: &'static str,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, GatewayError> {
    if size <= INLINE_UP_TO {
        return Ok(work());
    }
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| GatewayError::Internal(format!("{what} failed: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn small_work_runs_in_place_and_large_work_elsewhere() {
        let here = std::thread::current().id();
        let small = run(10, "small", move || std::thread::current().id()).await;
        assert_eq!(small.unwrap(), here);
        let large = run(INLINE_UP_TO + 1, "large", move || {
            std::thread::current().id()
        })
        .await;
        assert_ne!(large.unwrap(), here);
        let failed = run(INLINE_UP_TO + 1, "decoding", || panic!("a bug")).await;
        assert!(
            matches!(failed, Err(GatewayError::Internal(m)) if m.starts_with("decoding failed: "))
        );
    }
}
