//! Retry-storm simulation (seed 003). Being written.
