//! HTTP edges. Being written.
