//! Embedded backend. Being written.
