//! `accumulate`: a stateful sequence model. OUTPUT0 is the running sum of INPUT0 over the
//! sequence so far. Like Triton's sequence batcher it needs a sequence id, and a non-start
//! request for a sequence it does not know is rejected. State ends at `sequence_end` or after
//! an idle timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dashmap::DashMap;

use super::{input, metadata, tensor_meta, Model, ModelError};
use crate::protocol::{DataType, InferRequest, ModelMetadata, Parameters, SequenceId, Tensor};

/// Live sequences beyond this are refused rather than letting memory grow without bound.
pub const MAX_SEQUENCES: usize = 1 << 20;

struct State {
    sum: i32,
    last_seen: Instant,
}

pub struct Accumulate {
    meta: ModelMetadata,
    sequences: DashMap<SequenceId, State>,
    idle_timeout: Duration,
    /// Milliseconds since `epoch` of the last sweep of idle sequences.
    last_sweep_ms: AtomicU64,
    epoch: Instant,
}

impl Accumulate {
    pub fn new(idle_timeout: Duration) -> Self {
        let t = || tensor_meta("INPUT0", DataType::Int32, &[1]);
        Accumulate {
            meta: metadata(
                "accumulate",
                vec![t()],
                vec![tensor_meta("OUTPUT0", DataType::Int32, &[1])],
            ),
            sequences: DashMap::new(),
            idle_timeout,
            last_sweep_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    pub fn live_sequences(&self) -> usize {
        self.sequences.len()
    }

    /// Drops idle sequences, at most once per half timeout, from whichever request comes by.
    fn sweep(&self, now: Instant) {
        let now_ms = now.duration_since(self.epoch).as_millis() as u64;
        let last = self.last_sweep_ms.load(Ordering::Relaxed);
        let every = (self.idle_timeout.as_millis() as u64 / 2).max(1);
        if now_ms.saturating_sub(last) < every
            || self
                .last_sweep_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        self.sequences
            .retain(|_, s| now.duration_since(s.last_seen) < self.idle_timeout);
    }
}

fn describe(id: &SequenceId) -> String {
    match id {
        SequenceId::Uint(u) => u.to_string(),
        SequenceId::String(s) => format!("'{s}'"),
    }
}

impl Model for Accumulate {
    fn metadata(&self) -> &ModelMetadata {
        &self.meta
    }

    fn sequence_batching(&self) -> bool {
        true
    }

    fn infer(&self, req: &InferRequest) -> Result<Vec<Tensor>, ModelError> {
        let now = Instant::now();
        self.sweep(now);
        let opts = &req.options;
        let Some(id) = opts.sequence_id.clone() else {
            return Err(ModelError::Invalid(
                "inference request to model 'accumulate' must specify a non-zero or non-empty correlation ID".into(),
            ));
        };
        let x = input(req, "INPUT0")?;
        let value = x
            .data
            .get(..4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .ok_or_else(|| ModelError::Invalid("INPUT0 must hold one INT32".into()))?;
        let sum = if opts.sequence_start {
            if self.sequences.len() >= MAX_SEQUENCES && !self.sequences.contains_key(&id) {
                return Err(ModelError::Invalid(format!(
                    "model 'accumulate' already holds {MAX_SEQUENCES} live sequences"
                )));
            }
            // A START for a sequence in progress ends the old one, as in Triton.
            self.sequences.insert(
                id.clone(),
                State {
                    sum: value,
                    last_seen: now,
                },
            );
            value
        } else {
            let mut state = self.sequences.get_mut(&id).filter(|s| now.duration_since(s.last_seen) < self.idle_timeout).ok_or_else(|| {
                ModelError::Invalid(format!(
                    "inference request for sequence {} to model 'accumulate' must specify the START flag on the first request of the sequence",
                    describe(&id)
                ))
            })?;
            state.sum = state.sum.wrapping_add(value);
            state.last_seen = now;
            state.sum
        };
        if opts.sequence_end {
            self.sequences.remove(&id);
        }
        Ok(vec![Tensor {
            name: "OUTPUT0".into(),
            datatype: DataType::Int32,
            shape: vec![1],
            parameters: Parameters::new(),
            data: Bytes::copy_from_slice(&sum.to_le_bytes()),
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{ParamValue, RequestOptions};

    fn req(id: Option<u64>, start: bool, end: bool, v: i32) -> InferRequest {
        let mut p = Parameters::new();
        if let Some(id) = id {
            p.set("sequence_id", ParamValue::Uint(id));
        }
        if start {
            p.set("sequence_start", ParamValue::Bool(true));
        }
        if end {
            p.set("sequence_end", ParamValue::Bool(true));
        }
        InferRequest {
            id: None,
            options: RequestOptions::from_parameters(&p).unwrap(),
            parameters: p,
            inputs: vec![Tensor {
                name: "INPUT0".into(),
                datatype: DataType::Int32,
                shape: vec![1],
                parameters: Parameters::new(),
                data: Bytes::copy_from_slice(&v.to_le_bytes()),
            }],
            outputs: None,
        }
    }

    fn run(m: &Accumulate, r: InferRequest) -> Result<i32, String> {
        m.infer(&r)
            .map(|o| i32::from_le_bytes(o[0].data[..4].try_into().unwrap()))
            .map_err(|e| e.message().to_string())
    }

    #[test]
    fn sums_over_a_sequence_and_forgets_it_at_the_end() {
        let m = Accumulate::new(Duration::from_secs(60));
        assert_eq!(run(&m, req(Some(7), true, false, 3)), Ok(3));
        assert_eq!(run(&m, req(Some(7), false, false, 4)), Ok(7));
        assert_eq!(run(&m, req(Some(8), true, false, 1)), Ok(1));
        assert_eq!(run(&m, req(Some(7), false, true, 5)), Ok(12));
        assert_eq!(m.live_sequences(), 1);
        assert_eq!(
            run(&m, req(Some(7), false, false, 1)),
            Err("inference request for sequence 7 to model 'accumulate' must specify the START flag on the first request of the sequence".into())
        );
        assert_eq!(
            run(&m, req(None, false, false, 1)),
            Err("inference request to model 'accumulate' must specify a non-zero or non-empty correlation ID".into())
        );
    }

    #[test]
    fn idle_sequences_expire() {
        let m = Accumulate::new(Duration::from_millis(20));
        assert_eq!(run(&m, req(Some(1), true, false, 3)), Ok(3));
        std::thread::sleep(Duration::from_millis(40));
        assert!(run(&m, req(Some(1), false, false, 1)).is_err());
        assert_eq!(m.live_sequences(), 0);
    }
}
