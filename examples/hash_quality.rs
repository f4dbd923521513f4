//! Measures the sequence hash the gateway uses (`routing::table::SequenceTable` at the
//! default `fleet.hash_table_size`, keyed by `routing::sequence_key`) against issue 4's
//! targets:
//!
//! - keys moved when one of N backends joins or leaves: at most 1.2/N, reported as the moved
//!   share times N (1.0 is the minimum any consistent hash can do; N is the larger of the two
//!   memberships, so a join is N-1 → N and a leave N → N-1);
//! - max/mean load over 1M keys at N = 100: at most 1.05. Also the max/mean of table slots
//!   per backend, the same balance without the sampling noise of the keys.
//!
//! Run: `cargo run --release --example hash_quality [--check] [TABLE_SIZE]`. Prints one JSON
//! object per line (see `bench/render.py`, which turns them into tables of BENCHMARKS.md),
//! each saying whether its target was met; with `--check` it exits 1 if one was missed.

use std::time::Instant;

use serde_json::json;
use tensorgate::config::FleetConfig;
use tensorgate::protocol::SequenceId;
use tensorgate::routing::sequence_key;
use tensorgate::routing::table::{is_valid_table_size, SequenceTable};

const KEYS: u64 = 1_000_000;
/// Joins and leaves measured per N, each with another backend joining or leaving.
const TRIALS: usize = 5;
const MOVED_TARGET: f64 = 1.2;
const BALANCE_TARGET: f64 = 1.05;
/// The fleet size the balance target is stated for.
const BALANCE_TARGET_N: usize = 100;

fn member(i: usize) -> String {
    format!(
        "http://10.{}.{}.{}:8000",
        i / 62_500,
        (i / 250) % 250,
        i % 250
    )
}

fn weighted(members: &[String]) -> Vec<(&str, u32)> {
    members.iter().map(|m| (m.as_str(), 1)).collect()
}

fn build(members: &[String], size: usize) -> SequenceTable {
    SequenceTable::new(&weighted(members), size)
}

/// The table after a membership change, updated from the one before, as the gateway does
/// (the unit tests check that this equals a full build).
fn derive(before: &SequenceTable, members: &[String], size: usize) -> SequenceTable {
    SequenceTable::derive(before, &weighted(members), size)
}

/// The sequence keys of `accumulate` sequences 1..=KEYS, as the router computes them.
fn keys() -> Vec<u64> {
    (1..=KEYS)
        .map(|id| sequence_key("accumulate", &SequenceId::Uint(id)))
        .collect()
}

/// Owner (as a member name) of every key.
fn owners<'a>(table: &SequenceTable, members: &'a [String], keys: &[u64]) -> Vec<&'a str> {
    keys.iter()
        .map(|k| members[table.lookup(*k).expect("a non-empty table")].as_str())
        .collect()
}

fn moved_share(before: &[&str], after: &[&str]) -> f64 {
    let moved = before.iter().zip(after).filter(|(a, b)| a != b).count();
    moved as f64 / before.len() as f64
}

/// Leaves (N → N-1) of different members, and joins (N-1 → N) of a new member to what was
/// left; moved share × N of each. One full build; every change is derived from it.
fn movement(n: usize, size: usize, keys: &[u64]) -> (Vec<f64>, Vec<f64>) {
    let full: Vec<String> = (0..n).map(member).collect();
    let full_table = build(&full, size);
    let full_owners = owners(&full_table, &full, keys);
    let (mut joins, mut leaves) = (Vec::new(), Vec::new());
    for t in 0..TRIALS {
        // Spread the member that changes over the fleet.
        let gone = (t * n) / TRIALS;
        let fewer: Vec<String> = full
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != gone)
            .map(|(_, m)| m.clone())
            .collect();
        let fewer_table = derive(&full_table, &fewer, size);
        let fewer_owners = owners(&fewer_table, &fewer, keys);
        leaves.push(moved_share(&full_owners, &fewer_owners) * n as f64);

        let mut joined = fewer.clone();
        joined.push(member(n + 1000 + t));
        let joined_owners = owners(&derive(&fewer_table, &joined, size), &joined, keys);
        joins.push(moved_share(&fewer_owners, &joined_owners) * n as f64);
    }
    (joins, leaves)
}

/// Max/mean of keys per member, and of table slots per member.
fn balance(n: usize, size: usize, keys: &[u64]) -> (f64, f64) {
    let members: Vec<String> = (0..n).map(member).collect();
    let table = build(&members, size);
    let mut load = vec![0u64; n];
    for k in keys {
        load[table.lookup(*k).expect("a non-empty table")] += 1;
    }
    let keys_ratio = *load.iter().max().unwrap() as f64 / (keys.len() as f64 / n as f64);
    // The smallest key that lands on each slot (lookup maps key k to k·size / 2^64).
    let mut slots = vec![0u64; n];
    for s in 0..size as u128 {
        let key = ((s << 64).div_ceil(size as u128)) as u64;
        slots[table.lookup(key).expect("a non-empty table")] += 1;
    }
    let slots_ratio = *slots.iter().max().unwrap() as f64 / (size as f64 / n as f64);
    (keys_ratio, slots_ratio)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::MIN, f64::max)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let check = args.iter().any(|a| a == "--check");
    // Another table size can be tried as an argument; the bench uses the default.
    let size = match args.iter().find(|a| *a != "--check") {
        Some(arg) => {
            let size: usize = arg.parse().expect("a table size");
            assert!(
                is_valid_table_size(size),
                "{size} is not a valid fleet.hash_table_size"
            );
            size
        }
        None => FleetConfig::default().hash_table_size,
    };
    let keys = keys();
    let mut all_met = true;
    for n in [10usize, 100, 1000] {
        let started = Instant::now();
        let (joins, leaves) = movement(n, size, &keys);
        for (op, ratios) in [("join", &joins), ("leave", &leaves)] {
            let met = max(ratios) <= MOVED_TARGET;
            all_met &= met;
            println!(
                "{}",
                json!({
                    "metric": "moved",
                    "op": op,
                    "n": n,
                    "table_size": size,
                    "keys": KEYS,
                    "trials": TRIALS,
                    "moved_times_n_mean": mean(ratios),
                    "moved_times_n_max": max(ratios),
                    "target": MOVED_TARGET,
                    "met": met,
                })
            );
        }
        let (keys_ratio, slots_ratio) = balance(n, size, &keys);
        let target = (n == BALANCE_TARGET_N).then_some(BALANCE_TARGET);
        let met = target.map(|t| keys_ratio <= t);
        all_met &= met.unwrap_or(true);
        println!(
            "{}",
            json!({
                "metric": "balance",
                "n": n,
                "table_size": size,
                "keys": KEYS,
                "keys_max_over_mean": keys_ratio,
                "slots_max_over_mean": slots_ratio,
                "target": target,
                "met": met,
            })
        );
        eprintln!("N = {n}: {:.1} s", started.elapsed().as_secs_f64());
    }
    if !all_met {
        eprintln!("hash_quality: a measurement missed its target");
        if check {
            std::process::exit(1);
        }
    }
}
