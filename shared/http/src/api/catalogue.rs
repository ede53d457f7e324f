//! The event-type catalogue: `POST/GET /v1/event-types`, `GET/PATCH /v1/event-types/{name}`.
//! A tenant's key (or its portal, to read) works on the tenant's catalogue, which includes the
//! deployment's types it does not define itself; an operator key works on the deployment's,
//! or on the tenant `Hookwise-Tenant` names.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use hookwise_core::model::{EventType, EventTypeDefinition, Tenant};
use hookwise_core::services::{Caller, Catalogue, EventTypePatch, NewEventType};
use serde::Serialize;

use super::error::{ApiError, ApiResult};
use super::extract::{acting_for, path_id, ApiJson, ApiQuery, Identified, PathId};
use super::handlers::{nonempty, parse_limit, PageParams};
use super::views::Page;
use super::ApiState;

/// An event type as the API shows it.
#[derive(Debug, Serialize)]
pub struct EventTypeView {
    pub name: EventType,
    /// `deployment` (the operator's, for every tenant), `tenant` (the tenant's own) or
    /// `hookwise` (Hookwise's own: its test ping and operational webhooks, in every catalogue).
    pub scope: &'static str,
    pub description: String,
    pub schema: Option<serde_json::Value>,
    pub example: Option<serde_json::Value>,
    pub validate: bool,
    pub deprecated: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<EventTypeDefinition> for EventTypeView {
    fn from(d: EventTypeDefinition) -> Self {
        let scope = match (&d.tenant_id, d.name.is_hookwise()) {
            (_, true) => "hookwise",
            (Some(_), false) => "tenant",
            (None, false) => "deployment",
        };
        Self {
            name: d.name,
            scope,
            description: d.description,
            schema: d.schema,
            example: d.example,
            validate: d.validate,
            deprecated: d.deprecated,
            created_at: d.created_at,
            updated_at: d.updated_at,
        }
    }
}

/// Whose catalogue the caller works on, and the tenant it acts for if any.
async fn catalogue_of(s: &ApiState, who: Identified) -> ApiResult<(Catalogue, Option<Tenant>, bool)> {
    let portal = matches!(who.caller, Caller::Portal { .. });
    if matches!(who.caller, Caller::Operator) && who.named.is_none() {
        return Ok((Catalogue::Deployment, None, false));
    }
    let tenant = acting_for(s, who.caller, who.named.as_ref()).await?;
    Ok((Catalogue::Tenant(tenant.id.clone()), Some(tenant), portal))
}

fn portal_cannot_define() -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "portal_cannot_define",
        "a portal session reads the catalogue; the sending service defines its types",
    )
}

pub async fn create_event_type(
    State(s): State<ApiState>,
    who: Identified,
    ApiJson(new): ApiJson<NewEventType>,
) -> ApiResult<(StatusCode, Json<EventTypeView>)> {
    let (catalogue, _, portal) = catalogue_of(&s, who).await?;
    if portal {
        return Err(portal_cannot_define());
    }
    let def = s.services.create_event_type(&catalogue, new).await?;
    Ok((StatusCode::CREATED, Json(def.into())))
}

pub async fn list_event_types(
    State(s): State<ApiState>,
    who: Identified,
    ApiQuery(params): ApiQuery<PageParams>,
) -> ApiResult<Json<Page<EventTypeView>>> {
    let (catalogue, _, _) = catalogue_of(&s, who).await?;
    let limit = parse_limit(params.limit)?;
    let after = nonempty(params.cursor)
        .map(|c| {
            EventType::parse(&c).map_err(|_| {
                ApiError::unprocessable(
                    "invalid_cursor",
                    format!("cursor `{c}` is not one this API returned: pass the `next_cursor` of a previous page"),
                )
            })
        })
        .transpose()?;
    let (defs, next) = s.services.list_event_types(&catalogue, after.as_ref(), limit).await?;
    Ok(Json(Page {
        data: defs.into_iter().map(EventTypeView::from).collect(),
        next_cursor: next.map(|n| n.to_string()),
    }))
}

pub async fn get_event_type(
    State(s): State<ApiState>,
    who: Identified,
    PathId(name): PathId,
) -> ApiResult<Json<EventTypeView>> {
    let name = path_id(&name, EventType::parse)?;
    let def = match catalogue_of(&s, who).await? {
        (_, Some(tenant), _) => s.services.event_type_for(&tenant, &name).await?,
        (_, None, _) => s.services.deployment_event_type(&name).await?,
    };
    Ok(Json(def.into()))
}

pub async fn update_event_type(
    State(s): State<ApiState>,
    who: Identified,
    PathId(name): PathId,
    ApiJson(patch): ApiJson<EventTypePatch>,
) -> ApiResult<Json<EventTypeView>> {
    let name = path_id(&name, EventType::parse)?;
    let (catalogue, _, portal) = catalogue_of(&s, who).await?;
    if portal {
        return Err(portal_cannot_define());
    }
    Ok(Json(
        s.services.update_event_type(&catalogue, &name, patch).await?.into(),
    ))
}
