use std::sync::Mutex;

use hookwise_core::model::DeliveryId;
use hookwise_core::ports::{DeliveryTask, PortResult, Received};

use super::*;

/// Receipts hidden again, and for how long.
type Extensions = Vec<(Vec<u32>, Duration)>;

/// A queue in a vector: what was received, acked and hidden again.
#[derive(Default, Clone)]
struct FakeQueue {
    waiting: Arc<Mutex<Vec<QueueMessage>>>,
    acked: Arc<Mutex<Vec<u32>>>,
    extended: Arc<Mutex<Extensions>>,
    /// How long an ack takes.
    ack_takes: Duration,
}

#[async_trait]
impl QueueConsumer for FakeQueue {
    type Receipt = u32;

    async fn receive(&self, max: usize, wait: Duration) -> PortResult<Vec<Received<u32>>> {
        // An empty queue waits for `wait`, as a long poll does.
        if self.waiting.lock().unwrap().is_empty() {
            tokio::time::sleep(wait).await;
        }
        let mut waiting = self.waiting.lock().unwrap();
        let n = max.min(waiting.len());
        Ok(waiting
            .drain(..n)
            .enumerate()
            .map(|(i, message)| Received {
                receipt: i as u32,
                message,
            })
            .collect())
    }
    async fn ack(&self, receipts: &[u32]) -> PortResult<()> {
        tokio::time::sleep(self.ack_takes).await;
        self.acked.lock().unwrap().extend(receipts);
        Ok(())
    }
    async fn change_visibility(&self, receipts: &[u32], hidden_for: Duration) -> PortResult<()> {
        self.extended.lock().unwrap().push((receipts.to_vec(), hidden_for));
        Ok(())
    }
    fn visibility_timeout(&self) -> Duration {
        Duration::from_secs(30)
    }
}

fn message(id: &str) -> QueueMessage {
    let task = DeliveryTask {
        delivery_id: DeliveryId::generate(chrono::Utc::now(), &mut rand::rng()),
        round: 1,
        attempt: 1,
        queued_at: None,
        slot: None,
        tenant_id: None,
        held_until: None,
        redrives: 0,
    };
    QueueMessage {
        message_id: id.into(),
        task: Ok(task),
        redriven: false,
        receive_count: 1,
    }
}

/// Answers from a script, after `takes`, and cancels `stop` once it has handled a batch.
struct Scripted {
    answers: Vec<Disposition>,
    takes: Duration,
    stop: CancellationToken,
}

#[async_trait]
impl BatchHandler for Scripted {
    async fn handle(&self, messages: &[QueueMessage]) -> Vec<Disposition> {
        assert_eq!(messages.len(), self.answers.len());
        tokio::time::sleep(self.takes).await;
        self.stop.cancel();
        self.answers.clone()
    }
}

fn config() -> WorkerConfig {
    WorkerConfig {
        name: "test",
        batch_size: 10,
        wait: Duration::from_millis(10),
        batches_in_flight: 1,
    }
}

#[tokio::test(start_paused = true)]
async fn given_a_batch_then_only_the_messages_the_handler_is_done_with_are_acked() {
    let queue = FakeQueue::default();
    queue
        .waiting
        .lock()
        .unwrap()
        .extend([message("a"), message("b"), message("c")]);
    let stop = CancellationToken::new();
    let handler = Scripted {
        answers: vec![Disposition::Done, Disposition::Redeliver, Disposition::Done],
        takes: Duration::from_millis(5),
        stop: stop.clone(),
    };
    run_worker(queue.clone(), handler, config(), stop).await;
    assert_eq!(
        *queue.acked.lock().unwrap(),
        vec![0, 2],
        "the redelivered one is left to come back"
    );
    assert!(
        queue.extended.lock().unwrap().is_empty(),
        "a quick batch needs no extension"
    );
}

#[tokio::test(start_paused = true)]
async fn given_a_batch_slower_than_half_the_visibility_timeout_then_its_visibility_is_extended_until_done() {
    let queue = FakeQueue::default();
    queue.waiting.lock().unwrap().extend([message("a"), message("b")]);
    let stop = CancellationToken::new();
    // 40 s on a 30 s timeout: extended at 15 s and at 30 s, each time by the whole timeout.
    let handler = Scripted {
        answers: vec![Disposition::Done; 2],
        takes: Duration::from_secs(40),
        stop: stop.clone(),
    };
    run_worker(queue.clone(), handler, config(), stop).await;
    let extended = queue.extended.lock().unwrap();
    assert_eq!(*extended, vec![(vec![0, 1], Duration::from_secs(30)); 2]);
    assert_eq!(*queue.acked.lock().unwrap(), vec![0, 1]);
}

#[tokio::test(start_paused = true)]
async fn given_shutdown_before_a_message_arrives_then_the_worker_returns_without_handling_any() {
    let queue = FakeQueue::default();
    let stop = CancellationToken::new();
    stop.cancel();
    let handler = Scripted {
        answers: vec![],
        takes: Duration::ZERO,
        stop: stop.clone(),
    };
    run_worker(queue.clone(), handler, config(), stop).await;
    assert!(queue.acked.lock().unwrap().is_empty());
}

/// Records when each batch started; done with every message after `takes`.
struct Timed {
    takes: Duration,
    started: Mutex<Vec<tokio::time::Instant>>,
}

#[async_trait]
impl BatchHandler for Arc<Timed> {
    async fn handle(&self, messages: &[QueueMessage]) -> Vec<Disposition> {
        self.started.lock().unwrap().push(tokio::time::Instant::now());
        tokio::time::sleep(self.takes).await;
        vec![Disposition::Done; messages.len()]
    }
}

/// Twenty messages (two batches of ten) through `run_worker`, each batch handled in `takes`,
/// stopped after `stop_after`: when each batch started, and how many messages were acked.
async fn two_batches(
    queue: FakeQueue,
    takes: Duration,
    config: WorkerConfig,
    stop_after: Duration,
) -> (Vec<tokio::time::Instant>, usize) {
    queue
        .waiting
        .lock()
        .unwrap()
        .extend((0..20).map(|i| message(&i.to_string())));
    let handler = Arc::new(Timed {
        takes,
        started: Mutex::new(Vec::new()),
    });
    let stop = CancellationToken::new();
    let worker = tokio::spawn(run_worker(queue.clone(), handler.clone(), config, stop.clone()));
    tokio::time::sleep(stop_after).await;
    stop.cancel();
    worker.await.unwrap();
    let started = handler.started.lock().unwrap().clone();
    let acked = queue.acked.lock().unwrap().len();
    (started, acked)
}

#[tokio::test(start_paused = true)]
async fn given_two_batches_in_flight_then_the_second_is_taken_while_the_first_is_in_hand_and_both_finish_on_shutdown() {
    let config = WorkerConfig {
        batches_in_flight: 2,
        ..config()
    };
    let (started, acked) = two_batches(
        FakeQueue::default(),
        Duration::from_secs(10),
        config,
        Duration::from_secs(1),
    )
    .await;
    assert_eq!(started.len(), 2, "two batches of ten");
    assert!(
        started[1] - started[0] < Duration::from_secs(1),
        "the second did not wait for the first"
    );
    assert_eq!(acked, 20, "shutdown waited for both");
}

#[tokio::test(start_paused = true)]
async fn given_a_slow_ack_then_the_next_batch_is_taken_without_waiting_for_it() {
    let queue = FakeQueue {
        ack_takes: Duration::from_secs(5),
        ..FakeQueue::default()
    };
    // One batch in hand at a time.
    let (started, acked) = two_batches(queue, Duration::from_secs(1), config(), Duration::from_secs(3)).await;
    assert_eq!(started.len(), 2, "two batches of ten");
    assert!(
        started[1] - started[0] < Duration::from_secs(2),
        "the second waited for the first one's ack: {:?}",
        started[1] - started[0]
    );
    assert_eq!(acked, 20, "shutdown waited for both acks");
}
