//! The contract suite every Store / DeliveryQueue / SchedulerTable implementation passes,
//! so the SQLite, in-memory and AWS backends cannot drift apart.
//!
//! A backend plugs in by implementing [`ContractBackend`] (its ports, a way to take what
//! its queues hold, and a way to let time pass), then expanding
//! [`store_contract_tests!`](crate::store_contract_tests) with an async factory in a test
//! file; each contract becomes one `#[test]`:
//!
//! ```ignore
//! struct Sqlite { backend: LocalBackend, clock: Arc<ManualClock> }
//! #[async_trait::async_trait]
//! impl ContractBackend for Sqlite { /* ... */ }
//!
//! async fn sqlite() -> Sqlite { /* a fresh backend */ }
//!
//! hookwise_core::store_contract_tests!(sqlite());
//! ```
//!
//! The factory must give each test a backend of its own: the queue, scheduler and overdue
//! contracts look at everything the backend holds. (Store contracts make fresh tenants, so a
//! shared store would do for them.) Every contract is also a `pub async fn` taking
//! `&dyn ContractBackend`, to call by hand.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeZone, Utc};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::error::PortError;
use crate::health::{EndpointHealth, HealthSample};
use crate::model::*;
use crate::policy::RetryPolicy;
use crate::ports::*;

/// What the suite needs from a backend.
#[async_trait]
pub trait ContractBackend: Send + Sync {
    fn store(&self) -> &dyn Store;
    fn queue(&self) -> &dyn DeliveryQueue;
    fn scheduler(&self) -> &dyn SchedulerTable;
    fn secrets(&self) -> &dyn SecretKeeper;
    /// Receive and delete every delivery-queue message visible now.
    async fn take_visible(&self) -> PortResult<Vec<DeliveryTask>>;
    /// Receive and delete every dead-letter-queue message visible now.
    async fn take_dead_letters(&self) -> PortResult<Vec<DeliveryTask>>;
    /// Whether the sweep (`Store::overdue_deliveries`) also looks after early retries
    /// ([`Delivery::awaits_queued_retry`]): where one database holds the store and the queue,
    /// no audit runs, and the sweep is their backstop.
    fn sweeps_early_retries(&self) -> bool {
        false
    }
    /// Let `by` pass on the clock the queue's delays run on: a manual clock moves, a real
    /// one is slept through. The suite never asks for more than a few seconds.
    async fn advance(&self, by: Duration);
}

/// Run one contract on a fresh current-thread runtime (what `#[tokio::test]` does), so the
/// crate expanding the macro needs no tokio features of its own.
pub fn run<F: Future<Output = ()>>(contract: F) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime for the contract test")
        .block_on(contract)
}

/// One `#[test]` per contract, each on a backend from `$factory` (an expression of a future
/// whose output implements [`ContractBackend`]).
#[macro_export]
macro_rules! store_contract_tests {
    ($factory:expr) => {
        $crate::__contract_tests! { $factory;
            tenants_are_found_by_id_and_by_api_key_hash,
            tenants_are_listed_by_id_a_page_at_a_time,
            update_tenant_claims_and_frees_keys_and_refuses_a_stale_copy,
            subscriptions_are_listed_oldest_first_within_their_tenant,
            subscriptions_are_listed_a_page_at_a_time_after_the_one_named,
            replace_subscription_writes_a_copy_still_as_read_and_refuses_a_stale_or_deleted_one,
            create_subscription_refuses_an_existing_id,
            delete_subscription_reports_whether_it_deleted_and_respects_tenants,
            create_event_writes_the_event_and_all_its_deliveries,
            a_test_sends_flag_is_kept_on_its_event_and_its_delivery,
            a_reused_idempotency_key_returns_the_first_event_and_stores_nothing_seen,
            a_large_fan_out_is_written_whole_and_returned_whole_to_a_repeat,
            another_tenants_ids_are_not_found,
            events_are_read_many_at_once_in_the_order_asked,
            apply_change_moves_the_delivery_and_records_the_attempt,
            apply_change_with_a_stale_expectation_fails_and_writes_nothing,
            apply_change_refuses_an_attempt_already_recorded,
            attempts_are_listed_in_the_order_they_were_made,
            list_deliveries_pages_newest_first_without_gaps_or_repeats,
            list_deliveries_filters_by_status_and_subscription,
            list_deliveries_clamps_the_page_size,
            a_cursor_the_store_did_not_hand_out_is_refused,
            overdue_deliveries_are_the_retrying_and_replayed_ones_due_before_the_time,
            deliveries_awaiting_a_queued_message_are_found_by_creation_time_a_page_at_a_time,
            a_dead_notice_is_recorded_once_per_round,
            an_owners_email_is_claimed_once_then_not_again_within_the_window,
            a_claim_never_finished_is_taken_over_once_stale,
            a_released_claim_leaves_its_notices_waiting,
            a_notice_recorded_while_an_email_is_out_waits_for_the_next,
            endpoint_health_starts_empty_round_trips_and_is_saved_over_its_version,
            endpoint_stats_add_up_per_bucket_and_are_read_from_a_time_on,
            rate_limit_turns_follow_each_other_then_the_backlog_and_none_is_given_twice,
            tasks_enqueued_without_delay_are_visible_at_once,
            a_delayed_task_stays_hidden_until_its_delay_has_passed,
            the_queue_accepts_its_max_delay_and_refuses_longer,
            dead_lettered_tasks_reach_only_the_dead_letter_queue,
            scheduled_items_come_due_earliest_first,
            removed_scheduled_items_are_no_longer_due,
            a_circuit_is_written_only_over_the_version_read,
            held_attempts_are_found_by_endpoint_oldest_delivery_first_one_item_an_attempt_and_also_scheduled,
            endpoints_that_held_an_attempt_are_listed_in_id_order_until_let_go,
            the_scheduler_lease_is_one_holders_until_it_expires_or_is_given_back,
            the_audits_position_round_trips,
            the_tending_position_round_trips,
            due_tasks_set_nothing_aside_and_none_is_listed,
            the_deployments_settings_are_written_only_over_the_copy_read,
            a_portal_session_is_created_once_read_by_id_and_revoked,
            an_event_type_is_created_once_per_scope_and_read_back_exactly,
            an_event_type_is_changed_only_over_the_copy_read,
            event_types_are_listed_by_name_a_page_at_a_time_within_their_scope,
            a_sealed_secret_shows_nothing_and_opens_only_for_its_own_subscription,
            a_sealed_header_value_shows_nothing_and_opens_only_for_its_own_header,
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __contract_tests {
    ($factory:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::testing::contract::run(async {
                    let backend = $factory.await;
                    $crate::testing::contract::$name(&backend).await;
                });
            }
        )*
    };
}

// ---------------------------------------------------------------------------------------
// Fixtures

/// Far from any real clock, so a stray `now` in a backend shows up as a wrong answer.
fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 6, 1, 12, 0, 0)
        .single()
        .expect("a valid time")
}

fn minutes(n: i64) -> chrono::Duration {
    chrono::Duration::minutes(n)
}

/// Random ids (from the OS), so tests never collide even on a shared table.
struct Fixture {
    rng: StdRng,
}

impl Fixture {
    fn new() -> Self {
        Self {
            rng: StdRng::from_os_rng(),
        }
    }

    fn tenant(&mut self) -> Tenant {
        let tenant = Tenant {
            id: TenantId::generate(t0(), &mut self.rng),
            name: "Acme".into(),
            owner_email: Email::parse("ops@acme.example").expect("a valid email"),
            retries: RetriesSetting::Rollout,
            status: TenantStatus::Active,
            created_at: t0(),
            api_keys: Vec::new(),
            version: 0,
            portal_sessions_since: None,
        };
        let key = format!("hwk_{}", tenant.id);
        with_key(tenant, &key)
    }

    /// A tenant written to the store.
    async fn stored_tenant(&mut self, b: &dyn ContractBackend) -> Tenant {
        let t = self.tenant();
        b.store().create_tenant(&t).await.expect("create tenant");
        t
    }

    fn subscription(&mut self, tenant: &TenantId, created_at: DateTime<Utc>) -> Subscription {
        Subscription {
            id: SubscriptionId::generate(created_at, &mut self.rng),
            tenant_id: tenant.clone(),
            url: EndpointUrl::parse("https://hooks.acme.example/in").expect("a valid url"),
            event_types: vec![EventTypeFilter::all()],
            // As stored before secrets were sealed: stores keep reading those.
            secret: SealedSecret::unsealed(&Secret::generate(&mut self.rng)),
            previous_secret: None,
            previous_secret_expires_at: None,
            retry_policy: RetryPolicy::standard(),
            timeout_ms: DEFAULT_TIMEOUT_MS,
            status: SubscriptionStatus::Active,
            rate_limit_per_second: None,
            auto_disable_after_hours: None,
            circuit_breaker: crate::circuit::CircuitBreaker {
                enabled: true,
                failure_threshold: 3,
                probe_interval_seconds: 7,
            },
            active_since: None,
            disable_notice_pending: false,
            disable_notice_claimed_at: None,
            disabled_reason: None,
            owner_email: None,
            description: Some("orders".into()),
            filter: None,
            headers: Vec::new(),
            created_at,
            updated_at: created_at,
        }
    }

    fn event(&mut self, tenant: &TenantId, created_at: DateTime<Utc>, key: Option<&str>) -> Event {
        Event {
            id: match key {
                Some(key) => EventId::for_key(tenant, key),
                None => EventId::generate(created_at, &mut self.rng),
            },
            tenant_id: tenant.clone(),
            event_type: EventType::parse("invoice.paid").expect("a valid type"),
            payload: serde_json::json!({"invoice": 42, "lines": [{"sku": "a", "qty": 2}], "note": "café"}),
            created_at,
            idempotency_key: key.map(str::to_owned),
            test: false,
        }
    }

    /// A fresh pending delivery of `event` to `sub`, due at once.
    fn delivery(&mut self, event: &Event, sub: &SubscriptionId) -> Delivery {
        Delivery::new(
            DeliveryId::generate(event.created_at, &mut self.rng),
            event,
            sub.clone(),
        )
    }

    /// An event written with one delivery per subscription id.
    async fn stored_event(
        &mut self,
        b: &dyn ContractBackend,
        tenant: &TenantId,
        at: DateTime<Utc>,
        subs: &[SubscriptionId],
    ) -> (Event, Vec<Delivery>) {
        let event = self.event(tenant, at, None);
        let deliveries: Vec<Delivery> = subs.iter().map(|s| self.delivery(&event, s)).collect();
        let created = b.store().create_event(&event, &deliveries).await.expect("create event");
        assert_eq!(created, Created::New);
        (event, deliveries)
    }

    fn sub_ids(&mut self, n: usize) -> Vec<SubscriptionId> {
        (0..n).map(|_| SubscriptionId::generate(t0(), &mut self.rng)).collect()
    }

    fn task(&mut self) -> DeliveryTask {
        DeliveryTask {
            delivery_id: DeliveryId::generate(t0(), &mut self.rng),
            round: 0,
            attempt: 1,
            queued_at: None,
            slot: None,
            tenant_id: None,
            held_until: None,
            redrives: 0,
        }
    }
}

fn attempt(d: &Delivery, round: u32, number: u32, status_code: u16, started_at: DateTime<Utc>) -> Attempt {
    Attempt {
        delivery_id: d.id.clone(),
        round,
        attempt: number,
        started_at,
        duration_ms: 120,
        status_code: Some(status_code),
        error: None,
        response_excerpt: Some(format!("status {status_code}")),
        next_attempt_at: None,
    }
}

/// `d` after a failed attempt: retrying, with the next one in `delay_minutes`.
fn failed(d: &Delivery, at: DateTime<Utc>, delay_minutes: i64) -> Delivery {
    Delivery {
        status: DeliveryStatus::Retrying,
        attempts: d.attempts + 1,
        next_attempt_at: Some(at + minutes(delay_minutes)),
        not_before: Some(at + minutes(delay_minutes)),
        last_delay_seconds: Some(60.0 * delay_minutes as f64),
        // As if the breaker had held the attempt to its give-up time: kept through the store.
        held_until: Some(at),
        last_status_code: Some(503),
        last_error: Some("HTTP 503".into()),
        updated_at: at,
        ..d.clone()
    }
}

fn finished(d: &Delivery, status: DeliveryStatus, at: DateTime<Utc>) -> Delivery {
    Delivery {
        status,
        attempts: d.attempts + 1,
        next_attempt_at: None,
        updated_at: at,
        ..d.clone()
    }
}

/// Apply a change that must succeed; returns the new state.
async fn change(b: &dyn ContractBackend, from: &Delivery, next: Delivery, attempt: Option<Attempt>) -> Delivery {
    b.store()
        .apply_change(&DeliveryChange {
            expected: Expected::of(from),
            next: next.clone(),
            attempt,
        })
        .await
        .expect("apply change");
    next
}

fn assert_condition_failed<T: std::fmt::Debug>(result: PortResult<T>, what: &str) {
    match result {
        Err(PortError::ConditionFailed(_)) => {}
        other => panic!("{what}: expected ConditionFailed, got {other:?}"),
    }
}

fn ids(ds: &[Delivery]) -> Vec<DeliveryId> {
    ds.iter().map(|d| d.id.clone()).collect()
}

fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v
}

/// Newest first: created_at descending, then id descending.
fn newest_first(mut ds: Vec<Delivery>) -> Vec<Delivery> {
    ds.sort_by(|a, b| b.created_at.cmp(&a.created_at).then_with(|| b.id.cmp(&a.id)));
    ds
}

/// Follow the cursors to the end, checking every page's size.
async fn all_pages(b: &dyn ContractBackend, tenant: &TenantId, query: DeliveryQuery) -> Vec<Delivery> {
    let mut query = query;
    let mut items = Vec::new();
    for _ in 0..1000 {
        let page = b
            .store()
            .list_deliveries(tenant, &query)
            .await
            .expect("list deliveries");
        assert!(
            page.items.len() <= query.limit as usize,
            "a page is larger than its limit"
        );
        match page.next_cursor {
            Some(cursor) => {
                assert_eq!(
                    page.items.len(),
                    query.limit as usize,
                    "a page with a next cursor must be full"
                );
                items.extend(page.items);
                query.cursor = Some(cursor);
            }
            None => {
                items.extend(page.items);
                return items;
            }
        }
    }
    panic!("list_deliveries never stopped returning a cursor");
}

// ---------------------------------------------------------------------------------------
// Store: tenants and subscriptions

/// `tenant` holding one more key.
fn with_key(mut tenant: Tenant, key: &str) -> Tenant {
    tenant.api_keys.push(ApiKey {
        hash: crate::auth::hash_api_key(key),
        created_at: t0(),
    });
    tenant
}

pub async fn tenants_are_found_by_id_and_by_api_key_hash(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    // An id the operator chose (the customer's account id), not a generated one.
    let generated = fx.tenant();
    let chosen = format!("acct_{}", &generated.id.as_str()[TenantId::PREFIX.len()..]).to_lowercase();
    let tenant = Tenant {
        id: TenantId::parse(&chosen).expect("a chosen id"),
        ..generated
    };
    b.store().create_tenant(&tenant).await.expect("create tenant");

    assert_eq!(
        b.store().get_tenant(&tenant.id).await.expect("get"),
        Some(tenant.clone())
    );
    for key in &tenant.api_keys {
        assert_eq!(
            b.store().tenant_by_api_key(&key.hash).await.expect("by key"),
            Some(tenant.clone())
        );
    }
    let other_hash = crate::auth::hash_api_key("hwk_contract_key_two");
    assert_eq!(
        b.store().tenant_by_api_key(&other_hash).await.expect("by unknown key"),
        None
    );
    assert_eq!(b.store().get_tenant(&fx.tenant().id).await.expect("get unknown"), None);

    // Neither its id nor its key can be taken again.
    let same_key = Tenant {
        id: fx.tenant().id,
        ..tenant.clone()
    };
    assert!(matches!(
        b.store().create_tenant(&same_key).await,
        Err(PortError::ConditionFailed(_))
    ));
    assert_eq!(b.store().get_tenant(&same_key.id).await.expect("get"), None);
}

pub async fn tenants_are_listed_by_id_a_page_at_a_time(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let mut made = Vec::new();
    for _ in 0..5 {
        made.push(fx.stored_tenant(b).await);
    }
    made.sort_by(|a, b| a.id.cmp(&b.id));
    // The store may hold other tests' tenants: page through all, and find these in order.
    let mut listed = Vec::new();
    let mut after: Option<TenantId> = None;
    loop {
        let page = b.store().list_tenants(after.as_ref(), 2).await.expect("list tenants");
        assert!(page.len() <= 2, "a page of {}", page.len());
        if page.is_empty() {
            break;
        }
        after = page.last().map(|t| t.id.clone());
        listed.extend(page);
    }
    let ids: Vec<&TenantId> = listed.iter().map(|t| &t.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "not by id, or repeated: {ids:?}");
    let ours: Vec<Tenant> = listed
        .into_iter()
        .filter(|t| made.iter().any(|m| m.id == t.id))
        .collect();
    assert_eq!(ours, made);
}

pub async fn update_tenant_claims_and_frees_keys_and_refuses_a_stale_copy(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let read = fx.stored_tenant(b).await;
    let old = read.api_keys[0].clone();

    // A rotation: a second key beside the first, and the flag turned off.
    let rotated = with_key(
        Tenant {
            retries: RetriesSetting::Off,
            status: TenantStatus::Disabled,
            version: read.version + 1,
            ..read.clone()
        },
        &format!("hwk_rotated_{}", read.id),
    );
    b.store().update_tenant(&rotated, &read).await.expect("rotate");
    assert_eq!(
        b.store().get_tenant(&read.id).await.expect("get"),
        Some(rotated.clone())
    );
    for key in &rotated.api_keys {
        assert_eq!(
            b.store().tenant_by_api_key(&key.hash).await.expect("by key"),
            Some(rotated.clone()),
            "each key finds the tenant as it is now"
        );
    }

    // A write from the copy read before the rotation is refused, and changes nothing.
    let stale = Tenant {
        name: "stale".into(),
        version: read.version + 1,
        ..read.clone()
    };
    assert!(matches!(
        b.store().update_tenant(&stale, &read).await,
        Err(PortError::ConditionFailed(_))
    ));
    assert_eq!(
        b.store().get_tenant(&read.id).await.expect("get"),
        Some(rotated.clone())
    );

    // A key another tenant holds cannot be claimed.
    let other = fx.stored_tenant(b).await;
    let grab = Tenant {
        api_keys: vec![rotated.api_keys[0].clone()],
        version: other.version + 1,
        ..other.clone()
    };
    assert!(matches!(
        b.store().update_tenant(&grab, &other).await,
        Err(PortError::ConditionFailed(_))
    ));
    assert_eq!(
        b.store()
            .tenant_by_api_key(&old.hash)
            .await
            .expect("by key")
            .map(|t| t.id),
        Some(read.id.clone())
    );

    // Revoking the first key: it finds nothing; the second still finds the tenant.
    let revoked = Tenant {
        api_keys: rotated.api_keys[1..].to_vec(),
        version: rotated.version + 1,
        ..rotated.clone()
    };
    b.store().update_tenant(&revoked, &rotated).await.expect("revoke");
    assert_eq!(b.store().tenant_by_api_key(&old.hash).await.expect("by key"), None);
    assert_eq!(
        b.store()
            .tenant_by_api_key(&revoked.api_keys[0].hash)
            .await
            .expect("by key"),
        Some(revoked.clone())
    );

    // A tenant that is gone is not written.
    let ghost = fx.tenant();
    let next = Tenant {
        version: 1,
        ..ghost.clone()
    };
    assert!(matches!(
        b.store().update_tenant(&next, &ghost).await,
        Err(PortError::ConditionFailed(_))
    ));
    assert_eq!(b.store().get_tenant(&ghost.id).await.expect("get"), None);
}

pub async fn subscriptions_are_listed_oldest_first_within_their_tenant(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let other = fx.stored_tenant(b).await;
    let s1 = fx.subscription(&a.id, t0() + minutes(1));
    let s2 = fx.subscription(&a.id, t0() + minutes(2));
    let s3 = fx.subscription(&a.id, t0() + minutes(3));
    let theirs = fx.subscription(&other.id, t0());
    // Written out of order: the listing sorts by creation time, not by writing order.
    for s in [&s2, &theirs, &s3, &s1] {
        b.store().create_subscription(s).await.expect("create");
    }

    assert_eq!(all_subscriptions(b, &a.id).await, vec![s1.clone(), s2, s3]);
    assert_eq!(all_subscriptions(b, &other.id).await, vec![theirs.clone()]);
    assert_eq!(
        b.store().get_subscription(&a.id, &s1.id).await.expect("get"),
        Some(s1.clone())
    );
    assert_eq!(
        b.store()
            .get_subscription(&other.id, &s1.id)
            .await
            .expect("get across tenants"),
        None
    );
    assert_eq!(
        b.store()
            .get_subscription(&a.id, &theirs.id)
            .await
            .expect("get across tenants"),
        None
    );
}

async fn all_subscriptions(b: &dyn ContractBackend, tenant: &TenantId) -> Vec<Subscription> {
    b.store().list_subscriptions(tenant, None, 100).await.expect("list")
}

pub async fn subscriptions_are_listed_a_page_at_a_time_after_the_one_named(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let other = fx.stored_tenant(b).await;
    let subs: Vec<Subscription> = (0..5).map(|i| fx.subscription(&a.id, t0() + minutes(i))).collect();
    for s in subs.iter().rev() {
        b.store().create_subscription(s).await.expect("create");
    }
    b.store()
        .create_subscription(&fx.subscription(&other.id, t0() + minutes(2)))
        .await
        .expect("create");
    let page = |after: Option<SubscriptionId>, limit| {
        let tenant = a.id.clone();
        async move {
            b.store()
                .list_subscriptions(&tenant, after.as_ref(), limit)
                .await
                .expect("list a page")
        }
    };
    assert_eq!(page(None, 2).await, subs[..2]);
    assert_eq!(page(Some(subs[1].id.clone()), 2).await, subs[2..4]);
    assert_eq!(page(Some(subs[3].id.clone()), 2).await, subs[4..]);
    assert_eq!(page(Some(subs[4].id.clone()), 2).await, []);
    // The one named may be gone since: the page goes on from where it was.
    assert!(b.store().delete_subscription(&a.id, &subs[2].id).await.expect("delete"));
    assert_eq!(page(Some(subs[2].id.clone()), 10).await, subs[3..]);
}

/// Also: a changed subscription reads back exactly as written, its content filter and
/// custom headers too.
pub async fn replace_subscription_writes_a_copy_still_as_read_and_refuses_a_stale_or_deleted_one(
    b: &dyn ContractBackend,
) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let original = fx.subscription(&a.id, t0());
    b.store().create_subscription(&original).await.expect("create");

    let changed = Subscription {
        url: EndpointUrl::parse("https://elsewhere.acme.example/hooks").expect("a valid url"),
        status: SubscriptionStatus::Disabled,
        disabled_reason: Some("endpoint answered 410".into()),
        previous_secret: Some(original.secret.clone()),
        previous_secret_expires_at: Some(t0() + chrono::Duration::hours(24)),
        secret: SealedSecret::envelope("contract:an envelope".into()),
        retry_policy: RetryPolicy::ledger(),
        // Read back exactly: 100.0 stays 100.0, a null stays, a `$or` keeps its order.
        filter: Some(
            crate::filter::ContentFilter::parse(serde_json::json!({
                "data": {"currency": ["EUR", null], "amount": [{"numeric": [">=", 100.0]}]},
                "$or": [{"type": [{"prefix": "invoice."}]}, {"data": {"note": [{"exists": true}]}}]
            }))
            .expect("a valid filter"),
        ),
        headers: vec![
            CustomHeader {
                name: HeaderName::parse("X-Env").expect("a valid name"),
                value: HeaderValue::Plain("prod eu-1".into()),
            },
            CustomHeader {
                name: HeaderName::parse("authorization").expect("a valid name"),
                value: HeaderValue::Sealed(SealedSecret::envelope("contract:a sealed value".into())),
            },
        ],
        updated_at: t0() + minutes(5),
        ..original.clone()
    };
    b.store()
        .replace_subscription(&changed, original.updated_at)
        .await
        .expect("replace as read");
    assert_eq!(
        b.store().get_subscription(&a.id, &original.id).await.expect("get"),
        Some(changed.clone())
    );
    assert_eq!(all_subscriptions(b, &a.id).await, vec![changed.clone()]);

    // A writer that read the original before `changed` landed loses: nothing is reverted.
    let stale = Subscription {
        description: Some("stale".into()),
        updated_at: t0() + minutes(6),
        ..original.clone()
    };
    assert!(matches!(
        b.store().replace_subscription(&stale, original.updated_at).await,
        Err(PortError::ConditionFailed(_))
    ));
    assert_eq!(
        b.store().get_subscription(&a.id, &original.id).await.expect("get"),
        Some(changed.clone())
    );

    // Deleted stays deleted: a replace does not bring it back.
    assert!(b
        .store()
        .delete_subscription(&a.id, &original.id)
        .await
        .expect("delete"));
    let revived = Subscription {
        updated_at: t0() + minutes(7),
        ..changed.clone()
    };
    assert!(matches!(
        b.store().replace_subscription(&revived, changed.updated_at).await,
        Err(PortError::ConditionFailed(_))
    ));
    assert_eq!(
        b.store().get_subscription(&a.id, &original.id).await.expect("get"),
        None
    );
}

pub async fn create_subscription_refuses_an_existing_id(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let sub = fx.subscription(&a.id, t0());
    b.store().create_subscription(&sub).await.expect("create");
    let again = Subscription {
        description: Some("again".into()),
        ..sub.clone()
    };
    assert!(matches!(
        b.store().create_subscription(&again).await,
        Err(PortError::ConditionFailed(_))
    ));
    assert_eq!(
        b.store().get_subscription(&a.id, &sub.id).await.expect("get"),
        Some(sub)
    );
}

pub async fn delete_subscription_reports_whether_it_deleted_and_respects_tenants(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let other = fx.stored_tenant(b).await;
    let sub = fx.subscription(&a.id, t0());
    b.store().create_subscription(&sub).await.expect("create");

    assert!(!b
        .store()
        .delete_subscription(&other.id, &sub.id)
        .await
        .expect("delete across tenants"));
    assert_eq!(
        b.store().get_subscription(&a.id, &sub.id).await.expect("get"),
        Some(sub.clone())
    );
    assert!(b.store().delete_subscription(&a.id, &sub.id).await.expect("delete"));
    assert_eq!(b.store().get_subscription(&a.id, &sub.id).await.expect("get"), None);
    assert!(all_subscriptions(b, &a.id).await.is_empty());
    assert!(!b
        .store()
        .delete_subscription(&a.id, &sub.id)
        .await
        .expect("delete again"));
}

// ---------------------------------------------------------------------------------------
// Store: events and deliveries

pub async fn create_event_writes_the_event_and_all_its_deliveries(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let subs = fx.sub_ids(3);
    let (event, deliveries) = fx.stored_event(b, &a.id, t0(), &subs).await;

    assert_eq!(
        b.store().get_event(&a.id, &event.id).await.expect("get event"),
        Some(event.clone())
    );
    let mut stored = b
        .store()
        .event_deliveries(&a.id, &event.id)
        .await
        .expect("event deliveries");
    stored.sort_by(|x, y| x.id.cmp(&y.id));
    let mut expected = deliveries.clone();
    expected.sort_by(|x, y| x.id.cmp(&y.id));
    assert_eq!(stored, expected);
    for d in &deliveries {
        assert_eq!(
            b.store().get_delivery(&d.id).await.expect("get delivery").as_ref(),
            Some(d)
        );
        assert!(b.store().attempts(&d.id).await.expect("attempts").is_empty());
    }
}

pub async fn a_test_sends_flag_is_kept_on_its_event_and_its_delivery(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let sub = fx.sub_ids(1).remove(0);
    let mut event = fx.event(&a.id, t0(), None);
    event.test = true;
    let delivery = Delivery::new(DeliveryId::for_event(&event.id, &sub), &event, sub.clone());
    assert!(delivery.test);
    b.store()
        .create_event(&event, std::slice::from_ref(&delivery))
        .await
        .expect("create event");
    let stored = b.store().get_event(&a.id, &event.id).await.expect("get event");
    assert!(stored.expect("stored").test, "the event's flag");
    let read = b.store().get_delivery(&delivery.id).await.expect("get delivery");
    assert!(read.expect("stored").test, "the delivery's flag");
    let listed = all_pages(
        b,
        &a.id,
        DeliveryQuery {
            limit: 10,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        listed.iter().map(|d| d.test).collect::<Vec<_>>(),
        [true],
        "listed as a test"
    );
    // And an ordinary event's stays off.
    let (plain, _) = fx.stored_event(b, &a.id, t0(), &[sub]).await;
    let stored = b.store().get_event(&a.id, &plain.id).await.expect("get event");
    assert!(!stored.expect("stored").test);
}

pub async fn a_reused_idempotency_key_returns_the_first_event_and_stores_nothing_seen(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let other = fx.stored_tenant(b).await;
    let subs = fx.sub_ids(2);

    let first = fx.event(&a.id, t0(), Some("order-17"));
    let first_deliveries: Vec<Delivery> = subs.iter().map(|s| fx.delivery(&first, s)).collect();
    assert_eq!(
        b.store().create_event(&first, &first_deliveries).await.expect("first"),
        Created::New
    );

    let again = fx.event(&a.id, t0() + minutes(1), Some("order-17"));
    let again_deliveries: Vec<Delivery> = subs.iter().map(|s| fx.delivery(&again, s)).collect();
    assert_eq!(
        b.store().create_event(&again, &again_deliveries).await.expect("again"),
        Created::Existing(first.id.clone())
    );
    // The key gave the same id; what is stored is the first event, untouched.
    assert_eq!(again.id, first.id);
    assert_eq!(
        b.store().get_event(&a.id, &first.id).await.expect("get"),
        Some(first.clone())
    );
    for d in &again_deliveries {
        assert_eq!(
            b.store().get_delivery(&d.id).await.expect("get delivery"),
            None,
            "a duplicate's delivery is seen"
        );
    }
    assert_eq!(
        sorted(ids(&b
            .store()
            .event_deliveries(&a.id, &first.id)
            .await
            .expect("deliveries"))),
        sorted(ids(&first_deliveries))
    );
    let listed = b
        .store()
        .list_deliveries(&a.id, &DeliveryQuery::default())
        .await
        .expect("list");
    assert_eq!(sorted(ids(&listed.items)), sorted(ids(&first_deliveries)));

    // Keys are per tenant; events without a key never clash.
    let theirs = fx.event(&other.id, t0(), Some("order-17"));
    assert_eq!(
        b.store().create_event(&theirs, &[]).await.expect("other tenant"),
        Created::New
    );
    for _ in 0..2 {
        let unkeyed = fx.event(&a.id, t0(), None);
        assert_eq!(
            b.store().create_event(&unkeyed, &[]).await.expect("no key"),
            Created::New
        );
    }
}

/// 150 deliveries: more than one DynamoDB transaction holds.
pub async fn a_large_fan_out_is_written_whole_and_returned_whole_to_a_repeat(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let subs = fx.sub_ids(150);
    let first = fx.event(&a.id, t0(), Some("fan-out"));
    let deliveries: Vec<Delivery> = subs.iter().map(|s| fx.delivery(&first, s)).collect();
    assert_eq!(
        b.store().create_event(&first, &deliveries).await.expect("create"),
        Created::New
    );
    let again = fx.event(&a.id, t0(), Some("fan-out"));
    let again_deliveries: Vec<Delivery> = subs.iter().map(|s| fx.delivery(&again, s)).collect();
    assert_eq!(
        b.store().create_event(&again, &again_deliveries).await.expect("repeat"),
        Created::Existing(first.id.clone())
    );
    let stored = b.store().event_deliveries(&a.id, &first.id).await.expect("deliveries");
    assert_eq!(sorted(ids(&stored)), sorted(ids(&deliveries)));
    for d in deliveries.iter().step_by(37).chain(deliveries.last()) {
        assert_eq!(b.store().get_delivery(&d.id).await.expect("get").as_ref(), Some(d));
    }
    let overdue: Vec<Delivery> = b
        .store()
        .overdue_deliveries(t0() + minutes(1), 500)
        .await
        .expect("overdue")
        .into_iter()
        .filter(|d| d.tenant_id == a.id)
        .collect();
    // Their first attempts were queued before the ingest: the sweep has nothing to find.
    assert_eq!(ids(&overdue), Vec::<DeliveryId>::new());
}

pub async fn another_tenants_ids_are_not_found(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let other = fx.stored_tenant(b).await;
    let sub = fx.subscription(&a.id, t0());
    b.store().create_subscription(&sub).await.expect("create");
    let (event, deliveries) = fx.stored_event(b, &a.id, t0(), std::slice::from_ref(&sub.id)).await;

    assert_eq!(
        b.store().get_event(&other.id, &event.id).await.expect("get event"),
        None
    );
    assert!(b
        .store()
        .event_deliveries(&other.id, &event.id)
        .await
        .expect("deliveries")
        .is_empty());
    let page = b
        .store()
        .list_deliveries(&other.id, &DeliveryQuery::default())
        .await
        .expect("list");
    assert!(page.items.is_empty() && page.next_cursor.is_none());
    let by_sub = DeliveryQuery {
        subscription_id: Some(sub.id.clone()),
        ..Default::default()
    };
    assert!(b
        .store()
        .list_deliveries(&other.id, &by_sub)
        .await
        .expect("list by sub")
        .items
        .is_empty());
    // The owner still sees them.
    assert_eq!(
        ids(&b.store().list_deliveries(&a.id, &by_sub).await.expect("list").items),
        ids(&deliveries)
    );
}

pub async fn events_are_read_many_at_once_in_the_order_asked(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let other = fx.stored_tenant(b).await;
    let subs = fx.sub_ids(1);
    let (first, _) = fx.stored_event(b, &a.id, t0(), &subs).await;
    let (second, _) = fx.stored_event(b, &a.id, t0() + minutes(1), &subs).await;
    let (theirs, _) = fx.stored_event(b, &other.id, t0(), &subs).await;
    let never = fx.event(&a.id, t0(), None);

    let asked = [second.id.clone(), never.id.clone(), theirs.id.clone(), first.id.clone()];
    assert_eq!(
        b.store().get_events(&a.id, &asked).await.expect("get events"),
        vec![Some(second.clone()), None, None, Some(first.clone())]
    );
    assert_eq!(b.store().get_events(&a.id, &[]).await.expect("none asked"), Vec::new());
    // More than one request's worth: a hundred and one, the last one stored.
    let mut many: Vec<EventId> = (0..100).map(|_| fx.event(&a.id, t0(), None).id).collect();
    many.push(first.id.clone());
    let read = b.store().get_events(&a.id, &many).await.expect("get many");
    assert_eq!(read.len(), 101);
    assert!(read[..100].iter().all(Option::is_none));
    assert_eq!(read[100], Some(first));
}

pub async fn apply_change_moves_the_delivery_and_records_the_attempt(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let subs = fx.sub_ids(1);
    let (_, ds) = fx.stored_event(b, &a.id, t0(), &subs).await;
    let d = &ds[0];

    let at = t0() + chrono::Duration::milliseconds(1500);
    let mut first = attempt(d, 0, 1, 503, at);
    first.next_attempt_at = Some(at + minutes(1));
    let retrying = change(b, d, failed(d, at, 1), Some(first.clone())).await;
    assert_eq!(
        b.store().get_delivery(&d.id).await.expect("get"),
        Some(retrying.clone())
    );
    assert_eq!(b.store().attempts(&d.id).await.expect("attempts"), vec![first.clone()]);

    let at2 = at + minutes(1);
    let second = attempt(d, 0, 2, 200, at2);
    let delivered = change(
        b,
        &retrying,
        finished(&retrying, DeliveryStatus::Delivered, at2),
        Some(second.clone()),
    )
    .await;
    assert_eq!(b.store().get_delivery(&d.id).await.expect("get"), Some(delivered));
    assert_eq!(b.store().attempts(&d.id).await.expect("attempts"), vec![first, second]);
}

pub async fn apply_change_with_a_stale_expectation_fails_and_writes_nothing(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let subs = fx.sub_ids(1);
    let (event, ds) = fx.stored_event(b, &a.id, t0(), &subs).await;
    let d = &ds[0];
    let first = attempt(d, 0, 1, 500, t0());
    let current = change(b, d, failed(d, t0(), 1), Some(first.clone())).await;

    let stale = [
        (
            "status and attempts",
            Expected {
                status: DeliveryStatus::Pending,
                round: 0,
                attempts: 0,
            },
        ),
        (
            "attempts",
            Expected {
                status: DeliveryStatus::Retrying,
                round: 0,
                attempts: 0,
            },
        ),
        (
            "round",
            Expected {
                status: DeliveryStatus::Retrying,
                round: 1,
                attempts: 1,
            },
        ),
        (
            "status",
            Expected {
                status: DeliveryStatus::Dead,
                round: 0,
                attempts: 1,
            },
        ),
    ];
    for (n, (what, expected)) in stale.into_iter().enumerate() {
        let next = finished(&current, DeliveryStatus::Delivered, t0() + minutes(1));
        let record = attempt(d, 0, 2 + n as u32, 200, t0() + minutes(1));
        let result = b
            .store()
            .apply_change(&DeliveryChange {
                expected,
                next,
                attempt: Some(record),
            })
            .await;
        assert_condition_failed(result, &format!("a stale {what}"));
    }
    assert_eq!(b.store().get_delivery(&d.id).await.expect("get"), Some(current.clone()));
    assert_eq!(b.store().attempts(&d.id).await.expect("attempts"), vec![first]);

    // A delivery that does not exist has nothing to match either.
    let ghost = fx.delivery(&event, &d.subscription_id);
    let result = b
        .store()
        .apply_change(&DeliveryChange {
            expected: Expected::of(&ghost),
            next: failed(&ghost, t0(), 1),
            attempt: None,
        })
        .await;
    assert_condition_failed(result, "an unknown delivery");
    assert_eq!(b.store().get_delivery(&ghost.id).await.expect("get"), None);
}

pub async fn apply_change_refuses_an_attempt_already_recorded(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let subs = fx.sub_ids(1);
    let (_, ds) = fx.stored_event(b, &a.id, t0(), &subs).await;
    let d = &ds[0];
    let first = attempt(d, 0, 1, 500, t0());
    let current = change(b, d, failed(d, t0(), 1), Some(first.clone())).await;

    // The expectation holds, but the attempt it records is already there: all or nothing.
    let duplicate = attempt(d, 0, 1, 200, t0() + minutes(1));
    let result = b
        .store()
        .apply_change(&DeliveryChange {
            expected: Expected::of(&current),
            next: finished(&current, DeliveryStatus::Delivered, t0() + minutes(1)),
            attempt: Some(duplicate),
        })
        .await;
    assert_condition_failed(result, "a duplicate attempt");
    assert_eq!(b.store().get_delivery(&d.id).await.expect("get"), Some(current));
    assert_eq!(b.store().attempts(&d.id).await.expect("attempts"), vec![first]);
}

pub async fn attempts_are_listed_in_the_order_they_were_made(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let subs = fx.sub_ids(1);
    let (_, ds) = fx.stored_event(b, &a.id, t0(), &subs).await;
    let d = &ds[0];

    let r0a1 = attempt(d, 0, 1, 500, t0());
    let s = change(b, d, failed(d, t0(), 1), Some(r0a1.clone())).await;
    let r0a2 = attempt(d, 0, 2, 500, t0() + minutes(1));
    let s = change(
        b,
        &s,
        finished(&s, DeliveryStatus::Dead, t0() + minutes(1)),
        Some(r0a2.clone()),
    )
    .await;
    // Replay: a new round starts with no attempt made.
    let replayed = Delivery {
        status: DeliveryStatus::Pending,
        round: 1,
        attempts: 0,
        next_attempt_at: Some(t0() + minutes(10)),
        updated_at: t0() + minutes(10),
        ..s.clone()
    };
    let s = change(b, &s, replayed, None).await;
    let r1a1 = attempt(d, 1, 1, 200, t0() + minutes(10));
    change(
        b,
        &s,
        finished(&s, DeliveryStatus::Delivered, t0() + minutes(10)),
        Some(r1a1.clone()),
    )
    .await;

    assert_eq!(
        b.store().attempts(&d.id).await.expect("attempts"),
        vec![r0a1, r0a2, r1a1]
    );
}

pub async fn list_deliveries_pages_newest_first_without_gaps_or_repeats(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let subs = fx.sub_ids(2);
    let mut all = Vec::new();
    // Seven events, three of them at the same instant (ties are broken by id), and events
    // with one or two deliveries: eleven deliveries.
    let times = [0, 5, 5, 5, 9, 12, 20];
    for (i, m) in times.into_iter().enumerate() {
        let targets = if i % 2 == 0 { &subs[..] } else { &subs[..1] };
        let (_, ds) = fx.stored_event(b, &a.id, t0() + minutes(m), targets).await;
        all.extend(ds);
    }
    assert_eq!(all.len(), 11);
    let expected = newest_first(all);

    for limit in [1, 3, 4, 11, 20] {
        let got = all_pages(
            b,
            &a.id,
            DeliveryQuery {
                limit,
                ..Default::default()
            },
        )
        .await;
        assert_eq!(ids(&got), ids(&expected), "pages of {limit}");
    }
    // The last page of an exact multiple has no cursor to an empty page.
    let whole = b
        .store()
        .list_deliveries(
            &a.id,
            &DeliveryQuery {
                limit: 11,
                ..Default::default()
            },
        )
        .await
        .expect("list");
    assert_eq!(whole.items, expected);
    assert_eq!(whole.next_cursor, None);
}

pub async fn list_deliveries_filters_by_status_and_subscription(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let subs = fx.sub_ids(2);
    let mut all = Vec::new();
    for m in 0..4 {
        let (_, ds) = fx.stored_event(b, &a.id, t0() + minutes(m), &subs).await;
        all.extend(ds);
    }
    // Deliver three of the eight: two to the first subscription, one to the second.
    let mut current = Vec::new();
    for (i, d) in all.iter().enumerate() {
        if [0, 3, 4].contains(&i) {
            current.push(
                change(
                    b,
                    d,
                    finished(d, DeliveryStatus::Delivered, t0()),
                    Some(attempt(d, 0, 1, 200, t0())),
                )
                .await,
            );
        } else {
            current.push(d.clone());
        }
    }
    let expect = |f: &dyn Fn(&Delivery) -> bool| ids(&newest_first(current.iter().filter(|d| f(d)).cloned().collect()));

    let delivered = DeliveryQuery {
        status: Some(DeliveryStatus::Delivered),
        ..Default::default()
    };
    let got = b.store().list_deliveries(&a.id, &delivered).await.expect("by status");
    assert_eq!(ids(&got.items), expect(&|d| d.status == DeliveryStatus::Delivered));
    assert_eq!(got.items.len(), 3);

    let first_sub = DeliveryQuery {
        subscription_id: Some(subs[0].clone()),
        ..Default::default()
    };
    let got = b
        .store()
        .list_deliveries(&a.id, &first_sub)
        .await
        .expect("by subscription");
    assert_eq!(ids(&got.items), expect(&|d| d.subscription_id == subs[0]));

    let both = DeliveryQuery {
        status: Some(DeliveryStatus::Pending),
        subscription_id: Some(subs[1].clone()),
        ..Default::default()
    };
    let got = b.store().list_deliveries(&a.id, &both).await.expect("by both");
    assert_eq!(
        ids(&got.items),
        expect(&|d| d.status == DeliveryStatus::Pending && d.subscription_id == subs[1])
    );

    // Filters hold across pages.
    let paged = all_pages(
        b,
        &a.id,
        DeliveryQuery {
            limit: 2,
            ..delivered.clone()
        },
    )
    .await;
    assert_eq!(ids(&paged), expect(&|d| d.status == DeliveryStatus::Delivered));
    let none = DeliveryQuery {
        status: Some(DeliveryStatus::Dead),
        ..Default::default()
    };
    assert!(b
        .store()
        .list_deliveries(&a.id, &none)
        .await
        .expect("none dead")
        .items
        .is_empty());
}

pub async fn list_deliveries_clamps_the_page_size(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let subs = fx.sub_ids(120);
    fx.stored_event(b, &a.id, t0(), &subs).await;

    let page = |limit| DeliveryQuery {
        limit,
        ..Default::default()
    };
    let default = b.store().list_deliveries(&a.id, &page(0)).await.expect("limit 0");
    assert_eq!(default.items.len(), 50, "limit 0 means the default of 50");
    assert!(default.next_cursor.is_some());
    let capped = b.store().list_deliveries(&a.id, &page(1000)).await.expect("limit 1000");
    assert_eq!(capped.items.len(), 100, "limits above 100 are cut to 100");
    assert!(capped.next_cursor.is_some());
    let rest = b
        .store()
        .list_deliveries(
            &a.id,
            &DeliveryQuery {
                limit: 1000,
                cursor: capped.next_cursor,
                ..Default::default()
            },
        )
        .await
        .expect("the rest");
    assert_eq!(rest.items.len(), 20);
    assert_eq!(rest.next_cursor, None);
    assert_eq!(
        b.store()
            .list_deliveries(&a.id, &page(1))
            .await
            .expect("limit 1")
            .items
            .len(),
        1
    );
}

pub async fn a_cursor_the_store_did_not_hand_out_is_refused(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let subs = fx.sub_ids(3);
    fx.stored_event(b, &a.id, t0(), &subs).await;
    let page = |cursor: &str| DeliveryQuery {
        limit: 2,
        cursor: Some(cursor.to_owned()),
        ..Default::default()
    };
    for garbage in ["nonsense", "12.x", "2030-06-01#x", "%00"] {
        match b.store().list_deliveries(&a.id, &page(garbage)).await {
            Err(PortError::InvalidCursor(c)) => assert_eq!(c, garbage),
            other => panic!("cursor {garbage:?}: {other:?}"),
        }
    }
    // The one it did hand out still works.
    let first = b
        .store()
        .list_deliveries(
            &a.id,
            &DeliveryQuery {
                limit: 2,
                ..Default::default()
            },
        )
        .await
        .expect("page 1");
    let next = first.next_cursor.expect("a second page");
    assert_eq!(
        b.store()
            .list_deliveries(&a.id, &page(&next))
            .await
            .expect("page 2")
            .items
            .len(),
        1
    );
}

pub async fn overdue_deliveries_are_the_retrying_and_replayed_ones_due_before_the_time(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let cut = t0() + chrono::Duration::hours(1);
    let subs = fx.sub_ids(11);
    let (_, ds) = fx.stored_event(b, &a.id, t0(), &subs).await;
    let with_due = |d: &Delivery, due: DateTime<Utc>| Delivery {
        next_attempt_at: Some(due),
        ..d.clone()
    };

    // Replayed (pending in round 1), due before the cut.
    let dead = change(
        b,
        &ds[0],
        finished(&ds[0], DeliveryStatus::Dead, t0()),
        Some(attempt(&ds[0], 0, 1, 500, t0())),
    )
    .await;
    let replayed = Delivery {
        status: DeliveryStatus::Pending,
        round: 1,
        attempts: 0,
        ..with_due(&dead, cut - minutes(10))
    };
    let pending_due = change(b, &dead, replayed, None).await;
    // Pending in its first round, its next attempt moved (held, deferred, or queued again by
    // the audit), due before the cut.
    let moved_due = change(b, &ds[6], with_due(&ds[6], cut - minutes(10)), None).await;
    // Pending in its first round as stored (created at t0, before the cut): its message was
    // queued before it was stored, so the sweep has nothing to look after (ds[7]).
    // Retrying, due before the cut.
    let retrying = failed(&ds[1], t0(), 1);
    let retrying_due = change(
        b,
        &ds[1],
        with_due(&retrying, cut - minutes(5)),
        Some(attempt(&ds[1], 0, 1, 500, t0())),
    )
    .await;
    // Retrying as its attempt left it, due soon after the creation: its message was queued
    // before its write, so the sweep has nothing to look after (ds[8]); due later than
    // `Delivery::QUEUED_RETRY_HORIZON` after it, the sweep looks after it (ds[9]).
    // Retrying soon after the creation but moved (held, deferred, queued again): the sweep's
    // (ds[10]).
    let failed_attempt = |d: &Delivery| Some(attempt(d, 0, 1, 500, t0()));
    let early_retry = change(b, &ds[8], failed(&ds[8], t0(), 1), failed_attempt(&ds[8])).await;
    let late_retry = change(b, &ds[9], failed(&ds[9], t0(), 30), failed_attempt(&ds[9])).await;
    let moved_retry = Delivery {
        next_attempt_at: Some(t0() + minutes(10)),
        ..failed(&ds[10], t0(), 1)
    };
    let moved_retry = change(b, &ds[10], moved_retry, failed_attempt(&ds[10])).await;
    // Pending, due exactly at the cut and after it: not yet.
    change(b, &ds[2], with_due(&ds[2], cut), None).await;
    change(b, &ds[3], with_due(&ds[3], cut + minutes(1)), None).await;
    // Delivered and dead: never overdue, whatever their time says.
    let delivered = finished(&ds[4], DeliveryStatus::Delivered, t0());
    change(
        b,
        &ds[4],
        with_due(&delivered, cut - minutes(30)),
        Some(attempt(&ds[4], 0, 1, 200, t0())),
    )
    .await;
    let dead = finished(&ds[5], DeliveryStatus::Dead, t0());
    change(
        b,
        &ds[5],
        with_due(&dead, cut - minutes(30)),
        Some(attempt(&ds[5], 0, 1, 500, t0())),
    )
    .await;

    let mine = |list: Vec<Delivery>| -> Vec<Delivery> { list.into_iter().filter(|d| d.tenant_id == a.id).collect() };
    let overdue = mine(b.store().overdue_deliveries(cut, 100).await.expect("overdue"));
    let mut expected = vec![
        pending_due.id.clone(),
        retrying_due.id.clone(),
        moved_due.id.clone(),
        late_retry.id.clone(),
        moved_retry.id.clone(),
    ];
    if b.sweeps_early_retries() {
        expected.push(early_retry.id.clone());
    }
    assert_eq!(sorted(ids(&overdue)), sorted(expected));
    assert!(
        overdue.contains(&pending_due) && overdue.contains(&retrying_due) && overdue.contains(&moved_due),
        "overdue deliveries come back whole"
    );
    assert_eq!(b.store().overdue_deliveries(cut, 1).await.expect("limit 1").len(), 1);
    assert!(mine(
        b.store()
            .overdue_deliveries(t0() - minutes(1), 100)
            .await
            .expect("none yet")
    )
    .is_empty());
}

pub async fn deliveries_awaiting_a_queued_message_are_found_by_creation_time_a_page_at_a_time(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let (a, z) = (fx.stored_tenant(b).await, fx.stored_tenant(b).await);
    let range = t0()..t0() + minutes(30);
    let subs = fx.sub_ids(7);
    let (_, ds) = fx.stored_event(b, &a.id, t0(), &subs).await;
    // Awaiting: ds[0], ds[1] as stored, and another tenant's, later in the range; ds[4],
    // retrying soon after its creation as its attempt left it (its retry's message queued
    // before its write).
    let (_, theirs) = fx.stored_event(b, &z.id, t0() + minutes(5), &subs[..1]).await;
    // Not: its next attempt moved (held, deferred, queued again), delivered, a retry due
    // past `Delivery::QUEUED_RETRY_HORIZON` (the sweep's), a retry moved.
    let moved = Delivery {
        next_attempt_at: Some(t0() + minutes(40)),
        ..ds[2].clone()
    };
    change(b, &ds[2], moved, None).await;
    let delivered = finished(&ds[3], DeliveryStatus::Delivered, t0());
    change(b, &ds[3], delivered, Some(attempt(&ds[3], 0, 1, 200, t0()))).await;
    let failed_attempt = |d: &Delivery| Some(attempt(d, 0, 1, 500, t0()));
    let retrying = change(b, &ds[4], failed(&ds[4], t0(), 1), failed_attempt(&ds[4])).await;
    change(b, &ds[5], failed(&ds[5], t0(), 30), failed_attempt(&ds[5])).await;
    let moved_retry = Delivery {
        next_attempt_at: Some(t0() + minutes(10)),
        ..failed(&ds[6], t0(), 1)
    };
    change(b, &ds[6], moved_retry, failed_attempt(&ds[6])).await;
    // Outside the range: created at its end, and just before its start.
    fx.stored_event(b, &a.id, range.end, &subs[..1]).await;
    fx.stored_event(b, &a.id, t0() - chrono::Duration::seconds(1), &subs[..1])
        .await;

    let expected = sorted(vec![
        ds[0].id.clone(),
        ds[1].id.clone(),
        retrying.id.clone(),
        theirs[0].id.clone(),
    ]);
    for limit in [1, 2, 100] {
        let (mut found, mut after, mut pages) = (Vec::new(), None, 0);
        loop {
            let page = b
                .store()
                .awaiting_queued_message(range.clone(), after.as_deref(), limit)
                .await
                .expect("an audit page");
            found.extend(
                page.deliveries
                    .into_iter()
                    .filter(|d| d.tenant_id == a.id || d.tenant_id == z.id),
            );
            pages += 1;
            assert!(pages < 10_000, "the audit's pages never end (limit {limit})");
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(sorted(ids(&found)), expected, "limit {limit}: each awaiting once");
        assert!(found.contains(&ds[0]) && found.contains(&theirs[0]), "whole deliveries");
    }
}

pub async fn the_audits_position_round_trips(b: &dyn ContractBackend) {
    assert_eq!(b.scheduler().audit_position().await.expect("read"), None);
    let mut position = AuditPosition {
        from: t0(),
        to: t0() + minutes(10),
        after: Some("a place#with/odd chars".into()),
    };
    for _ in 0..2 {
        b.scheduler().save_audit_position(&position).await.expect("save");
        assert_eq!(
            b.scheduler().audit_position().await.expect("read"),
            Some(position.clone())
        );
        position = AuditPosition {
            from: position.to,
            after: None,
            ..position
        };
    }
}

pub async fn the_tending_position_round_trips(b: &dyn ContractBackend) {
    assert_eq!(b.scheduler().tend_position().await.expect("read"), None);
    let subs = Fixture::new().sub_ids(2);
    for after in [Some(&subs[0]), Some(&subs[1]), None, Some(&subs[0])] {
        b.scheduler().save_tend_position(after).await.expect("save");
        assert_eq!(b.scheduler().tend_position().await.expect("read").as_ref(), after);
    }
}

/// Tasks that read back are never set aside. (Each backend's own tests put an item that
/// cannot be read beside them: only they can write one.)
pub async fn due_tasks_set_nothing_aside_and_none_is_listed(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let item = scheduled(&mut fx, t0() + minutes(1));
    b.scheduler().schedule(&item).await.expect("schedule");
    let page = b.scheduler().due_page(t0(), t0() + minutes(5), 10).await.expect("due");
    assert_eq!(
        page,
        DuePage {
            tasks: vec![item],
            set_aside: 0
        }
    );
    assert!(b.scheduler().set_aside(None, 10).await.expect("list").is_empty());
}

/// The deployment's settings are one value: written over the copy read, refused over a stale
/// one. (A backend shared by several tests may have them written already.)
pub async fn the_deployments_settings_are_written_only_over_the_copy_read(b: &dyn ContractBackend) {
    let read = b.store().deployment().await.expect("read");
    if read.version == 0 {
        assert_eq!(read, Deployment::default(), "never written: the defaults");
    }
    let next = Deployment {
        operator_keys: vec![ApiKey {
            hash: "a".repeat(64),
            created_at: t0(),
        }],
        retries_rollout_percent: 10,
        operations_tenant: Some(TenantId::parse("ten_operations").expect("an id")),
        strict_catalogue: true,
        version: read.version + 1,
    };
    b.store()
        .put_deployment(&next, &read)
        .await
        .expect("written over the copy read");
    assert_eq!(b.store().deployment().await.expect("read"), next);
    let lost = Deployment {
        retries_rollout_percent: 50,
        ..next.clone()
    };
    assert!(matches!(
        b.store().put_deployment(&lost, &read).await,
        Err(PortError::ConditionFailed(_))
    ));
    let later = Deployment {
        operator_keys: Vec::new(),
        retries_rollout_percent: 50,
        operations_tenant: None,
        strict_catalogue: false,
        version: next.version + 1,
    };
    b.store()
        .put_deployment(&later, &next)
        .await
        .expect("written over the copy read");
    assert_eq!(b.store().deployment().await.expect("read"), later);
}

pub async fn a_portal_session_is_created_once_read_by_id_and_revoked(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let tenant = fx.stored_tenant(b).await;
    let session = PortalSession {
        id: PortalSessionId::generate(t0(), &mut fx.rng),
        tenant_id: tenant.id.clone(),
        secret_hash: "b".repeat(64),
        read_only: true,
        created_at: t0(),
        valid_until: t0() + minutes(60),
    };
    b.store().create_portal_session(&session).await.expect("create");
    assert_eq!(
        b.store().portal_session(&session.id).await.expect("read"),
        Some(session.clone())
    );
    assert!(matches!(
        b.store().create_portal_session(&session).await,
        Err(PortError::ConditionFailed(_))
    ));
    let other = PortalSessionId::generate(t0(), &mut fx.rng);
    assert_eq!(b.store().portal_session(&other).await.expect("read"), None);
    assert!(b.store().delete_portal_session(&session.id).await.expect("revoke"));
    assert!(!b.store().delete_portal_session(&session.id).await.expect("again"));
    assert_eq!(b.store().portal_session(&session.id).await.expect("read"), None);
}

// ---------------------------------------------------------------------------------------
// Store: the event-type catalogue

/// A definition with a schema (a float, nested objects, a null) and an example, validated.
fn event_type_definition(tenant: Option<&TenantId>, name: &str) -> EventTypeDefinition {
    EventTypeDefinition {
        name: EventType::parse(name).expect("a valid event type"),
        tenant_id: tenant.cloned(),
        description: "An invoice was paid — in full, or the rest of it.".into(),
        schema: Some(serde_json::json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "required": ["amount", "customer"],
            "properties": {
                "amount": {"type": "number", "minimum": 100.0, "multipleOf": 0.01},
                "customer": {
                    "type": "object",
                    "properties": {"id": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}}
                },
                "note": {"type": ["string", "null"], "default": null}
            }
        })),
        example: Some(serde_json::json!({"amount": 100.0, "customer": {"id": "cus_1", "tags": []}, "note": null})),
        validate: true,
        deprecated: false,
        created_at: t0(),
        updated_at: t0(),
    }
}

/// A name prefix of this test's alone, for definitions in the deployment's catalogue (the
/// backend may be shared with other tests).
fn catalogue_tag(fx: &mut Fixture) -> String {
    TenantId::generate(t0(), &mut fx.rng).to_string().to_lowercase()
}

/// The stored copy equals `def`, and its schema and example read back as the same text (key
/// order, `100.0` still a float).
async fn assert_event_type_stored(b: &dyn ContractBackend, def: &EventTypeDefinition) {
    let read = b
        .store()
        .event_type(def.tenant_id.as_ref(), &def.name)
        .await
        .expect("read event type");
    assert_eq!(read.as_ref(), Some(def));
    let read = read.expect("found");
    let text = |v: &Option<serde_json::Value>| v.as_ref().map(|v| v.to_string());
    assert_eq!(text(&read.schema), text(&def.schema));
    assert_eq!(text(&read.example), text(&def.example));
}

pub async fn an_event_type_is_created_once_per_scope_and_read_back_exactly(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let other = fx.stored_tenant(b).await;
    let name = format!("{}.invoice.paid", catalogue_tag(&mut fx));

    // The deployment's, for every tenant.
    let deployments = event_type_definition(None, &name);
    b.store()
        .put_event_type(&deployments, None)
        .await
        .expect("create in the deployment's catalogue");
    assert_event_type_stored(b, &deployments).await;

    // A tenant's own of the same name: no schema, no example, deprecated.
    let tenants = EventTypeDefinition {
        tenant_id: Some(a.id.clone()),
        description: String::new(),
        schema: None,
        example: None,
        validate: false,
        deprecated: true,
        created_at: t0() + minutes(1),
        updated_at: t0() + minutes(1),
        ..deployments.clone()
    };
    b.store()
        .put_event_type(&tenants, None)
        .await
        .expect("the same name in a tenant's catalogue");
    assert_event_type_stored(b, &tenants).await;
    assert_event_type_stored(b, &deployments).await;
    assert_eq!(
        b.store()
            .event_type(Some(&other.id), &deployments.name)
            .await
            .expect("read"),
        None,
        "another tenant's catalogue has none of that name"
    );
    let unknown = EventType::parse(&format!("{name}.v2")).expect("a valid event type");
    assert_eq!(b.store().event_type(None, &unknown).await.expect("read"), None);
    assert_eq!(b.store().event_type(Some(&a.id), &unknown).await.expect("read"), None);

    // Created once per scope: a second creation is refused and changes nothing.
    let again = EventTypeDefinition {
        description: "again".into(),
        updated_at: t0() + minutes(2),
        ..deployments.clone()
    };
    assert_condition_failed(
        b.store().put_event_type(&again, None).await,
        "create the deployment's again",
    );
    let again = EventTypeDefinition {
        description: "again".into(),
        updated_at: t0() + minutes(2),
        ..tenants.clone()
    };
    assert_condition_failed(
        b.store().put_event_type(&again, None).await,
        "create the tenant's again",
    );
    assert_event_type_stored(b, &deployments).await;
    assert_event_type_stored(b, &tenants).await;

    // Another tenant's is its own.
    let others = EventTypeDefinition {
        tenant_id: Some(other.id.clone()),
        description: "theirs".into(),
        ..deployments.clone()
    };
    b.store()
        .put_event_type(&others, None)
        .await
        .expect("the same name in another tenant's catalogue");
    assert_event_type_stored(b, &others).await;
    assert_event_type_stored(b, &tenants).await;
    assert_event_type_stored(b, &deployments).await;
}

pub async fn an_event_type_is_changed_only_over_the_copy_read(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let tag = catalogue_tag(&mut fx);
    for scope in [None, Some(&a.id)] {
        let original = event_type_definition(scope, &format!("{tag}.order.shipped"));
        b.store().put_event_type(&original, None).await.expect("create");

        // Over the copy read: written whole. A version to the nanosecond.
        let changed = EventTypeDefinition {
            description: "Shipped, tracking number included.".into(),
            schema: Some(
                serde_json::json!({"type": "object", "properties": {"weight": {"type": "number", "maximum": 2.5e3}}}),
            ),
            example: Some(serde_json::json!({"weight": 1.0})),
            validate: false,
            deprecated: true,
            updated_at: t0() + minutes(5) + chrono::Duration::nanoseconds(123_456_789),
            ..original.clone()
        };
        b.store()
            .put_event_type(&changed, Some(original.updated_at))
            .await
            .expect("change over the copy read");
        assert_event_type_stored(b, &changed).await;

        // A writer that read the original before the change landed loses: nothing reverted.
        let stale = EventTypeDefinition {
            description: "stale".into(),
            updated_at: t0() + minutes(6),
            ..original.clone()
        };
        assert_condition_failed(
            b.store().put_event_type(&stale, Some(original.updated_at)).await,
            "change over a stale copy",
        );
        assert_event_type_stored(b, &changed).await;

        // The schema and example taken off: gone from the stored copy too.
        let bare = EventTypeDefinition {
            schema: None,
            example: None,
            updated_at: t0() + minutes(7),
            ..changed.clone()
        };
        b.store()
            .put_event_type(&bare, Some(changed.updated_at))
            .await
            .expect("change over the copy read");
        assert_event_type_stored(b, &bare).await;

        // A change of one never created is refused, and creates nothing.
        let never = event_type_definition(scope, &format!("{tag}.never.created"));
        assert_condition_failed(
            b.store().put_event_type(&never, Some(never.updated_at)).await,
            "change one never created",
        );
        assert_eq!(b.store().event_type(scope, &never.name).await.expect("read"), None);
    }

    // A change in a scope that has none of the name, another having one, is refused there.
    let deployments = event_type_definition(None, &format!("{tag}.deployment.only"));
    b.store().put_event_type(&deployments, None).await.expect("create");
    let tenants = EventTypeDefinition {
        tenant_id: Some(a.id.clone()),
        updated_at: t0() + minutes(1),
        ..deployments.clone()
    };
    assert_condition_failed(
        b.store().put_event_type(&tenants, Some(deployments.updated_at)).await,
        "change a tenant's that only the deployment has",
    );
    assert_eq!(
        b.store().event_type(Some(&a.id), &tenants.name).await.expect("read"),
        None
    );
    assert_event_type_stored(b, &deployments).await;
}

/// A scope's whole catalogue, `limit` at a time, checking each page's size.
async fn all_event_types(b: &dyn ContractBackend, tenant: Option<&TenantId>, limit: u32) -> Vec<EventTypeDefinition> {
    let mut listed: Vec<EventTypeDefinition> = Vec::new();
    for _ in 0..1000 {
        let after = listed.last().map(|d| d.name.clone());
        let page = b
            .store()
            .list_event_types(tenant, after.as_ref(), limit)
            .await
            .expect("list event types");
        assert!(
            page.len() <= limit as usize,
            "a page of {} for a limit of {limit}",
            page.len()
        );
        if page.is_empty() {
            return listed;
        }
        listed.extend(page);
    }
    panic!("list_event_types never came to an end");
}

pub async fn event_types_are_listed_by_name_a_page_at_a_time_within_their_scope(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let a = fx.stored_tenant(b).await;
    let other = fx.stored_tenant(b).await;
    let tag = catalogue_tag(&mut fx);

    // Names whose order is their bytes': capitals first, then `-` < `.` < digits < `_`, and a
    // name before the longer ones it begins.
    let order = [
        "Invoice.paid",
        "invoice",
        "invoice-paid",
        "invoice.paid",
        "invoice.paid.v2",
        "invoice_paid",
        "order.created",
    ];
    let mine: Vec<EventTypeDefinition> = order
        .iter()
        .map(|name| event_type_definition(Some(&a.id), name))
        .collect();
    // Written out of order, interleaved with another tenant's and the deployment's.
    let theirs: Vec<EventTypeDefinition> = ["invoice.paid", "zeta.only"]
        .iter()
        .map(|name| EventTypeDefinition {
            description: "theirs".into(),
            ..event_type_definition(Some(&other.id), name)
        })
        .collect();
    let deployments: Vec<EventTypeDefinition> = ["order.created", "invoice.paid", "account.opened"]
        .iter()
        .map(|name| event_type_definition(None, &format!("{tag}.{name}")))
        .collect();
    for i in [3, 6, 0, 5, 1, 4, 2] {
        b.store().put_event_type(&mine[i], None).await.expect("create");
        if let Some(t) = theirs.get(i) {
            b.store().put_event_type(t, None).await.expect("create");
        }
        if let Some(d) = deployments.get(i) {
            b.store().put_event_type(d, None).await.expect("create");
        }
    }

    // Pages of 3: no gap, no repeat, the last one short, then none.
    let page = |after: Option<&str>, limit: u32| {
        let tenant = a.id.clone();
        let after = after.map(|n| EventType::parse(n).expect("a valid event type"));
        async move {
            b.store()
                .list_event_types(Some(&tenant), after.as_ref(), limit)
                .await
                .expect("list a page")
        }
    };
    assert_eq!(page(None, 3).await, mine[..3]);
    assert_eq!(page(Some(order[2]), 3).await, mine[3..6]);
    assert_eq!(page(Some(order[5]), 3).await, mine[6..]);
    assert_eq!(page(Some(order[6]), 3).await, []);
    assert_eq!(all_event_types(b, Some(&a.id), 3).await, mine);
    assert_eq!(page(None, 100).await, mine);
    assert_eq!(page(None, 1).await, mine[..1]);
    // After a name that was never defined: from the next one there is.
    assert_eq!(page(Some("invoice.paid.v1"), 2).await, mine[4..6]);
    assert_eq!(page(Some("a"), 1).await, mine[1..2]);
    assert_eq!(page(Some("zzz"), 100).await, []);

    // Each scope lists its own alone.
    assert_eq!(all_event_types(b, Some(&other.id), 100).await, theirs);
    let nobody = fx.tenant();
    assert_eq!(all_event_types(b, Some(&nobody.id), 100).await, []);
    let listed = all_event_types(b, None, 2).await;
    let names: Vec<&str> = listed.iter().map(|d| d.name.as_str()).collect();
    assert!(
        names.windows(2).all(|w| w[0] < w[1]),
        "not by name, or repeated: {names:?}"
    );
    assert!(
        listed.iter().all(|d| d.tenant_id.is_none()),
        "a tenant's definition in the deployment's catalogue: {names:?}"
    );
    let ours: Vec<EventTypeDefinition> = listed
        .into_iter()
        .filter(|d| d.name.as_str().starts_with(&format!("{tag}.")))
        .collect();
    let mut expected = deployments.clone();
    expected.sort_by(|x, y| x.name.cmp(&y.name));
    assert_eq!(ours, expected);
}

impl Fixture {
    /// `n` deliveries of one stored event, to be told of as dead.
    async fn deliveries(&mut self, b: &dyn ContractBackend, n: usize) -> Vec<Delivery> {
        let a = self.stored_tenant(b).await;
        let subs = self.sub_ids(n);
        self.stored_event(b, &a.id, t0(), &subs).await.1
    }
}

/// An owner of this test's alone (the backend may be shared with other tests).
fn owner(fx: &mut Fixture) -> Email {
    let tag = TenantId::generate(t0(), &mut fx.rng).to_string().to_lowercase();
    Email::parse(&format!("owner-{tag}@acme.example")).expect("a valid email")
}

fn notice(d: &Delivery, round: u32, died_at: DateTime<Utc>) -> DeadNotice {
    DeadNotice {
        delivery_id: d.id.clone(),
        round,
        tenant_id: d.tenant_id.clone(),
        subscription_id: d.subscription_id.clone(),
        died_at,
    }
}

async fn queue(b: &dyn ContractBackend, owner: &Email, n: &DeadNotice) -> bool {
    b.store().queue_dead_notice(owner, n).await.expect("queue dead notice")
}

/// A claim at `at` within a 5-minute window and a one-minute claim timeout.
async fn claim_at(b: &dyn ContractBackend, owner: &Email, at: DateTime<Utc>) -> Option<DigestClaim> {
    b.store()
        .claim_digest(owner, at, at - minutes(5), at - minutes(1))
        .await
        .expect("claim digest")
}

async fn due(b: &dyn ContractBackend, owner: &Email, at: DateTime<Utc>) -> bool {
    b.store()
        .due_digests(at, at - minutes(5), 1000)
        .await
        .expect("due digests")
        .contains(owner)
}

fn told(claim: &DigestClaim) -> Vec<(DeliveryId, u32)> {
    claim.notices.iter().map(|n| (n.delivery_id.clone(), n.round)).collect()
}

pub async fn a_dead_notice_is_recorded_once_per_round(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let ds = fx.deliveries(b, 2).await;
    let (owner, other) = (owner(&mut fx), owner(&mut fx));

    assert!(queue(b, &owner, &notice(&ds[0], 0, t0())).await);
    assert!(!queue(b, &owner, &notice(&ds[0], 0, t0())).await, "a repeat");
    assert!(
        !queue(b, &other, &notice(&ds[0], 0, t0())).await,
        "a repeat, whoever it is for"
    );
    assert!(
        queue(b, &owner, &notice(&ds[0], 1, t0() + minutes(1))).await,
        "the next round"
    );
    assert!(queue(b, &owner, &notice(&ds[1], 0, t0())).await, "another delivery");

    let claim = claim_at(b, &owner, t0()).await.expect("the owner's email");
    assert_eq!(claim.notices.len(), 3);
    for n in [notice(&ds[0], 0, t0()), notice(&ds[1], 0, t0())] {
        assert!(claim.notices[..2].contains(&n), "notices come back whole: {n:?}");
    }
    assert_eq!(
        claim.notices[2],
        notice(&ds[0], 1, t0() + minutes(1)),
        "oldest death first"
    );
    b.store().finish_digest(&claim).await.expect("finish");
    assert!(
        !queue(b, &owner, &notice(&ds[0], 0, t0())).await,
        "a sent notice is not told again"
    );
    assert!(claim_at(b, &owner, t0() + minutes(60)).await.is_none(), "nothing waits");
    assert!(!due(b, &owner, t0() + minutes(60)).await);
}

pub async fn an_owners_email_is_claimed_once_then_not_again_within_the_window(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let ds = fx.deliveries(b, 3).await;
    let (owner, other) = (owner(&mut fx), owner(&mut fx));
    let now = t0() + minutes(10);

    assert!(!due(b, &owner, now).await, "nothing waits yet");
    queue(b, &owner, &notice(&ds[0], 0, t0())).await;
    queue(b, &other, &notice(&ds[1], 0, t0())).await;
    assert!(due(b, &owner, now).await && due(b, &other, now).await);

    let claim = claim_at(b, &owner, now).await.expect("never emailed: due at once");
    assert_eq!(told(&claim), vec![(ds[0].id.clone(), 0)]);
    assert_eq!((claim.owner.clone(), claim.claimed_at), (owner.clone(), now));
    assert!(claim_at(b, &owner, now).await.is_none(), "claimed once");
    b.store().finish_digest(&claim).await.expect("finish");
    assert!(
        claim_at(b, &other, now).await.is_some(),
        "another owner's window is their own"
    );

    // A death a minute later waits until five minutes after the email.
    queue(b, &owner, &notice(&ds[2], 0, now + minutes(1))).await;
    for at in [now + minutes(1), now + minutes(4)] {
        assert!(!due(b, &owner, at).await, "within the window at {at}");
        assert!(claim_at(b, &owner, at).await.is_none(), "within the window at {at}");
    }
    assert!(due(b, &owner, now + minutes(5)).await, "the window has passed");
    let next = claim_at(b, &owner, now + minutes(5))
        .await
        .expect("the window has passed");
    assert_eq!(told(&next), vec![(ds[2].id.clone(), 0)], "only what waited");
}

pub async fn a_claim_never_finished_is_taken_over_once_stale(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let ds = fx.deliveries(b, 1).await;
    let owner = owner(&mut fx);
    queue(b, &owner, &notice(&ds[0], 0, t0())).await;

    let first = claim_at(b, &owner, t0()).await.expect("claimed");
    // Its claimer died before sending: within the minute it is held, after it taken over.
    assert!(claim_at(b, &owner, t0() + chrono::Duration::seconds(59))
        .await
        .is_none());
    let second = claim_at(b, &owner, t0() + minutes(2)).await.expect("taken over");
    assert_eq!(told(&second), told(&first));
    assert!(
        claim_at(b, &owner, t0() + minutes(2)).await.is_none(),
        "the new claim holds in turn"
    );
    // The first claimer's late release does not free the second's claim.
    b.store().release_digest(&first, t0()).await.expect("release");
    assert!(claim_at(b, &owner, t0() + minutes(2)).await.is_none());
    b.store().finish_digest(&second).await.expect("finish");
    assert!(!queue(b, &owner, &notice(&ds[0], 0, t0())).await, "sent");
}

pub async fn a_released_claim_leaves_its_notices_waiting(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let ds = fx.deliveries(b, 2).await;
    let owner = owner(&mut fx);
    queue(b, &owner, &notice(&ds[0], 0, t0())).await;
    queue(b, &owner, &notice(&ds[1], 0, t0() + minutes(1))).await;

    let claim = claim_at(b, &owner, t0() + minutes(2)).await.expect("claimed");
    let retry_at = t0() + minutes(7);
    b.store().release_digest(&claim, retry_at).await.expect("release");
    // Held back until its retry time, so owners whose emails keep failing do not take the
    // others' places; then due and claimable again, with the same notices.
    for at in [t0() + minutes(2), t0() + minutes(6)] {
        assert!(!due(b, &owner, at).await, "held back at {at}");
        assert!(claim_at(b, &owner, at).await.is_none(), "held back at {at}");
    }
    assert!(due(b, &owner, retry_at).await, "due again");
    let again = claim_at(b, &owner, retry_at)
        .await
        .expect("claimed again after its release");
    assert_eq!(told(&again), told(&claim));
    assert!(
        !queue(b, &owner, &notice(&ds[0], 0, t0())).await,
        "a waiting notice is not recorded twice"
    );
}

pub async fn a_notice_recorded_while_an_email_is_out_waits_for_the_next(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let ds = fx.deliveries(b, 2).await;
    let owner = owner(&mut fx);
    queue(b, &owner, &notice(&ds[0], 0, t0())).await;

    let claim = claim_at(b, &owner, t0()).await.expect("claimed");
    // Another handler records a death while this email is on its way.
    assert!(queue(b, &owner, &notice(&ds[1], 0, t0())).await);
    b.store().finish_digest(&claim).await.expect("finish");
    assert!(!due(b, &owner, t0() + minutes(4)).await, "within the window");
    assert!(due(b, &owner, t0() + minutes(5)).await, "it waits for the next email");
    let next = claim_at(b, &owner, t0() + minutes(5)).await.expect("the next email");
    assert_eq!(told(&next), vec![(ds[1].id.clone(), 0)]);
}

pub async fn rate_limit_turns_follow_each_other_then_the_backlog_and_none_is_given_twice(b: &dyn ContractBackend) {
    use crate::rate_limit::{Arrival, Verdict};
    let mut fx = Fixture::new();
    let tenant = fx.tenant().id;
    let sub = fx.subscription(&tenant, t0()).id;
    let every = Duration::from_millis(250);
    let ms = chrono::Duration::milliseconds;
    let store = b.store();
    let sub = &sub;
    let take = |at, arrival| async move { store.limit_rate(sub, every, at, arrival).await.expect("a verdict") };
    let send = |n| Verdict::SendAt(t0() + ms(n));
    let wait = |n| Verdict::Wait(t0() + ms(n));
    // A second's worth of turns on the send line, then slots on the backlog.
    let mut verdicts = Vec::new();
    for _ in 0..7 {
        verdicts.push(take(t0(), Arrival::New).await);
    }
    assert_eq!(
        verdicts,
        [
            send(0),
            send(250),
            send(500),
            send(750),
            send(1000),
            wait(1250),
            wait(1500)
        ]
    );
    // Back from the backlog a second early: the next turn, waited for.
    assert_eq!(take(t0() + ms(250), Arrival::FromBacklog).await, send(1250));
    // A new one goes behind the backlog.
    assert_eq!(take(t0() + ms(250), Arrival::New).await, wait(1750));
    // Back late, the send line fallen behind: a turn at once, though the backlog is ahead.
    assert_eq!(take(t0() + ms(1700), Arrival::FromBacklog).await, send(1700));
    // Idle for a while: afresh at the new now, not a burst of the turns missed.
    let later = t0() + minutes(1);
    assert_eq!(take(later, Arrival::New).await, Verdict::SendAt(later));
    assert_eq!(take(later, Arrival::New).await, Verdict::SendAt(later + ms(250)));

    // Many at once (as many workers would): each its own turn or slot, one interval apart.
    let other = fx.subscription(&tenant, t0()).id;
    let at = t0() + minutes(2);
    let every = Duration::from_millis(100);
    let verdicts = futures::future::join_all((0..40).map(|_| store.limit_rate(&other, every, at, Arrival::New))).await;
    let mut slots: Vec<DateTime<Utc>> = verdicts
        .into_iter()
        .map(|v| match v.expect("a verdict") {
            Verdict::SendAt(t) | Verdict::Wait(t) => t,
        })
        .collect();
    slots.sort();
    let want: Vec<DateTime<Utc>> = (0..40).map(|i| at + ms(100) * i).collect();
    assert_eq!(slots, want);

    // Back from the backlog to a full send line: back for its next turn, the backlog kept.
    let third = fx.subscription(&tenant, t0()).id;
    let at = t0() + minutes(3);
    let take = |at, arrival| {
        let third = &third;
        async move { store.limit_rate(third, every, at, arrival).await.expect("a verdict") }
    };
    for i in 0..11 {
        assert_eq!(take(at, Arrival::New).await, Verdict::SendAt(at + ms(100) * i));
    }
    assert_eq!(take(at, Arrival::New).await, Verdict::Wait(at + ms(1100)));
    assert_eq!(take(at, Arrival::FromBacklog).await, Verdict::Wait(at + ms(1100)));
    assert_eq!(take(at, Arrival::New).await, Verdict::Wait(at + ms(1200)));
    // None came back from that backlog for 20 s: taken for gone. A new attempt takes a turn,
    // and, the send line full, starts the backlog afresh rather than follow its last slot.
    let later = at + chrono::Duration::seconds(20);
    for i in 0..11 {
        assert_eq!(take(later, Arrival::New).await, Verdict::SendAt(later + ms(100) * i));
    }
    assert_eq!(take(later, Arrival::New).await, Verdict::Wait(later + ms(1100)));
    assert_eq!(take(later, Arrival::New).await, Verdict::Wait(later + ms(1200)));
}

/// Statistics add up: two writes to one bucket (two processes' counts) sum, every field of
/// them; a read starts at the time it names, oldest first; each endpoint has its own.
pub async fn endpoint_stats_add_up_per_bucket_and_are_read_from_a_time_on(b: &dyn ContractBackend) {
    use crate::stats::{bucket_of, StatsCounts, LATENCY_BINS};
    let mut fx = Fixture::new();
    let subs = fx.sub_ids(2);
    let store = b.store();
    assert!(store.endpoint_stats(&subs[0], t0()).await.expect("none").is_empty());
    let first = bucket_of(t0());
    let second = first + chrono::TimeDelta::seconds(crate::stats::BUCKET_SECONDS);
    let a = StatsCounts {
        succeeded: 3,
        http_4xx: 1,
        http_5xx: 2,
        timeout: 1,
        error: 1,
        dead: 1,
        latency: std::array::from_fn(|i| i as u64),
    };
    let b_ = StatsCounts {
        succeeded: 5,
        latency: [1; LATENCY_BINS],
        ..StatsCounts::default()
    };
    store
        .add_endpoint_stats(&subs[0], &[(first, a), (second, b_)])
        .await
        .expect("added");
    store.add_endpoint_stats(&subs[0], &[(first, b_)]).await.expect("added");
    store.add_endpoint_stats(&subs[1], &[(first, a)]).await.expect("added");
    let mut sum = a;
    sum.add(&b_);
    assert_eq!(
        store.endpoint_stats(&subs[0], first).await.expect("read"),
        vec![(first, sum), (second, b_)]
    );
    assert_eq!(
        store.endpoint_stats(&subs[0], second).await.expect("read"),
        vec![(second, b_)]
    );
    assert_eq!(
        store.endpoint_stats(&subs[1], first).await.expect("read"),
        vec![(first, a)]
    );
}

pub async fn endpoint_health_starts_empty_round_trips_and_is_saved_over_its_version(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let sub = fx.sub_ids(1).remove(0);
    assert_eq!(
        b.store().endpoint_health(&sub).await.expect("no history"),
        EndpointHealth::default()
    );

    let mut health = EndpointHealth::default();
    health.record(HealthSample {
        at: t0() + chrono::Duration::nanoseconds(123_456_789),
        success: true,
    });
    health.record(HealthSample {
        at: t0() + minutes(1),
        success: false,
    });
    b.store().save_endpoint_health(&sub, &health).await.expect("save");
    let read = b.store().endpoint_health(&sub).await.expect("read");
    assert_eq!(
        read,
        EndpointHealth {
            version: 1,
            ..health.clone()
        }
    );

    // A save over a copy read before another save is refused: it would undo that save's
    // samples (the caller reads again and merges).
    let mut stale = health.clone();
    stale.record(HealthSample {
        at: t0() + minutes(2),
        success: false,
    });
    assert!(
        matches!(
            b.store().save_endpoint_health(&sub, &stale).await,
            Err(PortError::ConditionFailed(_))
        ),
        "a save over a stale read must be refused"
    );
    let mut health = read;
    health.record(HealthSample {
        at: t0() + minutes(2),
        success: true,
    });
    b.store().save_endpoint_health(&sub, &health).await.expect("save again");
    assert_eq!(
        b.store().endpoint_health(&sub).await.expect("read again"),
        EndpointHealth {
            version: 2,
            ..health.clone()
        }
    );
    // The same save again (a retry whose first try's answer was lost) finds its own write:
    // done, nothing written twice; a caller that took it for another's save would merge its
    // samples in a second time.
    b.store()
        .save_endpoint_health(&sub, &health)
        .await
        .expect("the same save again is done");
    assert_eq!(
        b.store().endpoint_health(&sub).await.expect("read again"),
        EndpointHealth {
            version: 2,
            ..health.clone()
        }
    );
    assert_eq!(
        b.store().endpoint_health(&fx.sub_ids(1)[0]).await.expect("another"),
        EndpointHealth::default()
    );
}

// ---------------------------------------------------------------------------------------
// Queue

pub async fn tasks_enqueued_without_delay_are_visible_at_once(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let tasks: Vec<DeliveryTask> = (0..3).map(|_| fx.task()).collect();
    let batch: Vec<(DeliveryTask, u32)> = tasks.iter().map(|t| (t.clone(), 0)).collect();
    b.queue().enqueue(&batch).await.expect("enqueue");

    let mut got = b.take_visible().await.expect("take");
    got.sort_by(|x, y| x.delivery_id.cmp(&y.delivery_id));
    let mut expected = tasks;
    expected.sort_by(|x, y| x.delivery_id.cmp(&y.delivery_id));
    assert_eq!(got, expected);
    assert!(
        b.take_visible().await.expect("take again").is_empty(),
        "taken messages are gone"
    );
    b.queue().enqueue(&[]).await.expect("an empty batch is fine");
}

pub async fn a_delayed_task_stays_hidden_until_its_delay_has_passed(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let now = fx.task();
    let later = DeliveryTask {
        round: 2,
        attempt: 3,
        ..fx.task()
    };
    b.queue()
        .enqueue(&[(now.clone(), 0), (later.clone(), 2)])
        .await
        .expect("enqueue");

    assert_eq!(b.take_visible().await.expect("take"), vec![now]);
    b.advance(Duration::from_secs(3)).await;
    assert_eq!(b.take_visible().await.expect("take after the delay"), vec![later]);
}

pub async fn the_queue_accepts_its_max_delay_and_refuses_longer(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let max = b.queue().max_delay_seconds();
    assert!((1..=900).contains(&max), "max delay {max} s: SQS allows at most 900");

    let at_max = fx.task();
    b.queue()
        .enqueue(&[(at_max.clone(), max)])
        .await
        .expect("a delay of exactly the max");
    let too_long = fx.task();
    assert!(
        b.queue().enqueue(&[(too_long.clone(), max + 1)]).await.is_err(),
        "a delay over the max is refused"
    );
    let visible = b.take_visible().await.expect("take");
    assert!(
        !visible.contains(&at_max),
        "a task at the max delay is not visible at once"
    );
    assert!(!visible.contains(&too_long), "a refused task was enqueued");
}

pub async fn dead_lettered_tasks_reach_only_the_dead_letter_queue(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let tasks = vec![fx.task(), fx.task()];
    b.queue().dead_letter(&tasks).await.expect("dead letter");

    assert!(b.take_visible().await.expect("delivery queue").is_empty());
    let mut got = b.take_dead_letters().await.expect("dead-letter queue");
    got.sort_by(|x, y| x.delivery_id.cmp(&y.delivery_id));
    let mut expected = tasks;
    expected.sort_by(|x, y| x.delivery_id.cmp(&y.delivery_id));
    assert_eq!(got, expected);
    assert!(b.take_dead_letters().await.expect("again").is_empty());
}

// ---------------------------------------------------------------------------------------
// Scheduler table

fn scheduled(fx: &mut Fixture, due: DateTime<Utc>) -> ScheduledTask {
    ScheduledTask { task: fx.task(), due }
}

pub async fn scheduled_items_come_due_earliest_first(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let ms = chrono::Duration::milliseconds;
    let mut first = scheduled(&mut fx, t0() + minutes(10) + ms(250));
    // A rate-limited attempt's slot, its tenant and its count of redrives come back with it.
    first.task.slot = Some(t0() + minutes(11) + ms(5));
    first.task.tenant_id = Some(fx.tenant().id);
    first.task.redrives = 2;
    let second = scheduled(&mut fx, t0() + minutes(20));
    let third = scheduled(&mut fx, t0() + minutes(30));
    let much_later = scheduled(&mut fx, t0() + chrono::Duration::hours(2));
    for item in [&third, &much_later, &first, &second] {
        b.scheduler().schedule(item).await.expect("schedule");
    }

    assert!(b
        .scheduler()
        .due(t0() + minutes(5), 10)
        .await
        .expect("none yet")
        .is_empty());
    assert_eq!(
        b.scheduler().due(t0() + minutes(30), 10).await.expect("due"),
        vec![first.clone(), second.clone(), third.clone()],
        "due at or before `until`, earliest first"
    );
    assert_eq!(
        b.scheduler().due(t0() + minutes(30), 2).await.expect("limited"),
        vec![first, second]
    );
}

pub async fn removed_scheduled_items_are_no_longer_due(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let one = scheduled(&mut fx, t0() + minutes(1));
    let two = scheduled(&mut fx, t0() + minutes(2));
    b.scheduler().schedule(&one).await.expect("schedule");
    b.scheduler().schedule(&two).await.expect("schedule");
    let until = t0() + minutes(5);

    b.scheduler().remove(std::slice::from_ref(&one)).await.expect("remove");
    assert_eq!(b.scheduler().due(until, 10).await.expect("due"), vec![two.clone()]);
    b.scheduler()
        .remove(std::slice::from_ref(&one))
        .await
        .expect("removing twice is fine");
    b.scheduler().remove(&[two]).await.expect("remove the other");
    assert!(b.scheduler().due(until, 10).await.expect("due").is_empty());
}

pub async fn a_circuit_is_written_only_over_the_version_read(b: &dyn ContractBackend) {
    use crate::circuit::{Circuit, CircuitState};
    let mut fx = Fixture::new();
    let sub = fx.sub_ids(1).remove(0);
    let store = b.store();
    assert_eq!(store.circuit(&sub).await.expect("none yet"), None);
    let open = Circuit {
        state: CircuitState::Open,
        since: t0() + chrono::Duration::nanoseconds(123_456_789),
        next_probe_at: Some(t0() + minutes(1)),
        probe: None,
        probe_attempt: None,
        released: 0,
        releasing: false,
        version: 1,
    };
    store.put_circuit(&sub, &open, None).await.expect("the first");
    assert_eq!(store.circuit(&sub).await.expect("read").as_ref(), Some(&open));
    assert!(matches!(
        store.put_circuit(&sub, &open, None).await,
        Err(PortError::ConditionFailed(_))
    ));
    let probing = Circuit {
        state: CircuitState::HalfOpen,
        probe: Some(fx.task().delivery_id),
        probe_attempt: Some((0, 1)),
        version: 2,
        ..open.clone()
    };
    store
        .put_circuit(&sub, &probing, Some(&open))
        .await
        .expect("over the one read");
    let stale = Circuit {
        version: 2,
        probe: Some(fx.task().delivery_id),
        ..open.clone()
    };
    assert!(
        matches!(
            store.put_circuit(&sub, &stale, Some(&open)).await,
            Err(PortError::ConditionFailed(_))
        ),
        "a second writer from the same read loses"
    );
    let closed = Circuit {
        state: CircuitState::Closed,
        next_probe_at: None,
        probe: None,
        probe_attempt: None,
        released: 500,
        releasing: true,
        version: 3,
        ..probing.clone()
    };
    store.put_circuit(&sub, &closed, Some(&probing)).await.expect("closed");
    assert_eq!(store.circuit(&sub).await.expect("read"), Some(closed));
}

pub async fn held_attempts_are_found_by_endpoint_oldest_delivery_first_one_item_an_attempt_and_also_scheduled(
    b: &dyn ContractBackend,
) {
    let mut fx = Fixture::new();
    let subs = fx.sub_ids(2);
    let mut item = |due| {
        let mut i = scheduled(&mut fx, due);
        i.task.held_until = Some(due);
        i
    };
    let late = item(t0() + minutes(50));
    let soon = item(t0() + minutes(20) + chrono::Duration::milliseconds(7));
    let other = item(t0() + minutes(10));
    // `late`'s attempt held again with another give-up time (an attempt redone after its
    // first hold): still one item, at the later call's time.
    let again = ScheduledTask {
        due: t0() + minutes(40),
        task: DeliveryTask {
            held_until: Some(t0() + minutes(40)),
            ..late.task.clone()
        },
    };
    let tenant = fx.tenant().id;
    let scheduler = b.scheduler();
    scheduler.hold(&tenant, &subs[0], &late).await.expect("hold");
    scheduler.hold(&tenant, &subs[0], &soon).await.expect("hold");
    scheduler
        .hold(&tenant, &subs[0], &soon)
        .await
        .expect("holding twice is once");
    scheduler.hold(&tenant, &subs[0], &again).await.expect("hold again");
    scheduler.hold(&tenant, &subs[1], &other).await.expect("hold");
    let mut oldest_first = vec![soon.clone(), again.clone()];
    oldest_first.sort_by_key(|i| i.task.delivery_id.clone());
    assert_eq!(
        scheduler.held(&subs[0], 10).await.expect("held"),
        oldest_first,
        "one item an attempt, the oldest delivery first"
    );
    assert_eq!(scheduler.held(&subs[0], 1).await.expect("held"), oldest_first[..1]);
    // Each is due, with its give-up time, when it gives up.
    assert_eq!(
        scheduler.due(t0() + minutes(30), 10).await.expect("due"),
        vec![other.clone(), soon.clone()]
    );
    scheduler
        .release(&subs[0], std::slice::from_ref(&soon))
        .await
        .expect("release");
    assert_eq!(scheduler.held(&subs[0], 10).await.expect("held"), vec![again.clone()]);
    assert_eq!(scheduler.held(&subs[1], 10).await.expect("held"), vec![other.clone()]);
    scheduler
        .release(&subs[0], &[soon, late])
        .await
        .expect("releasing twice is fine");
    assert!(
        scheduler.held(&subs[0], 10).await.expect("held").is_empty(),
        "released by its attempt, whatever give-up time it was read with"
    );
}

pub async fn endpoints_that_held_an_attempt_are_listed_in_id_order_until_let_go(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let tenant = fx.tenant().id;
    let mut subs = fx.sub_ids(3);
    subs.sort();
    let scheduler = b.scheduler();
    for (i, sub) in subs.iter().enumerate() {
        let item = scheduled(&mut fx, t0() + minutes(10 + i as i64));
        scheduler.hold(&tenant, sub, &item).await.expect("hold");
        scheduler
            .hold(&tenant, sub, &item)
            .await
            .expect("holding again lists it once");
    }
    // Other tests share the backend: only these three are looked at.
    let ours = |list: Vec<Holding>| -> Vec<SubscriptionId> {
        list.into_iter()
            .filter(|h| subs.contains(&h.subscription_id))
            .inspect(|h| assert_eq!(h.tenant_id, tenant))
            .map(|h| h.subscription_id)
            .collect()
    };
    let all = |after: Option<SubscriptionId>| async move {
        let mut found = Vec::new();
        let mut after = after;
        loop {
            let page = scheduler.holding(after.as_ref(), 2).await.expect("holding");
            let Some(last) = page.last() else { return found };
            after = Some(last.subscription_id.clone());
            found.extend(page);
        }
    };
    assert_eq!(ours(all(None).await), subs, "paged two at a time, in id order");
    assert_eq!(ours(all(Some(subs[0].clone())).await), subs[1..].to_vec());
    scheduler.stop_holding(&subs[1]).await.expect("stop");
    scheduler.stop_holding(&subs[1]).await.expect("stopping twice is fine");
    assert_eq!(ours(all(None).await), vec![subs[0].clone(), subs[2].clone()]);
    let again = scheduled(&mut fx, t0() + minutes(30));
    scheduler.hold(&tenant, &subs[1], &again).await.expect("hold");
    assert_eq!(ours(all(None).await), subs, "a hold lists it again");
}

pub async fn the_scheduler_lease_is_one_holders_until_it_expires_or_is_given_back(b: &dyn ContractBackend) {
    let scheduler = b.scheduler();
    let (t, until) = (t0(), t0() + minutes(1));
    assert!(
        scheduler.take_lease("a", t, until).await.expect("take"),
        "free: a takes it"
    );
    assert!(!scheduler.take_lease("b", t, until).await.expect("take"), "held by a");
    assert!(
        scheduler.take_lease("a", t, until + minutes(1)).await.expect("take"),
        "its holder may take it again (longer)"
    );
    assert!(
        !scheduler
            .take_lease("b", until + minutes(1) - chrono::Duration::milliseconds(1), until)
            .await
            .expect("take"),
        "held until its new expiry"
    );
    scheduler.end_lease("b", t).await.expect("not b's: nothing changes");
    assert!(!scheduler.take_lease("b", t, until).await.expect("take"), "still a's");
    // Expired: anyone's (a tick that died holding it stops nobody for longer).
    assert!(scheduler
        .take_lease("b", until + minutes(1), until + minutes(2))
        .await
        .expect("take"));
    assert!(!scheduler
        .take_lease("a", until + minutes(1), until + minutes(3))
        .await
        .expect("take"));
    // Given back: free at once.
    scheduler.end_lease("b", until + minutes(1)).await.expect("end");
    assert!(scheduler
        .take_lease("a", until + minutes(1), until + minutes(3))
        .await
        .expect("take"));
}

pub async fn a_sealed_secret_shows_nothing_and_opens_only_for_its_own_subscription(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let keeper = b.secrets();
    let (tenant, other_tenant) = (fx.tenant().id, fx.tenant().id);
    let sub = SubscriptionId::generate(t0(), &mut fx.rng);
    let other_sub = SubscriptionId::generate(t0(), &mut fx.rng);
    let context = SecretContext::new;
    let secret = Secret::generate(&mut fx.rng);
    let sealed = keeper.seal(&secret, &context(&tenant, &sub)).await.expect("seal");
    let again = keeper.seal(&secret, &context(&tenant, &sub)).await.expect("seal");

    let key_b64 = secret.as_str().trim_start_matches(Secret::PREFIX);
    assert!(
        sealed.plain().is_none() && !sealed.as_str().contains(key_b64),
        "the envelope shows the secret"
    );
    assert_ne!(sealed, again, "two seals of one secret look alike");
    assert_eq!(
        keeper.open(&sealed, &context(&tenant, &sub)).await.expect("open"),
        secret
    );
    assert_eq!(
        keeper.open(&again, &context(&tenant, &sub)).await.expect("open"),
        secret
    );
    for (t, s) in [(&tenant, &other_sub), (&other_tenant, &sub)] {
        assert!(
            matches!(
                keeper.open(&sealed, &context(t, s)).await,
                Err(PortError::Permanent { .. })
            ),
            "opened under another subscription's context"
        );
    }
    // One character of its middle changed.
    let mut text = sealed.as_str().to_owned().into_bytes();
    let middle = text.len() * 2 / 3;
    text[middle] = if text[middle] == b'A' { b'B' } else { b'A' };
    let damaged = SealedSecret::envelope(String::from_utf8(text).expect("ASCII"));
    assert!(
        keeper.open(&damaged, &context(&tenant, &sub)).await.is_err(),
        "a damaged envelope opened"
    );
}

pub async fn a_sealed_header_value_shows_nothing_and_opens_only_for_its_own_header(b: &dyn ContractBackend) {
    let mut fx = Fixture::new();
    let keeper = b.secrets();
    let tenant = fx.tenant().id;
    let sub = SubscriptionId::generate(t0(), &mut fx.rng);
    let secret_context = SecretContext::new(&tenant, &sub);
    let header = secret_context.clone().with_header("X-Api-Key");
    assert_eq!(
        header.header.as_deref(),
        Some("x-api-key"),
        "a header's name is held lowercase"
    );
    let value = format!(
        "Bearer {}",
        Secret::generate(&mut fx.rng)
            .as_str()
            .trim_start_matches(Secret::PREFIX)
    );
    let sealed = keeper.seal_text(&value, &header).await.expect("seal");
    let again = keeper.seal_text(&value, &header).await.expect("seal");

    let token = value.trim_start_matches("Bearer ");
    assert!(
        sealed.plain().is_none() && !sealed.as_str().contains(token),
        "the envelope shows the header's value"
    );
    assert_ne!(sealed, again, "two seals of one value look alike");
    assert_eq!(keeper.open_text(&sealed, &header).await.expect("open"), value);
    assert_eq!(keeper.open_text(&again, &header).await.expect("open"), value);
    assert_eq!(
        keeper
            .open_text(&sealed, &secret_context.clone().with_header("x-api-key"))
            .await
            .expect("open"),
        value,
        "the header's name in another case is the same header"
    );
    for other in [
        secret_context.clone(),
        secret_context.clone().with_header("authorization"),
    ] {
        assert!(
            matches!(
                keeper.open_text(&sealed, &other).await,
                Err(PortError::Permanent { .. })
            ),
            "opened under {other:?}"
        );
    }
    assert!(
        matches!(keeper.open(&sealed, &header).await, Err(PortError::Permanent { .. })),
        "a header's value opened as a signing secret"
    );

    // A signing secret's envelope does not open as a header's value, and still opens as itself.
    let secret = Secret::generate(&mut fx.rng);
    let sealed_secret = keeper.seal(&secret, &secret_context).await.expect("seal");
    assert!(
        matches!(
            keeper.open_text(&sealed_secret, &header).await,
            Err(PortError::Permanent { .. })
        ),
        "a signing secret opened as a header's value"
    );
    assert_eq!(
        keeper.open_text(&sealed_secret, &secret_context).await.expect("open"),
        secret.as_str()
    );
    assert_eq!(
        keeper.open(&sealed_secret, &secret_context).await.expect("open"),
        secret
    );
}
