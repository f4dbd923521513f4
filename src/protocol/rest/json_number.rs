//! A fast path for reading FP32 tensor data, the most common JSON payload.
//!
//! General float parsers (lexical, fast-float) take their exact route for an f32 as soon as
//! the decimal mantissa exceeds 24 bits, which is most of what clients send: numpy and
//! Python print 8 to 17 significant digits. Here the number is read with 8-digit SWAR steps
//! and scaled in f64 by one multiplication. The f64 result is within a few f64 ulps of the
//! decimal value (see `f32_prefix`), and an f32 keeps 29 bits fewer than an f64, so rounding
//! it to f32 gives the correctly rounded result unless it sits right next to the midpoint
//! between two f32 values. Those rare numbers, and every number outside the fast path's
//! range, return `None` and go to the general parser.

/// Powers of ten that are exact in f64.
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// Their reciprocals, each correctly rounded to f64: multiplying is several times faster
/// than dividing, at the cost of one more rounding, which the margin below allows for.
const NEG_POW10: [f64; 23] = [
    1e0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10, 1e-11, 1e-12, 1e-13, 1e-14,
    1e-15, 1e-16, 1e-17, 1e-18, 1e-19, 1e-20, 1e-21, 1e-22,
];

/// How close, in f64 ulps, the scaled value may come to an f32 midpoint before the fast
/// path declines. The error bound is just over 3 ulps: see `f32_prefix`.
const MIDPOINT_MARGIN: u64 = 8;

/// Digits kept in the u64 mantissa; later digits are dropped (see `f32_prefix`).
const MAX_DIGITS: u32 = 19;

/// The value of 8 ASCII digits at the start of `b`, or `None` if they are not all digits.
#[inline(always)]
fn eight_digits(b: &[u8]) -> Option<u64> {
    let v = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
    // A byte above '9' sets its high bit in `v + 0x46`, one below '0' in `v - 0x30`; the
    // lowest offending byte is computed without carries from below, so it is always caught.
    let digits = v.wrapping_sub(0x3030_3030_3030_3030);
    if (v.wrapping_add(0x4646_4646_4646_4646) | digits) & 0x8080_8080_8080_8080 != 0 {
        return None;
    }
    // Pairs, then groups of four, then all eight (the first digit is the lowest byte).
    // The products carry into bits that the final shift discards, hence wrapping.
    let pairs = digits.wrapping_mul(10).wrapping_add(digits >> 8);
    let lo = (pairs & 0x0000_00ff_0000_00ff).wrapping_mul(100 + (1_000_000 << 32));
    let hi = ((pairs >> 16) & 0x0000_00ff_0000_00ff).wrapping_mul(1 + (10_000 << 32));
    Some(lo.wrapping_add(hi) >> 32)
}

#[inline(always)]
fn digit_at(s: &[u8], p: usize) -> Option<u64> {
    match s.get(p) {
        Some(c @ b'0'..=b'9') => Some(u64::from(c - b'0')),
        _ => None,
    }
}

/// Reads the JSON number at the start of `s` as the correctly rounded f32, and returns it
/// with the number's length. `None` means "not handled here": the text is not a JSON number
/// (the general path words the error), or the value needs the general parser.
#[inline]
pub fn f32_prefix(s: &[u8]) -> Option<(f32, usize)> {
    let neg = s.first() == Some(&b'-');
    let mut p = usize::from(neg);
    let mut mantissa = 0u64;
    let mut digits = 0u32;
    let mut exp10 = 0i32;
    let mut dropped = false;

    // Integer part: "0", or a non-zero digit and more digits (JSON forbids leading zeros).
    match digit_at(s, p)? {
        0 => p += 1,
        _ => {
            while let Some(d) = digit_at(s, p) {
                if digits < MAX_DIGITS {
                    mantissa = mantissa * 10 + d;
                    digits += 1;
                } else {
                    exp10 += 1;
                    dropped = true;
                }
                p += 1;
            }
        }
    }
    if s.get(p) == Some(&b'.') {
        p += 1;
        let start = p;
        while digits + 8 <= MAX_DIGITS {
            let Some(d8) = s.get(p..).and_then(eight_digits) else {
                break;
            };
            mantissa = mantissa * 100_000_000 + d8;
            digits += 8;
            exp10 -= 8;
            p += 8;
        }
        while let Some(d) = digit_at(s, p) {
            if digits < MAX_DIGITS {
                mantissa = mantissa * 10 + d;
                digits += 1;
                exp10 -= 1;
            } else {
                dropped = true;
            }
            p += 1;
        }
        if p == start {
            return None;
        }
    }
    if let Some(b'e' | b'E') = s.get(p) {
        p += 1;
        let negative_exp = match s.get(p) {
            Some(b'-') => {
                p += 1;
                true
            }
            Some(b'+') => {
                p += 1;
                false
            }
            _ => false,
        };
        let start = p;
        let mut e = 0i32;
        while let Some(d) = digit_at(s, p) {
            // Saturates far beyond the fast path's range, which then declines.
            e = (e * 10 + d as i32).min(100_000);
            p += 1;
        }
        if p == start {
            return None;
        }
        exp10 += if negative_exp { -e } else { e };
    }
    // Dropped digits are harmless only when the kept ones carry the precision (leading
    // zeros of "0.000…" count as kept digits).
    if dropped && mantissa < 1_000_000_000_000_000_000 {
        return None;
    }
    if mantissa == 0 {
        return Some((if neg { -0.0 } else { 0.0 }, p));
    }
    if !(-22..=22).contains(&exp10) {
        return None;
    }
    // A signed conversion is one instruction on x86-64; an unsigned one is several.
    let m = match i64::try_from(mantissa) {
        Ok(m) => m as f64,
        Err(_) => mantissa as f64,
    };
    // Error of `q` against the decimal value d: dropped digits (relative < 1e-18, since at
    // least 19 digits were kept), then at most three roundings of 2^-53 each (the mantissa
    // if above 2^53, the reciprocal, the product). So |q - d| < 3.02 · 2^-53 · q, which is
    // less than 3.02 ulps of q.
    let q = if exp10 < 0 {
        m * NEG_POW10[exp10.unsigned_abs() as usize]
    } else {
        m * POW10[exp10 as usize]
    };
    // Subnormal and overflowing f32 results go to the general parser.
    if !(f64::from(f32::MIN_POSITIVE)..=f64::from(f32::MAX)).contains(&q) {
        return None;
    }
    // Rounding to f32 drops 29 bits, and they equal 1 << 28 exactly at an f32 midpoint
    // (which is never near a binade edge). Unless one lies within the error bound of `q`,
    // d and `q` round to the same f32.
    let dropped_bits = q.to_bits() & ((1 << 29) - 1);
    if dropped_bits.abs_diff(1 << 28) <= MIDPOINT_MARGIN {
        return None;
    }
    // The sign is set on the bits: half of all values are negative, at random, and a branch
    // on it would be mispredicted for every other element.
    let f = f32::from_bits((q as f32).to_bits() | (u32::from(neg) << 31));
    Some((f, p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The fast path either declines or agrees bit for bit with std's parser (which rounds
    /// correctly), and reads the whole number.
    fn agrees(text: &str) -> bool {
        match f32_prefix(text.as_bytes()) {
            None => false,
            Some((v, len)) => {
                let want: f32 = text.parse().unwrap();
                assert_eq!(v.to_bits(), want.to_bits(), "{text}");
                assert_eq!(len, text.len(), "{text}");
                true
            }
        }
    }

    #[test]
    fn common_forms_take_the_fast_path() {
        for text in [
            "0",
            "-0",
            "1",
            "-2",
            "0.5",
            "-0.12345679",
            "0.30000001192092896",
            "123456.78",
            "3.4028234e20",
            "1e-5",
            "1.5E+3",
            "2e0",
            "9999999999999999999",
            "0.1234567890123456789012",
        ] {
            assert!(agrees(text), "declined {text}");
        }
        assert_eq!(f32_prefix(b"-0").unwrap().0.to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn stops_at_the_end_of_the_number() {
        assert_eq!(f32_prefix(b"1.5,2"), Some((1.5, 3)));
        assert_eq!(f32_prefix(b"-7]"), Some((-7.0, 2)));
        assert_eq!(
            f32_prefix(b"12345678901234567, 1"),
            Some((12345678901234567.0, 17))
        );
    }

    #[test]
    fn declines_what_is_not_a_json_number() {
        for text in [
            "", "-", "+1", ".5", "1.", "1e", "1e+", "x", "-x", "NaN", "\"1\"",
        ] {
            assert_eq!(f32_prefix(text.as_bytes()), None, "{text}");
        }
        // A leading zero ends the number; the caller then rejects the "1" that follows.
        assert_eq!(f32_prefix(b"01"), Some((0.0, 1)));
    }

    #[test]
    fn declines_what_needs_the_general_parser() {
        for text in [
            "1e39",                            // overflow
            "1e-40",                           // subnormal
            "1e-23",                           // exponent beyond exact powers of ten
            "0.000000000000000000001234567",   // dropped digits with a short mantissa
            "16777217",                        // exactly halfway between two f32 values
            "0.50000002980232238769531250000", // exactly halfway, as a decimal fraction
        ] {
            assert_eq!(f32_prefix(text.as_bytes()), None, "{text}");
        }
    }

    #[test]
    fn midpoints_and_their_neighbours_round_correctly() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let a = f32::from_bits((x as u32 & 0x7fff_ffff) % 0x7f00_0000 + 0x0080_0000);
            let mid = (f64::from(a) + f64::from(f32::from_bits(a.to_bits() + 1))) / 2.0;
            // The exact decimal expansion of the midpoint, then values just beside it.
            let exact = format!("{mid:.60e}");
            for text in [exact.clone(), exact.replacen("e", "1e", 1)] {
                agrees(&text);
            }
        }
    }

    proptest! {
        #[test]
        fn any_f32_in_any_common_form(bits in any::<u32>()) {
            let v = f32::from_bits(bits);
            prop_assume!(v.is_finite());
            for text in [
                format!("{v}"),
                format!("{}", f64::from(v)),
                format!("{v:e}"),
                format!("{:.9}", v),
                format!("{:.17e}", f64::from(v)),
            ] {
                agrees(&text);
            }
        }

        #[test]
        fn any_decimal_text(int in "-?(0|[1-9][0-9]{0,24})", frac in "(\\.[0-9]{1,30})?", exp in "([eE][+-]?[0-9]{1,3})?") {
            let text = format!("{int}{frac}{exp}");
            if let Some((v, len)) = f32_prefix(text.as_bytes()) {
                let want: f32 = text.parse().unwrap();
                prop_assert_eq!(v.to_bits(), want.to_bits(), "{}", text);
                prop_assert_eq!(len, text.len());
            }
        }
    }
}
