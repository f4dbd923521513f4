//! The classification extension: an output replaced by its top-k classes per batch row, as
//! BYTES strings `<value>:<index>[:<label>]`, with Triton's semantics and formatting.
//!
//! Selection is a single pass with a bounded buffer of the k best (a comparison or two per
//! element), falling back to `select_nth_unstable` when k is large. Ties go to the lower
//! index, so results are deterministic (Triton leaves their order unspecified).

use std::cmp::Ordering;

use bytes::Bytes;
use half::{bf16, f16};

use super::datatype::DataType;
use super::error::{ProtocolError, Result};
use super::params::Parameters;
use super::tensor::Tensor;

/// Reads a label file: one label per line, index = line number. A trailing newline adds
/// no label, and an empty line is a class without a label.
pub fn parse_labels(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.trim_end_matches('\r').to_string())
        .collect()
}

/// Above this k, a full selection beats keeping a sorted buffer.
const BUFFER_LIMIT: usize = 64;

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

/// The indices of the k best values, best first.
pub fn top_k<T: PartialOrd + Copy>(values: &[T], k: usize) -> Vec<usize> {
    let k = k.min(values.len());
    if k == 0 {
        return Vec::new();
    }
    if k > BUFFER_LIMIT {
        let mut all: Vec<(T, usize)> = values.iter().copied().zip(0..).collect();
        all.select_nth_unstable_by(k - 1, better);
        all.truncate(k);
        all.sort_unstable_by(better);
        return all.into_iter().map(|(_, i)| i).collect();
    }
    // `best` stays sorted best first. A later element only enters by being strictly greater
    // than the worst kept one, since equal values keep the earlier (lower) index.
    let mut best: Vec<(T, usize)> = Vec::with_capacity(k + 1);
    for (i, &v) in values.iter().enumerate() {
        if best.len() == k {
            let worst = best[k - 1].0;
            if !(v > worst || (is_nan(&worst) && !is_nan(&v))) {
                continue;
            }
        }
        let item = (v, i);
        let pos = best.partition_point(|b| better(b, &item) == Ordering::Less);
        best.insert(pos, item);
        best.truncate(k);
    }
    best.into_iter().map(|(_, i)| i).collect()
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

/// Replaces `t` by its top `k` classes per row. `batched` says the first dimension is a
/// batch dimension (the model's shape starts with -1), giving shape [batch, k'] instead of
/// [k'], where k' = min(k, elements per row).
pub fn classify(t: &Tensor, k: u64, batched: bool, labels: Option<&[String]>) -> Result<Tensor> {
    if !supported(t.datatype) {
        return Err(unsupported(&t.name, t.datatype));
    }
    let count = t.element_count() as usize;
    let (rows, per_row) = if batched && !t.shape.is_empty() {
        let b = t.shape[0] as usize;
        (b, count.checked_div(b).unwrap_or(0))
    } else {
        (1, count)
    };
    let kept = (k as usize).min(per_row);
    let size = t
        .datatype
        .fixed_size()
        .expect("classified types have a fixed size");
    let mut out = Vec::new();
    macro_rules! run {
        ($read:expr, $fmt:expr) => {{
            let values = decode(&t.data, size, $read);
            for r in 0..rows {
                row_strings(
                    &values[r * per_row..(r + 1) * per_row],
                    kept,
                    labels,
                    $fmt,
                    &mut out,
                );
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
    fn rejects_bool_and_bytes() {
        let t = tensor(DataType::Bool, vec![1], vec![1]);
        assert_eq!(
            classify(&t, 1, false, None).unwrap_err().to_string(),
            "output 'OUT': classification is not supported for datatype BOOL"
        );
    }
}
