//! Hookwise's HTTP edges: [`api::router`], the public API served by `hookwise dev` with
//! `axum::serve` and on Lambda with `lambda_http`; and [`sender::HttpSender`], the
//! reqwest implementation of the core's `Sender` port.

pub mod api;
pub mod sender;

pub use api::{router, ApiState, PortalConfig};
pub use sender::{send_batch, HttpSender, SenderConfig, SsrfGuard};
