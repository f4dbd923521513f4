//! The classification extension: an output replaced by its top-k classes per batch row, as
//! BYTES strings `<value>:<index>[:<label>]`, with Triton's semantics and formatting.
//!
//! Selection is one pass over the values with a buffer of candidates cut back to the k best
//! by `select_nth_unstable` whenever it fills (O(n) whatever the input's order, and one
//! comparison per element for the values that cannot enter); only the k chosen are sorted.
//! Ties go to the lower index, so results are deterministic (Triton leaves their order
//! unspecified).

use std::cmp::Ordering;

use bytes::Bytes;
use half::{bf16, f16};

use super::datatype::DataType;
use super::error::{ProtocolError, Result, Role};
use super::params::Parameters;
use super::tensor::Tensor;

/// Reads a label file: one label per line, index = line number. A trailing newline adds
/// no label, and an empty line is a class without a label.
pub fn parse_labels(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.trim_end_matches('\r').to_string())
        .collect()
}

pub fn supported(dt: DataType) -> bool {
    !matches!(dt, DataType::Bool | DataType::Bytes)
}

/// The error for an output whose type cannot be classified.
pub fn unsupported(output: &str, dt: DataType) -> ProtocolError {
    ProtocolError::invalid(format!(
        "output '{output}': classification is not supported for datatype {dt}"
    ))
}

/// NaN is the one value not comparable with itself.
#[inline]
fn is_nan<T: PartialOrd>(v: &T) -> bool {
    v.partial_cmp(v).is_none()
}

/// Orders (value, index) pairs best first: larger value, then lower index. NaN ranks last.
#[inline]
fn better<T: PartialOrd>(a: &(T, usize), b: &(T, usize)) -> Ordering {
    match b.0.partial_cmp(&a.0) {
        Some(Ordering::Equal) => a.1.cmp(&b.1),
        Some(o) => o,
        None => is_nan(&a.0).cmp(&is_nan(&b.0)).then(a.1.cmp(&b.1)),
    }
}

/// The indices of the k best values, best first: larger value first, equal values by lower
/// index, NaN last.
pub fn top_k<T: PartialOrd + Copy>(values: &[T], k: usize) -> Vec<usize> {
    let k = k.min(values.len());
    if k == 0 {
        return Vec::new();
    }
    let mut best = best_k(values, k);
    best.sort_unstable_by(better);
    best.into_iter().map(|(_, i)| i).collect()
}

/// Least spare room in the candidate buffer of `best_k` beyond the k kept: each selection
/// over the buffer then frees at least this many places.
const SPARE: usize = 8192;

/// The k best as (value, index), in no particular order, in O(n) whatever the order of the
/// values. Values that beat the bar (the worst of the k best so far) are collected; when the
/// buffer is full, a selection keeps its k best, and their worst becomes the new bar. The
/// spare room is at least 4k, so a selection's cost, linear in the buffer, is at most 1.25
/// times the places it frees: even ascending input, where every value beats the bar, costs
/// O(n) in all. A value that cannot enter costs one comparison. Values are met in index order, so a value equal to the bar has the higher
/// index and loses the tie: only a strictly better one enters.
fn best_k<T: PartialOrd + Copy>(values: &[T], k: usize) -> Vec<(T, usize)> {
    let capacity = k + (4 * k).max(SPARE);
    let mut buf: Vec<(T, usize)> = Vec::with_capacity(capacity.min(values.len()));
    buf.extend(values[..k].iter().copied().zip(0..));
    let mut bar = buf.iter().copied().max_by(better).expect("k > 0").0;
    for (i, &v) in values.iter().enumerate().skip(k) {
        if v > bar || (is_nan(&bar) && !is_nan(&v)) {
            buf.push((v, i));
            if buf.len() == capacity {
                bar = keep_best(&mut buf, k);
            }
        }
    }
    keep_best(&mut buf, k);
    buf
}

/// Cuts `buf` to its k best and returns the worst of them.
fn keep_best<T: PartialOrd + Copy>(buf: &mut Vec<(T, usize)>, k: usize) -> T {
    if buf.len() > k {
        buf.select_nth_unstable_by(k - 1, better);
        buf.truncate(k);
    }
    buf.iter().copied().max_by(better).expect("k > 0").0
}

/// Formats a float as C++ `std::to_string` does (`%f`: six decimals).
fn format_float(v: f64) -> String {
    if v.is_nan() {
        if v.is_sign_negative() {
            "-nan".into()
        } else {
            "nan".into()
        }
    } else if v.is_infinite() {
        if v < 0.0 {
            "-inf".into()
        } else {
            "inf".into()
        }
    } else {
        format!("{v:.6}")
    }
}

fn row_strings<T: PartialOrd + Copy>(
    values: &[T],
    k: usize,
    labels: Option<&[String]>,
    fmt: impl Fn(T) -> String,
    out: &mut Vec<u8>,
) {
    for i in top_k(values, k) {
        let mut s = fmt(values[i]);
        s.push(':');
        s.push_str(itoa::Buffer::new().format(i));
        if let Some(label) = labels.and_then(|l| l.get(i)).filter(|l| !l.is_empty()) {
            s.push(':');
            s.push_str(label);
        }
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
}

fn decode<T>(data: &[u8], size: usize, read: impl Fn(&[u8]) -> T) -> Vec<T> {
    data.chunks_exact(size).map(read).collect()
}

/// Most classes one output's classification may give (rows × k). Each is a formatted
/// string, built on the thread that also answers health checks: a client asking for the
/// top 16 million of a 16-million-element output held a gateway's liveness for seconds.
/// A real top-k is small; 2^18 results take about 100 ms.
pub const MAX_RESULTS: usize = 1 << 18;

/// Replaces `t` by its top `k` classes per row. `batched` says the first dimension is a
/// batch dimension (the model's shape starts with -1), giving shape [batch, k'] instead of
/// [k'], where k' = min(k, elements per row).
pub fn classify(t: &Tensor, k: u64, batched: bool, labels: Option<&[String]>) -> Result<Tensor> {
    if !supported(t.datatype) {
        return Err(unsupported(&t.name, t.datatype));
    }
    let size = t
        .datatype
        .fixed_size()
        .expect("classified types have a fixed size");
    // A decoded body is always consistent; a tensor an in-process model built wrongly may
    // not be, and that is an error rather than a panic or a silently shorter row.
    t.check_consistent()
        .map_err(|e| e.in_tensor(Role::Output, &t.name))?;
    let count = t.data.len() / size;
    let (rows, per_row) = if batched && !t.shape.is_empty() {
        // From the shape, not count / rows: an empty batch still has rows of a size. Only an
        // empty batch's row size can overflow, and then no row is read.
        let per_row = t.shape[1..]
            .iter()
            .try_fold(1u64, |n, d| n.checked_mul(*d))
            .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
        (t.shape[0] as usize, per_row)
    } else {
        (1, count)
    };
    let kept = (k as usize).min(per_row);
    let results = rows.saturating_mul(kept);
    if results > MAX_RESULTS {
        return Err(ProtocolError::invalid(format!(
            "output '{}': classification would give {results} classes ({rows} rows of {kept}); at most {MAX_RESULTS} per output",
            t.name
        )));
    }
    let mut out = Vec::new();
    macro_rules! run {
        ($read:expr, $fmt:expr) => {{
            let values = decode(&t.data, size, $read);
            // `Tensor::check_consistent` made values.len() == count == rows * per_row.
            for row in values.chunks_exact(per_row.max(1)).take(rows) {
                row_strings(row, kept, labels, $fmt, &mut out);
            }
        }};
    }
    let int = |v: i128| itoa::Buffer::new().format(v).to_string();
    match t.datatype {
        DataType::Uint8 => run!(|c: &[u8]| c[0] as i128, int),
        DataType::Int8 => run!(|c: &[u8]| c[0] as i8 as i128, int),
        DataType::Uint16 => run!(|c: &[u8]| u16::from_le_bytes([c[0], c[1]]) as i128, int),
        DataType::Int16 => run!(|c: &[u8]| i16::from_le_bytes([c[0], c[1]]) as i128, int),
        DataType::Uint32 => run!(
            |c: &[u8]| u32::from_le_bytes(c.try_into().unwrap()) as i128,
            int
        ),
        DataType::Int32 => run!(
            |c: &[u8]| i32::from_le_bytes(c.try_into().unwrap()) as i128,
            int
        ),
        DataType::Uint64 => run!(
            |c: &[u8]| u64::from_le_bytes(c.try_into().unwrap()) as i128,
            int
        ),
        DataType::Int64 => run!(
            |c: &[u8]| i64::from_le_bytes(c.try_into().unwrap()) as i128,
            int
        ),
        DataType::Fp16 => run!(
            |c: &[u8]| f16::from_le_bytes([c[0], c[1]]).to_f32(),
            |v: f32| format_float(v as f64)
        ),
        DataType::Bf16 => run!(
            |c: &[u8]| bf16::from_le_bytes([c[0], c[1]]).to_f32(),
            |v: f32| format_float(v as f64)
        ),
        DataType::Fp32 => run!(
            |c: &[u8]| f32::from_le_bytes(c.try_into().unwrap()),
            |v: f32| format_float(v as f64)
        ),
        DataType::Fp64 => run!(
            |c: &[u8]| f64::from_le_bytes(c.try_into().unwrap()),
            format_float
        ),
        DataType::Bool | DataType::Bytes => unreachable!("checked above"),
    }
    let shape = if batched && !t.shape.is_empty() {
        vec![rows as u64, kept as u64]
    } else {
        vec![kept as u64]
    };
    Ok(Tensor {
        name: t.name.clone(),
        datatype: DataType::Bytes,
        shape,
        parameters: Parameters::new(),
        data: Bytes::from(out),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::tensor::format_shape;
    use proptest::strategy::Strategy;

    fn tensor(dt: DataType, shape: Vec<u64>, data: Vec<u8>) -> Tensor {
        Tensor {
            name: "OUT".into(),
            datatype: dt,
            shape,
            parameters: Parameters::new(),
            data: Bytes::from(data),
        }
    }

    fn strings(t: &Tensor) -> Vec<String> {
        t.bytes_elements()
            .map(|e| String::from_utf8(e.to_vec()).unwrap())
            .collect()
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn top_k_breaks_ties_by_lower_index() {
        assert_eq!(top_k(&[1, 3, 3, 2, 3], 2), vec![1, 2]);
        assert_eq!(top_k(&[1, 3, 3, 2, 3], 5), vec![1, 2, 4, 3, 0]);
        assert_eq!(top_k(&[5.0, f32::NAN, 7.0], 3), vec![2, 0, 1]);
        assert_eq!(top_k(&[f32::NAN, 1.0], 1), vec![1]);
        let big: Vec<i32> = (0..1000).map(|i| (i * 7919) % 100).collect();
        let got = top_k(&big, 200);
        let mut want: Vec<usize> = (0..1000).collect();
        want.sort_by(|a, b| big[*b].cmp(&big[*a]).then(a.cmp(b)));
        want.truncate(200);
        assert_eq!(got, want);
    }

    /// Rows × k is bounded, whichever of the two is large.
    #[test]
    fn too_many_classes_are_refused() {
        let n = MAX_RESULTS + 1;
        let t = tensor(DataType::Uint8, vec![n as u64], vec![1; n]);
        let e = classify(&t, n as u64, false, None).unwrap_err();
        assert_eq!(
            e.message(),
            format!("output 'OUT': classification would give {n} classes (1 rows of {n}); at most {MAX_RESULTS} per output")
        );
        let rows = tensor(DataType::Uint8, vec![n as u64, 1], vec![1; n]);
        assert!(classify(&rows, 1, true, None).is_err());
        assert_eq!(classify(&t, 3, false, None).unwrap().shape, vec![3]);
    }

    #[test]
    fn formats_like_triton() {
        let t = tensor(DataType::Fp32, vec![1, 3], f32s(&[1.5, 3.3, 0.25]));
        let labels = vec!["a".to_string(), String::new()];
        let c = classify(&t, 2, true, Some(&labels)).unwrap();
        assert_eq!(c.shape, vec![1, 2]);
        assert_eq!(c.datatype, DataType::Bytes);
        assert_eq!(strings(&c), vec!["3.300000:1", "1.500000:0:a"]);
        let t = tensor(DataType::Int8, vec![4], vec![5, 0xff, 9, 5]);
        let c = classify(&t, 10, false, None).unwrap();
        assert_eq!(c.shape, vec![4]);
        assert_eq!(strings(&c), vec!["9:2", "5:0", "5:3", "-1:1"]);
    }

    #[test]
    fn batches_rows() {
        let t = tensor(
            DataType::Fp64,
            vec![2, 2],
            [1.0f64, 2.0, 4.0, 3.0]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
        );
        let c = classify(&t, 1, true, None).unwrap();
        assert_eq!(c.shape, vec![2, 1]);
        assert_eq!(strings(&c), vec!["2.000000:1", "4.000000:0"]);
        let c = classify(&t, 1, false, None).unwrap();
        assert_eq!(strings(&c), vec!["4.000000:2"]);
    }

    #[test]
    fn inconsistent_tensors_are_errors_not_panics() {
        // An in-process model that built its output wrongly: too short, too long, or not a
        // whole number of elements.
        for (shape, len, need) in [
            (vec![2, 3], 20, "24"),
            (vec![2, 3], 28, "24"),
            (vec![3], 10, "12"),
            (vec![u64::MAX, 2], 4, "more than 2^64"),
        ] {
            let t = tensor(DataType::Fp32, shape.clone(), vec![0; len]);
            for batched in [false, true] {
                assert_eq!(
                    classify(&t, 2, batched, None).unwrap_err().to_string(),
                    format!(
                        "output 'OUT': inconsistent tensor: shape {} of FP32 needs {need} bytes, data has {len}",
                        format_shape(&shape)
                    )
                );
            }
        }
        // Empty rows and an empty batch are consistent.
        let c = classify(&tensor(DataType::Int32, vec![3, 0], vec![]), 2, true, None).unwrap();
        assert_eq!((c.shape, c.data.len()), (vec![3, 0], 0));
        let c = classify(&tensor(DataType::Int32, vec![0, 4], vec![]), 2, true, None).unwrap();
        assert_eq!((c.shape, c.data.len()), (vec![0, 2], 0));
        let t = tensor(DataType::Int32, vec![0, u64::MAX, 2], vec![]);
        let c = classify(&t, 3, true, None).unwrap();
        assert_eq!((c.shape, c.data.len()), (vec![0, 3], 0));
    }

    /// What `top_k` must return: a stable sort of all indices by value alone (larger first,
    /// NaN last), so that equal values keep their index order, cut to k.
    fn reference<T: PartialOrd + Copy>(values: &[T], k: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..values.len()).collect();
        all.sort_by(|a, b| {
            let (x, y) = (values[*a], values[*b]);
            match (is_nan(&x), is_nan(&y)) {
                (false, false) => y.partial_cmp(&x).unwrap(),
                (nx, ny) => nx.cmp(&ny),
            }
        });
        all.truncate(k);
        all
    }

    /// Inputs that cost a naive bounded buffer the most, or that only ties tell apart.
    fn adversarial(n: usize) -> Vec<Vec<f32>> {
        let n32 = n as f32;
        vec![
            (0..n).map(|i| i as f32).collect(),
            (0..n).map(|i| n32 - i as f32).collect(),
            vec![1.0; n],
            (0..n).map(|i| (i % 7) as f32).collect(),
            (0..n)
                .map(|i| if i % 3 == 0 { f32::NAN } else { i as f32 })
                .collect(),
            (0..n)
                .map(|i| if i % 2 == 0 { f32::NAN } else { 0.0 })
                .collect(),
            (0..n).map(|i| (i / 4) as f32).collect(),
            (0..n)
                .map(|i| if i % 2 == 0 { i as f32 } else { -(i as f32) })
                .collect(),
        ]
    }

    #[test]
    fn top_k_matches_a_stable_sort_on_adversarial_inputs() {
        for n in [1, 2, 5, 64, 300, 1000] {
            for values in adversarial(n) {
                for k in [1, 2, 10, 64, 65, 256, 257, n / 2, n - 1, n, n + 3] {
                    assert_eq!(top_k(&values, k), reference(&values, k), "n {n} k {k}");
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn top_k_matches_a_stable_sort(
            values in proptest::collection::vec(
                proptest::prop_oneof![
                    8 => (-20i32..20).prop_map(|v| v as f32),
                    2 => proptest::num::f32::ANY,
                    1 => proptest::strategy::Just(f32::NAN),
                ],
                0..700,
            ),
            k in 0usize..400,
            sorted in 0u8..4,
        ) {
            let mut values = values;
            // Some runs sorted ascending or descending: the worst orders for a buffer.
            match sorted {
                1 => values.sort_by(|a, b| a.total_cmp(b)),
                2 => values.sort_by(|a, b| b.total_cmp(a)),
                _ => {}
            }
            proptest::prop_assert_eq!(top_k(&values, k), reference(&values, k));
            let ints: Vec<i64> = values.iter().map(|v| *v as i64 % 11).collect();
            proptest::prop_assert_eq!(top_k(&ints, k), reference(&ints, k));
        }
    }

    #[test]
    fn rejects_bool_and_bytes() {
        let t = tensor(DataType::Bool, vec![1], vec![1]);
        assert_eq!(
            classify(&t, 1, false, None).unwrap_err().to_string(),
            "output 'OUT': classification is not supported for datatype BOOL"
        );
    }
}
