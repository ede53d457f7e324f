//! Hookwise's domain, pure: no AWS SDK, no HTTP client, no clock or RNG of its own.
//!
//! Follow an event: [`services::Services::ingest`] writes it and one delivery per matching
//! subscription, then queues a [`ports::DeliveryTask`] for each; [`services::Services::deliver`]
//! signs and POSTs it, and [`state::decide`] turns the outcome into `Delivered`,
//! `Retry { at }` or `Dead`, applied as a conditional [`ports::DeliveryChange`]; retries
//! beyond the queue's delay limit wait in the scheduler table until
//! [`services::Services::run_scheduler`] moves them; dead ones reach
//! [`services::Services::handle_dead_letters`], which emails the owner once.

pub mod auth;
pub mod circuit;
pub mod error;
pub mod filter;
pub mod health;
pub mod metrics;
pub mod model;
pub mod policy;
pub mod ports;
pub mod rate_limit;
pub mod services;
pub mod signing;
pub mod state;
pub mod stats;
pub mod storm;
#[cfg(feature = "testing")]
pub mod testing;

pub use error::{Error, PortError, Result, ValidationError};
