//! Maglev consistent hashing (Eisenbud et al., NSDI 2016): a lookup table of prime size in
//! which each backend claims slots along its own permutation, in turn. Lookups are one hash
//! and one array read; the table is rebuilt when membership changes.
//!
//! Why Maglev: see docs/ARCHITECTURE.md ("Choosing the hash"). In short, lookups are O(1)
//! (rendezvous hashing is O(n): microseconds at 1,000 backends), balance is within a slot
//! per backend, and movement on a join or leave stays close to the 1/N minimum.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The default table size (`fleet.hash_table_size`), a prime. The size is fixed rather
/// than grown with the fleet: a table of another size is a different table, so crossing a
/// size step would move nearly every key at once. Maglev moves more keys than the 1/N
/// minimum on a join when slots per member are few (measured at N = 100: 1.64/N at 655 slots
/// per member, 1.29/N at 2,621, 1.10/N at 10,485), and balance is within one slot per
/// member; 1,048,573 slots (2 MiB, one table per distinct set of backends) keep both close to
/// ideal up to a few hundred backends.
pub const DEFAULT_TABLE_SIZE: usize = 1_048_573;
/// Bounds of `fleet.hash_table_size`.
pub const MIN_TABLE_SIZE: usize = 1_009;
pub const MAX_TABLE_SIZE: usize = 16_777_213;
pub const MAX_MEMBERS: usize = u16::MAX as usize - 1;
const OFFSET_SEED: u64 = 0x6d61_676c_6576_3031;
const SKIP_SEED: u64 = 0x6d61_676c_6576_3032;

#[derive(Debug, Clone)]
pub struct Maglev {
    /// Slot → index into the `members` the table was built from.
    table: Vec<u16>,
}

impl Maglev {
    /// Builds the table over `members` given as (stable key, weight). The keys, not their
    /// order, decide the result: every process given the same members builds the same table.
    /// At most `MAX_MEMBERS` members are used; the table stores 16-bit indices. `size` must
    /// be a prime (see `is_valid_table_size`), so that every member's permutation visits
    /// every slot.
    pub fn new(members: &[(&str, u32)], size: usize) -> Maglev {
        debug_assert!(is_valid_table_size(size), "table size {size}");
        let m = size;
        let members = &members[..members.len().min(MAX_MEMBERS).min(m)];
        if members.is_empty() {
            return Maglev { table: Vec::new() };
        }
        let n = members.len();
        // Fill in key order, so that the input order cannot change the table.
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|a, b| members[*a].0.cmp(members[*b].0));
        let perm: Vec<(u64, u64)> = members
            .iter()
            .map(|(k, _)| {
                let offset = xxh3_64_with_seed(k.as_bytes(), OFFSET_SEED) % m as u64;
                let skip = xxh3_64_with_seed(k.as_bytes(), SKIP_SEED) % (m as u64 - 1) + 1;
                (offset, skip)
            })
            .collect();
        let max_w = members.iter().map(|(_, w)| (*w).max(1)).max().unwrap_or(1) as f64;
        let mut next = vec![0u64; n];
        let mut credit = vec![0f64; n];
        let mut table = vec![u16::MAX; m];
        let mut filled = 0;
        'fill: loop {
            for &i in &order {
                // Weighted turns: a backend claims slots in proportion to its weight.
                credit[i] += members[i].1.max(1) as f64 / max_w;
                while credit[i] >= 1.0 {
                    credit[i] -= 1.0;
                    let (offset, skip) = perm[i];
                    let mut c = ((offset + next[i] * skip) % m as u64) as usize;
                    while table[c] != u16::MAX {
                        next[i] += 1;
                        c = ((offset + next[i] * skip) % m as u64) as usize;
                    }
                    table[c] = i as u16;
                    next[i] += 1;
                    filled += 1;
                    if filled == m {
                        break 'fill;
                    }
                }
            }
        }
        Maglev { table }
    }

    /// The member index that owns `key`.
    #[inline]
    pub fn lookup(&self, key: u64) -> Option<usize> {
        if self.table.is_empty() {
            return None;
        }
        // Multiply-shift maps the 64-bit hash onto the table without a division.
        let slot = ((key as u128 * self.table.len() as u128) >> 64) as usize;
        Some(self.table[slot] as usize)
    }

    pub fn table_size(&self) -> usize {
        self.table.len()
    }
}

/// Whether `size` can be a table's size: a prime within the bounds.
pub fn is_valid_table_size(size: usize) -> bool {
    (MIN_TABLE_SIZE..=MAX_TABLE_SIZE).contains(&size)
        && (2..).take_while(|d| d * d <= size).all(|d| size % d != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("http://10.0.{}.{}:8000", i / 250, i % 250))
            .collect()
    }

    fn build(names: &[String]) -> Maglev {
        let m: Vec<(&str, u32)> = names.iter().map(|s| (s.as_str(), 1)).collect();
        Maglev::new(&m, DEFAULT_TABLE_SIZE)
    }

    fn keys(count: u64) -> impl Iterator<Item = u64> {
        (0..count).map(|i| xxh3_64_with_seed(&i.to_le_bytes(), 42))
    }

    #[test]
    fn same_members_in_any_order_give_the_same_table() {
        let n = names(10);
        let mut r = n.clone();
        r.reverse();
        let (a, b) = (build(&n), build(&r));
        for k in keys(10_000) {
            assert_eq!(n[a.lookup(k).unwrap()], r[b.lookup(k).unwrap()]);
        }
    }

    #[test]
    fn balance_over_a_million_keys_at_100_backends() {
        let n = names(100);
        let t = build(&n);
        let mut load = vec![0u64; 100];
        for k in keys(1_000_000) {
            load[t.lookup(k).unwrap()] += 1;
        }
        let max = *load.iter().max().unwrap() as f64;
        let ratio = max / 10_000.0;
        assert!(ratio <= 1.05, "max/mean = {ratio}");
    }

    /// Share of keys whose owner differs between two memberships.
    fn moved(before: &[String], after: &[String]) -> f64 {
        let (a, b) = (build(before), build(after));
        let total = 200_000u64;
        let moved = keys(total)
            .filter(|k| before[a.lookup(*k).unwrap()] != after[b.lookup(*k).unwrap()])
            .count();
        moved as f64 / total as f64
    }

    #[test]
    fn adding_or_removing_one_backend_moves_few_keys() {
        // 6 → 7 and 13 → 14 crossed a table-size step when the size grew with the fleet,
        // and moved nearly every key.
        for n in [1usize, 6, 13, 100] {
            let before = names(n);
            let mut after = before.clone();
            after.push("http://10.9.9.9:8000".into());
            let share = moved(&before, &after);
            assert!(
                share <= 1.2 / (n + 1) as f64,
                "join at n={n}: moved {share}"
            );
            if n > 1 {
                let mut fewer = before.clone();
                fewer.remove(n / 2);
                let share = moved(&before, &fewer);
                assert!(share <= 1.2 / n as f64, "leave at n={n}: moved {share}");
            }
        }
    }

    #[test]
    fn table_sizes_must_be_primes_within_bounds() {
        assert!(is_valid_table_size(DEFAULT_TABLE_SIZE));
        assert!(is_valid_table_size(65_537));
        assert!(is_valid_table_size(MIN_TABLE_SIZE) && is_valid_table_size(MAX_TABLE_SIZE));
        assert!(!is_valid_table_size(65_536));
        assert!(!is_valid_table_size(997)); // prime, below the bound
        assert!(!is_valid_table_size(16_777_259)); // prime, above the bound
    }

    #[test]
    fn weights_scale_the_share() {
        let n = names(2);
        let t = Maglev::new(
            &[(n[0].as_str(), 3), (n[1].as_str(), 1)],
            DEFAULT_TABLE_SIZE,
        );
        let first = keys(100_000).filter(|k| t.lookup(*k) == Some(0)).count() as f64 / 100_000.0;
        assert!((first - 0.75).abs() < 0.02, "share {first}");
        assert!(Maglev::new(&[], DEFAULT_TABLE_SIZE).lookup(1).is_none());
    }
}
