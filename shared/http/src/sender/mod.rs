//! The webhook sender: one pooled reqwest client (rustls), a total timeout per request,
//! redirects not followed, an SSRF guard on every resolved address, and a bounded record
//! of what the endpoint answered.

mod guard;
mod retry_after;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use futures::StreamExt;
use hookwise_core::model::{excerpt, DEFAULT_TIMEOUT_MS, EXCERPT_LIMIT};
use hookwise_core::ports::{SendErrorKind, SendOutcome, Sender, WebhookRequest};
use ipnet::IpNet;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::StatusCode;

pub use guard::{BlockedAddress, SsrfGuard};
pub use retry_after::parse_retry_after;

/// How the sender is built. `Default` allows no special-purpose address at all.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    /// CIDRs the SSRF guard lets through even though they are private, loopback, ... .
    pub allow_cidrs: Vec<IpNet>,
    /// The longest a TCP (and TLS) connect may take; the request's own `timeout` bounds
    /// the whole exchange, connect included, so the shorter of the two wins.
    pub connect_timeout: Duration,
    pub user_agent: String,
    /// Idle connections kept per host for reuse.
    pub max_idle_per_host: usize,
}

impl Default for SenderConfig {
    fn default() -> Self {
        Self {
            allow_cidrs: Vec::new(),
            connect_timeout: Duration::from_millis(u64::from(DEFAULT_TIMEOUT_MS)),
            user_agent: concat!("Hookwise/", env!("CARGO_PKG_VERSION")).into(),
            max_idle_per_host: 32,
        }
    }
}

/// Builds the reqwest client once; clones share its connection pool.
#[derive(Debug, Clone)]
pub struct HttpSender {
    client: reqwest::Client,
    guard: Arc<SsrfGuard>,
}

impl HttpSender {
    pub fn new(config: SenderConfig) -> Result<Self, reqwest::Error> {
        let guard = Arc::new(SsrfGuard::new(config.allow_cidrs));
        let client = reqwest::Client::builder()
            .dns_resolver(Arc::new(GuardedResolver { guard: guard.clone() }))
            // A proxy would resolve the name itself, out of the guard's sight.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(config.connect_timeout)
            .pool_max_idle_per_host(config.max_idle_per_host)
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_nodelay(true)
            .user_agent(config.user_agent)
            .build()?;
        Ok(Self { client, guard })
    }

    pub fn guard(&self) -> &SsrfGuard {
        &self.guard
    }

    async fn post(&self, request: WebhookRequest) -> Result<SendOutcome, (SendErrorKind, String)> {
        let url = request.url.to_url();
        // reqwest connects to an IP literal without asking the resolver, so check it here.
        if let Some(ip) = url.host_str().and_then(ip_literal) {
            self.guard
                .check(ip)
                .map_err(|b| (SendErrorKind::Blocked, b.to_string()))?;
        }
        let headers = header_map(&request.headers).map_err(|m| (SendErrorKind::Other, m))?;
        let started = Instant::now();
        let mut response = self
            .client
            .post(url)
            .headers(headers)
            .body(request.body)
            .timeout(request.timeout)
            .send()
            .await
            .map_err(|e| classify(e, request.timeout))?;
        let status = response.status();
        let retry_after = match status {
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| parse_retry_after(v, SystemTime::now())),
            _ => None,
        };
        // Read no more than the excerpt keeps: an endpoint may answer with gigabytes.
        // A body cut short by the timeout still leaves the status, which is what counts.
        let mut body = Vec::new();
        while body.len() < EXCERPT_LIMIT {
            match response.chunk().await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk[..chunk.len().min(EXCERPT_LIMIT - body.len())]),
                Ok(None) | Err(_) => break,
            }
        }
        Ok(SendOutcome {
            status_code: Some(status.as_u16()),
            error: None,
            response_excerpt: (!body.is_empty()).then(|| excerpt(&body)),
            duration_ms: started.elapsed().as_millis() as u64,
            retry_after,
        })
    }
}

#[async_trait]
impl Sender for HttpSender {
    async fn send(&self, request: WebhookRequest) -> SendOutcome {
        let started = Instant::now();
        match self.post(request).await {
            Ok(outcome) => outcome,
            Err((kind, message)) => SendOutcome {
                status_code: None,
                error: Some((kind, message)),
                response_excerpt: None,
                duration_ms: started.elapsed().as_millis() as u64,
                retry_after: None,
            },
        }
    }
}

/// Send a batch with at most `concurrency` requests in flight; outcomes in request order.
pub async fn send_batch<S: Sender + ?Sized>(
    sender: &S,
    requests: impl IntoIterator<Item = WebhookRequest>,
    concurrency: usize,
) -> Vec<SendOutcome> {
    futures::stream::iter(requests)
        .map(|r| sender.send(r))
        .buffered(concurrency.max(1))
        .collect()
        .await
}

fn ip_literal(host: &str) -> Option<IpAddr> {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
        .parse()
        .ok()
}

fn header_map(headers: &[(String, String)]) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let n = HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("invalid header name `{name}`"))?;
        let v = HeaderValue::from_str(value).map_err(|_| format!("invalid value for header `{name}`"))?;
        map.append(n, v);
    }
    Ok(map)
}

/// Timeout, blocked, connect or other; the message is the error chain without the URL,
/// which may carry a customer's token.
fn classify(err: reqwest::Error, timeout: Duration) -> (SendErrorKind, String) {
    let err = err.without_url();
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    let mut chain: Vec<String> = Vec::new();
    let mut blocked = None;
    while let Some(e) = source {
        if let Some(b) = e.downcast_ref::<BlockedAddress>() {
            blocked = Some(b.to_string());
        }
        let text = e.to_string();
        if !chain.iter().any(|seen| seen.contains(&text)) {
            chain.push(text);
        }
        source = e.source();
    }
    if let Some(message) = blocked {
        return (SendErrorKind::Blocked, message);
    }
    if err.is_timeout() {
        return (
            SendErrorKind::Timeout,
            format!("no response within {} ms", timeout.as_millis()),
        );
    }
    let kind = if err.is_connect() {
        SendErrorKind::Connect
    } else {
        SendErrorKind::Other
    };
    (kind, chain.join(": "))
}

/// Resolves with the system resolver, then keeps only the addresses the guard allows.
struct GuardedResolver {
    guard: Arc<SsrfGuard>,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let guard = self.guard.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refused = None;
            let allowed: Vec<SocketAddr> = resolved
                .into_iter()
                .filter(|a| match guard.check(a.ip()) {
                    Ok(()) => true,
                    Err(b) => {
                        refused.get_or_insert(b);
                        false
                    }
                })
                .collect();
            match (allowed.is_empty(), refused) {
                (true, Some(blocked)) => Err(blocked.into()),
                (true, None) => Err(format!("`{host}` resolved to no address").into()),
                (false, _) => Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs),
            }
        })
    }
}
