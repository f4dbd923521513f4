//! A 2×2, stride-2 max-pool over NCHW f32 without padding: the pooling of most CNNs (LeNet,
//! VGG, U-Net encoders). tract 0.23 runs this shape through a scalar loop that checks bounds
//! for every tap, and on the CNN of the fixtures that loop was 43% of the model's time, more
//! than its convolutions. The op below replaces tract's when the pool is exactly this shape;
//! every other pool stays tract's.
//!
//! It reduces two input rows into one with an element-wise max (contiguous, so it
//! vectorises), then folds each pair of that row into an output element. NaN taps are
//! skipped unless the whole window is NaN (IEEE maxNum, as tract's pools skip them too), and
//! a window of -inf gives -inf, where tract gives `f32::MIN` (it starts from that). No rule
//! matches onnxruntime exactly: its vectorised pool keeps a NaN only in some positions of the
//! window (onnxruntime 1.32, 2×2 windows: the second tap's NaN comes out, the others' do
//! not); maxNum agrees with it on three positions of four, on all-NaN windows and on -inf.

use tract_onnx::prelude::*;
use tract_onnx::tract_core::ops::cnn::{MaxPool, OptMaxPool, PaddingSpec, PoolSpec};
use tract_onnx::tract_core::ops::nn::DataFormat;

use super::nchw_op::{replace_each, NchwKernel};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MaxPool2x2 {
    /// tract's spec of the pool replaced, which gives the output's facts.
    pool_spec: PoolSpec,
}

impl NchwKernel for MaxPool2x2 {
    const NAME: &'static str = "tensorgate.MaxPool2x2Stride2";

    fn pool_spec(&self) -> &PoolSpec {
        &self.pool_spec
    }

    fn output_shape(&self, [n, c, h, w]: [usize; 4]) -> Result<[usize; 4], String> {
        Ok([n, c, h / 2, w / 2])
    }

    fn compute(&self, [_, _, h, w]: [usize; 4], input: &[f32], output: &mut [f32]) {
        pool(input, output, h, w)
    }
}

/// Pools every `h`×`w` plane of `input` into its `h/2`×`w/2` plane of `output`; an odd last
/// row or column is left out, as a pool without padding or ceil mode does.
fn pool(input: &[f32], output: &mut [f32], h: usize, w: usize) {
    let (oh, ow) = (h / 2, w / 2);
    if output.is_empty() {
        return;
    }
    let mut pairs = vec![0f32; 2 * ow];
    for (plane, out_plane) in input
        .chunks_exact(h * w)
        .zip(output.chunks_exact_mut(oh * ow))
    {
        for (oy, out_row) in out_plane.chunks_exact_mut(ow).enumerate() {
            let top = &plane[2 * oy * w..][..2 * ow];
            let bottom = &plane[(2 * oy + 1) * w..][..2 * ow];
            for ((p, t), b) in pairs.iter_mut().zip(top).zip(bottom) {
                *p = t.max(*b);
            }
            for (o, pair) in out_row.iter_mut().zip(pairs.chunks_exact(2)) {
                *o = pair[0].max(pair[1]);
            }
        }
    }
}

/// Whether tract's pool `spec` (without index outputs) over `input` is one this op computes.
fn fits(spec: &PoolSpec, with_index_outputs: Option<DatumType>, input: &TypedFact) -> bool {
    let zeros = |v: &[usize]| v.iter().all(|p| *p == 0);
    let unpadded = match &spec.padding {
        PaddingSpec::Valid => true,
        PaddingSpec::Explicit(before, after) => zeros(before) && zeros(after),
        PaddingSpec::ExplicitOnnxPool(before, after, ceil_mode) => {
            zeros(before) && zeros(after) && !ceil_mode
        }
        PaddingSpec::SameUpper | PaddingSpec::SameLower => false,
    };
    with_index_outputs.is_none()
        && unpadded
        && input.datum_type == f32::datum_type()
        && input.rank() == 4
        && spec.data_format == DataFormat::NCHW
        && spec.kernel_shape[..] == [2, 2]
        && spec.strides.as_deref().unwrap_or(&[1, 1]) == [2, 2]
        && spec.dilations.as_deref().unwrap_or(&[1, 1]) == [1, 1]
}

/// Replaces each of `model`'s max-pools that fits with the op above; returns how many.
pub fn replace_pools(model: &mut TypedModel) -> TractResult<usize> {
    replace_each(model, |model, node| {
        let (spec, indices) = if let Some(op) = node.op_as::<MaxPool>() {
            (&op.pool_spec, op.with_index_outputs)
        } else if let Some(op) = node.op_as::<OptMaxPool>() {
            (&op.pool_spec, op.with_index_outputs)
        } else {
            return Ok(None);
        };
        let input = node.inputs[0];
        Ok(fits(spec, indices, model.outlet_fact(input)?).then(|| {
            let op = MaxPool2x2 {
                pool_spec: spec.clone(),
            };
            (op, input)
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pool read tap by tap: the largest tap that is not NaN, NaN if all are.
    fn reference(input: &[f32], n_planes: usize, h: usize, w: usize) -> Vec<f32> {
        let (oh, ow) = (h / 2, w / 2);
        let mut out = Vec::with_capacity(n_planes * oh * ow);
        for p in 0..n_planes {
            for oy in 0..oh {
                for ox in 0..ow {
                    let taps = [(0, 0), (0, 1), (1, 0), (1, 1)]
                        .map(|(dy, dx)| input[p * h * w + (2 * oy + dy) * w + 2 * ox + dx]);
                    let m = if taps.iter().all(|t| t.is_nan()) {
                        f32::NAN
                    } else {
                        taps.into_iter()
                            .filter(|t| !t.is_nan())
                            .fold(f32::NEG_INFINITY, f32::max)
                    };
                    out.push(m);
                }
            }
        }
        out
    }

    #[test]
    fn pools_even_and_odd_planes_like_the_scalar_reading() {
        for (planes, h, w) in [(3, 4, 6), (2, 5, 7), (1, 2, 2), (4, 1, 8), (2, 9, 1)] {
            let input: Vec<f32> = (0..planes * h * w)
                .map(|i| ((i * 7919) % 101) as f32 - 50.0)
                .collect();
            let mut out = vec![0.0; planes * (h / 2) * (w / 2)];
            pool(&input, &mut out, h, w);
            assert_eq!(out, reference(&input, planes, h, w), "{planes}x{h}x{w}");
        }
    }

    /// maxNum: a NaN tap is skipped wherever it sits, a window of NaN stays NaN, and a window
    /// of -inf stays -inf (tract's own pool would give f32::MIN).
    #[test]
    fn nan_taps_are_skipped_and_minus_infinity_kept() {
        let (nan, inf) = (f32::NAN, f32::INFINITY);
        for at in 0..4 {
            let mut window = [1.0, 2.0, 3.0, 4.0];
            window[at] = nan;
            let mut out = [0.0; 1];
            pool(&window, &mut out, 2, 2);
            let want = if at == 3 { 3.0 } else { 4.0 };
            assert_eq!(out[0], want, "NaN at tap {at}");
        }
        let mut out = [0.0; 1];
        pool(&[nan; 4], &mut out, 2, 2);
        assert!(out[0].is_nan());
        pool(&[nan, -inf, -inf, -inf], &mut out, 2, 2);
        assert_eq!(out[0], -inf);
        let input = [-inf, -inf, 5.0, -inf, -inf, -inf, -inf, inf];
        let mut out = [0.0; 2];
        pool(&input, &mut out, 2, 4);
        assert_eq!(out, [-inf, inf]);
        let planes: Vec<f32> = (0..2 * 6 * 6)
            .map(|i| match i % 7 {
                0 => nan,
                3 => -inf,
                5 => inf,
                k => k as f32,
            })
            .collect();
        let mut out = vec![0.0; 2 * 3 * 3];
        pool(&planes, &mut out, 6, 6);
        let want = reference(&planes, 2, 6, 6);
        for (got, want) in out.iter().zip(&want) {
            assert!(
                got == want || (got.is_nan() && want.is_nan()),
                "{got} against {want}"
            );
        }
    }

    #[test]
    fn replaces_only_the_pools_it_computes() {
        let fact = f32::fact([1, 2, 4, 4]);
        let spec = |kernel: usize, stride: usize, padding: PaddingSpec| PoolSpec {
            data_format: DataFormat::NCHW,
            kernel_shape: tvec![kernel, kernel],
            padding,
            dilations: None,
            strides: Some(tvec![stride, stride]),
            input_channels: 2,
            output_channels: 2,
        };
        let mut model = TypedModel::default();
        let x = model.add_source("x", fact.clone()).unwrap();
        let mut wire = x;
        for (name, spec) in [
            ("fits", spec(2, 2, PaddingSpec::Valid)),
            (
                "ceil",
                spec(
                    2,
                    2,
                    PaddingSpec::ExplicitOnnxPool(tvec![0, 0], tvec![0, 0], true),
                ),
            ),
            ("stride1", spec(2, 1, PaddingSpec::Valid)),
        ] {
            wire = model
                .wire_node(name, MaxPool::new(spec, None), &[wire])
                .unwrap()[0];
        }
        model.select_output_outlets(&[wire]).unwrap();
        assert_eq!(replace_pools(&mut model).unwrap(), 1);
        let names: Vec<String> = model
            .eval_order()
            .unwrap()
            .into_iter()
            .map(|id| model.node(id).op().name().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "Source",
                "tensorgate.MaxPool2x2Stride2",
                "MaxPool",
                "MaxPool"
            ]
        );
    }
}
