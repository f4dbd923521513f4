//! Decoding limits that keep hostile bodies from costing unbounded time or memory.

#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Largest JSON part of a body (Triton's default is 64 MiB).
    pub max_json_bytes: usize,
    /// Deepest nesting of a tensor's `data` array.
    pub max_json_depth: usize,
    /// Most elements one tensor may have.
    pub max_tensor_elements: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_json_bytes: 64 << 20,
            max_json_depth: 64,
            max_tensor_elements: 1 << 28,
        }
    }
}
