//! Helpers for the end-to-end tests: start the real `hookwise dev` binary, a real receiving
//! HTTP server on 127.0.0.1 that records what it got, and a small API client.

pub mod bench;
pub mod cpu;
pub mod fault_proxy;
pub mod iam_policy;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use serde_json::Value;

/// The `hookwise` binary of this workspace, built once per test run.
pub fn hookwise_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(bin) = std::env::var("HOOKWISE_BIN") {
            return PathBuf::from(bin);
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the workspace root")
            .to_owned();
        let status = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "-p", "hookwise-cli"])
            .current_dir(&root)
            .status()
            .expect("cargo runs");
        assert!(status.success(), "cargo build -p hookwise-cli failed");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        target.join("debug").join("hookwise")
    })
    .clone()
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(label: &str) -> Self {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "hookwise-e2e-{label}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Start `command` with stdout piped and hand its lines to `ready` until it says the process
/// is ready; then keep draining stdout on a thread, so the child never blocks on a full pipe.
/// Panics if the process exits first.
pub fn spawn_until_ready(command: &mut Command, mut ready: impl FnMut(&str) -> bool) -> Child {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("hookwise starts");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    loop {
        let line = lines
            .next()
            .expect("hookwise printed its ready lines before exiting")
            .expect("a line");
        if ready(&line) {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    child
}

/// `hookwise tenant <args>` with `env` set: its stdout, or a panic with its stderr.
pub fn tenant_cli(args: &[&str], env: &[(String, String)]) -> String {
    let out = Command::new(hookwise_bin())
        .arg("tenant")
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("HOOKWISE_LOG", "warn")
        .output()
        .expect("hookwise tenant runs");
    assert!(
        out.status.success(),
        "hookwise tenant {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// `hookwise tenant <args> --json`, parsed.
pub fn tenant_cli_json(args: &[&str], env: &[(String, String)]) -> Value {
    let out = tenant_cli(args, env);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// A running `hookwise dev`.
pub struct Dev {
    child: Child,
    pub base: String,
    pub api_key: String,
    pub data_dir: PathBuf,
    args: Vec<String>,
}

impl Dev {
    /// Start on a free port with a fast scheduler and short visibility timeout.
    pub fn start(data_dir: &Path, extra: &[&str]) -> Self {
        let args = extra.iter().map(|s| s.to_string()).collect();
        Self::spawn(data_dir, args)
    }

    fn spawn(data_dir: &Path, args: Vec<String>) -> Self {
        // A short visibility timeout unless the test sets its own.
        let visibility: &[&str] = if args.iter().any(|a| a == "--visibility-timeout") {
            &[]
        } else {
            &["--visibility-timeout", "3"]
        };
        let mut command = Command::new(hookwise_bin());
        command
            .args(["dev", "--listen", "127.0.0.1:0", "--scheduler-interval", "1"])
            .args(visibility)
            .arg("--data-dir")
            .arg(data_dir)
            .args(&args)
            .env("HOOKWISE_LOG", "warn");
        let (mut base, mut api_key) = (None, None);
        let child = spawn_until_ready(&mut command, |line| {
            if let Some(url) = line.split("listening on ").nth(1) {
                base = Some(url.trim().to_owned());
            }
            if let Some(key) = line.strip_prefix("API key:") {
                api_key = Some(key.trim().to_owned());
            }
            base.is_some() && api_key.is_some()
        });
        Self {
            child,
            base: base.unwrap(),
            api_key: api_key.unwrap(),
            data_dir: data_dir.to_owned(),
            args,
        }
    }

    /// SIGKILL: no chance to finish anything.
    pub fn kill9(&mut self) {
        self.child.kill().expect("kill -9");
        self.child.wait().expect("reaped");
    }

    /// Start again on the same data dir (on a new port).
    pub fn restart(&mut self) {
        let again = Self::spawn(&self.data_dir, self.args.clone());
        let old = std::mem::replace(self, again);
        drop(old);
    }

    /// The process id, e.g. to read its memory from `/proc`.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn api(&self) -> Api {
        Api {
            base: self.base.clone(),
            key: self.api_key.clone(),
            http: reqwest::Client::new(),
        }
    }

    /// The `.eml` files in the outbox.
    pub fn outbox(&self) -> Vec<String> {
        let dir = self.data_dir.join("outbox");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        files
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "eml"))
            .map(|p| std::fs::read_to_string(p).expect("eml"))
            .collect()
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Batch ingest end to end, on whatever host `api` talks to: 25 events in one request, one of
/// them invalid, to two subscriptions on `receiver`. The invalid one is refused in its place,
/// and each of the 24 others reaches both endpoints, once.
pub async fn batch_reaches_every_subscription(api: &Api, receiver: &Receiver, within: Duration) {
    api.subscribe(serde_json::json!({"url": receiver.url("/a")})).await;
    api.subscribe(serde_json::json!({"url": receiver.url("/b")})).await;
    let events: Vec<Value> = (0..25)
        .map(|n| {
            let kind = if n == 7 { "Not A Type!" } else { "order.created" };
            serde_json::json!({"type": kind, "payload": {"n": n}, "idempotency_key": format!("batch-{n}")})
        })
        .collect();
    let (status, mut batch) = api
        .post("/v1/events/batch", serde_json::json!({"events": events}))
        .await;
    assert_eq!(status, 202, "{batch}");
    // As a client does: an event answered 503 (moto's DynamoDB sometimes fails a transaction
    // among concurrent ones) is sent again with its key, until it is accepted.
    for _ in 0..5 {
        let again: Vec<usize> = (0..events.len())
            .filter(|i| batch["results"][*i]["error"]["status"] == 503)
            .collect();
        if again.is_empty() {
            break;
        }
        let resend: Vec<Value> = again.iter().map(|i| events[*i].clone()).collect();
        let (_, retried) = api
            .post("/v1/events/batch", serde_json::json!({"events": resend}))
            .await;
        for (k, i) in again.iter().enumerate() {
            batch["results"][*i] = retried["results"][k].clone();
        }
    }
    let accepted = (0..events.len())
        .filter(|i| batch["results"][*i].get("id").is_some())
        .count();
    assert_eq!((accepted, events.len() - accepted), (24, 1), "{batch}");
    assert_eq!(batch["results"][7]["error"]["code"], "invalid_event_type");
    receiver.wait_count(48, within).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut sent: Vec<u64> = receiver
        .requests()
        .iter()
        .map(|r| r.json()["data"]["n"].as_u64().expect("the payload's n"))
        .collect();
    sent.sort_unstable();
    let want: Vec<u64> = (0..25u64).filter(|n| *n != 7).flat_map(|n| [n, n]).collect();
    assert_eq!(sent, want, "each accepted event to both subscriptions, once");
}

/// A small client for the API.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub key: String,
    pub http: reqwest::Client,
}

impl Api {
    pub fn with_key(&self, key: &str) -> Api {
        Api {
            key: key.to_owned(),
            ..self.clone()
        }
    }

    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{}", self.base, path))
            .bearer_auth(&self.key);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("the API answers");
        let status = resp.status().as_u16();
        let text = resp.text().await.expect("a body");
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, None, &[]).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, Some(body), &[]).await
    }

    /// Create a subscription; returns its JSON (with the secret).
    pub async fn subscribe(&self, body: Value) -> Value {
        let (status, sub) = self.post("/v1/subscriptions", body).await;
        assert_eq!(status, 201, "{sub}");
        sub
    }

    pub async fn send_event(&self, event_type: &str, payload: Value) -> Value {
        let (status, ev) = self
            .post(
                "/v1/events",
                serde_json::json!({"type": event_type, "payload": payload}),
            )
            .await;
        assert_eq!(status, 202, "{ev}");
        ev
    }

    pub async fn delivery(&self, id: &str) -> Value {
        let (status, d) = self.get(&format!("/v1/deliveries/{id}")).await;
        assert_eq!(status, 200, "{d}");
        d
    }

    /// Poll a delivery until its status is `want`.
    pub async fn wait_status(&self, id: &str, want: &str, within: Duration) -> Value {
        poll_delivery_status(id, want, within, Duration::from_millis(100), || self.delivery(id)).await
    }
}

/// Read a delivery with `read` every `every` until its status is `want`; fail after `within`.
/// Shared by the API clients, whatever carries their requests.
pub async fn poll_delivery_status<F, Fut>(id: &str, want: &str, within: Duration, every: Duration, mut read: F) -> Value
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Value>,
{
    let start = Instant::now();
    loop {
        let d = read().await;
        if d["status"] == want {
            return d;
        }
        assert!(
            start.elapsed() < within,
            "delivery {id} is still {} after {within:?}, wanted {want}: {d}",
            d["status"]
        );
        tokio::time::sleep(every).await;
    }
}

/// What the receiver got: headers (lower-case names) and the raw body.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// When it arrived.
    pub at: Instant,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    /// Whether its Standard Webhooks signature verifies with `secret` (`whsec_…`), as a
    /// subscriber checks it (five minutes' tolerance).
    pub fn signed_with(&self, secret: &str) -> bool {
        let Ok(secret) = hookwise_core::model::Secret::parse(secret) else {
            return false;
        };
        let header = |name: &str| self.header(name).unwrap_or_default();
        hookwise_core::signing::verify(
            &secret,
            header("webhook-id"),
            header("webhook-timestamp"),
            header("webhook-signature"),
            &self.body,
            chrono::Utc::now().timestamp(),
            300,
        )
        .is_ok()
    }
}

/// A real HTTP server on 127.0.0.1 that records every POST and fails the first
/// `fail_first` of them with 500 (`u32::MAX`: fail until told otherwise).
pub struct Receiver {
    pub addr: SocketAddr,
    pub got: Arc<Mutex<Vec<Received>>>,
    fail_first: Arc<AtomicU32>,
    hits: Arc<AtomicU32>,
    /// How long each answer takes, in milliseconds.
    delay_ms: Arc<AtomicU64>,
    /// The status of an answer that is not a failure (200 unless told otherwise).
    status: Arc<AtomicU32>,
}

impl Receiver {
    pub async fn start(fail_first: u32) -> Self {
        let got = Arc::new(Mutex::new(Vec::new()));
        let fail = Arc::new(AtomicU32::new(fail_first));
        let hits = Arc::new(AtomicU32::new(0));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let status = Arc::new(AtomicU32::new(200));
        let (g, f, h, d, s) = (
            got.clone(),
            fail.clone(),
            hits.clone(),
            delay_ms.clone(),
            status.clone(),
        );
        let app = axum::Router::new().fallback(move |headers: HeaderMap, body: Bytes| {
            let (g, f, h, d, s) = (g.clone(), f.clone(), h.clone(), d.clone(), s.clone());
            async move {
                let headers = headers
                    .iter()
                    .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
                    .collect();
                g.lock().unwrap().push(Received {
                    headers,
                    body: body.to_vec(),
                    at: Instant::now(),
                });
                tokio::time::sleep(Duration::from_millis(d.load(Ordering::SeqCst))).await;
                let n = h.fetch_add(1, Ordering::SeqCst);
                if n < f.load(Ordering::SeqCst) {
                    (StatusCode::INTERNAL_SERVER_ERROR, "down for maintenance")
                } else {
                    let status = u16::try_from(s.load(Ordering::SeqCst)).ok();
                    (
                        status
                            .and_then(|s| StatusCode::from_u16(s).ok())
                            .unwrap_or(StatusCode::OK),
                        "thanks",
                    )
                }
            }
        });
        let addr = serve_on_loopback(app).await;
        Self {
            addr,
            got,
            fail_first: fail,
            hits,
            delay_ms,
            status,
        }
    }

    /// Answer what does not fail with `status` (410: gone for good) instead of 200.
    pub fn answer_with(&self, status: u16) {
        self.status.store(status.into(), Ordering::SeqCst);
    }

    /// Answer each request only after `delay` (the request is recorded on arrival).
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms.store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// From now on every request succeeds.
    pub fn recover(&self) {
        self.fail_first.store(0, Ordering::SeqCst);
    }

    pub fn count(&self) -> usize {
        self.got.lock().unwrap().len()
    }

    pub fn requests(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }

    pub async fn wait_count(&self, n: usize, within: Duration) {
        wait_for_count(n, within, Duration::from_millis(50), || self.count()).await;
    }

    pub fn hits(&self) -> u32 {
        self.hits.load(Ordering::SeqCst)
    }

    /// The most requests that arrived within any one second (a sliding window).
    pub fn busiest_second(&self) -> usize {
        let mut times: Vec<Instant> = self.got.lock().unwrap().iter().map(|r| r.at).collect();
        times.sort();
        (0..times.len())
            .map(|i| {
                times[i..]
                    .iter()
                    .take_while(|t| **t - times[i] <= Duration::from_secs(1))
                    .count()
            })
            .max()
            .unwrap_or(0)
    }
}

/// Serve `app` on a free port of 127.0.0.1 in the background: its address.
pub async fn serve_on_loopback(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Wait until `count()` reaches `n`, looking every `every`; fail after `within`.
pub async fn wait_for_count(n: usize, within: Duration, every: Duration, count: impl Fn() -> usize) {
    let start = Instant::now();
    while count() < n {
        assert!(start.elapsed() < within, "{} of {n} arrived after {within:?}", count());
        tokio::time::sleep(every).await;
    }
}
