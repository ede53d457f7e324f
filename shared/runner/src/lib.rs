//! What a long-running host runs around the services: `hookwise dev` (on SQLite),
//! `hookwise dev --aws`, and the tests' stand-in for Lambda's event source mapping. On Lambda
//! the runtime and the event source mapping do these jobs instead.
//!
//! - [`worker`]: the one loop that drains a queue through the core's consumer port.
//! - [`host`]: the API, both workers and the scheduler tick under one shutdown.
//!
//! Shutdown is a [`CancellationToken`]: cancelled by Ctrl-C or SIGTERM
//! ([`cancel_on_signals`]), watched by every role.

pub mod host;
pub mod worker;

pub use host::{cancel_on_signals, run_host, HostConfig};
pub use tokio_util::sync::CancellationToken;
pub use worker::{run_worker, BatchHandler, ServicesHandler, WorkerConfig};
