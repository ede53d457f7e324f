//! The sender against a real HTTP server on 127.0.0.1 (allowed through the guard's
//! allow-list); every other address is only ever refused, never contacted.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{any, get, post};
use axum::Router;
use hookwise_core::model::{EndpointUrl, EXCERPT_LIMIT};
use hookwise_core::ports::{SendErrorKind, Sender, WebhookRequest};
use hookwise_http::{send_batch, HttpSender, SenderConfig, SsrfGuard};

#[derive(Default)]
struct Receiver {
    /// (headers, body) of each POST to /echo.
    received: Mutex<Vec<(HeaderMap, Vec<u8>)>>,
    /// The peer address of each request to /peer: the same one means the connection was reused.
    peers: Mutex<Vec<SocketAddr>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

/// A receiving server on 127.0.0.1:0 with one route per behaviour under test.
async fn spawn_receiver() -> (SocketAddr, Arc<Receiver>) {
    let state = Arc::new(Receiver::default());
    let app = Router::new()
        .route("/ok", any(|| async { "thanks" }))
        .route("/fail", any(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "boom") }))
        .route(
            "/redirect",
            any(|| async { (StatusCode::FOUND, [("location", "/ok")], "moved") }),
        )
        .route(
            "/slow",
            any(|| async {
                tokio::time::sleep(Duration::from_secs(10)).await;
                "late"
            }),
        )
        .route(
            "/busy",
            any(|| async { (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "120")], "later") }),
        )
        .route(
            "/limited",
            any(|| async {
                let at = std::time::SystemTime::now() + Duration::from_secs(300);
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    [("retry-after", httpdate::fmt_http_date(at))],
                    "slow down",
                )
            }),
        )
        .route(
            "/fail-with-retry-after",
            any(|| async { (StatusCode::INTERNAL_SERVER_ERROR, [("retry-after", "60")]) }),
        )
        .route("/big", any(|| async { "é".repeat(1 << 20) }))
        .route(
            "/endless",
            any(|| async {
                let chunk = Bytes::from(vec![b'x'; 16 * 1024]);
                Body::from_stream(futures::stream::repeat_with(move || {
                    Ok::<_, std::convert::Infallible>(chunk.clone())
                }))
            }),
        )
        .route(
            "/echo",
            post(
                |State(r): State<Arc<Receiver>>, headers: HeaderMap, body: Bytes| async move {
                    r.received.lock().unwrap().push((headers, body.to_vec()));
                    StatusCode::NO_CONTENT
                },
            ),
        )
        .route(
            "/peer",
            any(
                |State(r): State<Arc<Receiver>>, ConnectInfo(peer): ConnectInfo<SocketAddr>| async move {
                    r.peers.lock().unwrap().push(peer);
                    "ok"
                },
            ),
        )
        .route("/gauge", get(gauge).post(gauge))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .await
            .unwrap();
    });
    (addr, state)
}

async fn gauge(State(r): State<Arc<Receiver>>) -> impl IntoResponse {
    let now = r.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    r.max_in_flight.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(100)).await;
    r.in_flight.fetch_sub(1, Ordering::SeqCst);
    "measured"
}

fn loopback_sender() -> HttpSender {
    HttpSender::new(SenderConfig {
        allow_cidrs: vec!["127.0.0.0/8".parse().unwrap()],
        ..Default::default()
    })
    .unwrap()
}

fn request(url: &str, timeout: Duration) -> WebhookRequest {
    WebhookRequest {
        url: EndpointUrl::parse(url).unwrap(),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("webhook-id".into(), "evt_1".into()),
        ],
        body: br#"{"hello":"world"}"#.to_vec(),
        timeout,
    }
}

fn at(addr: SocketAddr, path: &str) -> WebhookRequest {
    request(&format!("http://{addr}{path}"), Duration::from_secs(5))
}

#[tokio::test]
async fn given_a_2xx_endpoint_when_sending_then_status_excerpt_and_duration_are_recorded() {
    let (addr, _) = spawn_receiver().await;
    let outcome = loopback_sender().send(at(addr, "/ok")).await;
    assert!(outcome.is_success(), "{outcome:?}");
    assert_eq!(outcome.status_code, Some(200));
    assert_eq!(outcome.error, None);
    assert_eq!(outcome.response_excerpt.as_deref(), Some("thanks"));
    assert_eq!(outcome.retry_after, None);
    assert!(outcome.duration_ms < 5_000);
}

#[tokio::test]
async fn given_a_post_then_the_receiver_gets_the_headers_and_the_body_as_given() {
    let (addr, receiver) = spawn_receiver().await;
    let outcome = loopback_sender().send(at(addr, "/echo")).await;
    assert_eq!(outcome.status_code, Some(204));
    assert_eq!(outcome.response_excerpt, None, "an empty body has no excerpt");
    let received = receiver.received.lock().unwrap();
    let (headers, body) = &received[0];
    assert_eq!(headers["webhook-id"], "evt_1");
    assert_eq!(headers["content-type"], "application/json");
    assert!(headers["user-agent"].to_str().unwrap().starts_with("Hookwise/"));
    assert_eq!(body, br#"{"hello":"world"}"#);
}

#[tokio::test]
async fn given_a_500_then_it_is_a_failure_with_its_status_and_body() {
    let (addr, _) = spawn_receiver().await;
    let outcome = loopback_sender().send(at(addr, "/fail")).await;
    assert!(!outcome.is_success());
    assert_eq!(outcome.status_code, Some(500));
    assert_eq!(outcome.error, None);
    assert_eq!(outcome.response_excerpt.as_deref(), Some("boom"));
    assert_eq!(outcome.describe(), "HTTP 500");
}

#[tokio::test]
async fn given_a_redirect_then_it_is_not_followed_and_is_recorded_as_a_failure() {
    let (addr, receiver) = spawn_receiver().await;
    let outcome = loopback_sender().send(at(addr, "/redirect")).await;
    assert_eq!(outcome.status_code, Some(302));
    assert!(!outcome.is_success());
    assert_eq!(outcome.response_excerpt.as_deref(), Some("moved"));
    assert!(receiver.received.lock().unwrap().is_empty());
}

#[tokio::test]
async fn given_an_endpoint_slower_than_the_timeout_then_the_outcome_is_a_timeout() {
    let (addr, _) = spawn_receiver().await;
    let outcome = loopback_sender()
        .send(request(&format!("http://{addr}/slow"), Duration::from_millis(300)))
        .await;
    assert_eq!(outcome.status_code, None);
    let (kind, message) = outcome.error.clone().expect("an error");
    assert_eq!(kind, SendErrorKind::Timeout, "{message}");
    assert!(
        outcome.duration_ms >= 300 && outcome.duration_ms < 5_000,
        "{}",
        outcome.duration_ms
    );
    assert_eq!(outcome.describe(), "timeout: no response within 300 ms");
}

#[tokio::test]
async fn given_nothing_listening_then_the_outcome_is_a_connect_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let outcome = loopback_sender().send(at(addr, "/ok")).await;
    let (kind, message) = outcome.error.expect("an error");
    assert_eq!(kind, SendErrorKind::Connect, "{message}");
    assert!(message.contains("Connection refused"), "{message}");
    assert!(
        !message.contains("http://"),
        "the URL, which may carry a token, is kept out: {message}"
    );
}

#[tokio::test]
async fn given_a_503_with_retry_after_seconds_then_they_are_recorded() {
    let (addr, _) = spawn_receiver().await;
    let outcome = loopback_sender().send(at(addr, "/busy")).await;
    assert_eq!(outcome.status_code, Some(503));
    assert_eq!(outcome.retry_after, Some(120.0));
}

#[tokio::test]
async fn given_a_429_with_an_http_date_then_the_wait_until_it_is_recorded() {
    let (addr, _) = spawn_receiver().await;
    let outcome = loopback_sender().send(at(addr, "/limited")).await;
    assert_eq!(outcome.status_code, Some(429));
    let wait = outcome.retry_after.expect("a Retry-After");
    assert!((295.0..=300.0).contains(&wait), "{wait}");
}

#[tokio::test]
async fn given_retry_after_on_another_status_then_it_is_ignored() {
    let (addr, _) = spawn_receiver().await;
    let outcome = loopback_sender().send(at(addr, "/fail-with-retry-after")).await;
    assert_eq!(outcome.status_code, Some(500));
    assert_eq!(outcome.retry_after, None);
}

#[tokio::test]
async fn given_a_large_body_then_the_excerpt_is_cut_at_the_limit() {
    let (addr, _) = spawn_receiver().await;
    let outcome = loopback_sender().send(at(addr, "/big")).await;
    let excerpt = outcome.response_excerpt.expect("an excerpt");
    assert!(
        excerpt.len() <= EXCERPT_LIMIT && excerpt.len() > EXCERPT_LIMIT - 4,
        "{}",
        excerpt.len()
    );
    assert!(excerpt.chars().all(|c| c == 'é'));
}

#[tokio::test]
async fn given_an_endless_body_then_only_the_excerpt_is_read_and_the_send_finishes() {
    let (addr, _) = spawn_receiver().await;
    let outcome = loopback_sender()
        .send(request(&format!("http://{addr}/endless"), Duration::from_secs(10)))
        .await;
    assert_eq!(outcome.status_code, Some(200));
    assert_eq!(outcome.error, None);
    assert_eq!(outcome.response_excerpt.map(|e| e.len()), Some(EXCERPT_LIMIT));
    assert!(
        outcome.duration_ms < 5_000,
        "it stopped reading: {} ms",
        outcome.duration_ms
    );
}

#[tokio::test]
async fn given_two_sends_to_one_host_then_the_connection_is_reused() {
    let (addr, receiver) = spawn_receiver().await;
    let sender = loopback_sender();
    for _ in 0..3 {
        assert_eq!(sender.send(at(addr, "/peer")).await.status_code, Some(200));
    }
    let peers = receiver.peers.lock().unwrap();
    assert_eq!(peers.len(), 3);
    assert!(peers.iter().all(|p| *p == peers[0]), "one pooled connection: {peers:?}");
}

#[tokio::test]
async fn given_the_metadata_address_then_the_send_is_blocked_without_any_traffic() {
    let outcome = HttpSender::new(SenderConfig::default())
        .unwrap()
        .send(request(
            "http://169.254.169.254/latest/meta-data/",
            Duration::from_secs(5),
        ))
        .await;
    let (kind, message) = outcome.error.clone().expect("blocked");
    assert_eq!(kind, SendErrorKind::Blocked);
    assert!(message.contains("169.254.169.254"), "{message}");
    assert_eq!(outcome.status_code, None);
    assert!(
        outcome.duration_ms < 100,
        "refused before connecting: {} ms",
        outcome.duration_ms
    );
}

#[tokio::test]
async fn given_a_private_address_then_the_send_is_blocked_unless_its_cidr_is_allowed() {
    let outcome = HttpSender::new(SenderConfig::default())
        .unwrap()
        .send(request("http://10.0.0.1/hook", Duration::from_secs(5)))
        .await;
    assert_eq!(outcome.error.map(|e| e.0), Some(SendErrorKind::Blocked));
    // Allowed: only the guard's decision is checked; nothing is sent to 10.0.0.1.
    let allowed = HttpSender::new(SenderConfig {
        allow_cidrs: vec!["10.0.0.0/8".parse().unwrap()],
        ..Default::default()
    })
    .unwrap();
    assert!(allowed.guard().is_allowed("10.0.0.1".parse().unwrap()));
    assert!(!allowed.guard().is_allowed("169.254.169.254".parse().unwrap()));
    assert!(!SsrfGuard::default().is_allowed("10.0.0.1".parse().unwrap()));
}

#[tokio::test]
async fn given_loopback_not_allowed_then_a_running_local_server_is_not_reached() {
    let (addr, receiver) = spawn_receiver().await;
    let sender = HttpSender::new(SenderConfig::default()).unwrap();
    for url in [
        format!("http://127.0.0.1:{}/echo", addr.port()),
        format!("http://[::ffff:127.0.0.1]:{}/echo", addr.port()),
        // A name goes through the resolver, which refuses what it resolves to.
        format!("http://localhost:{}/echo", addr.port()),
    ] {
        let outcome = sender.send(request(&url, Duration::from_secs(5))).await;
        assert_eq!(
            outcome.error.as_ref().map(|e| e.0),
            Some(SendErrorKind::Blocked),
            "{url}: {outcome:?}"
        );
    }
    assert!(
        receiver.received.lock().unwrap().is_empty(),
        "nothing reached the server"
    );
}

#[tokio::test]
async fn given_a_name_resolving_to_an_allowed_address_then_it_is_delivered() {
    let (addr, receiver) = spawn_receiver().await;
    let outcome = loopback_sender()
        .send(request(
            &format!("http://localhost:{}/echo", addr.port()),
            Duration::from_secs(5),
        ))
        .await;
    assert_eq!(outcome.status_code, Some(204), "{outcome:?}");
    assert_eq!(receiver.received.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn given_a_batch_then_outcomes_come_in_order_with_concurrency_bounded() {
    let (addr, receiver) = spawn_receiver().await;
    let sender = loopback_sender();
    let mut requests: Vec<_> = (0..9).map(|_| at(addr, "/gauge")).collect();
    requests.insert(4, at(addr, "/fail"));
    let outcomes = send_batch(&sender, requests, 3).await;
    let statuses: Vec<_> = outcomes.iter().map(|o| o.status_code.unwrap()).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 500, 200, 200, 200, 200, 200]);
    let max = receiver.max_in_flight.load(Ordering::SeqCst);
    assert!((2..=3).contains(&max), "at most 3 at once, and some at once: {max}");
}
