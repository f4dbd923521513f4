//! Counting the elements of a flat JSON number array 64 bytes at a time.
//!
//! Each block is classified into bit masks (number characters, commas, spaces) with SSE2
//! compares (a scalar loop on other targets); the array's structure is then checked on
//! the masks, and the count is the number of commas plus one. Only the shapes clients
//! actually send are taken (`[1,2]` and `[1, 2]`: a space only right after a comma); any
//! other text returns `None` and is counted by the general walk, which also words errors.

/// Bit masks of one 64-byte block: bit `i` describes byte `i`.
struct Masks {
    number: u64,
    comma: u64,
    space: u64,
}

/// SSE2 is part of the x86-64 baseline, so this needs no runtime detection.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn classify(block: &[u8; 64]) -> Masks {
    use std::arch::x86_64::*;
    let (mut number, mut comma, mut space) = (0u64, 0u64, 0u64);
    for (lane, chunk) in block.chunks_exact(16).enumerate() {
        // SAFETY: `chunk` is 16 readable bytes and the load is unaligned; the other
        // intrinsics only compute on registers, with SSE2, which every x86-64 CPU has.
        let (n, c, s) = unsafe {
            let v = _mm_loadu_si128(chunk.as_ptr().cast());
            let eq = |b: u8| _mm_cmpeq_epi8(v, _mm_set1_epi8(b as i8));
            let offset = _mm_sub_epi8(v, _mm_set1_epi8(b'0' as i8));
            let digit = _mm_cmpeq_epi8(_mm_min_epu8(offset, _mm_set1_epi8(9)), offset);
            let lower = _mm_or_si128(v, _mm_set1_epi8(0x20));
            let exp = _mm_cmpeq_epi8(lower, _mm_set1_epi8(b'e' as i8));
            let sign = _mm_or_si128(eq(b'-'), eq(b'+'));
            let n = _mm_or_si128(_mm_or_si128(digit, exp), _mm_or_si128(sign, eq(b'.')));
            (
                _mm_movemask_epi8(n) as u16,
                _mm_movemask_epi8(eq(b',')) as u16,
                _mm_movemask_epi8(eq(b' ')) as u16,
            )
        };
        number |= u64::from(n) << (16 * lane);
        comma |= u64::from(c) << (16 * lane);
        space |= u64::from(s) << (16 * lane);
    }
    Masks {
        number,
        comma,
        space,
    }
}

#[cfg(not(target_arch = "x86_64"))]
use classify_scalar as classify;

#[cfg(any(test, not(target_arch = "x86_64")))]
#[inline(always)]
fn classify_scalar(block: &[u8; 64]) -> Masks {
    let (mut number, mut comma, mut space) = (0u64, 0u64, 0u64);
    for (i, &b) in block.iter().enumerate() {
        // The characters `walk` takes as part of a number token.
        let is_number =
            b.wrapping_sub(b'0') < 10 || b == b'.' || b == b'-' || b == b'+' || (b | 0x20) == b'e';
        number |= u64::from(is_number) << i;
        comma |= u64::from(b == b',') << i;
        space |= u64::from(b == b' ') << i;
    }
    Masks {
        number,
        comma,
        space,
    }
}

/// The number of elements of the array that starts at `s[0] == b'['`, and the position
/// just after its closing bracket; `None` if the text is not of the simple flat form.
pub fn count_flat_numbers(s: &[u8]) -> Option<(u64, usize)> {
    if s.first() != Some(&b'[') {
        return None;
    }
    let mut pos = 1;
    // What the byte before the current block was. The opening bracket acts like a comma:
    // a number (or one space, then a number) must follow it.
    let (mut prev_number, mut prev_comma, mut prev_space) = (0u64, 1u64, 0u64);
    let mut commas = 0u64;
    let mut tail = [0u8; 64];
    loop {
        let block: &[u8; 64] = match s.get(pos..pos + 64) {
            Some(b) => b.try_into().ok()?,
            None => {
                // The last partial block, padded with NULs, which are never valid here.
                let rest = &s[pos..];
                tail[..rest.len()].copy_from_slice(rest);
                tail[rest.len()..].fill(0);
                &tail
            }
        };
        let m = classify(block);
        let after_comma = (m.comma << 1) | prev_comma;
        let after_number = (m.number << 1) | prev_number;
        let after_space = (m.space << 1) | prev_space;
        let bad = (m.space & !after_comma)           // a space only right after a comma
            | (m.comma & !after_number)              // a comma only right after a number
            | (after_comma & !(m.number | m.space))  // a number or a space after a comma
            | (after_space & !m.number); // and a number after that space
        let other = !(m.number | m.comma | m.space);
        if other == 0 {
            if bad != 0 {
                return None;
            }
            commas += u64::from(m.comma.count_ones());
            prev_number = m.number >> 63;
            prev_comma = m.comma >> 63;
            prev_space = m.space >> 63;
            pos += 64;
            continue;
        }
        // The first other byte must be the closing bracket, right after a number.
        let k = other.trailing_zeros();
        let before = (1u64 << k) - 1;
        if block[k as usize] != b']' || bad & before != 0 || after_number & (1 << k) == 0 {
            return None;
        }
        commas += u64::from((m.comma & before).count_ones());
        return Some((commas + 1, pos + k as usize + 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_and_scalar_classification_agree() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            let mut block = [0u8; 64];
            for b in block.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Half the bytes from the interesting set, half anything.
                *b = if x & 1 == 0 {
                    b"0123456789.-+eE, ]["[(x >> 8) as usize % 19]
                } else {
                    (x >> 16) as u8
                };
            }
            let (v, s) = (classify(&block), classify_scalar(&block));
            assert_eq!((v.number, v.comma, v.space), (s.number, s.comma, s.space));
        }
    }

    #[test]
    fn counts_the_forms_clients_send() {
        assert_eq!(count_flat_numbers(b"[1]"), Some((1, 3)));
        assert_eq!(count_flat_numbers(b"[1,2.5,-3e-2]"), Some((3, 13)));
        assert_eq!(count_flat_numbers(b"[1, 2, 3] tail"), Some((3, 9)));
        assert_eq!(count_flat_numbers(b"[ 1]"), Some((1, 4)));
        // Long arrays cross blocks at every offset.
        for n in 1..200usize {
            for sep in [",", ", "] {
                let body: Vec<String> = (0..n).map(|i| format!("{}.5", i * 7)).collect();
                let text = format!("[{}]", body.join(sep));
                assert_eq!(
                    count_flat_numbers(text.as_bytes()),
                    Some((n as u64, text.len())),
                    "{text}"
                );
            }
        }
    }

    #[test]
    fn declines_everything_else() {
        for text in [
            "", "1", "[]", "[ ]", "[1 ]", "[1 ,2]", "[1,,2]", "[1, ,2]", "[1,  2]", "[,1]", "[1,]",
            "[1", "[1,2", "[[1]]", "[\"a\"]", "[true]", "[1\n,2]", "[1,\n2]", "[1 2]",
        ] {
            assert_eq!(count_flat_numbers(text.as_bytes()), None, "{text}");
        }
        // The same faults far into a long array, past the first blocks.
        let long = "1.25,".repeat(40);
        for fault in [",,", ", ,", " ,", "x", "  ", "\n"] {
            let text = format!("[{long}{fault}{long}1]");
            assert_eq!(count_flat_numbers(text.as_bytes()), None, "{fault:?}");
        }
    }
}
