//! The JSON tensor-data scanner: never a panic, and counting agrees with parsing.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tensorgate::protocol::rest::json_data::{count_elements, parse_data};
use tensorgate::protocol::DataType;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, text)) = data.split_first() else {
        return;
    };
    let dt = DataType::ALL[sel as usize % DataType::ALL.len()];
    let counted = count_elements(text, 16);
    if let Ok((bytes, n)) = parse_data(text, dt, 16, 1 << 16) {
        assert_eq!(counted.as_ref().ok(), Some(&n), "count and parse disagree");
        if let Some(size) = dt.fixed_size() {
            assert_eq!(bytes.len() as u64, n * size as u64);
        }
    }
});
