//! The sequence table: rendezvous (highest random weight) hashing, precomputed over a fixed
//! number of buckets. A key's bucket is a multiply-shift of its hash; the bucket's owner is
//! the member with the highest score for that bucket. Lookups are one multiplication and one
//! array read.
//!
//! Why this and not Maglev or a ring: see docs/ARCHITECTURE.md ("Choosing the hash"). In
//! short, a bucket changes owner only when the member that joins wins it or the member that
//! owned it leaves, so the share of keys that move stays at the 1/N minimum at any fleet
//! size; balance is binomial over the buckets (about 10,000 per member at N = 100).
//!
//! The table is a pure function of the membership (keys and weights) and the size: every
//! replica with the same backends builds the same table, whatever the order of the members
//! and whatever tables it had before. `derive` updates a table in O(buckets) per member that
//! joins or leaves, instead of the O(buckets × members) of a full build, and gives exactly
//! what `new` would.

use std::sync::Arc;
use std::time::Instant;

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// A hash table that stopped being current less than a sequence idle timeout ago.
#[derive(Clone)]
pub struct PastTable {
    /// The member keys, by table index.
    pub members: Arc<[String]>,
    pub table: Arc<SequenceTable>,
    pub replaced_at: Instant,
}

/// The default table size (`fleet.hash_table_size`). The size is fixed rather than grown
/// with the fleet: a table of another size is a different table, so crossing a size step
/// would move nearly every key at once.
pub const DEFAULT_TABLE_SIZE: usize = 1_048_573;
/// Bounds of `fleet.hash_table_size`.
pub const MIN_TABLE_SIZE: usize = 1_009;
pub const MAX_TABLE_SIZE: usize = 16_777_213;
/// Owners are stored as u16 indices, with one value kept free as a marker.
pub const MAX_MEMBERS: usize = u16::MAX as usize - 1;
const MEMBER_SEED: u64 = 0x7365_7174_6162_6c31;
/// A bucket whose owner left, to be scored again.
const ORPHAN: u16 = u16::MAX;

/// Whether `size` can be a table's size.
pub fn is_valid_table_size(size: usize) -> bool {
    (MIN_TABLE_SIZE..=MAX_TABLE_SIZE).contains(&size)
}

#[derive(Debug, Clone, PartialEq)]
struct Member {
    key: String,
    weight: u32,
    seed: u64,
}

#[derive(Debug, Clone)]
pub struct SequenceTable {
    size: usize,
    /// In the order given to `new` or `derive`: `lookup` returns indices into it.
    members: Vec<Member>,
    /// Whether weights differ, which changes how scores are computed (not who wins when
    /// they are all equal).
    weighted: bool,
    /// Bucket → owner index. Empty when there are fewer than two members.
    owner: Vec<u16>,
    /// Each bucket's winning score, kept so that `derive` can compare a newcomer with it.
    score: Vec<u32>,
}

/// A strong 64-bit mixer (the finalizer of MurmurHash3's 128-bit variant, with Stafford's
/// constants): every input bit affects every output bit.
#[inline(always)]
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The score of `m` for `bucket`: the top 32 bits of a hash of the pair, or, when weights
/// differ, rendezvous' `w / -ln(u)` for that hash as a uniform `u` in (0, 1), which gives
/// each member a share of buckets proportional to its weight. The weighted form is stored as
/// the bits of a positive f32, which order like the values. Ties go to the lower key.
#[inline(always)]
fn score(m: &Member, bucket: usize, weighted: bool) -> u32 {
    let h = mix((bucket as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ m.seed);
    if !weighted {
        return (h >> 32) as u32;
    }
    let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let s = (f64::from(m.weight) / -u.ln()) as f32;
    s.to_bits()
}

impl SequenceTable {
    /// Builds the table over `members` given as (stable key, weight). At most `MAX_MEMBERS`
    /// members are used. `size` must satisfy `is_valid_table_size`.
    pub fn new(members: &[(&str, u32)], size: usize) -> SequenceTable {
        let mut t = SequenceTable::unscored(members, size);
        if t.members.len() >= 2 {
            t.owner = vec![ORPHAN; size];
            t.score = vec![0; size];
            // Member by member, in key order: a member takes a bucket only by scoring
            // strictly higher, so ties stay with the lower key. One tight loop per member
            // rather than one per bucket.
            for i in t.key_order() {
                let (m, weighted) = (&t.members[i], t.weighted);
                for (bucket, (owner, best)) in
                    t.owner.iter_mut().zip(t.score.iter_mut()).enumerate()
                {
                    let s = score(m, bucket, weighted);
                    if *owner == ORPHAN || s > *best {
                        *owner = i as u16;
                        *best = s;
                    }
                }
            }
        }
        t
    }

    /// The members and mode of a table over `members`, with no buckets scored yet.
    fn unscored(members: &[(&str, u32)], size: usize) -> SequenceTable {
        debug_assert!(is_valid_table_size(size), "table size {size}");
        let members: Vec<Member> = members[..members.len().min(MAX_MEMBERS)]
            .iter()
            .map(|(k, w)| Member {
                key: k.to_string(),
                weight: (*w).max(1),
                seed: xxh3_64_with_seed(k.as_bytes(), MEMBER_SEED),
            })
            .collect();
        let weighted = members.iter().any(|m| m.weight != members[0].weight);
        SequenceTable {
            size,
            members,
            weighted,
            owner: Vec::new(),
            score: Vec::new(),
        }
    }

    /// The table over `members`, computed from `prev` where that is cheaper: buckets keep
    /// their owner unless it left or a newcomer outscores it. The result is the table `new`
    /// would build.
    pub fn derive(prev: &SequenceTable, members: &[(&str, u32)], size: usize) -> SequenceTable {
        let mut t = SequenceTable::unscored(members, size);
        let members = &members[..t.members.len()];
        // A member whose weight changed scores differently: it counts as leaving and joining.
        let old_index = |key: &str, weight: u32| {
            prev.members
                .iter()
                .position(|m| m.key == key && m.weight == weight.max(1))
        };
        let kept: Vec<Option<usize>> = members.iter().map(|(k, w)| old_index(k, *w)).collect();
        let joined = kept.iter().filter(|k| k.is_none()).count();
        let mut distinct: Vec<usize> = kept.iter().flatten().copied().collect();
        distinct.sort_unstable();
        distinct.dedup();
        // Two new members that match one old member (a key listed twice) cannot be
        // remapped; a full build decides them.
        let duplicated = distinct.len() != kept.iter().flatten().count();
        let left = prev.members.len().saturating_sub(distinct.len());
        if duplicated
            || size != prev.size
            || t.weighted != prev.weighted
            || prev.members.len() < 2
            || members.len() < 2
            || joined + left > members.len() / 2
        {
            // A full build costs about as much as updating for many changes at once.
            return SequenceTable::new(members, size);
        }
        // Old index → new index, or ORPHAN for a member that left.
        let mut remap = vec![ORPHAN; prev.members.len()];
        for (new, old) in kept.iter().enumerate() {
            if let Some(old) = old {
                remap[*old] = new as u16;
            }
        }
        t.owner = prev.owner.iter().map(|o| remap[*o as usize]).collect();
        t.score = prev.score.clone();
        let orphans: Vec<usize> = (0..size).filter(|b| t.owner[*b] == ORPHAN).collect();
        for i in (0..members.len()).filter(|i| kept[*i].is_none()) {
            for bucket in 0..size {
                if t.owner[bucket] != ORPHAN {
                    t.challenge(bucket, i);
                }
            }
        }
        let order = t.key_order();
        for bucket in orphans {
            for &i in &order {
                t.challenge(bucket, i);
            }
        }
        t
    }

    /// Member indices by key, the order in which ties are settled.
    fn key_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.members.len()).collect();
        order.sort_by(|a, b| self.members[*a].key.cmp(&self.members[*b].key));
        order
    }

    /// Gives `bucket` to member `i` if it outscores the owner (or ties with a higher key).
    #[inline(always)]
    fn challenge(&mut self, bucket: usize, i: usize) {
        let s = score(&self.members[i], bucket, self.weighted);
        let owner = self.owner[bucket];
        let wins = owner == ORPHAN
            || s > self.score[bucket]
            || (s == self.score[bucket] && self.members[i].key < self.members[owner as usize].key);
        if wins {
            self.owner[bucket] = i as u16;
            self.score[bucket] = s;
        }
    }

    /// The member index that owns `key`.
    #[inline]
    pub fn lookup(&self, key: u64) -> Option<usize> {
        match self.members.len() {
            0 => None,
            1 => Some(0),
            _ => {
                // Multiply-shift maps the 64-bit hash onto the buckets without a division.
                let bucket = ((key as u128 * self.size as u128) >> 64) as usize;
                Some(self.owner[bucket] as usize)
            }
        }
    }

    pub fn table_size(&self) -> usize {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small enough for debug builds, big enough for the statistics below.
    const SIZE: usize = 262_139;

    /// A backend listed twice (the same URL under two names in a config) is not a reason to
    /// panic; the derived table is the full build's.
    #[test]
    fn a_member_listed_twice_derives_like_a_full_build() {
        let prev = SequenceTable::new(&[("a", 1), ("b", 1), ("c", 1)], 1009);
        let twice = [("a", 1), ("b", 1), ("b", 1), ("c", 1)];
        let derived = SequenceTable::derive(&prev, &twice, 1009);
        let built = SequenceTable::new(&twice, 1009);
        for key in 0..5000u64 {
            let k = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            assert_eq!(derived.lookup(k), built.lookup(k));
        }
    }

    fn names(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("http://10.0.{}.{}:8000", i / 250, i % 250))
            .collect()
    }

    fn weights(names: &[String]) -> Vec<(&str, u32)> {
        names.iter().map(|s| (s.as_str(), 1)).collect()
    }

    fn build(names: &[String], size: usize) -> SequenceTable {
        SequenceTable::new(&weights(names), size)
    }

    fn keys(count: u64) -> impl Iterator<Item = u64> {
        (0..count).map(|i| xxh3_64_with_seed(&i.to_le_bytes(), 42))
    }

    /// Each bucket's owner, by key: tables over the same members compare equal whatever the
    /// order of their members.
    fn owners(t: &SequenceTable) -> Vec<&str> {
        t.owner
            .iter()
            .map(|o| t.members[*o as usize].key.as_str())
            .collect()
    }

    #[test]
    fn same_members_in_any_order_give_the_same_table() {
        let n = names(10);
        let mut r = n.clone();
        r.reverse();
        let (a, b) = (build(&n, SIZE), build(&r, SIZE));
        assert_eq!(owners(&a), owners(&b));
        for k in keys(1000) {
            assert_eq!(n[a.lookup(k).unwrap()], r[b.lookup(k).unwrap()]);
        }
    }

    #[test]
    fn derive_gives_what_a_full_build_gives() {
        let n = names(12);
        let base = build(&n[..8], SIZE);
        let mut reweighted = weights(&n[..8]);
        reweighted[3].1 = 3;
        let both: Vec<String> = [&n[..3], &n[4..9]].concat();
        let cases: Vec<Vec<(&str, u32)>> = vec![
            weights(&n[..9]),                             // a join
            weights(&n[1..8]),                            // a leave
            weights(&both),                               // both at once
            weights(&n[..8]).into_iter().rev().collect(), // another order
            reweighted,                                   // weights differ now
            weights(&n[..2]),                             // most members left
        ];
        for members in cases {
            let derived = SequenceTable::derive(&base, &members, SIZE);
            let built = SequenceTable::new(&members, SIZE);
            assert_eq!(owners(&derived), owners(&built), "{members:?}");
            assert_eq!(derived.score, built.score);
            for k in keys(1000) {
                assert_eq!(
                    members[derived.lookup(k).unwrap()].0,
                    members[built.lookup(k).unwrap()].0
                );
            }
        }
        // A weighted table derived further, with a weight change and a join.
        let weighted = SequenceTable::new(&[(&n[0], 2), (&n[1], 1), (&n[2], 1)], SIZE);
        let members = [
            (n[0].as_str(), 2),
            (n[1].as_str(), 4),
            (n[2].as_str(), 1),
            (n[3].as_str(), 1),
        ];
        assert_eq!(
            owners(&SequenceTable::derive(&weighted, &members, SIZE)),
            owners(&SequenceTable::new(&members, SIZE))
        );
    }

    #[test]
    fn balance_over_a_million_keys_at_100_backends() {
        let n = names(100);
        let t = build(&n, DEFAULT_TABLE_SIZE);
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
        let a = build(before, SIZE);
        let b = SequenceTable::derive(&a, &weights(after), SIZE);
        let total = 200_000u64;
        let moved = keys(total)
            .filter(|k| before[a.lookup(*k).unwrap()] != after[b.lookup(*k).unwrap()])
            .count();
        moved as f64 / total as f64
    }

    #[test]
    fn adding_or_removing_one_backend_moves_few_keys() {
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
    fn only_the_newcomer_takes_keys_on_a_join() {
        let before = names(20);
        let mut after = before.clone();
        after.push("http://10.9.9.9:8000".into());
        let a = build(&before, SIZE);
        let b = SequenceTable::derive(&a, &weights(&after), SIZE);
        for k in keys(50_000) {
            let (was, is) = (&before[a.lookup(k).unwrap()], &after[b.lookup(k).unwrap()]);
            assert!(was == is || is == "http://10.9.9.9:8000", "{was} → {is}");
        }
    }

    #[test]
    fn table_sizes_within_bounds() {
        assert!(is_valid_table_size(DEFAULT_TABLE_SIZE));
        assert!(is_valid_table_size(65_536));
        assert!(is_valid_table_size(MIN_TABLE_SIZE) && is_valid_table_size(MAX_TABLE_SIZE));
        assert!(!is_valid_table_size(MIN_TABLE_SIZE - 1));
        assert!(!is_valid_table_size(MAX_TABLE_SIZE + 1));
    }

    #[test]
    fn weights_scale_the_share() {
        let n = names(2);
        let t = SequenceTable::new(&[(n[0].as_str(), 3), (n[1].as_str(), 1)], SIZE);
        let first = keys(100_000).filter(|k| t.lookup(*k) == Some(0)).count() as f64 / 100_000.0;
        assert!((first - 0.75).abs() < 0.02, "share {first}");
        assert!(SequenceTable::new(&[], SIZE).lookup(1).is_none());
        assert_eq!(SequenceTable::new(&[("only", 1)], SIZE).lookup(1), Some(0));
    }
}
