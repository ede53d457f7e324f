//! One small function per route: authenticate, parse, call the service, shape the answer.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use std::collections::HashMap;

use hookwise_core::model::{DeliveryId, DeliveryStatus, EventId, EventType, SubscriptionId, Tenant, TenantId};
use hookwise_core::ports::DeliveryQuery;
use hookwise_core::services::{Caller, NewEvent, NewSubscription, Services, SubscriptionPatch, MAX_BATCH};
use hookwise_core::stats::Window;
use serde::Deserialize;

use super::error::{ApiError, ApiResult};
use super::extract::{self, path_id, ApiJson, ApiQuery, Authenticated, Identified, OptionalJson, PathId};
use super::views::*;
use super::ApiState;

pub async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

pub async fn no_route(uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route for `{}`", uri.path()))
}

pub async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("`{method} {}` is not supported", uri.path()),
    )
}

// Subscriptions

pub async fn create_subscription(
    State(s): State<ApiState>,
    Authenticated(tenant): Authenticated,
    ApiJson(new): ApiJson<NewSubscription>,
) -> ApiResult<(StatusCode, Json<SubscriptionView>)> {
    let sub = s.services.create_subscription(&tenant, new).await?;
    Ok((StatusCode::CREATED, Json(SubscriptionView::with_secret(sub))))
}

#[derive(Debug, Default, Deserialize)]
pub struct PageParams {
    pub(super) limit: Option<String>,
    pub(super) cursor: Option<String>,
}

pub async fn list_subscriptions(
    State(s): State<ApiState>,
    Authenticated(tenant): Authenticated,
    ApiQuery(params): ApiQuery<PageParams>,
) -> ApiResult<Json<Page<SubscriptionSummary>>> {
    let limit = parse_limit(params.limit)?;
    let page = s
        .services
        .list_subscriptions(&tenant, limit, nonempty(params.cursor).as_deref())
        .await?;
    let mut data = Vec::with_capacity(page.items.len());
    for sub in page.items {
        match s.services.subscription_overview(&tenant, &sub.id).await {
            Ok(overview) => data.push(overview.into()),
            // Deleted since it was listed: it is simply no longer there.
            Err(hookwise_core::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Json(Page {
        data,
        next_cursor: page.next_cursor,
    }))
}

/// An empty query parameter is as good as none.
pub(super) fn nonempty(v: Option<String>) -> Option<String> {
    v.filter(|s| !s.is_empty())
}

/// A page size, 1 to `MAX_PAGE`; 0 (none given) means the service's default.
pub(super) fn parse_limit(limit: Option<String>) -> ApiResult<u32> {
    let Some(l) = nonempty(limit) else { return Ok(0) };
    l.parse::<u32>()
        .ok()
        .filter(|n| (1..=Services::MAX_PAGE).contains(n))
        .ok_or_else(|| {
            ApiError::unprocessable(
                "invalid_limit",
                format!("limit must be an integer from 1 to {} (got `{l}`)", Services::MAX_PAGE),
            )
        })
}

pub async fn get_subscription(
    State(s): State<ApiState>,
    Authenticated(tenant): Authenticated,
    PathId(id): PathId,
) -> ApiResult<Json<SubscriptionSummary>> {
    let id = path_id(&id, SubscriptionId::parse)?;
    Ok(Json(s.services.subscription_overview(&tenant, &id).await?.into()))
}

pub async fn update_subscription(
    State(s): State<ApiState>,
    Authenticated(tenant): Authenticated,
    PathId(id): PathId,
    ApiJson(patch): ApiJson<SubscriptionPatch>,
) -> ApiResult<Json<SubscriptionView>> {
    let id = path_id(&id, SubscriptionId::parse)?;
    Ok(Json(SubscriptionView::public(
        s.services.update_subscription(&tenant, &id, patch).await?,
    )))
}

pub async fn delete_subscription(
    State(s): State<ApiState>,
    Authenticated(tenant): Authenticated,
    PathId(id): PathId,
) -> ApiResult<StatusCode> {
    let id = path_id(&id, SubscriptionId::parse)?;
    s.services.delete_subscription(&tenant, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn rotate_secret(
    State(s): State<ApiState>,
    Authenticated(tenant): Authenticated,
    PathId(id): PathId,
) -> ApiResult<Json<SubscriptionView>> {
    let id = path_id(&id, SubscriptionId::parse)?;
    Ok(Json(SubscriptionView::with_secret(
        s.services.rotate_secret(&tenant, &id).await?,
    )))
}

/// `POST /v1/subscriptions/{id}/test`: no body, or `{}`, sends a `hookwise.ping`;
/// `{"type"}` that type's example in the catalogue; `{"type", "payload"}` that event; to this
/// subscription alone, whichever.
pub async fn send_test(
    State(s): State<ApiState>,
    who: Identified,
    PathId(id): PathId,
    OptionalJson(test): OptionalJson<TestSend>,
) -> ApiResult<(StatusCode, Json<AcceptedEvent>)> {
    let id = path_id(&id, SubscriptionId::parse)?;
    let test = test.unwrap_or_default();
    // A portal session sends what Hookwise or the catalogue wrote, never a payload of its own.
    if matches!(who.caller, Caller::Portal { .. }) && test.payload.is_some() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "portal_cannot_send",
            "a portal session sends a ping or a type's example from the catalogue, not a payload of its own",
        ));
    }
    let tenant = extract::acting_for(&s, who.caller, who.named.as_ref()).await?;
    let sent = s
        .services
        .send_test(&tenant, &id, test.event_type, test.payload)
        .await?;
    Ok((StatusCode::ACCEPTED, Json(AcceptedEvent::from(&sent))))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestSend {
    #[serde(rename = "type")]
    event_type: Option<EventType>,
    payload: Option<serde_json::Value>,
}

/// A POST, though it changes nothing: a reveal is an act (logged; on AWS a KMS Decrypt in
/// CloudTrail), never cached, and a read-only portal session may not make it.
pub async fn reveal_secret(
    State(s): State<ApiState>,
    Authenticated(tenant): Authenticated,
    PathId(id): PathId,
) -> ApiResult<Json<SubscriptionView>> {
    let id = path_id(&id, SubscriptionId::parse)?;
    Ok(Json(SubscriptionView::with_secret(
        s.services.reveal_secret(&tenant, &id).await?,
    )))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recover {
    /// Parsed here rather than by serde, whose chrono errors say only "invalid characters".
    since: String,
}

pub async fn recover_subscription(
    State(s): State<ApiState>,
    Authenticated(tenant): Authenticated,
    PathId(id): PathId,
    ApiJson(body): ApiJson<Recover>,
) -> ApiResult<(StatusCode, Json<Replayed>)> {
    let id = path_id(&id, SubscriptionId::parse)?;
    let since = parse_since(&body.since)?;
    let replayed = s.services.recover_subscription(&tenant, &id, since).await?;
    Ok(replayed_response(replayed))
}

/// `GET /v1/subscriptions/{id}/recover?since=`: how many a recover from then would replay.
pub async fn preview_recover(
    State(s): State<ApiState>,
    Authenticated(tenant): Authenticated,
    PathId(id): PathId,
    ApiQuery(query): ApiQuery<Recover>,
) -> ApiResult<Json<serde_json::Value>> {
    let id = path_id(&id, SubscriptionId::parse)?;
    let since = parse_since(&query.since)?;
    let dead = s.services.dead_since(&tenant, &id, since).await?;
    Ok(Json(serde_json::json!({"would_replay": dead.len()})))
}

/// `GET /v1/subscriptions/{id}/stats?window=`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatsQuery {
    window: Option<String>,
}

/// `GET /v1/subscriptions/{id}/stats?window=1h|24h|7d` (24h by default): the endpoint's
/// attempts by outcome, success rate, latency percentiles and dead deliveries, with a series.
pub async fn subscription_stats(
    State(s): State<ApiState>,
    Authenticated(tenant): Authenticated,
    PathId(id): PathId,
    ApiQuery(query): ApiQuery<StatsQuery>,
) -> ApiResult<Json<StatsView>> {
    let id = path_id(&id, SubscriptionId::parse)?;
    let window = Window::parse(query.window.as_deref().unwrap_or("24h")).map_err(hookwise_core::Error::from)?;
    let summary = s.services.subscription_stats(&tenant, &id, window).await?;
    Ok(Json(StatsView::of(&id, &summary)))
}

fn parse_since(since: &str) -> ApiResult<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(since)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            ApiError::unprocessable(
                "invalid_since",
                format!("since `{since}` is not an RFC 3339 time such as 2026-01-31T00:00:00Z ({e})"),
            )
        })
}

// Events

pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

pub async fn ingest_event(
    State(s): State<ApiState>,
    Authenticated(tenant): Authenticated,
    headers: HeaderMap,
    ApiJson(new): ApiJson<NewEvent>,
) -> ApiResult<Response> {
    let key = match headers.get(IDEMPOTENCY_KEY) {
        None => None,
        Some(v) => Some(v.to_str().map(str::to_owned).map_err(|_| {
            ApiError::unprocessable("invalid_idempotency_key", "Idempotency-Key must be visible ASCII")
        })?),
    };
    let ingested = s.services.ingest(&tenant, new, key).await?;
    let mut response = (StatusCode::ACCEPTED, Json(AcceptedEvent::from(&ingested))).into_response();
    if !ingested.created {
        // The key named an event already accepted: nothing new was written.
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Batch {
    /// Parsed one by one: an invalid event fails alone.
    events: Vec<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchEvent {
    #[serde(rename = "type")]
    event_type: EventType,
    payload: serde_json::Value,
    idempotency_key: Option<String>,
    /// With an operator key: the tenant this event is for (else the one `Hookwise-Tenant`
    /// names). A tenant's key may name only its own.
    tenant: Option<TenantId>,
}

/// Up to [`MAX_BATCH`] events, each for its own tenant if the caller is the operator: each
/// result keeps its event's place and names its tenant, and an event that fails (invalid, a
/// tenant unknown or not the caller's) fails alone.
pub async fn ingest_batch(
    State(s): State<ApiState>,
    Identified { caller, named }: Identified,
    ApiJson(batch): ApiJson<Batch>,
) -> ApiResult<(StatusCode, Json<AcceptedBatch>)> {
    if batch.events.is_empty() || batch.events.len() > MAX_BATCH {
        return Err(ApiError::unprocessable(
            "invalid_batch",
            format!("`events` holds 1 to {MAX_BATCH} events (got {})", batch.events.len()),
        ));
    }
    // Each event parsed, and its tenant found (once per tenant named). The header's tenant is
    // the request's: one the caller may not act for refuses the whole request.
    let mut tenants: HashMap<Option<TenantId>, Result<Tenant, ApiError>> = HashMap::new();
    if let Some(header) = &named {
        let found = extract::acting_for(&s, caller.clone(), Some(header)).await?;
        tenants.insert(Some(header.clone()), Ok(found));
    }
    let mut parsed = Vec::with_capacity(batch.events.len());
    for (i, value) in batch.events.into_iter().enumerate() {
        let e = match extract::parse_value::<BatchEvent>(value, "an event") {
            Ok(e) => e,
            Err(mut e) => {
                e.message = format!("events[{i}]: {}", e.message);
                parsed.push(Err((None, e)));
                continue;
            }
        };
        let wanted = e.tenant.clone().or_else(|| named.clone());
        if !tenants.contains_key(&wanted) {
            let found = extract::acting_for(&s, caller.clone(), wanted.as_ref()).await;
            tenants.insert(wanted.clone(), found);
        }
        match &tenants[&wanted] {
            Ok(tenant) => parsed.push(Ok((tenant.clone(), e))),
            Err(err) => parsed.push(Err((wanted, err.clone()))),
        }
    }
    // One call of the service per tenant, its events in order; each result back in place.
    let mut results: Vec<Option<BatchResult>> = Vec::with_capacity(parsed.len());
    let mut groups: Vec<(Tenant, Vec<(usize, BatchEvent)>)> = Vec::new();
    for (i, item) in parsed.into_iter().enumerate() {
        match item {
            Ok((tenant, e)) => {
                results.push(None);
                match groups.iter_mut().find(|(t, _)| t.id == tenant.id) {
                    Some((_, group)) => group.push((i, e)),
                    None => groups.push((tenant, vec![(i, e)])),
                }
            }
            Err((tenant, err)) => results.push(Some(BatchResult::failed(err, tenant))),
        }
    }
    let one_tenant = groups.len() == 1;
    for (tenant, group) in groups {
        let tenant = &tenant;
        let (places, events): (Vec<usize>, Vec<_>) = group
            .into_iter()
            .map(|(i, e)| {
                let new = NewEvent {
                    event_type: e.event_type,
                    payload: e.payload,
                };
                (i, (new, e.idempotency_key))
            })
            .unzip();
        match s.services.ingest_batch(tenant, events).await {
            Ok(ingested) => {
                for (i, result) in places.into_iter().zip(ingested) {
                    results[i] = Some(match result {
                        Ok(i) => BatchResult::Accepted {
                            event: AcceptedEvent::from(&i),
                            replayed: !i.created,
                            tenant: tenant.id.clone(),
                        },
                        Err(e) => BatchResult::failed(e.into(), Some(tenant.id.clone())),
                    });
                }
            }
            // One tenant's batch fails as a whole, as before tenants could share one.
            Err(e) if one_tenant => return Err(e.into()),
            // This tenant's events fail together (each worth sending again, with its key).
            Err(e) => {
                let err = ApiError::from(e);
                for i in places {
                    results[i] = Some(BatchResult::failed(err.clone(), Some(tenant.id.clone())));
                }
            }
        }
    }
    let results: Vec<BatchResult> = results
        .into_iter()
        .map(|r| r.expect("a result for every event"))
        .collect();
    let accepted = results
        .iter()
        .filter(|r| matches!(r, BatchResult::Accepted { .. }))
        .count();
    let body = AcceptedBatch {
        accepted,
        failed: results.len() - accepted,
        results,
    };
    Ok((StatusCode::ACCEPTED, Json(body)))
}

pub async fn get_event(
    State(s): State<ApiState>,
    Authenticated(tenant): Authenticated,
    PathId(id): PathId,
) -> ApiResult<Json<EventView>> {
    let id = path_id(&id, EventId::parse)?;
    let found = s.services.get_event(&tenant, &id).await?;
    Ok(Json(EventView {
        id: found.event.id,
        event_type: found.event.event_type,
        payload: found.event.payload,
        idempotency_key: found.event.idempotency_key,
        test: found.event.test,
        created_at: found.event.created_at,
        deliveries: found.deliveries.into_iter().map(DeliveryView::from).collect(),
    }))
}

pub async fn replay_event(
    State(s): State<ApiState>,
    Authenticated(tenant): Authenticated,
    PathId(id): PathId,
) -> ApiResult<(StatusCode, Json<Replayed>)> {
    let id = path_id(&id, EventId::parse)?;
    Ok(replayed_response(s.services.replay_event(&tenant, &id).await?))
}

fn replayed_response(replayed: Vec<hookwise_core::model::Delivery>) -> (StatusCode, Json<Replayed>) {
    (
        StatusCode::ACCEPTED,
        Json(Replayed {
            replayed: replayed.into_iter().map(DeliveryView::from).collect(),
        }),
    )
}

// Deliveries

#[derive(Debug, Default, Deserialize)]
pub struct DeliveryListParams {
    status: Option<String>,
    subscription_id: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

impl DeliveryListParams {
    fn into_query(self) -> ApiResult<DeliveryQuery> {
        let limit = parse_limit(self.limit)?;
        Ok(DeliveryQuery {
            status: nonempty(self.status)
                .map(|s| DeliveryStatus::parse(&s))
                .transpose()
                .map_err(hookwise_core::Error::from)?,
            subscription_id: nonempty(self.subscription_id)
                .map(|s| SubscriptionId::parse(&s))
                .transpose()
                .map_err(hookwise_core::Error::from)?,
            limit,
            cursor: nonempty(self.cursor),
        })
    }
}

pub async fn list_deliveries(
    State(s): State<ApiState>,
    Authenticated(tenant): Authenticated,
    ApiQuery(params): ApiQuery<DeliveryListParams>,
) -> ApiResult<Json<Page<DeliveryView>>> {
    let query = params.into_query()?;
    let page = s.services.list_deliveries(&tenant, query).await?;
    Ok(Json(Page {
        data: page.items.into_iter().map(DeliveryView::from).collect(),
        next_cursor: page.next_cursor,
    }))
}

pub async fn get_delivery(
    State(s): State<ApiState>,
    Authenticated(tenant): Authenticated,
    PathId(id): PathId,
) -> ApiResult<Json<DeliveryDetail>> {
    let id = path_id(&id, DeliveryId::parse)?;
    let (delivery, attempts) = s.services.get_delivery(&tenant, &id).await?;
    let headers = s.services.attempt_headers(&delivery, &attempts).await?;
    let mut headers = headers.map(Vec::into_iter);
    Ok(Json(DeliveryDetail {
        delivery: delivery.into(),
        attempts: attempts
            .into_iter()
            .map(|a| AttemptView {
                request_headers: headers
                    .as_mut()
                    .and_then(Iterator::next)
                    .map(|h| h.into_iter().collect()),
                ..AttemptView::from(a)
            })
            .collect(),
    }))
}

pub async fn replay_delivery(
    State(s): State<ApiState>,
    Authenticated(tenant): Authenticated,
    PathId(id): PathId,
) -> ApiResult<(StatusCode, Json<DeliveryView>)> {
    let id = path_id(&id, DeliveryId::parse)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(s.services.replay_delivery(&tenant, &id).await?.into()),
    ))
}
