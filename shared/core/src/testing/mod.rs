//! Test support, behind the `testing` feature: in-memory ports and the contract suite
//! every backend must pass. Never used on a production path.

pub mod contract;
pub mod memory;
