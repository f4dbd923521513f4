//! The 13 tensor datatypes of the Open Inference Protocol.

use std::fmt;

/// A tensor element type. The wire name is the upper-case string of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Fp16,
    Bf16,
    Fp32,
    Fp64,
    Bytes,
}

impl DataType {
    pub const ALL: [DataType; 14] = [
        DataType::Bool,
        DataType::Uint8,
        DataType::Uint16,
        DataType::Uint32,
        DataType::Uint64,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::Fp16,
        DataType::Bf16,
        DataType::Fp32,
        DataType::Fp64,
        DataType::Bytes,
    ];

    pub fn parse(s: &str) -> Option<DataType> {
        Some(match s {
            "BOOL" => DataType::Bool,
            "UINT8" => DataType::Uint8,
            "UINT16" => DataType::Uint16,
            "UINT32" => DataType::Uint32,
            "UINT64" => DataType::Uint64,
            "INT8" => DataType::Int8,
            "INT16" => DataType::Int16,
            "INT32" => DataType::Int32,
            "INT64" => DataType::Int64,
            "FP16" => DataType::Fp16,
            "BF16" => DataType::Bf16,
            "FP32" => DataType::Fp32,
            "FP64" => DataType::Fp64,
            "BYTES" => DataType::Bytes,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::Uint8 => "UINT8",
            DataType::Uint16 => "UINT16",
            DataType::Uint32 => "UINT32",
            DataType::Uint64 => "UINT64",
            DataType::Int8 => "INT8",
            DataType::Int16 => "INT16",
            DataType::Int32 => "INT32",
            DataType::Int64 => "INT64",
            DataType::Fp16 => "FP16",
            DataType::Bf16 => "BF16",
            DataType::Fp32 => "FP32",
            DataType::Fp64 => "FP64",
            DataType::Bytes => "BYTES",
        }
    }

    /// Bytes per element in the binary encoding; `None` for BYTES, whose elements vary.
    pub fn fixed_size(self) -> Option<usize> {
        match self {
            DataType::Bool | DataType::Uint8 | DataType::Int8 => Some(1),
            DataType::Uint16 | DataType::Int16 | DataType::Fp16 | DataType::Bf16 => Some(2),
            DataType::Uint32 | DataType::Int32 | DataType::Fp32 => Some(4),
            DataType::Uint64 | DataType::Int64 | DataType::Fp64 => Some(8),
            DataType::Bytes => None,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(
            self,
            DataType::Fp16 | DataType::Bf16 | DataType::Fp32 | DataType::Fp64
        )
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_round_trips() {
        for dt in DataType::ALL {
            assert_eq!(DataType::parse(dt.as_str()), Some(dt));
        }
        assert_eq!(DataType::parse("fp32"), None);
        assert_eq!(DataType::parse("STRING"), None);
    }

    #[test]
    fn sizes_follow_the_protocol_table() {
        assert_eq!(DataType::Bool.fixed_size(), Some(1));
        assert_eq!(DataType::Bf16.fixed_size(), Some(2));
        assert_eq!(DataType::Uint32.fixed_size(), Some(4));
        assert_eq!(DataType::Fp64.fixed_size(), Some(8));
        assert_eq!(DataType::Bytes.fixed_size(), None);
    }
}
