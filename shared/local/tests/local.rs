//! What only the embedded backend promises: visibility timeouts, redrive, restarts, the
//! `.eml` outbox, and sharing one file between handles.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use hookwise_core::model::*;
use hookwise_core::policy::RetryPolicy;
use hookwise_core::ports::*;
use hookwise_core::testing::memory::{ManualClock, ScriptedSender};
use hookwise_local::{LocalBackend, LocalConfig, QueueName, DB_FILE, OUTBOX_DIR};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn start() -> DateTime<Utc> {
    "2030-06-01T11:00:00Z".parse().expect("a valid time")
}

fn clocked() -> (Arc<ManualClock>, LocalConfig) {
    let clock = Arc::new(ManualClock::new(start()));
    (
        clock.clone(),
        LocalConfig {
            clock,
            ..LocalConfig::default()
        },
    )
}

fn secs(n: i64) -> chrono::Duration {
    chrono::Duration::seconds(n)
}

fn task(rng: &mut StdRng) -> DeliveryTask {
    DeliveryTask {
        delivery_id: DeliveryId::generate(start(), rng),
        round: 0,
        attempt: 1,
        queued_at: None,
        slot: None,
        tenant_id: None,
        held_until: None,
        redrives: 0,
    }
}

/// A tenant, a subscription, and an event with one delivery, all written.
async fn seed(store: &dyn Store, rng: &mut StdRng) -> (Tenant, Subscription, Event, Delivery) {
    let now = start();
    let tenant = Tenant {
        id: TenantId::generate(now, rng),
        name: "Acme".into(),
        owner_email: Email::parse("ops@acme.example").unwrap(),
        retries: RetriesSetting::On,
        status: TenantStatus::Active,
        created_at: now,
        api_keys: vec![ApiKey {
            hash: "hash-of-key".into(),
            created_at: now,
        }],
        version: 0,
        portal_sessions_since: None,
    };
    store.create_tenant(&tenant).await.unwrap();
    let sub = Subscription {
        id: SubscriptionId::generate(now, rng),
        tenant_id: tenant.id.clone(),
        url: EndpointUrl::parse("http://127.0.0.1:9/hook").unwrap(),
        event_types: vec![EventTypeFilter::all()],
        secret: SealedSecret::unsealed(&Secret::generate(rng)),
        previous_secret: None,
        previous_secret_expires_at: None,
        retry_policy: RetryPolicy::standard(),
        timeout_ms: DEFAULT_TIMEOUT_MS,
        status: SubscriptionStatus::Active,
        rate_limit_per_second: None,
        auto_disable_after_hours: None,
        circuit_breaker: Default::default(),
        active_since: None,
        disable_notice_pending: false,
        disable_notice_claimed_at: None,
        disabled_reason: None,
        owner_email: None,
        description: None,
        filter: None,
        headers: Vec::new(),
        created_at: now,
        updated_at: now,
    };
    store.create_subscription(&sub).await.unwrap();
    let event = Event {
        id: EventId::for_key(&tenant.id, "k-1"),
        tenant_id: tenant.id.clone(),
        event_type: EventType::parse("order.created").unwrap(),
        payload: serde_json::json!({"order": 1}),
        created_at: now,
        idempotency_key: Some("k-1".into()),
        test: false,
    };
    let delivery = Delivery {
        id: DeliveryId::generate(now, rng),
        tenant_id: tenant.id.clone(),
        event_id: event.id.clone(),
        subscription_id: sub.id.clone(),
        event_type: event.event_type.clone(),
        status: DeliveryStatus::Pending,
        round: 0,
        attempts: 0,
        next_attempt_at: Some(now),
        not_before: None,
        last_delay_seconds: None,
        held_until: None,
        last_status_code: None,
        last_error: None,
        test: false,
        created_at: now,
        updated_at: now,
    };
    assert_eq!(
        store
            .create_event(&event, std::slice::from_ref(&delivery))
            .await
            .unwrap(),
        Created::New
    );
    (tenant, sub, event, delivery)
}

#[tokio::test]
async fn a_received_message_is_hidden_until_its_visibility_timeout_then_comes_back() {
    let mut rng = StdRng::seed_from_u64(1);
    let (clock, config) = clocked();
    let backend = LocalBackend::open_in_memory_with(config).unwrap();
    let t = task(&mut rng);
    backend.enqueue(&[(t.clone(), 0)]).await.unwrap();

    let first = backend.receive(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!((first[0].task.clone(), first[0].receive_count), (t.clone(), 1));
    assert!(
        backend.receive(10, Duration::from_secs(30)).await.unwrap().is_empty(),
        "hidden while handled"
    );
    clock.advance(secs(29));
    assert!(
        backend.receive(10, Duration::from_secs(30)).await.unwrap().is_empty(),
        "still hidden at 29 s"
    );

    // The handler died: after the timeout the message is back, received a second time.
    clock.advance(secs(2));
    let second = backend.receive(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(second.len(), 1);
    assert_eq!((second[0].task.clone(), second[0].receive_count), (t, 2));

    assert!(
        !backend.ack(&first[0].receipt).await.unwrap(),
        "the first handler's receipt is stale"
    );
    assert_eq!(backend.queue_len(QueueName::Delivery).await.unwrap(), 1);
    assert!(backend.ack(&second[0].receipt).await.unwrap());
    assert!(
        !backend.ack(&second[0].receipt).await.unwrap(),
        "acking twice deletes nothing more"
    );
    assert_eq!(backend.queue_len(QueueName::Delivery).await.unwrap(), 0);
    clock.advance(secs(60));
    assert!(backend.receive(10, Duration::from_secs(30)).await.unwrap().is_empty());
}

#[tokio::test]
async fn receive_takes_at_most_max_messages_oldest_first() {
    let mut rng = StdRng::seed_from_u64(2);
    let (clock, config) = clocked();
    let backend = LocalBackend::open_in_memory_with(config).unwrap();
    let tasks: Vec<DeliveryTask> = (0..5).map(|_| task(&mut rng)).collect();
    for t in &tasks {
        backend.enqueue(&[(t.clone(), 0)]).await.unwrap();
        clock.advance(secs(1));
    }
    let got = backend.receive(3, Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        got.iter().map(|r| r.task.clone()).collect::<Vec<_>>(),
        tasks[..3].to_vec()
    );
    assert!(backend.receive(0, Duration::from_secs(30)).await.unwrap().is_empty());
    let rest = backend.receive(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        rest.iter().map(|r| r.task.clone()).collect::<Vec<_>>(),
        tasks[3..].to_vec()
    );
}

#[tokio::test]
async fn a_message_received_too_often_moves_to_the_dead_letter_queue() {
    let mut rng = StdRng::seed_from_u64(3);
    let (clock, mut config) = clocked();
    config.max_receive_count = Some(2);
    let backend = LocalBackend::open_in_memory_with(config).unwrap();
    let poison = task(&mut rng);
    backend.enqueue(&[(poison.clone(), 0)]).await.unwrap();

    for n in 1..=2 {
        let got = backend.receive(10, Duration::from_secs(10)).await.unwrap();
        assert_eq!(got.len(), 1, "receive #{n}");
        clock.advance(secs(11));
    }
    assert!(
        backend.receive(10, Duration::from_secs(10)).await.unwrap().is_empty(),
        "redriven, not received"
    );
    let dead = backend.receive_dead(10, Duration::from_secs(10)).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].task, poison);
    assert!(backend.ack_dead(&dead[0].receipt).await.unwrap());
    assert_eq!(
        backend.queue_len(QueueName::Delivery).await.unwrap() + backend.queue_len(QueueName::DeadLetter).await.unwrap(),
        0
    );
}

#[tokio::test]
async fn a_receipt_only_acks_on_its_own_queue() {
    let mut rng = StdRng::seed_from_u64(4);
    let backend = LocalBackend::open_in_memory().unwrap();
    backend.dead_letter(&[task(&mut rng)]).await.unwrap();
    let dead = backend.receive_dead(1, Duration::from_secs(30)).await.unwrap();
    assert!(backend.ack(&dead[0].receipt).await.is_err());
    assert!(backend.ack_dead(&dead[0].receipt).await.unwrap());
}

#[tokio::test]
async fn a_lowered_max_delay_is_honoured_to_the_second() {
    let mut rng = StdRng::seed_from_u64(5);
    let (clock, mut config) = clocked();
    config.max_delay_seconds = 5;
    let backend = LocalBackend::open_in_memory_with(config).unwrap();
    assert_eq!(backend.max_delay_seconds(), 5);
    let t = task(&mut rng);
    backend.enqueue(&[(t.clone(), 5)]).await.unwrap();
    let err = backend
        .enqueue(&[(task(&mut rng), 0), (task(&mut rng), 6)])
        .await
        .unwrap_err();
    assert!(matches!(err, hookwise_core::PortError::Permanent { .. }), "{err}");
    assert_eq!(
        backend.queue_len(QueueName::Delivery).await.unwrap(),
        1,
        "a refused batch writes nothing"
    );

    clock.advance(secs(4));
    assert!(backend.receive(10, Duration::from_secs(30)).await.unwrap().is_empty());
    assert_eq!(
        backend.next_visible_at(QueueName::Delivery).await.unwrap(),
        Some(start() + secs(5))
    );
    clock.advance(secs(1));
    let got = backend.receive(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(got.into_iter().map(|r| r.task).collect::<Vec<_>>(), vec![t]);
}

#[tokio::test]
async fn reopening_the_data_dir_loses_nothing() {
    let mut rng = StdRng::seed_from_u64(6);
    let dir = tempfile::tempdir().unwrap();
    let (clock, config) = clocked();
    let first = LocalBackend::open_with(dir.path(), config.clone()).unwrap();
    let (tenant, sub, event, delivery) = seed(&first, &mut rng).await;
    let attempt = Attempt {
        delivery_id: delivery.id.clone(),
        round: 0,
        attempt: 1,
        started_at: start(),
        duration_ms: 12,
        status_code: Some(500),
        error: None,
        response_excerpt: Some("oops".into()),
        next_attempt_at: Some(start() + secs(60)),
    };
    let retrying = Delivery {
        status: DeliveryStatus::Retrying,
        attempts: 1,
        next_attempt_at: Some(start() + secs(60)),
        last_delay_seconds: Some(61.25),
        held_until: None,
        last_status_code: Some(500),
        ..delivery.clone()
    };
    first
        .apply_change(&DeliveryChange {
            expected: Expected::of(&delivery),
            next: retrying.clone(),
            attempt: Some(attempt.clone()),
        })
        .await
        .unwrap();
    let in_flight = task(&mut rng);
    let delayed = task(&mut rng);
    first
        .enqueue(&[(in_flight.clone(), 0), (delayed.clone(), 120)])
        .await
        .unwrap();
    let received = first.receive(10, Duration::from_secs(60)).await.unwrap();
    assert_eq!(received.len(), 1, "only the undelayed one is visible");
    let later = ScheduledTask {
        task: task(&mut rng),
        due: start() + secs(3600),
    };
    first.schedule(&later).await.unwrap();
    let owner = Email::parse("ops@acme.example").unwrap();
    let notice = DeadNotice {
        delivery_id: delivery.id.clone(),
        round: 0,
        tenant_id: tenant.id.clone(),
        subscription_id: sub.id.clone(),
        died_at: start(),
    };
    assert!(first.queue_dead_notice(&owner, &notice).await.unwrap());
    first
        .send(&OutgoingEmail {
            to: Email::parse("ops@acme.example").unwrap(),
            subject: "Dead".into(),
            text: "gone".into(),
        })
        .await
        .unwrap();
    // The process dies with the message received but not acked.
    drop(first);

    let again = LocalBackend::open_with(dir.path(), config).unwrap();
    assert_eq!(
        again.tenant_by_api_key("hash-of-key").await.unwrap(),
        Some(tenant.clone())
    );
    assert_eq!(again.get_subscription(&tenant.id, &sub.id).await.unwrap(), Some(sub));
    assert_eq!(
        again.get_event(&tenant.id, &event.id).await.unwrap(),
        Some(event.clone())
    );
    assert_eq!(again.get_delivery(&delivery.id).await.unwrap(), Some(retrying));
    assert_eq!(again.attempts(&delivery.id).await.unwrap(), vec![attempt]);
    let claim = again
        .claim_digest(&owner, start(), start() - secs(300), start() - secs(60))
        .await
        .unwrap()
        .expect("the notice waits for its email");
    assert_eq!(claim.notices, vec![notice.clone()]);
    assert!(
        !again.queue_dead_notice(&owner, &notice).await.unwrap(),
        "recorded once"
    );
    assert_eq!(again.due(start() + secs(3600), 10).await.unwrap(), vec![later]);
    assert_eq!(again.outbox().await.unwrap().len(), 1);
    let dup = Event {
        id: EventId::generate(start(), &mut rng),
        ..event.clone()
    };
    assert_eq!(
        again.create_event(&dup, &[]).await.unwrap(),
        Created::Existing(event.id)
    );

    assert!(
        again.receive(10, Duration::from_secs(60)).await.unwrap().is_empty(),
        "still hidden after the restart"
    );
    clock.advance(secs(61));
    let back = again.receive(10, Duration::from_secs(60)).await.unwrap();
    assert_eq!(
        back.iter()
            .map(|r| (r.task.clone(), r.receive_count))
            .collect::<Vec<_>>(),
        vec![(in_flight, 2)]
    );
    assert!(again.ack(&back[0].receipt).await.unwrap());
    clock.advance(secs(60));
    let next = again.receive(10, Duration::from_secs(60)).await.unwrap();
    assert_eq!(next.into_iter().map(|r| r.task).collect::<Vec<_>>(), vec![delayed]);
}

#[tokio::test]
async fn open_creates_the_database_and_the_outbox_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("nested").join(".hookwise");
    let backend = LocalBackend::open(&data).unwrap();
    assert!(data.join(DB_FILE).is_file());
    assert!(data.join(OUTBOX_DIR).is_dir());
    assert_eq!(backend.data_dir(), Some(data.as_path()));
    let mode: String = rusqlite::Connection::open(data.join(DB_FILE))
        .unwrap()
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[tokio::test]
async fn each_mail_is_an_rfc_5322_eml_file_in_the_outbox() {
    let (_clock, config) = clocked();
    let backend = LocalBackend::open_temp_with(config).unwrap();
    let email = OutgoingEmail {
        to: Email::parse("owner@acme.example").unwrap(),
        subject: "Delivery dead: order.created → café\r\nBcc: evil@x.example".into(),
        text: "Event evt_1 could not be delivered.\nLast error: HTTP 500\n\nReplay: POST /v1/deliveries/dlv_1/replay"
            .into(),
    };
    backend.send(&email).await.unwrap();

    let sent = backend.outbox().await.unwrap();
    assert_eq!(sent.len(), 1);
    let mail = &sent[0];
    assert_eq!(
        (mail.to.clone(), mail.subject.clone(), mail.text.clone()),
        (email.to.clone(), email.subject.clone(), email.text.clone())
    );
    assert_eq!(mail.sent_at, start());
    let path = mail.path.clone().expect("a file");
    assert_eq!(path.parent(), backend.outbox_dir());
    assert_eq!(path.extension().and_then(|e| e.to_str()), Some("eml"));

    let eml = std::fs::read_to_string(&path).unwrap();
    let (head, body) = eml
        .split_once("\r\n\r\n")
        .expect("a blank line between headers and body");
    let headers: Vec<(&str, &str)> = head
        .split("\r\n")
        .map(|l| l.split_once(": ").expect("a header line"))
        .collect();
    let header = |name: &str| headers.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
    assert_eq!(header("From"), Some("Hookwise <hookwise@hookwise.local>"));
    assert_eq!(header("To"), Some("owner@acme.example"));
    assert_eq!(header("Date"), Some("Sat, 1 Jun 2030 11:00:00 +0000"));
    assert_eq!(header("Message-ID"), Some(mail.message_id.as_str()));
    assert!(mail.message_id.starts_with('<') && mail.message_id.ends_with("@hookwise.local>"));
    assert_eq!(header("Content-Type"), Some("text/plain; charset=utf-8"));
    assert_eq!(header("MIME-Version"), Some("1.0"));
    assert!(
        header("Bcc").is_none(),
        "a line break in the subject cannot add a header"
    );
    let subject = header("Subject").unwrap();
    assert!(
        subject.starts_with("=?UTF-8?B?"),
        "non-ASCII subjects are encoded: {subject}"
    );
    assert_eq!(
        body,
        "Event evt_1 could not be delivered.\r\nLast error: HTTP 500\r\n\r\nReplay: POST /v1/deliveries/dlv_1/replay\r\n"
    );

    backend
        .send(&OutgoingEmail {
            to: email.to.clone(),
            subject: "Second".into(),
            text: "two".into(),
        })
        .await
        .unwrap();
    let sent = backend.outbox().await.unwrap();
    assert_eq!(
        sent.iter().map(|m| m.subject.as_str()).collect::<Vec<_>>(),
        vec![email.subject.as_str(), "Second"]
    );
    assert_ne!(sent[0].message_id, sent[1].message_id);
    assert_ne!(sent[0].path, sent[1].path);
    let files = std::fs::read_dir(backend.outbox_dir().unwrap()).unwrap().count();
    assert_eq!(files, 2, "no temp files left behind");
}

#[tokio::test]
async fn an_in_memory_backend_keeps_mail_as_rows_only() {
    let backend = LocalBackend::open_in_memory().unwrap();
    let email = OutgoingEmail {
        to: Email::parse("a@b.example").unwrap(),
        subject: "s".into(),
        text: "t".into(),
    };
    backend.send(&email).await.unwrap();
    let sent = backend.outbox().await.unwrap();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].path, None);
    assert_eq!(sent[0].text, "t");
}

#[tokio::test]
async fn a_waiting_worker_wakes_when_a_message_is_enqueued() {
    let mut rng = StdRng::seed_from_u64(7);
    let backend = LocalBackend::open_in_memory().unwrap();
    let waiter = {
        let backend = backend.clone();
        tokio::spawn(async move {
            let began = std::time::Instant::now();
            backend
                .wait_for_messages(QueueName::Delivery, Duration::from_secs(30))
                .await
                .unwrap();
            began.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    backend.enqueue(&[(task(&mut rng), 0)]).await.unwrap();
    let waited = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken")
        .unwrap();
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
    assert_eq!(backend.receive(10, Duration::from_secs(30)).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_on_one_file_and_concurrent_writers_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // As `hookwise tenant create` beside a running `hookwise dev`: two connections, one file.
    let a = LocalBackend::open(dir.path()).unwrap();
    let b = LocalBackend::open(dir.path()).unwrap();
    let mut handles = Vec::new();
    for (i, backend) in [a.clone(), b.clone(), a.clone(), b.clone()].into_iter().enumerate() {
        handles.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(100 + i as u64);
            for _ in 0..50 {
                backend.enqueue(&[(task(&mut rng), 0)]).await.unwrap();
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    assert_eq!(a.queue_len(QueueName::Delivery).await.unwrap(), 200);
    let mut seen = std::collections::HashSet::new();
    loop {
        let batch = b.receive(64, Duration::from_secs(30)).await.unwrap();
        if batch.is_empty() {
            break;
        }
        for r in &batch {
            assert!(seen.insert(r.task.clone()), "a message was received twice");
        }
        a.ack_many(&batch.iter().map(|r| r.receipt.clone()).collect::<Vec<_>>())
            .await
            .unwrap();
    }
    assert_eq!(seen.len(), 200);
    assert_eq!(b.queue_len(QueueName::Delivery).await.unwrap(), 0);
}

#[tokio::test]
async fn an_event_and_its_first_attempts_messages_are_written_together_or_not_at_all() {
    let mut rng = StdRng::seed_from_u64(10);
    let backend = LocalBackend::open_temp().unwrap();
    let (tenant, sub, keyed, _) = seed(&backend, &mut rng).await;
    let event = Event {
        id: EventId::generate(start(), &mut rng),
        idempotency_key: None,
        ..keyed.clone()
    };
    let delivery = Delivery::new(DeliveryId::for_event(&event.id, &sub.id), &event, sub.id.clone());
    let tasks = [(hookwise_core::state::queued_ahead_task(&delivery, start()), 0)];
    let written = |event: Event| {
        let (backend, delivery, tasks) = (backend.clone(), delivery.clone(), tasks.clone());
        async move { write_one(&backend, &event, &delivery, &tasks).await }
    };

    assert_eq!(written(event.clone()).await.unwrap(), Created::New);
    assert!(backend.get_event(&tenant.id, &event.id).await.unwrap().is_some());
    let received = backend.receive(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(received.iter().map(|r| &r.task).collect::<Vec<_>>(), vec![&tasks[0].0]);

    // The same event again fails, and queues nothing.
    assert!(matches!(
        written(event.clone()).await,
        Err(hookwise_core::PortError::ConditionFailed(_))
    ));
    // A key the tenant used names the stored event, and queues nothing.
    let again = Event {
        id: EventId::generate(start(), &mut rng),
        ..keyed.clone()
    };
    let delivery = Delivery::new(DeliveryId::for_event(&again.id, &sub.id), &again, sub.id.clone());
    let tasks = [(hookwise_core::state::queued_ahead_task(&delivery, start()), 0)];
    assert_eq!(
        write_one(&backend, &again, &delivery, &tasks).await.unwrap(),
        Created::Existing(keyed.id.clone())
    );
    assert_eq!(
        backend.queue_len(QueueName::Delivery).await.unwrap(),
        1,
        "only the first message"
    );
}

async fn write_one(
    backend: &LocalBackend,
    event: &Event,
    delivery: &Delivery,
    tasks: &[(DeliveryTask, u32)],
) -> PortResult<Created> {
    let write = EventWrite {
        event,
        deliveries: std::slice::from_ref(delivery),
        tasks,
    };
    let mut results = backend.create_events_queued(&[write]).await;
    assert_eq!(results.len(), 1);
    results.pop().unwrap()
}

/// A batch's events share one call, but each is all or nothing on its own: one that fails
/// (its delivery's id is taken) leaves no row and no message, and the others are stored and queued.
#[tokio::test]
async fn one_failed_event_of_a_batch_undoes_only_its_own_writes() {
    let mut rng = StdRng::seed_from_u64(11);
    let backend = LocalBackend::open_temp().unwrap();
    let (tenant, sub, keyed, _) = seed(&backend, &mut rng).await;
    let event = |rng: &mut StdRng| Event {
        id: EventId::generate(start(), rng),
        idempotency_key: None,
        ..keyed.clone()
    };
    let (first, taken, last) = (event(&mut rng), event(&mut rng), event(&mut rng));
    type Planned = (Event, Vec<Delivery>, Vec<(DeliveryTask, u32)>);
    let planned: Vec<Planned> = [&first, &taken, &last]
        .into_iter()
        .map(|e| {
            let d = Delivery::new(DeliveryId::for_event(&e.id, &sub.id), e, sub.id.clone());
            let tasks = vec![(hookwise_core::state::queued_ahead_task(&d, start()), 0)];
            (e.clone(), vec![d], tasks)
        })
        .collect();
    // Another event's delivery has the id `taken`'s delivery is to have: its event row is
    // written, then its delivery's fails.
    let other = event(&mut rng);
    let clash = Delivery::new(planned[1].1[0].id.clone(), &other, sub.id.clone());
    backend.create_event(&other, &[clash]).await.unwrap();
    let writes: Vec<EventWrite<'_>> = planned
        .iter()
        .map(|(event, deliveries, tasks)| EventWrite {
            event,
            deliveries,
            tasks,
        })
        .collect();

    let results = backend.create_events_queued(&writes).await;
    assert!(matches!(results[0], Ok(Created::New)), "{:?}", results[0]);
    assert!(
        matches!(results[1], Err(hookwise_core::PortError::ConditionFailed(_))),
        "{:?}",
        results[1]
    );
    assert!(matches!(results[2], Ok(Created::New)), "{:?}", results[2]);
    let stored = |id: &EventId| {
        let backend = backend.clone();
        let (tenant, id) = (tenant.id.clone(), id.clone());
        async move { backend.event_deliveries(&tenant, &id).await.unwrap().len() }
    };
    assert_eq!(stored(&first.id).await, 1);
    assert!(
        backend.get_event(&tenant.id, &taken.id).await.unwrap().is_none(),
        "the failed event's row was undone"
    );
    assert_eq!(stored(&last.id).await, 1);
    let received = backend.receive(10, Duration::from_secs(30)).await.unwrap();
    let queued: Vec<_> = received.iter().map(|r| &r.task).collect();
    assert_eq!(
        queued,
        vec![&planned[0].2[0].0, &planned[2].2[0].0],
        "no message for the failed event"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_answers_from_the_last_commit_while_a_write_waits_for_the_database() {
    let mut rng = StdRng::seed_from_u64(9);
    let dir = tempfile::tempdir().unwrap();
    let backend = LocalBackend::open(dir.path()).unwrap();
    let (tenant, _sub, event, delivery) = seed(&backend, &mut rng).await;
    // Another process holds the write lock: the backend's next write waits for it.
    let other = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let write = tokio::spawn({
        let backend = backend.clone();
        let task = task(&mut rng);
        async move { backend.enqueue(&[(task, 0)]).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;

    let reads = tokio::time::timeout(Duration::from_secs(2), async {
        (
            backend.get_delivery(&delivery.id).await.unwrap(),
            backend.get_event(&tenant.id, &event.id).await.unwrap(),
        )
    })
    .await
    .expect("the reads answer while the write waits");
    assert_eq!(reads.0.map(|d| d.id), Some(delivery.id));
    assert_eq!(reads.1.map(|e| e.id), Some(event.id));
    assert!(!write.is_finished(), "the write waits for the other process");

    other.execute_batch("COMMIT").unwrap();
    write.await.unwrap().unwrap();
    assert_eq!(backend.queue_len(QueueName::Delivery).await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_that_fail_undo_only_their_own_writes() {
    let mut rng = StdRng::seed_from_u64(8);
    let backend = LocalBackend::open_in_memory().unwrap();
    let mut deliveries = Vec::new();
    for _ in 0..40 {
        deliveries.push(seed_delivery(&backend, &mut rng).await);
    }
    // Half the changes expect a state the delivery is not in; all race for the connection,
    // so many share a transaction with a failing neighbour.
    let mut calls = Vec::new();
    for (i, d) in deliveries.iter().enumerate() {
        let b = backend.clone();
        let d = d.clone();
        calls.push(tokio::spawn(async move {
            let stale = i % 2 == 1;
            let expected = if stale {
                Expected {
                    attempts: 7,
                    ..Expected::of(&d)
                }
            } else {
                Expected::of(&d)
            };
            let next = Delivery {
                status: DeliveryStatus::Delivered,
                attempts: 1,
                next_attempt_at: None,
                ..d.clone()
            };
            let attempt = Attempt {
                delivery_id: d.id.clone(),
                round: 0,
                attempt: 1,
                started_at: start(),
                duration_ms: 1,
                status_code: Some(200),
                error: None,
                response_excerpt: None,
                next_attempt_at: None,
            };
            (
                stale,
                b.apply_change(&DeliveryChange {
                    expected,
                    next,
                    attempt: Some(attempt),
                })
                .await,
            )
        }));
    }
    for call in calls {
        let (stale, result) = call.await.unwrap();
        assert_eq!(
            stale,
            matches!(result, Err(hookwise_core::PortError::ConditionFailed(_))),
            "{result:?}"
        );
        assert!(stale || result.is_ok());
    }
    for (i, d) in deliveries.iter().enumerate() {
        let now = backend.get_delivery(&d.id).await.unwrap().unwrap();
        let attempts = backend.attempts(&d.id).await.unwrap();
        if i % 2 == 1 {
            assert_eq!(
                (now.status, attempts.len()),
                (DeliveryStatus::Pending, 0),
                "a failed change left a trace"
            );
        } else {
            assert_eq!((now.status, attempts.len()), (DeliveryStatus::Delivered, 1));
        }
    }
}

/// An event with one pending delivery, for a tenant and subscription of its own.
async fn seed_delivery(store: &LocalBackend, rng: &mut StdRng) -> Delivery {
    let now = start();
    let tenant = TenantId::generate(now, rng);
    let sub = SubscriptionId::generate(now, rng);
    let event = Event {
        id: EventId::generate(now, rng),
        tenant_id: tenant.clone(),
        event_type: EventType::parse("order.created").unwrap(),
        payload: serde_json::json!({}),
        created_at: now,
        idempotency_key: None,
        test: false,
    };
    let delivery = Delivery {
        id: DeliveryId::generate(now, rng),
        tenant_id: tenant.clone(),
        event_id: event.id.clone(),
        subscription_id: sub.clone(),
        event_type: event.event_type.clone(),
        status: DeliveryStatus::Pending,
        round: 0,
        attempts: 0,
        next_attempt_at: Some(now),
        not_before: None,
        last_delay_seconds: None,
        held_until: None,
        last_status_code: None,
        last_error: None,
        test: false,
        created_at: now,
        updated_at: now,
    };
    store
        .create_event(&event, std::slice::from_ref(&delivery))
        .await
        .unwrap();
    delivery
}

#[tokio::test]
async fn the_consumer_port_receives_returns_extends_and_acks_on_either_queue() {
    use hookwise_core::ports::QueueConsumer;
    let mut rng = StdRng::seed_from_u64(9);
    let (clock, config) = clocked();
    let backend = LocalBackend::open_in_memory_with(config).unwrap();
    let consumer = backend.consumer(QueueName::Delivery, Duration::from_secs(30));
    let t = task(&mut rng);
    backend.enqueue(&[(t.clone(), 0)]).await.unwrap();

    let got = consumer.receive(10, Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message.task, Ok(t.clone()));
    assert!(!got[0].message.redriven);
    // Extended to 60 s: not back at the 30 s timeout, back after 60 s.
    consumer
        .change_visibility(&[got[0].receipt.clone()], Duration::from_secs(60))
        .await
        .unwrap();
    clock.advance(secs(31));
    assert!(
        consumer.receive(10, Duration::ZERO).await.unwrap().is_empty(),
        "still hidden: extended"
    );
    // Returned at once: visible now, with the same receipt still good.
    consumer
        .change_visibility(&[got[0].receipt.clone()], Duration::ZERO)
        .await
        .unwrap();
    let again = consumer.receive(10, Duration::ZERO).await.unwrap();
    assert_eq!(again.len(), 1, "returned for redelivery");
    consumer.ack(&[again[0].receipt.clone()]).await.unwrap();
    assert_eq!(backend.queue_len(QueueName::Delivery).await.unwrap(), 0);

    // The dead-letter queue's consumer sees only its own queue.
    backend.dead_letter(std::slice::from_ref(&t)).await.unwrap();
    assert!(consumer.receive(10, Duration::ZERO).await.unwrap().is_empty());
    let dead = backend.consumer(QueueName::DeadLetter, Duration::from_secs(30));
    let got = dead.receive(10, Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 1);
    dead.ack(&[got[0].receipt.clone()]).await.unwrap();
    assert_eq!(backend.queue_len(QueueName::DeadLetter).await.unwrap(), 0);
}

#[tokio::test]
async fn given_messages_in_flight_when_the_next_owner_releases_them_then_they_are_visible_at_once_and_delayed_ones_are_not(
) {
    let mut rng = StdRng::seed_from_u64(10);
    let (_clock, config) = clocked();
    let backend = LocalBackend::open_in_memory_with(config).unwrap();
    let (in_flight, delayed) = (task(&mut rng), task(&mut rng));
    backend
        .enqueue(&[(in_flight.clone(), 0), (delayed.clone(), 300)])
        .await
        .unwrap();
    let got = backend.receive(10, Duration::from_secs(120)).await.unwrap();
    assert_eq!(got.len(), 1, "the delayed one is not due");
    assert!(backend.receive(10, Duration::from_secs(120)).await.unwrap().is_empty());

    assert_eq!(backend.release_in_flight().await.unwrap(), 1);
    let again = backend.receive(10, Duration::from_secs(120)).await.unwrap();
    assert_eq!(
        again.iter().map(|r| r.task.clone()).collect::<Vec<_>>(),
        vec![in_flight]
    );
    assert_eq!(again[0].receive_count, 2, "still counted toward the redrive");
}

#[test]
fn given_a_data_dir_owned_by_one_lock_then_a_second_is_refused_naming_the_owner_and_free_after_release() {
    let dir = tempfile::tempdir().unwrap();
    let first = hookwise_local::DataDirLock::acquire(dir.path()).unwrap();
    let err = hookwise_local::DataDirLock::acquire(dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains(&format!("pid {}", std::process::id())), "{err}");
    assert!(err.contains("--data-dir"), "{err}");
    drop(first);
    hookwise_local::DataDirLock::acquire(dir.path()).expect("free once the owner is gone");
}

/// A data dir as an older build left it (`sql` makes its database), opened by this one.
async fn opened_after(sql: &str) -> (tempfile::TempDir, LocalBackend) {
    let dir = tempfile::tempdir().unwrap();
    rusqlite::Connection::open(dir.path().join("hookwise.db"))
        .unwrap()
        .execute_batch(sql)
        .unwrap();
    let backend = LocalBackend::open(dir.path()).unwrap_or_else(|e| panic!("{e}\n{sql}"));
    (dir, backend)
}

/// Whether `delivery`'s round 0 is recorded as new now (`false`: its owner was told already).
async fn records_afresh(backend: &LocalBackend, delivery: &str) -> bool {
    let owner = Email::parse("ops@acme.example").unwrap();
    backend
        .queue_dead_notice(&owner, &upgraded_notice(delivery))
        .await
        .unwrap()
}

/// A notice of `delivery` as the upgrade tests record it.
fn upgraded_notice(delivery: &str) -> DeadNotice {
    let mut rng = StdRng::seed_from_u64(3);
    DeadNotice {
        delivery_id: DeliveryId::parse(delivery).unwrap(),
        round: 0,
        tenant_id: TenantId::generate(start(), &mut rng),
        subscription_id: SubscriptionId::generate(start(), &mut rng),
        died_at: start(),
    }
}

#[tokio::test]
async fn a_version_1_data_dir_is_upgraded_and_its_notices_count_as_sent() {
    // What version 1 wrote: a claim had no sent mark, and meant the email went out.
    let (_dir, backend) = opened_after(
        "CREATE TABLE dead_notices (delivery_id TEXT NOT NULL, round INTEGER NOT NULL,
             claimed_at INTEGER NOT NULL, PRIMARY KEY (delivery_id, round)) WITHOUT ROWID;
         INSERT INTO dead_notices VALUES ('dlv_01J0000000000000000000000A', 0, 1);
         PRAGMA user_version = 1;",
    )
    .await;
    assert!(
        !records_afresh(&backend, "dlv_01J0000000000000000000000A").await,
        "told already"
    );
    assert!(records_afresh(&backend, "dlv_01J0000000000000000000000B").await);
}

#[tokio::test]
async fn a_version_2_data_dir_keeps_its_sent_notices_and_drops_claims_never_sent() {
    let (_dir, backend) = opened_after(
        "CREATE TABLE dead_notices (delivery_id TEXT NOT NULL, round INTEGER NOT NULL,
             claimed_at INTEGER NOT NULL, sent_at INTEGER, PRIMARY KEY (delivery_id, round)) WITHOUT ROWID;
         INSERT INTO dead_notices VALUES ('dlv_01J0000000000000000000000A', 0, 1, 2);
         INSERT INTO dead_notices VALUES ('dlv_01J0000000000000000000000B', 0, 1, NULL);
         PRAGMA user_version = 2;",
    )
    .await;
    assert!(
        !records_afresh(&backend, "dlv_01J0000000000000000000000A").await,
        "told already"
    );
    // Its dead letter comes back (its batch failed) and records it afresh.
    assert!(records_afresh(&backend, "dlv_01J0000000000000000000000B").await);
    assert_eq!(
        backend.due_digests(start(), start(), 10).await.unwrap(),
        vec![Email::parse("ops@acme.example").unwrap()],
        "and it waits for the owner's email"
    );
}

#[tokio::test]
async fn a_version_2_data_dir_left_half_upgraded_by_a_killed_process_still_opens_and_keeps_its_notices() {
    // Killed after copying the sent notices, before (or after) dropping the old table, and
    // before the version was set.
    let copied = "CREATE TABLE dead_notices (delivery_id TEXT NOT NULL, round INTEGER NOT NULL,
             claimed_at INTEGER NOT NULL, sent_at INTEGER, PRIMARY KEY (delivery_id, round)) WITHOUT ROWID;
         INSERT INTO dead_notices VALUES ('dlv_01J0000000000000000000000A', 0, 1, 2);
         CREATE TABLE notices (delivery_id TEXT NOT NULL, round INTEGER NOT NULL, owner TEXT NOT NULL,
             died_at INTEGER NOT NULL, sent_at INTEGER, doc TEXT NOT NULL,
             PRIMARY KEY (delivery_id, round)) WITHOUT ROWID;
         INSERT INTO notices VALUES ('dlv_01J0000000000000000000000A', 0, '', 1, 2, '{}');
         PRAGMA user_version = 2;";
    for sql in [copied.to_owned(), format!("{copied} DROP TABLE dead_notices;")] {
        let (_dir, backend) = opened_after(&sql).await;
        assert!(
            !records_afresh(&backend, "dlv_01J0000000000000000000000A").await,
            "told already"
        );
    }
}

#[tokio::test]
async fn a_version_3_data_dir_moves_each_tenants_key_beside_it_and_lists_it_on_the_tenant() {
    // What version 3 wrote: one key per tenant, in a column of its row.
    let (_dir, backend) = opened_after(
        r#"CREATE TABLE tenants (id TEXT PRIMARY KEY, api_key_hash TEXT NOT NULL UNIQUE, doc TEXT NOT NULL);
         INSERT INTO tenants VALUES ('ten_01J0000000000000000000000A', 'hash-a',
             '{"id":"ten_01J0000000000000000000000A","name":"Acme","owner_email":"ops@acme.example","retries_enabled":true,"created_at":"2026-01-01T00:00:00Z"}');
         PRAGMA user_version = 3;"#,
    )
    .await;
    let tenant = backend
        .tenant_by_api_key("hash-a")
        .await
        .unwrap()
        .expect("its key still works");
    assert_eq!(tenant.name, "Acme");
    // Its `retries_enabled` flag reads as the setting it was: on, not left to the rollout.
    assert_eq!(
        (tenant.retries, tenant.status),
        (RetriesSetting::On, TenantStatus::Active)
    );
    assert_eq!(
        tenant.api_keys,
        vec![ApiKey {
            hash: "hash-a".into(),
            created_at: "2026-01-01T00:00:00Z".parse().unwrap()
        }]
    );
    assert_eq!(backend.list_tenants(None, 10).await.unwrap(), vec![tenant.clone()]);
    // And a second key can be added beside it.
    let rotated = Tenant {
        api_keys: vec![
            tenant.api_keys[0].clone(),
            ApiKey {
                hash: "hash-b".into(),
                created_at: start(),
            },
        ],
        version: 1,
        ..tenant.clone()
    };
    backend.update_tenant(&rotated, &tenant).await.unwrap();
    assert_eq!(
        backend.tenant_by_api_key("hash-b").await.unwrap(),
        Some(rotated.clone())
    );
    assert_eq!(backend.tenant_by_api_key("hash-a").await.unwrap(), Some(rotated));
}

#[tokio::test]
async fn a_receive_takes_each_tenants_messages_in_turn_oldest_first() {
    let mut rng = StdRng::seed_from_u64(9);
    let (clock, config) = clocked();
    let backend = LocalBackend::open_in_memory_with(config).unwrap();
    let (a, b) = (
        TenantId::generate(start(), &mut rng),
        TenantId::generate(start(), &mut rng),
    );
    let of = |tenant: &TenantId, rng: &mut StdRng| DeliveryTask {
        tenant_id: Some(tenant.clone()),
        ..task(rng)
    };
    // A's backlog first, then two of B's and one an older build queued (no tenant).
    let mut queued = Vec::new();
    for _ in 0..5 {
        queued.push(of(&a, &mut rng));
    }
    queued.extend([of(&b, &mut rng), of(&b, &mut rng), task(&mut rng)]);
    for t in &queued {
        backend.enqueue(&[(t.clone(), 0)]).await.unwrap();
        clock.advance(chrono::Duration::milliseconds(1));
    }
    let got: Vec<DeliveryTask> = backend
        .receive(6, Duration::from_secs(30))
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.task)
        .collect();
    let want = [&queued[0], &queued[5], &queued[7], &queued[1], &queued[6], &queued[2]];
    assert_eq!(got.iter().collect::<Vec<_>>(), want, "A, B, none, A, B, A");
}

/// Services on `backend` whose POSTs a script answers 200, on the backend's clock.
fn services_on(backend: &LocalBackend) -> (hookwise_core::services::Services, Arc<ScriptedSender>) {
    let sender = Arc::new(ScriptedSender::always(200));
    let ports = backend.ports(sender.clone(), backend.config().clock.clone());
    let config = hookwise_core::services::Config::default();
    (
        hookwise_core::services::Services::new(ports, config, StdRng::seed_from_u64(3)),
        sender,
    )
}

/// An event for `tenant`, its one delivery made.
async fn ingest_and_deliver(services: &hookwise_core::services::Services, backend: &LocalBackend, tenant: &Tenant) {
    let event = serde_json::from_value(serde_json::json!({"type": "a.b", "payload": {}})).unwrap();
    services.ingest(tenant, event, None).await.unwrap();
    let received = backend.receive(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(received.len(), 1);
    services.deliver(&received[0].task).await.unwrap();
}

/// Whether the request's signature verifies with `secret`.
fn signed_with(request: &WebhookRequest, secret: &Secret, now: DateTime<Utc>) -> bool {
    let header = |name: &str| {
        request
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    };
    hookwise_core::signing::verify(
        secret,
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
        &request.body,
        now.timestamp(),
        300,
    )
    .is_ok()
}

#[tokio::test]
async fn a_subscriptions_secret_is_on_disk_only_sealed_with_a_key_file_only_its_owner_reads() {
    let dir = tempfile::tempdir().unwrap();
    let backend = LocalBackend::open(dir.path()).unwrap();
    let (services, _) = services_on(&backend);
    let (tenant, _) = services
        .create_tenant(hookwise_core::services::NewTenant::named(
            "Acme",
            Email::parse("ops@acme.example").unwrap(),
        ))
        .await
        .unwrap();
    let new = serde_json::from_value(serde_json::json!({"url": "https://hooks.acme.example/in"})).unwrap();
    let made = services.create_subscription(&tenant, new).await.unwrap();
    drop((services, backend));

    let key_b64 = made
        .secret
        .as_str()
        .trim_start_matches(Secret::PREFIX)
        .as_bytes()
        .to_vec();
    assert!(dir.path().join(DB_FILE).is_file());
    for file in [DB_FILE.to_owned(), format!("{DB_FILE}-wal")] {
        let Ok(bytes) = std::fs::read(dir.path().join(&file)) else {
            continue; // no WAL left: the last connection checkpointed it
        };
        let holds = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
        assert!(!holds(b"whsec_") && !holds(&key_b64), "{file} holds the secret");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(hookwise_local::KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "the key file is its owner's alone");
    }

    // Reopened, the data dir's key opens it to sign.
    let backend = LocalBackend::open(dir.path()).unwrap();
    let (services, sender) = services_on(&backend);
    ingest_and_deliver(&services, &backend, &tenant).await;
    let request = sender.requests.lock().unwrap()[0].clone();
    assert!(signed_with(&request, &made.secret, Utc::now()));

    // Without its key the data dir does not open: a new key would open none of its secrets.
    drop((services, backend));
    std::fs::remove_file(dir.path().join(hookwise_local::KEY_FILE)).unwrap();
    let err = LocalBackend::open(dir.path()).expect_err("refused without its key");
    assert!(err.to_string().contains("secrets.key is missing"), "{err}");
}

#[tokio::test]
async fn a_secret_stored_in_plain_text_by_an_older_build_signs_and_is_sealed_on_its_next_change() {
    let (clock, config) = clocked();
    let backend = LocalBackend::open_in_memory_with(config).unwrap();
    let mut rng = StdRng::seed_from_u64(9);
    let (tenant, sub, _, delivery) = seed(&backend, &mut rng).await;
    let plain = sub.secret.plain().expect("seeded in plain text");
    let (services, sender) = services_on(&backend);

    let deliver = |attempt_of: &Delivery| DeliveryTask {
        delivery_id: attempt_of.id.clone(),
        ..task(&mut StdRng::seed_from_u64(1))
    };
    services.deliver(&deliver(&delivery)).await.unwrap();
    assert!(signed_with(&sender.requests.lock().unwrap()[0], &plain, clock.now()));

    let patch = serde_json::from_value(serde_json::json!({"description": "orders"})).unwrap();
    services.update_subscription(&tenant, &sub.id, patch).await.unwrap();
    let stored = backend.get_subscription(&tenant.id, &sub.id).await.unwrap().unwrap();
    assert!(
        stored.secret.plain().is_none() && stored.secret.as_str().starts_with("local1:"),
        "still in plain text after a change: {:?}",
        stored.secret
    );
    // The same secret, sealed: the next delivery still verifies with it.
    ingest_and_deliver(&services, &backend, &tenant).await;
    let requests = sender.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    assert!(signed_with(&requests[1], &plain, clock.now()));
}

#[tokio::test]
async fn a_backlog_older_than_the_audits_hour_gets_no_duplicate_messages_here() {
    // The queue is in the store's database and loses nothing: the audit of queued messages,
    // which would queue a copy of each first attempt still waiting an hour on, does not run.
    let (clock, config) = clocked();
    let backend = LocalBackend::open_temp_with(config).unwrap();
    let (services, _) = services_on(&backend);
    let (tenant, _) = services
        .create_tenant(hookwise_core::services::NewTenant::named(
            "Acme",
            Email::parse("ops@acme.example").unwrap(),
        ))
        .await
        .unwrap();
    let new = serde_json::from_value(serde_json::json!({"url": "https://hooks.example.com/in"})).unwrap();
    services.create_subscription(&tenant, new).await.unwrap();
    services.run_scheduler().await.unwrap();
    for _ in 0..3 {
        let event = serde_json::from_value(serde_json::json!({"type": "a.b", "payload": {}})).unwrap();
        services.ingest(&tenant, event, None).await.unwrap();
    }
    for _ in 0..80 {
        clock.advance(secs(60));
        assert_eq!(services.run_scheduler().await.unwrap().audited, 0);
    }
    assert_eq!(
        backend.queue_len(QueueName::Delivery).await.unwrap(),
        3,
        "the backlog, once"
    );
}
