//! A 3×3, stride-1 convolution over NCHW f32 with few input channels: the convolution of
//! small CNNs (LeNet-style digit and sensor models) and of the early layers of larger ones.
//!
//! tract 0.23 lowers it to im2col and a matrix product. On narrow feature maps (its direct
//! convolution starts at rows of 128) that lowering spends more time building the patch
//! matrix than multiplying it: on the CNN of the fixtures the patcher alone was a quarter of
//! the model's time, and the products ran on kernels sized for larger matrices. This op
//! computes the convolution directly instead. It keeps four output channels × sixteen
//! output columns in registers and adds every tap of every input channel into them, reading
//! each input row once for those four channels, so the work is nothing but vector
//! multiply-adds over rows of a zero-padded copy of the input. It is compiled three times
//! (AVX-512, AVX2 with FMA, and portable) and picks one at run time, as tract's own kernels
//! do, since the crate is built for the baseline x86-64.

use std::sync::Arc;

use tract_onnx::prelude::*;
use tract_onnx::tract_core::ops::cnn::{Conv, KernelFormat, PaddingSpec, PoolSpec};
use tract_onnx::tract_core::ops::nn::DataFormat;

#[cfg(test)]
use super::nchw_op::NchwOp;
use super::nchw_op::{replace_each, NchwKernel};

/// Output columns computed together: one AVX-512 register, two AVX2 ones.
const LANES: usize = 16;
/// Output channels computed together: each input row loaded serves this many.
const CHANNELS: usize = 4;
/// Taps of the kernel.
const TAPS: usize = 9;
/// Input channels at most, and the row width from which tract's own direct convolution
/// takes over: beyond either, tract was as fast or faster in `tests::speed_against_tract` (64
/// channels on 56×56 rows: 1.10 × tract's time; 3 channels on 224×224: 2.6 ×), and the op
/// leaves the convolution to tract.
const MAX_INPUT_CHANNELS: usize = 32;
const MIN_TRACT_ROW: usize = 128;

#[derive(Debug, Clone, PartialEq)]
pub struct Conv3x3 {
    /// tract's spec of the convolution replaced, which gives the output's facts.
    pool_spec: PoolSpec,
    /// Rows (top, bottom) and columns (left, right) of zeros around the input.
    pads: [[usize; 2]; 2],
    inputs: usize,
    outputs: usize,
    /// The kernel, packed for the loop: `[output block][input channel][tap][CHANNELS]`,
    /// the output channels padded with zeros to a multiple of `CHANNELS`.
    packed: Arc<Vec<f32>>,
    /// One per output channel, padded as `packed`.
    bias: Arc<Vec<f32>>,
}

/// tract compares ops only to merge duplicates: one with a NaN weight is never merged,
/// which costs nothing.
impl Eq for Conv3x3 {}

impl Conv3x3 {
    /// The op for tract's `conv` whose kernel is `kernel` (OIHW) and bias `bias` (one per
    /// output channel, or one for all), or `None` if this op does not compute it.
    fn new(conv: &Conv, input: &TypedFact, kernel: &Tensor, bias: &Tensor) -> Option<Self> {
        let spec = &conv.pool_spec;
        let (inputs, outputs) = (spec.input_channels, spec.output_channels);
        let fits = conv.q_params.is_none()
            && conv.group == 1
            && conv.kernel_fmt == KernelFormat::OIHW
            && spec.data_format == DataFormat::NCHW
            && spec.kernel_shape[..] == [3, 3]
            && spec.strides.as_deref().unwrap_or(&[1, 1]) == [1, 1]
            && spec.dilations.as_deref().unwrap_or(&[1, 1]) == [1, 1]
            && (1..=MAX_INPUT_CHANNELS).contains(&inputs)
            && outputs > 0
            && input.datum_type == f32::datum_type()
            && input.rank() == 4
            // A row whose width is known only at run time stays tract's: it may be as wide as
            // the rows where tract's own direct convolution wins.
            && input.shape[3]
                .to_i64()
                .is_ok_and(|w| (w as usize) < MIN_TRACT_ROW)
            && input.shape[1] == inputs.to_dim();
        if !fits {
            return None;
        }
        Self::pack(conv, kernel, bias)
    }

    /// The op with `kernel` and `bias` packed, for any channel counts and rows.
    fn pack(conv: &Conv, kernel: &Tensor, bias: &Tensor) -> Option<Self> {
        let spec = &conv.pool_spec;
        let (inputs, outputs) = (spec.input_channels, spec.output_channels);
        let pads = padding(&spec.padding)?;
        let fits = kernel.datum_type() == f32::datum_type()
            && kernel.shape() == [outputs, inputs, 3, 3]
            && bias.datum_type() == f32::datum_type()
            && (bias.len() == outputs || bias.len() == 1);
        if !fits {
            return None;
        }
        let kernel = kernel.try_as_plain_ram().ok()?;
        let kernel = kernel.as_slice::<f32>().ok()?;
        let bias = bias.try_as_plain_ram().ok()?;
        let bias = bias.as_slice::<f32>().ok()?;
        let blocks = outputs.div_ceil(CHANNELS);
        let mut packed = vec![0f32; blocks * inputs * TAPS * CHANNELS];
        for o in 0..outputs {
            let (block, lane) = (o / CHANNELS, o % CHANNELS);
            for i in 0..inputs {
                for tap in 0..TAPS {
                    packed[((block * inputs + i) * TAPS + tap) * CHANNELS + lane] =
                        kernel[(o * inputs + i) * TAPS + tap];
                }
            }
        }
        let bias = (0..blocks * CHANNELS)
            .map(|o| match o < outputs {
                true => bias[if bias.len() == 1 { 0 } else { o }],
                false => 0.0,
            })
            .collect();
        Some(Conv3x3 {
            pool_spec: spec.clone(),
            pads,
            inputs,
            outputs,
            packed: Arc::new(packed),
            bias: Arc::new(bias),
        })
    }

    fn geometry(&self, [h, w]: [usize; 2]) -> Geometry {
        let [rows, cols] = self.pads;
        Geometry::new(self.inputs, self.outputs, [h, w], rows, cols)
    }
}

/// The padding of a 3×3 stride-1 convolution: rows (top, bottom) and columns (left, right),
/// the same for every input size; `None` for a kind this op does not take.
fn padding(spec: &PaddingSpec) -> Option<[[usize; 2]; 2]> {
    match spec {
        PaddingSpec::Valid => Some([[0, 0]; 2]),
        // SAME keeps the size: at stride 1 a 3×3 kernel needs two rows and two columns,
        // one on each side, whichever side SAME_UPPER or SAME_LOWER would favour.
        PaddingSpec::SameUpper | PaddingSpec::SameLower => Some([[1, 1]; 2]),
        PaddingSpec::Explicit(before, after) if before.len() == 2 && after.len() == 2 => {
            Some([[before[0], after[0]], [before[1], after[1]]])
        }
        // Ceil mode and the like are pools' and are not expected on a convolution.
        _ => None,
    }
}

impl NchwKernel for Conv3x3 {
    const NAME: &'static str = "tensorgate.Conv3x3Stride1";

    fn pool_spec(&self) -> &PoolSpec {
        &self.pool_spec
    }

    fn output_shape(&self, [n, c, h, w]: [usize; 4]) -> Result<[usize; 4], String> {
        if c != self.inputs {
            return Err(format!("takes {} channels, got {c}", self.inputs));
        }
        let g = self.geometry([h, w]);
        Ok([n, self.outputs, g.oh, g.ow])
    }

    fn compute(&self, [_, _, h, w]: [usize; 4], input: &[f32], output: &mut [f32]) {
        convolve(
            input,
            output,
            &self.packed,
            &self.bias,
            &self.geometry([h, w]),
        );
    }
}

/// The sizes of one run: input `h`×`w` planes of `c` channels, output `oh`×`ow` planes of
/// `o` channels, and the zero-padded copy of a sample's input (`ph` rows of `pw`, wide
/// enough for the last block of columns to read whole vectors).
#[derive(Debug, Clone, Copy)]
struct Geometry {
    c: usize,
    o: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    top: usize,
    left: usize,
    ph: usize,
    pw: usize,
    column_blocks: usize,
}

impl Geometry {
    fn new(c: usize, o: usize, [h, w]: [usize; 2], rows: [usize; 2], cols: [usize; 2]) -> Self {
        let (ph, padded_w) = (h + rows[0] + rows[1], w + cols[0] + cols[1]);
        let (oh, ow) = (ph.saturating_sub(2), padded_w.saturating_sub(2));
        let column_blocks = ow.div_ceil(LANES);
        Geometry {
            c,
            o,
            h,
            w,
            oh,
            ow,
            top: rows[0],
            left: cols[0],
            ph,
            pw: column_blocks * LANES + 2,
            column_blocks,
        }
    }
}

/// Every sample of `input` convolved into `output`, with the best kernel this CPU runs.
fn convolve(input: &[f32], output: &mut [f32], packed: &[f32], bias: &[f32], g: &Geometry) {
    if g.oh == 0 || g.ow == 0 || output.is_empty() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has just been found to run AVX-512F.
            return unsafe { convolve_avx512(input, output, packed, bias, g) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has just been found to run AVX2 and FMA.
            return unsafe { convolve_avx2(input, output, packed, bias, g) };
        }
        convolve_with::<false>(input, output, packed, bias, g)
    }
    #[cfg(not(target_arch = "x86_64"))]
    convolve_with::<true>(input, output, packed, bias, g)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn convolve_avx512(input: &[f32], output: &mut [f32], packed: &[f32], bias: &[f32], g: &Geometry) {
    convolve_with::<true>(input, output, packed, bias, g)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn convolve_avx2(input: &[f32], output: &mut [f32], packed: &[f32], bias: &[f32], g: &Geometry) {
    convolve_with::<true>(input, output, packed, bias, g)
}

/// The loops, inlined into each of the wrappers above so that each is vectorised for its
/// instruction set. `FMA`: whether `mul_add` is one instruction here (without it, it is a
/// call into libm, far slower than a multiply and an add).
#[inline(always)]
fn convolve_with<const FMA: bool>(
    input: &[f32],
    output: &mut [f32],
    packed: &[f32],
    bias: &[f32],
    g: &Geometry,
) {
    let (in_plane, out_plane) = (g.h * g.w, g.oh * g.ow);
    // The padding cells are written once, as zeros; each sample overwrites only the interior.
    // (Index loops, not chunks: an empty input plane, padded, still has an output.)
    let mut padded = vec![0f32; g.c * g.ph * g.pw];
    for (s, out) in output.chunks_exact_mut(g.o * out_plane).enumerate() {
        for i in 0..g.c {
            for y in 0..g.h {
                let row = &input[(s * g.c + i) * in_plane + y * g.w..][..g.w];
                let at = (i * g.ph + g.top + y) * g.pw + g.left;
                padded[at..at + g.w].copy_from_slice(row);
            }
        }
        for block in 0..g.o.div_ceil(CHANNELS) {
            let weights = &packed[block * g.c * TAPS * CHANNELS..][..g.c * TAPS * CHANNELS];
            let bias: &[f32; CHANNELS] = bias[block * CHANNELS..][..CHANNELS]
                .try_into()
                .expect("bias padded to whole blocks");
            let channels = CHANNELS.min(g.o - block * CHANNELS);
            for y in 0..g.oh {
                for column_block in 0..g.column_blocks {
                    let x0 = column_block * LANES;
                    let sums = output_block::<FMA>(&padded, weights, bias, g, y, x0);
                    let columns = LANES.min(g.ow - x0);
                    for (k, sum) in sums.iter().take(channels).enumerate() {
                        let at = (block * CHANNELS + k) * out_plane + y * g.ow + x0;
                        out[at..at + columns].copy_from_slice(&sum[..columns]);
                    }
                }
            }
        }
    }
}

/// `CHANNELS` output channels at row `y`, columns `x0..x0 + LANES`: the bias plus every
/// tap of every input channel.
#[inline(always)]
fn output_block<const FMA: bool>(
    padded: &[f32],
    weights: &[f32],
    bias: &[f32; CHANNELS],
    g: &Geometry,
    y: usize,
    x0: usize,
) -> [[f32; LANES]; CHANNELS] {
    let mut sums = bias.map(|b| [b; LANES]);
    for (i, taps) in weights.chunks_exact(TAPS * CHANNELS).enumerate() {
        for ky in 0..3 {
            let row = &padded[(i * g.ph + y + ky) * g.pw + x0..][..LANES + 2];
            for kx in 0..3 {
                let x: &[f32; LANES] = row[kx..kx + LANES].try_into().expect("LANES long");
                let w: &[f32; CHANNELS] = taps[(ky * 3 + kx) * CHANNELS..][..CHANNELS]
                    .try_into()
                    .expect("CHANNELS long");
                for (sum, w) in sums.iter_mut().zip(w) {
                    for (s, x) in sum.iter_mut().zip(x) {
                        *s = if FMA { x.mul_add(*w, *s) } else { x * w + *s };
                    }
                }
            }
        }
    }
    sums
}

/// Replaces each of `model`'s convolutions that fits with the op above; returns how many.
/// Runs on a decluttered model, before tract lowers its convolutions.
pub fn replace_convs(model: &mut TypedModel) -> TractResult<usize> {
    replace_each(model, |model, node| {
        let Some(conv) = node.op_as::<Conv>() else {
            return Ok(None);
        };
        let [x, kernel, bias] = node.inputs[..] else {
            return Ok(None);
        };
        let (Some(kernel), Some(bias)) = (
            &model.outlet_fact(kernel)?.konst,
            &model.outlet_fact(bias)?.konst,
        ) else {
            return Ok(None);
        };
        Ok(Conv3x3::new(conv, model.outlet_fact(x)?, kernel, bias).map(|op| (op, x)))
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use tract_onnx::tract_core::internal::EvalOp;

    use super::*;

    /// The convolution read tap by tap, in f64: the definition the op must meet.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        input: &[f32],
        kernel: &[f32],
        bias: &[f32],
        n: usize,
        c: usize,
        o: usize,
        [h, w]: [usize; 2],
        [top, bottom, left, right]: [usize; 4],
    ) -> Vec<f32> {
        let (oh, ow) = (
            (h + top + bottom).saturating_sub(2),
            (w + left + right).saturating_sub(2),
        );
        let mut out = Vec::with_capacity(n * o * oh * ow);
        for s in 0..n {
            for oc in 0..o {
                for y in 0..oh {
                    for x in 0..ow {
                        let mut sum = bias[oc] as f64;
                        for i in 0..c {
                            for ky in 0..3 {
                                for kx in 0..3 {
                                    let (iy, ix) = (
                                        (y + ky) as isize - top as isize,
                                        (x + kx) as isize - left as isize,
                                    );
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                        continue;
                                    }
                                    let v =
                                        input[((s * c + i) * h + iy as usize) * w + ix as usize];
                                    sum +=
                                        v as f64 * kernel[((oc * c + i) * 3 + ky) * 3 + kx] as f64;
                                }
                            }
                        }
                        out.push(sum as f32);
                    }
                }
            }
        }
        out
    }

    /// Explicit padding as [top, bottom, left, right], or a kind ONNX names.
    #[derive(Debug, Clone)]
    enum Pad {
        Explicit([usize; 4]),
        Valid,
        SameUpper,
        SameLower,
    }

    impl Pad {
        fn spec(&self) -> PaddingSpec {
            match self {
                Pad::Explicit(p) => PaddingSpec::Explicit(tvec![p[0], p[2]], tvec![p[1], p[3]]),
                Pad::Valid => PaddingSpec::Valid,
                Pad::SameUpper => PaddingSpec::SameUpper,
                Pad::SameLower => PaddingSpec::SameLower,
            }
        }

        /// [top, bottom, left, right], by ONNX's definition of each kind.
        fn sides(&self) -> [usize; 4] {
            match self {
                Pad::Explicit(p) => *p,
                Pad::Valid => [0; 4],
                Pad::SameUpper | Pad::SameLower => [1; 4],
            }
        }
    }

    fn pads() -> impl Strategy<Value = Pad> {
        prop_oneof![
            proptest::array::uniform4(0usize..3).prop_map(Pad::Explicit),
            Just(Pad::Valid),
            Just(Pad::SameUpper),
            Just(Pad::SameLower),
        ]
    }

    fn spec(c: usize, o: usize, pads: [usize; 4]) -> PoolSpec {
        with_padding(c, o, &Pad::Explicit(pads))
    }

    fn with_padding(c: usize, o: usize, pad: &Pad) -> PoolSpec {
        PoolSpec {
            data_format: DataFormat::NCHW,
            kernel_shape: tvec![3, 3],
            padding: pad.spec(),
            dilations: None,
            strides: None,
            input_channels: c,
            output_channels: o,
        }
    }

    fn conv_op(spec: PoolSpec) -> Conv {
        Conv {
            pool_spec: spec,
            kernel_fmt: KernelFormat::OIHW,
            group: 1,
            q_params: None,
        }
    }

    fn op(kernel: &[f32], bias: &[f32], shape: [usize; 4], o: usize, pad: &Pad) -> Conv3x3 {
        let [n, c, h, w] = shape;
        let kernel = Tensor::from_shape(&[o, c, 3, 3], kernel).unwrap();
        let bias = Tensor::from_shape(&[bias.len()], bias).unwrap();
        Conv3x3::new(
            &conv_op(with_padding(c, o, pad)),
            &f32::fact([n, c, h, w]),
            &kernel,
            &bias,
        )
        .expect("the op fits")
    }

    /// Runs the op as a plan would, on `input` of shape `[n, c, h, w]`.
    fn run(
        input: &[f32],
        kernel: &[f32],
        bias: &[f32],
        shape: [usize; 4],
        o: usize,
        pad: &Pad,
    ) -> Vec<f32> {
        let [n, c, h, w] = shape;
        let op = op(kernel, bias, shape, o, pad);
        let input = Tensor::from_shape(&[n, c, h, w], input).unwrap();
        let out = NchwOp(op)
            .eval_out_of_plan(tvec!(input.into_tvalue()))
            .unwrap()
            .unwrap();
        let out = out[0].try_as_plain_ram().unwrap();
        out.as_slice::<f32>().unwrap().to_vec()
    }

    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut state = seed | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / 8_388_608.0 - 1.0
            })
            .collect()
    }

    fn assert_close(got: &[f32], want: &[f32], kernel: &str) {
        assert_eq!(got.len(), want.len());
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 + 1e-5 * w.abs(),
                "{kernel}, element {k}: {g} against {w}"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any batch, channel counts on both sides of a block, rows narrower and wider than a
        /// block of columns, every explicit padding from none to two on each side, VALID and
        /// both SAMEs.
        #[test]
        fn computes_the_convolution(
            n in 0usize..3, c in 1usize..6, o in 1usize..10,
            h in 0usize..9, w in 0usize..40,
            pad in pads(),
            seed in any::<u64>(),
        ) {
            let pads = pad.sides();
            let input = values(n * c * h * w, seed);
            let kernel = values(o * c * 9, seed.rotate_left(17));
            let bias = values(o, seed.rotate_left(31));
            let got = run(&input, &kernel, &bias, [n, c, h, w], o, &pad);
            let want = reference(&input, &kernel, &bias, n, c, o, [h, w], pads);
            assert_close(&got, &want, "picked");
            // The kernels this CPU did not pick compute the same.
            let op = op(&kernel, &bias, [n, c, h, w], o, &pad);
            let g = op.geometry([h, w]);
            for (name, kernel) in other_kernels() {
                let mut out = vec![0.0; want.len()];
                if !out.is_empty() {
                    kernel(&input, &mut out, &op.packed, &op.bias, &g);
                }
                assert_close(&out, &want, name);
            }
        }
    }

    type Kernel = fn(&[f32], &mut [f32], &[f32], &[f32], &Geometry);

    /// The portable loops, with and without `mul_add`, and the AVX2 one where it runs.
    fn other_kernels() -> Vec<(&'static str, Kernel)> {
        let mut kernels: Vec<(&'static str, Kernel)> = vec![
            ("portable", convolve_with::<false>),
            ("portable with mul_add", convolve_with::<true>),
        ];
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU runs AVX2 and FMA.
            kernels.push(("avx2", |i, o, p, b, g| unsafe {
                convolve_avx2(i, o, p, b, g)
            }));
        }
        kernels
    }

    /// One bias for every channel, as tract holds a convolution without a bias (0).
    #[test]
    fn a_single_bias_applies_to_every_channel() {
        let (c, o) = (2, 5);
        let input = values(c * 6 * 6, 3);
        let kernel = values(o * c * 9, 5);
        let got = run(&input, &kernel, &[0.25], [1, c, 6, 6], o, &Pad::SameUpper);
        let want = reference(&input, &kernel, &[0.25; 5], 1, c, o, [6, 6], [1, 1, 1, 1]);
        assert_close(&got, &want, "picked");
    }

    /// Non-finite inputs spread as in the definition: an infinity times a tap gives an
    /// infinity, and a NaN anywhere in a window gives NaN.
    #[test]
    fn non_finite_inputs_spread_to_their_windows() {
        let mut input = vec![1.0f32; 5 * 5];
        input[0] = f32::INFINITY;
        input[24] = f32::NAN;
        let kernel = vec![1.0f32; 9];
        let got = run(
            &input,
            &kernel,
            &[0.0],
            [1, 1, 5, 5],
            1,
            &Pad::Explicit([1; 4]),
        );
        assert_eq!(got[0], f32::INFINITY);
        assert!(got[24].is_nan() && got[18].is_nan());
        assert_eq!(got[12], 9.0);
    }

    /// How many convolutions `replace_convs` takes from a model of one 3×3 convolution (two
    /// outputs, padding 1) over `input`, changed by `change`.
    /// A model of one 3×3 convolution (`o` outputs, zero weights, padding 1) over `input`,
    /// changed by `change`.
    fn one_conv(input: TypedFact, o: usize, change: impl Fn(&mut Conv)) -> TypedModel {
        let c = input.shape[1].to_i64().unwrap() as usize;
        let mut conv = conv_op(spec(c, o, [1; 4]));
        change(&mut conv);
        let per_group = c / conv.group;
        let mut model = TypedModel::default();
        let x = model.add_source("x", input).unwrap();
        let k = model
            .add_const("k", Tensor::zero::<f32>(&[o, per_group, 3, 3]).unwrap())
            .unwrap();
        let b = model
            .add_const("b", Tensor::zero::<f32>(&[o]).unwrap())
            .unwrap();
        let y = model.wire_node("conv", conv, &[x, k, b]).unwrap()[0];
        model.select_output_outlets(&[y]).unwrap();
        model
    }

    /// How many convolutions `replace_convs` takes from `one_conv` over `input`.
    fn replaced(input: TypedFact, change: impl Fn(&mut Conv)) -> usize {
        replace_convs(&mut one_conv(input, 2, change)).unwrap()
    }

    /// `cargo test --release --lib conv3x3 -- --ignored --nocapture`: tract's plan of one
    /// convolution against this op's, per shape; the limits above come from it.
    #[test]
    #[ignore]
    fn speed_against_tract() {
        for (n, c, o, hw) in [
            (1, 1, 8, 28),
            (8, 1, 8, 28),
            (1, 8, 16, 14),
            (8, 8, 16, 14),
            (1, 16, 64, 55),
            (1, 32, 32, 56),
            (1, 64, 64, 56),
            (1, 64, 128, 112),
            (1, 3, 64, 224),
            (1, 64, 64, 28),
            (1, 32, 32, 28),
        ] {
            let mut times = Vec::new();
            for ours in [false, true] {
                let mut model = one_conv(f32::fact([n, c, hw, hw]), o, |_| ());
                if ours {
                    // Past the limits above, this op's kernel is timed all the same.
                    let node = model.node(model.output_outlets().unwrap()[0].node);
                    let conv = node.op_as::<Conv>().unwrap().clone();
                    let kernel = Tensor::zero::<f32>(&[o, c, 3, 3]).unwrap();
                    let op = NchwOp(Conv3x3::pack(&conv, &kernel, &tensor0(0f32)).unwrap());
                    let patch =
                        TypedModelPatch::replace_single_op(&model, node, &node.inputs[..1], op)
                            .unwrap();
                    patch.apply(&mut model).unwrap();
                }
                let plan = model.into_optimized().unwrap().into_runnable().unwrap();
                let input = Tensor::zero::<f32>(&[n, c, hw, hw]).unwrap().into_tvalue();
                let runs = (20_000_000 / (n * c * o * hw * hw * 9)).clamp(3, 20_000);
                plan.run(tvec!(input.clone())).unwrap();
                let start = std::time::Instant::now();
                for _ in 0..runs {
                    plan.run(tvec!(input.clone())).unwrap();
                }
                times.push(start.elapsed().as_secs_f64() * 1e6 / runs as f64);
            }
            println!(
                "n={n} c={c} o={o} {hw}x{hw}: tract {:.1} us, ours {:.1} us, ours/tract {:.2}",
                times[0],
                times[1],
                times[1] / times[0]
            );
        }
    }

    /// Rows as wide as tract's own direct convolution takes, or of a width known only at run
    /// time, dilations, groups and a pool's ceil mode stay tract's.
    #[test]
    fn leaves_to_tract_what_it_does_as_well_or_this_op_does_not_compute() {
        let fact = |w: usize| f32::fact([1, 2, 8, w]);
        assert_eq!(replaced(fact(MIN_TRACT_ROW - 1), |_| ()), 1);
        assert_eq!(replaced(fact(MIN_TRACT_ROW), |_| ()), 0);
        let n = TDim::Sym(SymbolScope::default().sym("N"));
        let w = TDim::Sym(SymbolScope::default().sym("W"));
        assert_eq!(
            replaced(
                f32::fact(&[n.clone(), 2.into(), 8.into(), 8.into()]),
                |_| ()
            ),
            1
        );
        assert_eq!(replaced(f32::fact(&[n, 2.into(), 8.into(), w]), |_| ()), 0);
        assert_eq!(
            replaced(fact(8), |c| c.pool_spec.dilations = Some(tvec![2, 2])),
            0
        );
        assert_eq!(replaced(fact(8), |c| c.group = 2), 0);
        assert_eq!(
            replaced(fact(8), |c| c.pool_spec.padding =
                PaddingSpec::ExplicitOnnxPool(tvec![1, 1], tvec![1, 1], true)),
            0
        );
    }

    #[test]
    fn replaces_only_the_convolutions_it_computes() {
        let mut model = TypedModel::default();
        let x = model.add_source("x", f32::fact([1, 2, 8, 8])).unwrap();
        let mut wire = x;
        let cases = [
            ("fits", 3, 1, 2),
            ("five_by_five", 5, 1, 2),
            ("strided", 3, 2, 2),
            ("too_many_channels", 3, 1, MAX_INPUT_CHANNELS + 1),
        ];
        for (name, k, stride, channels) in cases {
            if channels != 2 {
                // A 1×1 convolution first brings the channels this case needs.
                let w = model
                    .add_const(
                        format!("{name}.widen.k"),
                        Tensor::zero::<f32>(&[channels, 2, 1, 1]).unwrap(),
                    )
                    .unwrap();
                let b = model
                    .add_const(format!("{name}.widen.b"), tensor0(0f32))
                    .unwrap();
                let mut widen = spec(2, channels, [0; 4]);
                widen.kernel_shape = tvec![1, 1];
                wire = model
                    .wire_node(format!("{name}.widen"), conv_op(widen), &[wire, w, b])
                    .unwrap()[0];
            }
            let c = channels;
            let w = model
                .add_const(
                    format!("{name}.k"),
                    Tensor::zero::<f32>(&[2, c, k, k]).unwrap(),
                )
                .unwrap();
            let b = model
                .add_const(format!("{name}.b"), tensor1(&[0f32, 1.0]))
                .unwrap();
            let mut s = spec(c, 2, [k / 2; 4]);
            s.kernel_shape = tvec![k, k];
            s.strides = Some(tvec![stride, stride]);
            wire = model.wire_node(name, conv_op(s), &[wire, w, b]).unwrap()[0];
        }
        model.select_output_outlets(&[wire]).unwrap();
        assert_eq!(replace_convs(&mut model).unwrap(), 1);
        let convs: Vec<String> = model
            .eval_order()
            .unwrap()
            .into_iter()
            .map(|id| model.node(id))
            .filter(|node| {
                node.op_as::<Conv>().is_some() || node.op_as::<NchwOp<Conv3x3>>().is_some()
            })
            .map(|node| format!("{} {}", node.name, node.op().name()))
            .collect();
        assert_eq!(
            convs,
            [
                "fits tensorgate.Conv3x3Stride1",
                "five_by_five Conv",
                "strided Conv",
                "too_many_channels.widen Conv",
                "too_many_channels Conv",
            ]
        );
    }
}
