//! Inflating a compressed request body (REST's `Content-Encoding`) or message (gRPC's
//! `grpc-encoding`), once all of its compressed bytes are here.
//!
//! Why not as it arrives: a body inflating while a slow client sends it holds its inflated
//! bytes in the budget for bodies for as long as the client takes (a few KiB a second of
//! gzip'd zeros held a thousand times that, and honest clients got 503s for up to
//! `body_read_timeout_ms`). Read first, the wait costs only the compressed bytes.
//!
//! Why not on the async threads: a small body can inflate to the largest one allowed, and
//! inflating hundreds of MiB takes a while. The first `heavy::INLINE_UP_TO` bytes inflate where
//! the request runs (most compressed bodies are small and end there); past it, the rest
//! inflates on the blocking pool, so that a bomb does not hold up the requests that share
//! its thread (`heavy`). It is refused as soon as it passes `max`, without holding what it would
//! become.
//!
//! gzip may hold several members (RFC 1952 2.2; `cat a.gz b.gz`), all of which are the
//! body; bytes after the end of the stream are not, and refuse it rather than vanish.

use std::io::{BufRead, Cursor, Read};

use bytes::Bytes;
use flate2::bufread::{GzDecoder, ZlibDecoder};

use super::heavy;
use crate::body_budget::Reservation;
use crate::error::GatewayError;

/// The codings a body may come in. HTTP's and gRPC's "deflate" is zlib's format (RFC 1950).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Coding {
    Gzip,
    Deflate,
}

impl Coding {
    pub fn name(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Deflate => "deflate",
        }
    }
}

/// Why a body did not inflate; each edge words these its own way.
#[derive(Debug, PartialEq)]
pub enum InflateError {
    /// Not in the coding it claims (the decoder's reason).
    Invalid(String),
    /// It inflates to more than the limit it was given.
    TooLarge,
    /// The budget for bodies has no room for what it inflates to.
    Refused(GatewayError),
}

const CHUNK: usize = 64 << 10;

/// `compressed`, inflated: at most `max` bytes, counted in `held` as they inflate (with the
/// compressed bytes, still held until the end).
pub async fn inflate(
    compressed: Bytes,
    coding: Coding,
    max: usize,
    held: &mut Reservation,
) -> Result<Bytes, InflateError> {
    let Some(mut inflater) = Inflater::start(compressed, coding, max)? else {
        return Ok(Bytes::new());
    };
    if inflater.run(held, heavy::INLINE_UP_TO)? {
        return inflater.finish(held);
    }
    heavy::run(usize::MAX, "inflating", held, move |held| {
        inflater
            .run(held, usize::MAX)
            .and_then(|_| inflater.finish(held))
    })
    .await
    .map_err(InflateError::Refused)?
}

enum Decoder {
    Gzip(GzDecoder<Cursor<Bytes>>),
    Zlib(ZlibDecoder<Cursor<Bytes>>),
}

impl Decoder {
    /// The compressed bytes after the end of the current stream (or member), once it ended.
    fn after_the_end(&self) -> Cursor<Bytes> {
        match self {
            Decoder::Gzip(d) => d.get_ref().clone(),
            Decoder::Zlib(d) => d.get_ref().clone(),
        }
    }

    /// At the end of a stream: done (true), or on to gzip's next member (false); anything
    /// else after the end is refused.
    fn next_member(&mut self) -> Result<bool, InflateError> {
        let mut rest = self.after_the_end();
        let after = rest.fill_buf().map_or(&[][..], |b| b);
        match after {
            [] => Ok(true),
            [0x1f, 0x8b, ..] if matches!(self, Decoder::Gzip(_)) => {
                *self = Decoder::Gzip(GzDecoder::new(rest));
                Ok(false)
            }
            [_] => Err(InflateError::Invalid(
                "1 byte follows the end of the compressed data".into(),
            )),
            _ => Err(InflateError::Invalid(format!(
                "{} bytes follow the end of the compressed data",
                after.len()
            ))),
        }
    }
}

struct Inflater {
    decoder: Decoder,
    compressed_len: usize,
    max: usize,
    out: Vec<u8>,
}

/// `compressed`, inflated all at once where it is called (a fuzz target's and a test's way;
/// requests take `inflate`).
pub fn inflate_now(
    compressed: Bytes,
    coding: Coding,
    max: usize,
    held: &mut Reservation,
) -> Result<Bytes, InflateError> {
    let Some(mut inflater) = Inflater::start(compressed, coding, max)? else {
        return Ok(Bytes::new());
    };
    inflater.run(held, usize::MAX)?;
    inflater.finish(held)
}

impl Inflater {
    /// `None` for an empty body: nothing was sent, so nothing to inflate (some clients mark
    /// even empty bodies).
    fn start(compressed: Bytes, coding: Coding, max: usize) -> Result<Option<Self>, InflateError> {
        if compressed.is_empty() {
            return Ok(None);
        }
        if coding == Coding::Gzip && !compressed.starts_with(&[0x1f, 0x8b]) {
            // Said at once: the decoder would read a short body as a cut-off header.
            return Err(InflateError::Invalid("invalid gzip header".into()));
        }
        Ok(Some(Inflater::new(compressed, coding, max)))
    }

    fn new(compressed: Bytes, coding: Coding, max: usize) -> Self {
        let compressed_len = compressed.len();
        let input = Cursor::new(compressed);
        let decoder = match coding {
            Coding::Gzip => Decoder::Gzip(GzDecoder::new(input)),
            Coding::Deflate => Decoder::Zlib(ZlibDecoder::new(input)),
        };
        Inflater {
            decoder,
            compressed_len,
            max,
            out: Vec::new(),
        }
    }

    /// Inflates until the end (true) or until `until` bytes are out (false).
    fn run(&mut self, held: &mut Reservation, until: usize) -> Result<bool, InflateError> {
        while self.out.len() < until {
            let start = self.out.len();
            // One byte past `max` tells a body of exactly `max` from a larger one.
            let room = (self.max + 1).saturating_sub(start).min(CHUNK);
            held.hold(self.compressed_len + start + room)
                .map_err(InflateError::Refused)?;
            self.out.resize(start + room, 0);
            let n = match &mut self.decoder {
                Decoder::Gzip(d) => d.read(&mut self.out[start..]),
                Decoder::Zlib(d) => d.read(&mut self.out[start..]),
            };
            let n = match n {
                Ok(n) => n,
                Err(e) => return Err(InflateError::Invalid(e.to_string())),
            };
            self.out.truncate(start + n);
            match n {
                0 if room == 0 => return Err(InflateError::TooLarge),
                0 if self.decoder.next_member()? => return Ok(true),
                0 => {}
                _ if self.out.len() > self.max => return Err(InflateError::TooLarge),
                _ => {}
            }
        }
        Ok(false)
    }

    /// The inflated body, once `run` reached its end; the compressed bytes are given back.
    fn finish(self, held: &mut Reservation) -> Result<Bytes, InflateError> {
        let inflated = Bytes::from(self.out);
        held.hold(inflated.len()).map_err(InflateError::Refused)?;
        Ok(inflated)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::body_budget::BodyBudget;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn zlib(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn run(compressed: Vec<u8>, coding: Coding, max: usize) -> Result<Bytes, InflateError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(inflate(
            compressed.into(),
            coding,
            max,
            &mut Reservation::default(),
        ))
    }

    #[test]
    fn both_codings_inflate_small_and_large_bodies() {
        // Large: past the inline part, finished on the blocking pool.
        let large: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        for data in [b"hello".to_vec(), large] {
            assert_eq!(run(gzip(&data), Coding::Gzip, data.len()).unwrap(), data);
            assert_eq!(run(zlib(&data), Coding::Deflate, data.len()).unwrap(), data);
        }
        assert_eq!(run(Vec::new(), Coding::Gzip, 0).unwrap(), Bytes::new());
    }

    #[test]
    fn every_gzip_member_is_the_body() {
        let mut two = gzip(b"first ");
        two.extend(gzip(b"second"));
        assert_eq!(run(two, Coding::Gzip, 100).unwrap(), &b"first second"[..]);
    }

    #[test]
    fn bytes_after_the_stream_are_refused() {
        let with = |mut body: Vec<u8>, after: &[u8]| {
            body.extend_from_slice(after);
            body
        };
        for (body, coding, said) in [
            (with(gzip(b"data"), b"junk"), Coding::Gzip, "4 bytes follow"),
            (
                with(zlib(b"data"), b"junk"),
                Coding::Deflate,
                "4 bytes follow",
            ),
            (with(zlib(b"data"), &[0]), Coding::Deflate, "1 byte follows"),
        ] {
            assert_eq!(
                run(body, coding, 100),
                Err(InflateError::Invalid(format!(
                    "{said} the end of the compressed data"
                )))
            );
        }
    }

    #[test]
    fn not_the_coding_is_invalid() {
        assert_eq!(
            run(b"not gzip".to_vec(), Coding::Gzip, 100),
            Err(InflateError::Invalid("invalid gzip header".into()))
        );
        assert!(matches!(
            run(b"not zlib".to_vec(), Coding::Deflate, 100),
            Err(InflateError::Invalid(_))
        ));
        // Cut short.
        let gz = gzip(&[7u8; 1000]);
        assert!(matches!(
            run(gz[..gz.len() - 6].to_vec(), Coding::Gzip, 10_000),
            Err(InflateError::Invalid(_))
        ));
    }

    #[test]
    fn a_bomb_stops_one_byte_past_the_limit() {
        let bomb = gzip(&vec![0u8; 20 << 20]);
        assert_eq!(
            run(bomb.clone(), Coding::Gzip, 1 << 20),
            Err(InflateError::TooLarge)
        );
        // Exactly at the limit is fine.
        assert_eq!(run(bomb, Coding::Gzip, 20 << 20).unwrap().len(), 20 << 20);
    }

    #[test]
    fn the_budget_holds_compressed_and_inflated_bytes_then_the_inflated_only() {
        let gauge = prometheus::IntGauge::new("held", "held").unwrap();
        let budget = BodyBudget::new(3 << 20, gauge.clone());
        let data = vec![1u8; 2 << 20];
        let gz: Bytes = gzip(&data).into();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let mut held = budget.reserve();
        let out = rt
            .block_on(inflate(gz, Coding::Gzip, 4 << 20, &mut held))
            .unwrap();
        assert_eq!(out.len(), 2 << 20);
        assert_eq!(gauge.get(), 2 << 20);
        drop(held);
        assert_eq!(gauge.get(), 0);
        // With other bodies holding the rest, the budget refuses what it inflates to, and
        // keeps nothing of it.
        let mut other = budget.reserve();
        other.hold(2 << 20).unwrap();
        let mut held = budget.reserve();
        let big: Bytes = gzip(&data).into();
        assert!(matches!(
            rt.block_on(inflate(big, Coding::Gzip, 4 << 20, &mut held)),
            Err(InflateError::Refused(GatewayError::BodiesFull(_)))
        ));
        drop(held);
        assert_eq!(gauge.get(), 2 << 20);
    }
}
