//! What a ModelInferRequest says of itself before its inputs are decoded: its model, id and
//! parameters. A stream orders its messages by sequence as they arrive, and answers one that
//! cannot be decoded by its id; reading only these fields skips the inputs' bytes (prost
//! steps over a field it does not know by its length), so it costs nothing in proportion to
//! the tensors.

use std::collections::HashMap;

use super::pb;

/// The head of a `ModelInferRequest`: its fields 1 to 4, with the same numbers.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MessageHead {
    #[prost(string, tag = "1")]
    pub model_name: String,
    #[prost(string, tag = "2")]
    pub model_version: String,
    #[prost(string, tag = "3")]
    pub id: String,
    #[prost(map = "string, message", tag = "4")]
    pub parameters: HashMap<String, pb::InferParameter>,
}

/// Fields 1 to 3 alone: what a message whose parameters may not be read says of itself.
#[derive(Clone, PartialEq, prost::Message)]
struct MessageNames {
    #[prost(string, tag = "1")]
    model_name: String,
    #[prost(string, tag = "2")]
    model_version: String,
    #[prost(string, tag = "3")]
    id: String,
}

impl MessageHead {
    /// The head of an encoded `ModelInferRequest`; its inputs are stepped over, not read.
    pub fn read(bytes: &[u8]) -> Result<Self, prost::DecodeError> {
        <Self as prost::Message>::decode(bytes)
    }

    /// The model and id of a message refused before its head could be read (a field
    /// repeated past the limit, parameters among them): what its answer names. Empty where
    /// even those cannot be read.
    pub fn names_only(bytes: &[u8]) -> Self {
        let names = <MessageNames as prost::Message>::decode(bytes).unwrap_or_default();
        MessageHead {
            model_name: names.model_name,
            model_version: names.model_version,
            id: names.id,
            parameters: HashMap::new(),
        }
    }

    /// The head of a message already decoded.
    pub fn of(msg: &pb::ModelInferRequest) -> Self {
        MessageHead {
            model_name: msg.model_name.clone(),
            model_version: msg.model_version.clone(),
            id: msg.id.clone(),
            parameters: msg.parameters.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    #[test]
    fn the_head_reads_what_the_whole_message_says() {
        let msg = pb::ModelInferRequest {
            model_name: "m".into(),
            model_version: "2".into(),
            id: "req-7".into(),
            parameters: HashMap::from([(
                "sequence_id".to_string(),
                pb::InferParameter {
                    parameter_choice: Some(pb::infer_parameter::ParameterChoice::Int64Param(9)),
                },
            )]),
            inputs: vec![pb::model_infer_request::InferInputTensor {
                name: "IN".into(),
                shape: vec![1; 1000],
                ..Default::default()
            }],
            raw_input_contents: vec![vec![0u8; 4096].into()],
            ..Default::default()
        };
        let head = MessageHead::read(&msg.encode_to_vec()).unwrap();
        assert_eq!(head, MessageHead::of(&msg));
        let names = MessageHead::names_only(&msg.encode_to_vec());
        assert_eq!(
            (names.model_name.as_str(), names.id.as_str()),
            ("m", "req-7")
        );
        assert!(names.parameters.is_empty());
        assert_eq!(MessageHead::names_only(&[0xff]), MessageHead::default());
    }
}
