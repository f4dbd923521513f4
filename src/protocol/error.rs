//! Errors of the protocol layer. All but `Inconsistent` are the client's (or a backend
//! body's) fault; the server maps them to HTTP statuses in one place (`crate::error`).

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    /// Malformed or inconsistent body: 400.
    Invalid(String),
    /// A configured size limit was exceeded: 413.
    TooLarge(String),
    /// A tensor built by the server itself (a built-in model's output) whose bytes do not
    /// match its shape: never the client's fault, so a 500.
    Inconsistent(String),
}

impl ProtocolError {
    pub fn invalid(msg: impl Into<String>) -> Self {
        ProtocolError::Invalid(msg.into())
    }

    pub fn too_large(msg: impl Into<String>) -> Self {
        ProtocolError::TooLarge(msg.into())
    }

    pub fn message(&self) -> &str {
        match self {
            ProtocolError::Invalid(m)
            | ProtocolError::TooLarge(m)
            | ProtocolError::Inconsistent(m) => m,
        }
    }

    /// Adds what the reader can do about it, after the message.
    pub fn with_hint(self, hint: &str) -> Self {
        match self {
            ProtocolError::Invalid(m) => ProtocolError::Invalid(format!("{m}; {hint}")),
            ProtocolError::TooLarge(m) => ProtocolError::TooLarge(format!("{m}; {hint}")),
            ProtocolError::Inconsistent(m) => ProtocolError::Inconsistent(format!("{m}; {hint}")),
        }
    }

    /// Prefixes the message with the tensor it concerns, e.g. `input 'INPUT0': `.
    pub fn in_tensor(self, role: Role, name: &str) -> Self {
        let wrap = |m: String| format!("{role} '{name}': {m}");
        match self {
            ProtocolError::Invalid(m) => ProtocolError::Invalid(wrap(m)),
            ProtocolError::TooLarge(m) => ProtocolError::TooLarge(wrap(m)),
            ProtocolError::Inconsistent(m) => ProtocolError::Inconsistent(wrap(m)),
        }
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for ProtocolError {}

/// Which side of an exchange a tensor belongs to, used in error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Input,
    Output,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Input => "input",
            Role::Output => "output",
        })
    }
}

pub type Result<T, E = ProtocolError> = std::result::Result<T, E>;
