//! What the gateway forgives in a backend's answers. Clients are held to the protocol; real
//! servers are not always, and refusing a whole backend over a gap that loses nothing helps
//! no one. Each tolerance is named, so that the fleet and the infer path can count it
//! (`tensorgate_backend_tolerated_total`) and an operator can see which backend needs it.

/// One deviation from the protocol that the gateway reads past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tolerance {
    /// Model metadata with `"versions": null` or no `versions` (KServe 0.21): read as a model
    /// that lists no versions.
    VersionsAbsent,
    /// Model metadata with no `platform`, or `"platform": null`: read as `""`.
    PlatformAbsent,
    /// `null` elements in the data of a floating-point output (KServe writes NaN so): read
    /// as NaN. Integer, BOOL and BYTES data stay strict.
    NullFloat,
    /// Bare `NaN`, `Infinity` and `-Infinity` literals in output data (Triton writes them):
    /// read as the non-finite values.
    NonFiniteLiteral,
    /// Model metadata that lists no versions for a model whose repository index entries
    /// name the versions it serves (MLServer 1.7): the index's versions are the model's.
    VersionsFromIndex,
}

impl Tolerance {
    pub const ALL: [Tolerance; 5] = [
        Tolerance::VersionsAbsent,
        Tolerance::PlatformAbsent,
        Tolerance::NullFloat,
        Tolerance::NonFiniteLiteral,
        Tolerance::VersionsFromIndex,
    ];

    /// The metric label value.
    pub fn label(self) -> &'static str {
        match self {
            Tolerance::VersionsAbsent => "metadata_versions_absent",
            Tolerance::PlatformAbsent => "metadata_platform_absent",
            Tolerance::NullFloat => "null_float_as_nan",
            Tolerance::NonFiniteLiteral => "bare_non_finite_literal",
            Tolerance::VersionsFromIndex => "metadata_versions_from_index",
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// The tolerances one answer needed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tolerated(u8);

impl Tolerated {
    pub fn insert(&mut self, t: Tolerance) {
        self.0 |= t.bit();
    }

    pub fn contains(self, t: Tolerance) -> bool {
        self.0 & t.bit() != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Tolerance> {
        Tolerance::ALL
            .into_iter()
            .filter(move |t| self.contains(*t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_holds_what_was_inserted() {
        let mut t = Tolerated::default();
        assert!(t.is_empty());
        t.insert(Tolerance::NullFloat);
        t.insert(Tolerance::VersionsAbsent);
        t.insert(Tolerance::NullFloat);
        assert_eq!(
            t.iter().collect::<Vec<_>>(),
            [Tolerance::VersionsAbsent, Tolerance::NullFloat]
        );
        let labels: std::collections::HashSet<_> =
            Tolerance::ALL.iter().map(|t| t.label()).collect();
        assert_eq!(labels.len(), Tolerance::ALL.len());
    }
}
