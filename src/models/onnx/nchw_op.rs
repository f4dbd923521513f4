//! What the crate's own tract ops share: one f32 NCHW input, one f32 output shaped as tract's
//! `PoolSpec` of the op they replace says, and a kernel from one slice to the other. The
//! wrapper below is the tract op; each kernel says only what it computes.

use std::fmt::Debug;

use tract_onnx::prelude::*;
use tract_onnx::tract_core::internal::{EvalContext, EvalOp, Op, StaticName, TypedOp};
use tract_onnx::tract_core::ops::cnn::PoolSpec;

pub trait NchwKernel: Debug + Clone + PartialEq + Eq + Send + Sync + 'static {
    /// The op's name in tract's plans.
    const NAME: &'static str;

    /// tract's spec of the op replaced, which gives the output's facts.
    fn pool_spec(&self) -> &PoolSpec;

    /// The output's shape for an input of `shape`, or why this op cannot take it.
    fn output_shape(&self, shape: [usize; 4]) -> Result<[usize; 4], String>;

    /// Fills `output` (zeros, of `output_shape`) from `input`, of `shape`.
    fn compute(&self, shape: [usize; 4], input: &[f32], output: &mut [f32]);
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NchwOp<K>(pub K);

impl<K: NchwKernel> Op for NchwOp<K> {
    fn name(&self) -> StaticName {
        K::NAME.into()
    }

    fn as_typed(&self) -> Option<&dyn TypedOp> {
        Some(self)
    }
}

impl<K: NchwKernel> EvalOp for NchwOp<K> {
    fn eval_out_of_plan(&self, inputs: TVec<TValue>) -> TractResult<Option<TVec<TValue>>> {
        Ok(Some(self.eval(&EvalContext::out_of_plan(), inputs)?))
    }

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let fail = |why: String| TractError::msg(format!("{}: {why}", K::NAME));
        let [input] = &inputs[..] else {
            return Err(fail(format!("takes one input, got {}", inputs.len())));
        };
        let shape: [usize; 4] = input
            .shape()
            .try_into()
            .map_err(|_| fail(format!("takes NCHW, got shape {:?}", input.shape())))?;
        let mut output = Tensor::zero::<f32>(&self.0.output_shape(shape).map_err(fail)?)?;
        {
            let source = input.try_as_plain_ram()?;
            let mut target = output.try_as_plain_ram_mut()?;
            self.0.compute(
                shape,
                source.as_slice::<f32>()?,
                target.as_slice_mut::<f32>()?,
            );
        }
        Ok(tvec!(output.into_tvalue()))
    }
}

impl<K: NchwKernel> TypedOp for NchwOp<K> {
    fn as_op(&self) -> &dyn Op {
        self
    }

    fn as_op_mut(&mut self) -> &mut dyn Op {
        self
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        self.0.pool_spec().output_facts(inputs)
    }
}

/// Replaces each node of `model` for which `choose` gives a kernel with that kernel's op,
/// wired to the inputs `choose` gives; returns how many were replaced.
pub fn replace_each<K: NchwKernel>(
    model: &mut TypedModel,
    choose: impl Fn(&TypedModel, &TypedNode) -> TractResult<Option<(K, OutletId)>>,
) -> TractResult<usize> {
    let mut replaced = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        let Some((kernel, input)) = choose(model, node)? else {
            continue;
        };
        let patch = TypedModelPatch::replace_single_op(model, node, &[input], NchwOp(kernel))?;
        patch.apply(model)?;
        replaced += 1;
    }
    if replaced > 0 {
        model.compact()?;
    }
    Ok(replaced)
}
