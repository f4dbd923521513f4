//! config.pbtxt, as the model repository reads it (a user's file, or one a load request makes
//! it read again): never a panic, and a config that parses names the fields it ignores.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tensorgate::models::repository::config::parse;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = parse(text) {
        assert!(config.inputs.iter().all(|i| !i.tensor.name.is_empty()));
        assert!(config.instances.is_none_or(|n| n >= 1));
    }
});
