//! End to end on the real `hookwise dev` process: real SQLite, a real receiving server on
//! 127.0.0.1, retries in real (short) time.

use std::process::Command;
use std::time::Duration;

use hookwise_tests::{hookwise_bin, Dev, Receiver, TempDir};
use serde_json::json;

const FAST: &str = r#"{"schedule_seconds": [1, 1, 1]}"#;

fn fast_policy() -> serde_json::Value {
    serde_json::from_str(FAST).unwrap()
}

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn given_an_endpoint_failing_its_first_two_requests_then_attempt_three_delivers_and_all_are_recorded() {
    let dir = TempDir::new("flaky");
    let dev = Dev::start(&dir.0, &[]);
    let api = dev.api();
    let receiver = Receiver::start(2).await;
    api.subscribe(json!({"url": receiver.url("/hook"), "retry_policy": fast_policy()}))
        .await;
    let event = api.send_event("invoice.paid", json!({"amount": 100})).await;
    let id = event["deliveries"][0]["id"].as_str().unwrap();

    let delivery = api.wait_status(id, "delivered", WAIT).await;
    let attempts = delivery["attempts"].as_array().unwrap();
    let codes: Vec<_> = attempts
        .iter()
        .map(|a| (a["attempt"].as_u64().unwrap(), a["status_code"].as_u64().unwrap()))
        .collect();
    assert_eq!(codes, [(1, 500), (2, 500), (3, 200)]);
    assert_eq!(attempts[0]["response_excerpt"], "down for maintenance");
    assert_eq!(receiver.count(), 3);
}

#[tokio::test]
async fn given_an_always_failing_endpoint_then_it_goes_dead_with_one_email_and_replay_delivers_it() {
    let dir = TempDir::new("dead");
    let dev = Dev::start(&dir.0, &["--owner-email", "ops@example.com"]);
    let api = dev.api();
    let receiver = Receiver::start(u32::MAX).await;
    let sub = api
        .subscribe(json!({"url": receiver.url("/hook"), "retry_policy": {"schedule_seconds": [1, 1]}}))
        .await;
    let event = api.send_event("invoice.paid", json!({"amount": 5})).await;
    let event_id = event["id"].as_str().unwrap();
    let id = event["deliveries"][0]["id"].as_str().unwrap();

    let dead = api.wait_status(id, "dead", WAIT).await;
    assert_eq!(dead["attempts"].as_array().unwrap().len(), 3);
    // The dead-letter handler runs after the delivery is marked dead.
    let start = std::time::Instant::now();
    while dev.outbox().is_empty() && start.elapsed() < WAIT {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mails = dev.outbox();
    assert_eq!(mails.len(), 1, "exactly one email: {mails:?}");
    let mail = &mails[0];
    for needle in [
        "To: ops@example.com",
        event_id,
        "invoice.paid",
        sub["url"].as_str().unwrap(),
        "HTTP 500",
        &format!("/v1/deliveries/{id}/replay"),
    ] {
        assert!(mail.contains(needle), "the email lacks {needle}:\n{mail}");
    }

    receiver.recover();
    let (status, replayed) = api.post(&format!("/v1/deliveries/{id}/replay"), json!({})).await;
    assert_eq!(status, 202, "{replayed}");
    let delivered = api.wait_status(id, "delivered", WAIT).await;
    let last = delivered["attempts"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (
            last["round"].as_u64(),
            last["attempt"].as_u64(),
            last["status_code"].as_u64()
        ),
        (Some(1), Some(1), Some(200))
    );
    assert_eq!(dev.outbox().len(), 1, "no second email");
}

#[tokio::test]
async fn given_the_same_idempotency_key_twice_then_one_event_and_one_delivery_per_subscription() {
    let dir = TempDir::new("idem");
    let dev = Dev::start(&dir.0, &[]);
    let api = dev.api();
    let receiver = Receiver::start(0).await;
    api.subscribe(json!({"url": receiver.url("/a")})).await;
    api.subscribe(json!({"url": receiver.url("/b")})).await;
    let body = json!({"type": "order.created", "payload": {"n": 1}});
    let (s1, first) = api
        .call(
            reqwest::Method::POST,
            "/v1/events",
            Some(body.clone()),
            &[("Idempotency-Key", "order-1")],
        )
        .await;
    let (s2, second) = api
        .call(
            reqwest::Method::POST,
            "/v1/events",
            Some(body),
            &[("Idempotency-Key", "order-1")],
        )
        .await;
    assert_eq!((s1, s2), (202, 202));
    assert_eq!(first["id"], second["id"]);
    let ids = |v: &serde_json::Value| {
        let mut ids: Vec<String> = v["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["id"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(&first), ids(&second));
    assert_eq!(first["deliveries"].as_array().unwrap().len(), 2);
    receiver.wait_count(2, WAIT).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.count(), 2, "two subscriptions, one delivery each");
    let (_, page) = api.get("/v1/deliveries").await;
    assert_eq!(page["data"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn given_a_batch_of_events_then_each_valid_one_reaches_every_subscription_once() {
    let dir = TempDir::new("batch");
    let dev = Dev::start(&dir.0, &[]);
    let receiver = Receiver::start(0).await;
    hookwise_tests::batch_reaches_every_subscription(&dev.api(), &receiver, WAIT).await;
}

#[tokio::test]
async fn given_three_subscriptions_with_filters_then_an_event_reaches_only_the_matching_ones() {
    let dir = TempDir::new("fanout");
    let dev = Dev::start(&dir.0, &[]);
    let api = dev.api();
    let (all, invoices, users) = (
        Receiver::start(0).await,
        Receiver::start(0).await,
        Receiver::start(0).await,
    );
    api.subscribe(json!({"url": all.url("/"), "event_types": ["*"]})).await;
    api.subscribe(json!({"url": invoices.url("/"), "event_types": ["invoice.*"]}))
        .await;
    api.subscribe(json!({"url": users.url("/"), "event_types": ["user.created"]}))
        .await;

    let ev = api.send_event("invoice.paid", json!({})).await;
    assert_eq!(ev["deliveries"].as_array().unwrap().len(), 2);
    let ev = api.send_event("user.created", json!({})).await;
    assert_eq!(ev["deliveries"].as_array().unwrap().len(), 2);
    all.wait_count(2, WAIT).await;
    invoices.wait_count(1, WAIT).await;
    users.wait_count(1, WAIT).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!((all.count(), invoices.count(), users.count()), (2, 1, 1));
    assert_eq!(invoices.requests()[0].json()["type"], "invoice.paid");
    assert_eq!(users.requests()[0].json()["type"], "user.created");
}

#[tokio::test]
async fn given_a_received_webhook_then_the_official_standard_webhooks_library_verifies_it() {
    let dir = TempDir::new("verify");
    let dev = Dev::start(&dir.0, &[]);
    let api = dev.api();
    let receiver = Receiver::start(0).await;
    let sub = api.subscribe(json!({"url": receiver.url("/hook")})).await;
    let ev = api
        .send_event("invoice.paid", json!({"amount": 42, "currency": "EUR"}))
        .await;
    receiver.wait_count(1, WAIT).await;
    let got = receiver.requests().remove(0);
    assert_eq!(got.header("webhook-id"), ev["id"].as_str());
    assert_eq!(got.header("idempotency-key"), ev["id"].as_str());
    assert_eq!(got.header("content-type"), Some("application/json"));
    let body = got.json();
    assert_eq!(
        (body["id"].clone(), body["type"].clone(), body["data"].clone()),
        (
            ev["id"].clone(),
            json!("invoice.paid"),
            json!({"amount": 42, "currency": "EUR"})
        )
    );

    let headers: serde_json::Map<String, serde_json::Value> = ["webhook-id", "webhook-timestamp", "webhook-signature"]
        .iter()
        .map(|h| (h.to_string(), json!(got.header(h).unwrap())))
        .collect();
    let script = r#"
import json, sys
from standardwebhooks.webhooks import Webhook
secret, headers, body = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
payload = Webhook(secret).verify(body, headers)
print(json.dumps(payload))
try:
    Webhook(secret).verify(body.replace("42", "43"), headers)
    print("TAMPERED BODY VERIFIED")
except Exception:
    print("tampered body refused")
"#;
    let out = Command::new("python3")
        .args([
            "-c",
            script,
            sub["secret"].as_str().unwrap(),
            &serde_json::Value::Object(headers).to_string(),
            std::str::from_utf8(&got.body).unwrap(),
        ])
        .output()
        .expect("python3 runs (the test command installs standardwebhooks)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "verification failed: {}\n{}",
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(r#""amount": 42"#), "{stdout}");
    assert!(stdout.contains("tampered body refused"), "{stdout}");
}

#[tokio::test]
async fn given_dev_is_killed_mid_run_then_after_a_restart_every_event_is_delivered() {
    let dir = TempDir::new("kill9");
    let mut dev = Dev::start(&dir.0, &[]);
    let api = dev.api();
    // Fails its first 15 requests, so deliveries are mid-retry when the process dies. Its
    // breaker is off: held, most would make one attempt, and the 15 would kill 10 of them.
    let receiver = Receiver::start(15).await;
    api.subscribe(
        json!({"url": receiver.url("/hook"), "retry_policy": {"schedule_seconds": [1, 1, 2, 2, 2, 2]},
        "circuit_breaker": {"enabled": false}}),
    )
    .await;
    let mut ids = Vec::new();
    for i in 0..20 {
        let ev = api.send_event("order.created", json!({"i": i})).await;
        ids.push(ev["deliveries"][0]["id"].as_str().unwrap().to_owned());
    }
    receiver.wait_count(5, WAIT).await;
    dev.kill9();
    dev.restart();
    let api = dev.api();
    for id in &ids {
        api.wait_status(id, "delivered", Duration::from_secs(60)).await;
    }
    let mut received_ids: Vec<String> = receiver
        .requests()
        .iter()
        .filter(|_| true)
        .map(|r| r.json()["data"]["i"].to_string())
        .collect();
    received_ids.sort();
    received_ids.dedup();
    assert_eq!(received_ids.len(), 20, "every event reached the endpoint");
}

#[tokio::test]
async fn given_the_ssrf_guard_then_metadata_and_private_addresses_are_refused_and_an_allowed_range_is_not() {
    let dir = TempDir::new("ssrf");
    // Loopback refused too, except the one address the operator allows.
    let dev = Dev::start(&dir.0, &["--deny-loopback", "--allow-target-cidr", "127.0.0.1/32"]);
    let api = dev.api();
    let receiver = Receiver::start(0).await;
    let never = json!({"schedule_seconds": []});
    api.subscribe(json!({"url": "http://169.254.169.254/latest/meta-data/", "event_types": ["probe.metadata"], "retry_policy": never})).await;
    api.subscribe(json!({"url": "http://10.0.0.1/hook", "event_types": ["probe.private"], "retry_policy": never}))
        .await;
    api.subscribe(json!({"url": "http://127.0.0.2:9/hook", "event_types": ["probe.loopback"], "retry_policy": never}))
        .await;
    api.subscribe(json!({"url": receiver.url("/ok"), "event_types": ["probe.allowed"], "retry_policy": never}))
        .await;

    for (t, blocked) in [
        ("probe.metadata", true),
        ("probe.private", true),
        ("probe.loopback", true),
        ("probe.allowed", false),
    ] {
        let ev = api.send_event(t, json!({})).await;
        let id = ev["deliveries"][0]["id"].as_str().unwrap().to_owned();
        let want = if blocked { "dead" } else { "delivered" };
        let d = api.wait_status(&id, want, WAIT).await;
        let error = d["attempts"][0]["error"].as_str().unwrap_or("").to_owned();
        assert_eq!(error.starts_with("blocked"), blocked, "{t}: {d}");
    }
    assert_eq!(receiver.count(), 1);
}

#[tokio::test]
async fn given_two_tenants_then_the_second_can_neither_read_nor_replay_the_firsts_events() {
    let dir = TempDir::new("tenants");
    let dev = Dev::start(&dir.0, &[]);
    let alice = dev.api();
    let receiver = Receiver::start(u32::MAX).await;
    alice
        .subscribe(json!({"url": receiver.url("/"), "retry_policy": {"schedule_seconds": []}}))
        .await;
    let ev = alice.send_event("invoice.paid", json!({})).await;
    let event_id = ev["id"].as_str().unwrap();
    let delivery_id = ev["deliveries"][0]["id"].as_str().unwrap();
    alice.wait_status(delivery_id, "dead", WAIT).await;

    let out = Command::new(hookwise_bin())
        .args([
            "tenant",
            "create",
            "--name",
            "Bob",
            "--owner-email",
            "bob@example.com",
            "--data-dir",
        ])
        .arg(&dir.0)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let created: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(created["id"].as_str().unwrap().starts_with("ten_"));
    let bob = alice.with_key(created["api_key"].as_str().unwrap());

    assert_eq!(bob.get(&format!("/v1/events/{event_id}")).await.0, 404);
    assert_eq!(bob.get(&format!("/v1/deliveries/{delivery_id}")).await.0, 404);
    assert_eq!(
        bob.post(&format!("/v1/deliveries/{delivery_id}/replay"), json!({}))
            .await
            .0,
        404
    );
    assert_eq!(
        bob.post(&format!("/v1/events/{event_id}/replay"), json!({})).await.0,
        404
    );
    let (_, page) = bob.get("/v1/deliveries").await;
    assert_eq!(page["data"], json!([]));
    assert_eq!(alice.get(&format!("/v1/events/{event_id}")).await.0, 200);
}

#[tokio::test]
async fn given_bad_input_then_the_api_answers_4xx_with_a_code_and_a_useful_message() {
    let dir = TempDir::new("badinput");
    let dev = Dev::start(&dir.0, &[]);
    let api = dev.api();
    let raw = |body: &'static str| {
        let api = api.clone();
        async move {
            let resp = api
                .http
                .post(format!("{}/v1/subscriptions", api.base))
                .bearer_auth(&api.key)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<serde_json::Value>().await.unwrap())
        }
    };
    let cases = [
        (raw("{not json").await, 400, ""),
        (raw(r#"{"url": 42}"#).await, 422, "url"),
        (
            raw(r#"{"url": "https://ok.example.com", "retry_policy": "fastest"}"#).await,
            422,
            "fastest",
        ),
        (raw(r#"{"url": "not a url"}"#).await, 422, "not a valid endpoint URL"),
    ];
    for ((status, body), want_status, needle) in cases {
        assert_eq!(status, want_status, "{body}");
        let code = body["error"]["code"].as_str().unwrap_or_default();
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(!code.is_empty(), "{body}");
        assert!(message.contains(needle), "message should mention {needle:?}: {body}");
    }
    let (status, body) = api.post("/v1/events", json!({"type": "a.b", "payload": "text"})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("invalid_payload")),
        "{body}"
    );
    let (status, _) = api.with_key("hwk_nobody_has_this_key").get("/v1/subscriptions").await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn given_dev_is_killed_with_deliveries_in_hand_then_the_restart_sends_them_within_seconds_not_after_the_visibility_timeout(
) {
    let dir = TempDir::new("inflight");
    // Two minutes of visibility, as a default `hookwise dev` has.
    let mut dev = Dev::start(&dir.0, &["--visibility-timeout", "120"]);
    let api = dev.api();
    let receiver = Receiver::start(0).await;
    receiver.set_delay(Duration::from_secs(30)); // the POSTs are still in hand when it dies
    api.subscribe(json!({"url": receiver.url("/slow")})).await;
    let ev = api.send_event("order.created", json!({"i": 1})).await;
    let id = ev["deliveries"][0]["id"].as_str().unwrap().to_owned();
    receiver.wait_count(1, WAIT).await; // the POST has arrived and is not answered
    dev.kill9();
    receiver.set_delay(Duration::ZERO);
    let restarted = std::time::Instant::now();
    dev.restart();
    let delivered = dev.api().wait_status(&id, "delivered", Duration::from_secs(20)).await;
    assert!(
        restarted.elapsed() < Duration::from_secs(20),
        "took {:?}",
        restarted.elapsed()
    );
    assert_eq!(
        delivered["attempt_count"], 1,
        "the killed attempt was never recorded: {delivered}"
    );
}

#[tokio::test]
async fn given_a_running_dev_then_a_second_on_its_data_dir_refuses_and_tenant_create_still_works_beside_it() {
    let dir = TempDir::new("owner");
    let _dev = Dev::start(&dir.0, &[]);
    let second = Command::new(hookwise_bin())
        .args(["dev", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&dir.0)
        .env("HOOKWISE_LOG", "warn")
        .output()
        .expect("hookwise dev runs");
    assert!(!second.status.success(), "a second owner must not start");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("another hookwise dev (pid"), "{stderr}");

    let tenant = Command::new(hookwise_bin())
        .args([
            "tenant",
            "create",
            "--name",
            "Beside",
            "--owner-email",
            "ops@example.com",
            "--data-dir",
        ])
        .arg(&dir.0)
        .output()
        .expect("hookwise tenant create runs");
    assert!(tenant.status.success(), "{}", String::from_utf8_lossy(&tenant.stderr));
    let out: serde_json::Value = serde_json::from_slice(&tenant.stdout).expect("JSON");
    assert!(out["api_key"].as_str().is_some_and(|k| k.starts_with("hwk_")), "{out}");
}

/// Polls until `key` answers `want` on `dev`; how long that took.
async fn until_key_answers(api: &hookwise_tests::Api, key: &str, want: u16, within: Duration) -> Duration {
    let started = std::time::Instant::now();
    loop {
        let (status, _) = api.with_key(key).get("/v1/subscriptions").await;
        if status == want {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "{key} still answers {status} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn given_the_tenant_commands_beside_a_running_dev_then_a_rotation_keeps_both_keys_and_a_revoked_one_is_refused_within_the_cache_time(
) {
    let dir = TempDir::new("tenant-admin");
    let dev = Dev::start(&dir.0, &[]);
    let api = dev.api();
    let data_dir = dir.0.to_str().unwrap();
    let on = ["--data-dir", data_dir];
    let cli = |args: &[&str]| hookwise_tests::tenant_cli(&[args, &on[..]].concat(), &[]);
    let json = |args: &[&str]| hookwise_tests::tenant_cli_json(&[args, &on[..]].concat(), &[]);

    let created = json(&["create", "--name", "Carol", "--owner-email", "carol@example.com"]);
    let (id, old_key) = (created["id"].as_str().unwrap(), created["api_key"].as_str().unwrap());
    assert_eq!(api.with_key(old_key).get("/v1/subscriptions").await.0, 200);

    let table = cli(&["list"]);
    assert!(table.starts_with("ID "), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(id) && l.contains("carol@example.com") && l.ends_with("Carol")),
        "{table}"
    );
    let listed = json(&["list", "--json"]);
    assert_eq!(
        listed.as_array().unwrap().len(),
        2,
        "dev's own tenant and Carol: {listed}"
    );

    let set = json(&["set", id, "--retries", "off", "--name", "Carol B", "--json"]);
    assert_eq!(
        (set["retries_enabled"].as_bool(), set["name"].as_str()),
        (Some(false), Some("Carol B"))
    );
    let shown = cli(&["show", id]);
    assert!(shown.contains("retries:     off"), "{shown}");

    let rotated = json(&["rotate-key", id]);
    let new_key = rotated["api_key"].as_str().unwrap();
    assert_ne!(new_key, old_key);
    for key in [old_key, new_key] {
        assert_eq!(
            api.with_key(key).get("/v1/subscriptions").await.0,
            200,
            "both keys work"
        );
    }
    let shown = json(&["show", id, "--json"]);
    let key_ids: Vec<&str> = shown["api_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["id"].as_str().unwrap())
        .collect();
    assert_eq!(key_ids.len(), 2, "{shown}");
    assert_eq!(key_ids[1], rotated["key_id"].as_str().unwrap());

    // A third key waits for a revocation: a clear error, not a crash.
    let third = std::process::Command::new(hookwise_bin())
        .args(["tenant", "rotate-key", id, "--data-dir", data_dir])
        .output()
        .unwrap();
    assert_eq!(third.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&third.stderr).contains("revoke one first"));

    let revoked = json(&["revoke-key", id, "--key-id", key_ids[0], "--json"]);
    assert_eq!(revoked["api_keys"].as_array().unwrap().len(), 1);
    // dev used the old key a moment ago: it may take it until its lookup is 30 s old.
    let took = until_key_answers(&api, old_key, 401, Duration::from_secs(35)).await;
    eprintln!("the revoked key answered 401 after {took:?}");
    assert_eq!(api.with_key(new_key).get("/v1/subscriptions").await.0, 200);
}

#[tokio::test]
async fn given_a_rate_limit_then_the_receiver_never_gets_more_than_the_limit_a_tenth_and_one_in_any_second() {
    let dir = TempDir::new("rate-limit");
    let dev = Dev::start(&dir.0, &[]);
    let api = dev.api();
    let receiver = Receiver::start(0).await;
    let limit = 20;
    let sub = api
        .subscribe(json!({"url": receiver.url("/limited"), "rate_limit_per_second": limit}))
        .await;
    assert_eq!(sub["rate_limit_per_second"], json!(limit));
    let started = std::time::Instant::now();
    for batch in 0..2 {
        let events: Vec<_> = (0..100)
            .map(|n| json!({"type": "order.paid", "payload": {"n": batch * 100 + n}}))
            .collect();
        let (status, out) = api.post("/v1/events/batch", json!({"events": events})).await;
        assert_eq!(status, 202, "{out}");
    }
    receiver.wait_count(200, Duration::from_secs(40)).await;
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(receiver.count(), 200, "one POST each: a deferral is not an attempt");
    let busiest = receiver.busiest_second();
    eprintln!("200 POSTs at {limit}/s took {took:?}; the busiest second had {busiest}");
    assert!(
        busiest as f64 <= f64::from(limit) * 1.1 + 1.0,
        "{busiest} POSTs in one second"
    );
    assert!(took >= Duration::from_secs(9), "200 at 20/s cannot take {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn given_one_tenants_backlog_to_a_slow_endpoint_then_another_tenants_deliveries_keep_a_p99_under_two_seconds() {
    let dir = TempDir::new("fairness");
    let dev = Dev::start(&dir.0, &[]);
    let a = dev.api();
    let slow = Receiver::start(0).await;
    slow.set_delay(Duration::from_millis(500));
    a.subscribe(json!({"url": slow.url("/slow"), "retry_policy": {"schedule_seconds": []}}))
        .await;
    let created = hookwise_tests::tenant_cli_json(
        &[
            "create",
            "--name",
            "B",
            "--owner-email",
            "b@example.com",
            "--data-dir",
            dir.0.to_str().unwrap(),
        ],
        &[],
    );
    let b = a.with_key(created["api_key"].as_str().unwrap());
    let fast = Receiver::start(0).await;
    b.subscribe(json!({"url": fast.url("/fast")})).await;

    // Tenant A: 10 000 events, a backlog of some 40 s at its endpoint's pace.
    for batch in 0..100 {
        let events: Vec<_> = (0..100)
            .map(|n| json!({"type": "order.paid", "payload": {"n": batch * 100 + n}}))
            .collect();
        let (status, out) = a.post("/v1/events/batch", json!({"events": events})).await;
        assert_eq!(status, 202, "{out}");
    }
    assert!(
        slow.count() < 5_000,
        "A's backlog is there when B sends ({} delivered)",
        slow.count()
    );

    // Tenant B: 100 events, one at a time, each timed from its send to its arrival.
    let mut sent = std::collections::HashMap::new();
    for n in 0..100 {
        let at = std::time::Instant::now();
        let ev = b.send_event("order.paid", json!({"n": n})).await;
        sent.insert(ev["id"].as_str().unwrap().to_owned(), at);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    fast.wait_count(100, Duration::from_secs(30)).await;
    let mut latencies: Vec<Duration> = fast
        .requests()
        .iter()
        .map(|r| r.at - sent[r.header("webhook-id").unwrap()])
        .collect();
    latencies.sort();
    let p99 = latencies[98];
    eprintln!(
        "B's latency: p50 {:?}, p99 {:?}, max {:?}; A's endpoint had {} of 10 000 by then",
        latencies[49],
        p99,
        latencies[99],
        slow.count()
    );
    assert!(p99 < Duration::from_secs(2), "B's p99 {p99:?} behind A's backlog");
}

/// The retries rollout's story on the real `hookwise dev`: an operator key made with the CLI beside the
/// running process creates two accounts under their own ids, subscribes and sends events for
/// each with `Hookwise-Tenant` and in one batch, and moves the rollout; each account's
/// endpoint gets its own events only, and an account out of the rollout has no retries.
#[tokio::test]
async fn given_an_operator_key_then_one_service_runs_every_accounts_webhooks_and_their_retries_rollout() {
    let dir = TempDir::new("accounts");
    let dev = Dev::start(&dir.0, &[]);
    let out = Command::new(hookwise_bin())
        .args(["operator", "create-key", "--data-dir"])
        .arg(&dir.0)
        .env("HOOKWISE_LOG", "warn")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let made: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let op = dev.api().with_key(made["api_key"].as_str().unwrap());
    let as_account = |id: &'static str| [("Hookwise-Tenant", id)];
    let call = |method: &str, path: &str, body: serde_json::Value, tenant: Option<&'static str>| {
        let op = op.clone();
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let path = path.to_owned();
        async move {
            let headers: Vec<(&str, &str)> = tenant.map(as_account).into_iter().flatten().collect();
            op.call(method, &path, Some(body), &headers).await
        }
    };

    let northwind = Receiver::start(0).await;
    let contoso = Receiver::start(u32::MAX).await;
    for (id, receiver) in [("acct_northwind", &northwind), ("acct_contoso", &contoso)] {
        let tenant = json!({"id": id, "name": id, "owner_email": format!("{id}@example.com")});
        let (status, body) = call("POST", "/v1/tenants", tenant, None).await;
        assert_eq!(status, 201, "{body}");
        let sub = json!({"url": receiver.url("/"), "retry_policy": {"schedule_seconds": [1, 1]}});
        let (status, body) = call("POST", "/v1/subscriptions", sub, Some(id)).await;
        assert_eq!(status, 201, "{body}");
    }
    // Northwind's retries are on whatever the rollout; Contoso follows it, now at 0 %.
    let (status, _) = call("PATCH", "/v1/tenants/acct_northwind", json!({"retries": "on"}), None).await;
    assert_eq!(status, 200);
    let (status, _) = call("PUT", "/v1/rollout", json!({"retries_percent": 0}), None).await;
    assert_eq!(status, 200);

    let (status, one) = call(
        "POST",
        "/v1/events",
        json!({"type": "invoice.paid", "payload": {"n": 1}}),
        Some("acct_northwind"),
    )
    .await;
    assert_eq!(status, 202, "{one}");
    let batch = json!({"events": [
        {"type": "invoice.paid", "payload": {"n": 2}, "tenant": "acct_northwind"},
        {"type": "invoice.paid", "payload": {"n": 3}, "tenant": "acct_contoso"},
    ]});
    let (status, both) = call("POST", "/v1/events/batch", batch, None).await;
    assert_eq!((status, both["accepted"].clone()), (202, json!(2)), "{both}");

    // Northwind's endpoint gets its two events; Contoso's delivery dies after one attempt.
    let contoso_delivery = both["results"][1]["deliveries"][0]["id"].as_str().unwrap();
    let contoso_api = op.clone();
    let headers = [("Hookwise-Tenant", "acct_contoso")];
    let dead = hookwise_tests::poll_delivery_status(contoso_delivery, "dead", WAIT, Duration::from_millis(100), || {
        let api = contoso_api.clone();
        async move {
            api.call(
                reqwest::Method::GET,
                &format!("/v1/deliveries/{contoso_delivery}"),
                None,
                &headers,
            )
            .await
            .1
        }
    })
    .await;
    assert_eq!(dead["attempt_count"], 1, "out of the rollout: no retries");
    let start = std::time::Instant::now();
    while northwind.count() < 2 && start.elapsed() < WAIT {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let bodies: Vec<String> = northwind
        .requests()
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    assert_eq!(bodies.len(), 2, "{bodies:?}");
    assert!(
        bodies.iter().all(|b| !b.contains("\"n\":3")),
        "Contoso's event stays Contoso's"
    );
    assert_eq!(contoso.count(), 1);
}
