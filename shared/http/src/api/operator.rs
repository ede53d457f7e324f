//! The operator routes: tenants (create with an id of the caller's choosing, list, read,
//! change, disable; their API keys), the retries rollout and the deployment's settings (who
//! hears operational webhooks, whether the catalogue is strict). An operator key only
//! (`extract::Operator`); a tenant's key gets 403. And `GET /v1/tenant`, any caller's view of
//! the tenant it acts for.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use hookwise_core::model::{Email, RetriesSetting, TenantId, TenantStatus};
use hookwise_core::services::{KeyRef, NewTenant, Services, TenantPatch};
use serde::Deserialize;

use super::error::{ApiError, ApiResult};
use super::extract::{path_id, ApiJson, ApiQuery, Authenticated, Operator, PathId, PathPair};
use super::handlers::{nonempty, parse_limit, PageParams};
use super::views::{CatalogueSettingsView, NewApiKeyView, OperationsView, Page, RolloutView, TenantView};
use super::ApiState;

/// `POST /v1/tenants`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewTenantBody {
    /// The caller's own account id (`acct_123`); none, one is made.
    id: Option<TenantId>,
    name: String,
    owner_email: Email,
    #[serde(default)]
    retries: RetriesSetting,
}

pub async fn create_tenant(
    State(s): State<ApiState>,
    _: Operator,
    ApiJson(body): ApiJson<NewTenantBody>,
) -> ApiResult<(StatusCode, Json<NewApiKeyView>)> {
    let new = NewTenant {
        id: body.id,
        name: body.name,
        owner_email: body.owner_email,
        retries: body.retries,
    };
    let (tenant, key) = s.services.create_tenant(new).await?;
    let deployment = s.services.deployment().await?;
    Ok((
        StatusCode::CREATED,
        Json(NewApiKeyView::new(TenantView::of(&tenant, &deployment), key)),
    ))
}

/// `GET /v1/tenant`: the tenant the caller acts for (its own, a portal's, or the one an
/// operator key names), with its retries as set and as they are, and why.
pub async fn current_tenant(
    State(s): State<ApiState>,
    Authenticated(tenant): Authenticated,
) -> ApiResult<Json<TenantView>> {
    Ok(Json(TenantView::of(&tenant, &s.services.deployment().await?)))
}

pub async fn list_tenants(
    State(s): State<ApiState>,
    _: Operator,
    ApiQuery(params): ApiQuery<PageParams>,
) -> ApiResult<Json<Page<TenantView>>> {
    let limit = match parse_limit(params.limit)? {
        0 => Services::DEFAULT_PAGE,
        n => n,
    };
    let after = nonempty(params.cursor)
        .map(|c| {
            TenantId::parse(&c).map_err(|_| {
                ApiError::unprocessable(
                    "invalid_cursor",
                    format!("cursor `{c}` is not one this API returned: pass the `next_cursor` of a previous page"),
                )
            })
        })
        .transpose()?;
    let (tenants, deployment) = (
        s.services.list_tenants(after.as_ref(), limit).await?,
        s.services.deployment().await?,
    );
    let next_cursor = (tenants.len() == limit as usize)
        .then(|| tenants.last().map(|t| t.id.to_string()))
        .flatten();
    Ok(Json(Page {
        data: tenants.iter().map(|t| TenantView::of(t, &deployment)).collect(),
        next_cursor,
    }))
}

pub async fn get_tenant(State(s): State<ApiState>, _: Operator, PathId(id): PathId) -> ApiResult<Json<TenantView>> {
    let id = path_id(&id, TenantId::parse)?;
    let (tenant, deployment) = (s.services.tenant(&id).await?, s.services.deployment().await?);
    Ok(Json(TenantView::of(&tenant, &deployment)))
}

/// `PATCH /v1/tenants/{id}`: each field given is changed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantPatchBody {
    name: Option<String>,
    owner_email: Option<Email>,
    retries: Option<RetriesSetting>,
    status: Option<TenantStatus>,
}

pub async fn update_tenant(
    State(s): State<ApiState>,
    _: Operator,
    PathId(id): PathId,
    ApiJson(body): ApiJson<TenantPatchBody>,
) -> ApiResult<Json<TenantView>> {
    let id = path_id(&id, TenantId::parse)?;
    let patch = TenantPatch {
        name: body.name,
        owner_email: body.owner_email,
        retries: body.retries,
        status: body.status,
    };
    let tenant = s.services.update_tenant(&id, &patch).await?;
    Ok(Json(TenantView::of(&tenant, &s.services.deployment().await?)))
}

/// `POST /v1/tenants/{id}/api-keys`: a key beside the current one (a rotation; both work
/// until one is revoked). Shown once.
pub async fn create_tenant_key(
    State(s): State<ApiState>,
    _: Operator,
    PathId(id): PathId,
) -> ApiResult<(StatusCode, Json<NewApiKeyView>)> {
    let id = path_id(&id, TenantId::parse)?;
    let (tenant, key) = s.services.rotate_api_key(&id).await?;
    let deployment = s.services.deployment().await?;
    Ok((
        StatusCode::CREATED,
        Json(NewApiKeyView::new(TenantView::of(&tenant, &deployment), key)),
    ))
}

/// `DELETE /v1/tenants/{id}/api-keys/{key_id}`: the key answers 401 from now on (within
/// 30 s on a warm process that used it).
pub async fn revoke_tenant_key(
    State(s): State<ApiState>,
    _: Operator,
    PathPair(id, key_id): PathPair,
) -> ApiResult<Json<TenantView>> {
    let id = path_id(&id, TenantId::parse)?;
    let tenant = s.services.revoke_api_key(&id, &KeyRef::Id(key_id)).await?;
    Ok(Json(TenantView::of(&tenant, &s.services.deployment().await?)))
}

pub async fn get_rollout(State(s): State<ApiState>, _: Operator) -> ApiResult<Json<RolloutView>> {
    Ok(Json(RolloutView::of(&s.services.deployment().await?)))
}

/// `PUT /v1/rollout`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutBody {
    retries_percent: u8,
}

pub async fn set_rollout(
    State(s): State<ApiState>,
    _: Operator,
    ApiJson(body): ApiJson<RolloutBody>,
) -> ApiResult<Json<RolloutView>> {
    Ok(Json(RolloutView::of(
        &s.services.set_retries_rollout(body.retries_percent).await?,
    )))
}

pub async fn get_operations(State(s): State<ApiState>, _: Operator) -> ApiResult<Json<OperationsView>> {
    Ok(Json(OperationsView::of(&s.services.deployment().await?)))
}

/// `PUT /v1/operational-webhooks`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperationsBody {
    /// Required, `null` included: `{}` is a mistake, not a way to turn it off.
    #[serde(deserialize_with = "required_nullable")]
    tenant_id: Option<TenantId>,
}

/// A field that must be present, and may be `null` (serde's own `Option` may be absent).
fn required_nullable<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<TenantId>, D::Error> {
    Option::deserialize(d)
}

pub async fn set_operations(
    State(s): State<ApiState>,
    _: Operator,
    ApiJson(body): ApiJson<OperationsBody>,
) -> ApiResult<Json<OperationsView>> {
    Ok(Json(OperationsView::of(
        &s.services.set_operations_tenant(body.tenant_id).await?,
    )))
}

pub async fn get_catalogue_settings(State(s): State<ApiState>, _: Operator) -> ApiResult<Json<CatalogueSettingsView>> {
    Ok(Json(CatalogueSettingsView::of(&s.services.deployment().await?)))
}

/// `PUT /v1/catalogue`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogueSettingsBody {
    strict: bool,
}

pub async fn set_catalogue_settings(
    State(s): State<ApiState>,
    _: Operator,
    ApiJson(body): ApiJson<CatalogueSettingsBody>,
) -> ApiResult<Json<CatalogueSettingsView>> {
    Ok(Json(CatalogueSettingsView::of(
        &s.services.set_strict_catalogue(body.strict).await?,
    )))
}
