//! Any bytes as a gzip or deflate request body: inflating never panics, never gives more
//! than its limit, and a body that inflates is what the reference decoder reads from it.
#![no_main]

use std::io::Read;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use tensorgate::body_budget::Reservation;
use tensorgate::gateway::inflate::{inflate_now, Coding};

const MAX: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the coding; the rest is the body.
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let coding = if pick & 1 == 0 {
        Coding::Gzip
    } else {
        Coding::Deflate
    };
    let Ok(inflated) = inflate_now(
        Bytes::copy_from_slice(body),
        coding,
        MAX,
        &mut Reservation::default(),
    ) else {
        return;
    };
    assert!(inflated.len() <= MAX);
    let mut expected = Vec::new();
    let read = match coding {
        Coding::Gzip => flate2::read::MultiGzDecoder::new(body).read_to_end(&mut expected),
        Coding::Deflate => flate2::read::ZlibDecoder::new(body).read_to_end(&mut expected),
    };
    if !body.is_empty() {
        read.expect("the reference decoder reads what inflated");
        assert_eq!(&inflated[..], &expected[..]);
    }
});
