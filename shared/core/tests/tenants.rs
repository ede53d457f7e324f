//! Many customer accounts behind one service: tenants an operator creates with ids of its
//! choosing, the operator's keys, and the percentage rollout of the retries flag.

use hookwise_core::model::*;
use hookwise_core::services::{Caller, KeyRef, NewEvent, NewSubscription, NewTenant, TenantPatch};
use hookwise_core::testing::memory::{Harness, ScriptedSender};
use hookwise_core::Error;

fn email(s: &str) -> Email {
    Email::parse(s).unwrap()
}

fn account(id: &str) -> NewTenant {
    NewTenant {
        id: Some(TenantId::parse(id).unwrap()),
        ..NewTenant::named(id, email("owner@example.com"))
    }
}

#[tokio::test]
async fn given_an_id_of_the_operators_choosing_then_the_tenant_has_it_once() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, key) = h.services.create_tenant(account("acct_123")).await.unwrap();
    assert_eq!(tenant.id.as_str(), "acct_123");
    assert_eq!(
        tenant.retries,
        RetriesSetting::Rollout,
        "a new tenant follows the rollout"
    );
    assert_eq!(h.services.authenticate(&key).await.unwrap().id, tenant.id);
    assert!(matches!(
        h.services.create_tenant(account("acct_123")).await,
        Err(Error::Conflict(m)) if m.contains("acct_123")
    ));
    let (generated, _) = h
        .services
        .create_tenant(NewTenant::named("Other", email("b@example.com")))
        .await
        .unwrap();
    assert!(generated.id.as_str().starts_with(TenantId::PREFIX));
}

#[tokio::test]
async fn given_an_operator_key_then_it_identifies_the_operator_until_revoked_and_rotates_with_two_valid() {
    let h = Harness::new(ScriptedSender::always(200));
    let (_, first) = h.services.create_operator_key().await.unwrap();
    assert!(first.starts_with("hwo_"));
    assert!(matches!(h.services.identify(&first).await, Ok(Caller::Operator)));
    // Not a tenant's key: the tenant routes' `authenticate` refuses it.
    assert!(matches!(
        h.services.authenticate(&first).await,
        Err(Error::Unauthorized)
    ));

    let (deployment, second) = h.services.create_operator_key().await.unwrap();
    assert_eq!(deployment.operator_keys.len(), 2);
    assert!(matches!(h.services.identify(&second).await, Ok(Caller::Operator)));
    assert!(matches!(h.services.identify(&first).await, Ok(Caller::Operator)));
    assert!(matches!(
        h.services.create_operator_key().await,
        Err(Error::Conflict(_))
    ));
    let stored = h.services.deployment().await.unwrap();
    assert!(
        stored
            .operator_keys
            .iter()
            .all(|k| k.hash.len() == 64 && !k.hash.contains(&first[4..])),
        "hashes only"
    );

    h.services
        .revoke_operator_key(&KeyRef::Key(first.clone()))
        .await
        .unwrap();
    assert!(matches!(h.services.identify(&first).await, Err(Error::Unauthorized)));
    assert!(matches!(h.services.identify(&second).await, Ok(Caller::Operator)));
    assert!(matches!(
        h.services.revoke_operator_key(&KeyRef::Key(first)).await,
        Err(Error::NotFound { .. })
    ));
    // A key made by another process works here at once, though this one keeps the settings
    // it read (a key found is kept; one not found is looked for again).
    let elsewhere = hookwise_core::services::Services::new(
        h.services.ports().clone(),
        hookwise_core::services::Config::default(),
        rand::SeedableRng::seed_from_u64(9),
    );
    h.services
        .revoke_operator_key(&KeyRef::Key(second.clone()))
        .await
        .unwrap();
    // (This process reads the settings, and keeps them.)
    assert!(matches!(h.services.identify(&second).await, Err(Error::Unauthorized)));
    let (_, third) = elsewhere.create_operator_key().await.unwrap();
    assert!(matches!(h.services.identify(&third).await, Ok(Caller::Operator)));
    // A made-up operator key is refused, as is junk.
    let made_up = format!("hwo_{}", "x".repeat(32));
    assert!(matches!(h.services.identify(&made_up).await, Err(Error::Unauthorized)));
    assert!(matches!(
        h.services.identify("hwo_short").await,
        Err(Error::Unauthorized)
    ));
}

#[tokio::test]
async fn given_a_disabled_tenant_then_its_key_is_forbidden_and_the_operator_cannot_act_for_it_until_enabled() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, key) = h.services.create_tenant(account("acct_9")).await.unwrap();
    let disable = TenantPatch {
        status: Some(TenantStatus::Disabled),
        ..TenantPatch::default()
    };
    h.services.update_tenant(&tenant.id, &disable).await.unwrap();
    assert!(matches!(
        h.services.identify(&key).await,
        Err(Error::Forbidden {
            code: "tenant_disabled",
            ..
        })
    ));
    assert!(matches!(
        h.services.tenant_for_operator(&tenant.id).await,
        Err(Error::Forbidden {
            code: "tenant_disabled",
            ..
        })
    ));
    let enable = TenantPatch {
        status: Some(TenantStatus::Active),
        ..TenantPatch::default()
    };
    h.services.update_tenant(&tenant.id, &enable).await.unwrap();
    assert_eq!(h.services.authenticate(&key).await.unwrap().id, tenant.id);
    let ghost = TenantId::parse("acct_nobody").unwrap();
    assert!(matches!(
        h.services.tenant_for_operator(&ghost).await,
        Err(Error::NotFound { what: "tenant", .. })
    ));
}

/// The rollout's plan: "internal accounts first, then 10 % of customers, then everyone". Raising the
/// percentage keeps in every tenant that was in; a tenant set on or off keeps its setting.
#[tokio::test]
async fn given_a_rollout_raised_from_10_to_50_percent_then_the_first_tenants_stay_in() {
    let h = Harness::new(ScriptedSender::always(200));
    let mut tenants = Vec::new();
    for i in 0..400 {
        tenants.push(h.services.create_tenant(account(&format!("acct_{i}"))).await.unwrap().0);
    }
    let internal = h
        .services
        .set_tenant_retries(&tenants[0].id, RetriesSetting::On)
        .await
        .unwrap();
    let opted_out = h
        .services
        .set_tenant_retries(&tenants[1].id, RetriesSetting::Off)
        .await
        .unwrap();
    tenants[0] = internal;
    tenants[1] = opted_out;

    let share = |percent: u8| {
        let h = &h;
        let tenants = &tenants;
        async move {
            h.services.set_retries_rollout(percent).await.unwrap();
            let mut on = Vec::new();
            for t in tenants {
                let effective = h.services.effective_retries(t).await.unwrap();
                assert_eq!(effective.rollout_percent, percent);
                if effective.enabled {
                    on.push(t.id.clone());
                }
            }
            on
        }
    };
    let at_0 = share(0).await;
    let at_10 = share(10).await;
    let at_50 = share(50).await;
    let at_100 = share(100).await;
    assert_eq!(at_0, vec![tenants[0].id.clone()], "at 0 %, only the one set on");
    assert!(
        (20..=60).contains(&at_10.len()),
        "about a tenth of 400: {}",
        at_10.len()
    );
    assert!((160..=240).contains(&at_50.len()), "about half of 400: {}", at_50.len());
    assert!(
        at_10.iter().all(|id| at_50.contains(id)),
        "10 % → 50 % keeps the first in"
    );
    assert_eq!(at_100.len(), 399, "everyone but the one set off");
    assert!(!at_100.contains(&tenants[1].id));
    let why = h.services.effective_retries(&tenants[2]).await.unwrap().why();
    assert!(why.contains("in the rollout"), "{why}");
}

/// The rollout decides what a failed attempt leads to: out of it, the first failure is
/// final; in it, the schedule goes on.
#[tokio::test]
async fn given_a_tenant_out_of_the_rollout_then_its_first_failure_is_final_and_in_it_it_is_retried() {
    let h = Harness::new(ScriptedSender::always(500));
    let (tenant, _) = h.services.create_tenant(account("acct_out")).await.unwrap();
    h.services.set_retries_rollout(0).await.unwrap();
    h.services
        .create_subscription(
            &tenant,
            NewSubscription {
                url: EndpointUrl::parse("https://a.example.com/").unwrap(),
                event_types: vec![EventTypeFilter::parse("*").unwrap()],
                owner_email: None,
                retry_policy: None,
                timeout_ms: None,
                rate_limit_per_second: None,
                auto_disable_after_hours: None,
                circuit_breaker: None,
                description: None,
                filter: None,
                headers: None,
            },
        )
        .await
        .unwrap();
    let event = || NewEvent {
        event_type: EventType::parse("invoice.paid").unwrap(),
        payload: serde_json::json!({}),
    };
    let out = h.services.ingest(&tenant, event(), None).await.unwrap();
    h.drain_now().await;
    let (delivery, _) = h.services.get_delivery(&tenant, &out.deliveries[0].id).await.unwrap();
    assert_eq!(delivery.status, DeliveryStatus::Dead, "out of the rollout: no retries");

    h.services.set_retries_rollout(100).await.unwrap();
    let ingested = h.services.ingest(&tenant, event(), None).await.unwrap();
    h.drain_now().await;
    let (delivery, _) = h
        .services
        .get_delivery(&tenant, &ingested.deliveries[0].id)
        .await
        .unwrap();
    assert_eq!(delivery.status, DeliveryStatus::Retrying, "in it: retried");
}
