//! The JSON header of a v2 REST request as serde reads it, shared by the serde decoder
//! (`decode`) and the single-pass one (`fast_request`), so that neither depends on the other
//! for its types. `data` stays raw text here; `json_data` converts it.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::protocol::params::Parameters;
use crate::protocol::tensor::MAX_RANK;

#[derive(Deserialize)]
pub(crate) struct WireTensor<'a> {
    pub(crate) name: String,
    /// Borrowed from the body unless it has escapes: only its `DataType` outlives decoding.
    #[serde(borrow)]
    pub(crate) datatype: Cow<'a, str>,
    pub(crate) shape: WireShape,
    #[serde(default)]
    pub(crate) parameters: Parameters,
    #[serde(borrow, default)]
    pub(crate) data: Option<WireData<'a>>,
}

/// A tensor's `shape`: JSON numbers as serde reads them (checked when the tensor is built),
/// or dimensions the fast path already read as plain unsigned integers.
pub(crate) enum WireShape {
    Numbers(Vec<serde_json::Number>),
    Dims(Vec<u64>),
}

impl WireShape {
    /// The number of elements, if every dimension is a u64 and the product fits.
    pub(crate) fn element_count(&self) -> Option<u64> {
        match self {
            WireShape::Dims(dims) => dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d)),
            WireShape::Numbers(dims) => dims
                .iter()
                .try_fold(1u64, |a, d| a.checked_mul(d.as_u64()?)),
        }
    }
}

impl<'de> Deserialize<'de> for WireShape {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_seq(ShapeVisitor)
    }
}

/// Reads at most `MAX_RANK` dimensions: a shape of millions of `1,` would otherwise become
/// a vector eight times the size of its text before any check could see it.
struct ShapeVisitor;

impl<'de> serde::de::Visitor<'de> for ShapeVisitor {
    type Value = WireShape;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "an array of at most {MAX_RANK} dimensions")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<WireShape, A::Error> {
        let mut dims = Vec::new();
        while let Some(d) = seq.next_element::<serde_json::Number>()? {
            if dims.len() == MAX_RANK {
                return Err(serde::de::Error::custom(format!(
                    "more than {MAX_RANK} dimensions (the most a tensor may have)"
                )));
            }
            dims.push(d);
        }
        Ok(WireShape::Numbers(dims))
    }
}

/// A tensor's JSON `data`: its text, or already converted by the fast path.
pub(crate) enum WireData<'a> {
    Text(&'a [u8]),
    /// Binary layout and element count.
    Parsed(Vec<u8>, u64),
}

impl<'de: 'a, 'a> Deserialize<'de> for WireData<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let raw: &'a RawValue = Deserialize::deserialize(d)?;
        Ok(WireData::Text(raw.get().as_bytes()))
    }
}

#[derive(Deserialize)]
pub(crate) struct WireRequestedOutput {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) parameters: Parameters,
}

#[derive(Deserialize)]
pub(crate) struct WireRequest<'a> {
    #[serde(default)]
    pub(crate) id: Option<String>,
    #[serde(default)]
    pub(crate) parameters: Parameters,
    #[serde(borrow)]
    pub(crate) inputs: Vec<WireTensor<'a>>,
    #[serde(default)]
    pub(crate) outputs: Option<Vec<WireRequestedOutput>>,
}
