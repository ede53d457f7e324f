//! The event-type catalogue: types defined for the whole deployment (by the operator) or by a
//! tenant for itself, each with a description, and optionally a JSON Schema (draft 2020-12)
//! of its payload and an example. An event of a type whose schema is validated must match it
//! to be accepted. A warm process compiles each schema once and keeps it as it keeps
//! subscriptions (`Config::lookup_ttl`), including that a type has no definition.

use std::sync::Arc;

use serde::Deserialize;

use super::Services;
use crate::error::{Error, PortError, Result, ValidationError};
use crate::model::{EventType, EventTypeDefinition, EventTypeFilter, Tenant, TenantId, HOOKWISE_PREFIX};

/// A schema's JSON, and an example's, at most: a page of 100 types stays well under a Lambda
/// response's 6 MB, and a definition under a DynamoDB item's 400 KB.
pub const MAX_SCHEMA_BYTES: usize = 16 * 1024;
pub const MAX_EXAMPLE_BYTES: usize = 16 * 1024;
pub const MAX_TYPE_DESCRIPTION_LEN: usize = 1000;
/// The most errors one refused payload reports.
const MAX_REPORTED: usize = 5;

/// `POST /v1/event-types`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewEventType {
    pub name: EventType,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub schema: Option<serde_json::Value>,
    #[serde(default)]
    pub example: Option<serde_json::Value>,
    /// Whether events must match the schema (when there is one); on unless `false`.
    #[serde(default = "yes")]
    pub validate: bool,
    #[serde(default)]
    pub deprecated: bool,
}

fn yes() -> bool {
    true
}

/// `PATCH /v1/event-types/{name}`: only the fields present change; `null` removes the schema
/// or the example.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventTypePatch {
    pub description: Option<String>,
    #[serde(default, deserialize_with = "super::subscriptions::present")]
    pub schema: Option<Option<serde_json::Value>>,
    #[serde(default, deserialize_with = "super::subscriptions::present")]
    pub example: Option<Option<serde_json::Value>>,
    pub validate: Option<bool>,
    pub deprecated: Option<bool>,
}

/// Whose catalogue a call reads or writes: a tenant's own, or the deployment's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Catalogue {
    Deployment,
    Tenant(TenantId),
}

impl Catalogue {
    fn tenant(&self) -> Option<&TenantId> {
        match self {
            Self::Deployment => None,
            Self::Tenant(t) => Some(t),
        }
    }
}

/// A definition as the events of one tenant meet it: only what checking a payload needs
/// (the schema compiled), not its example or description, so the cache stays small.
pub(super) struct Resolved {
    validator: Option<jsonschema::Validator>,
}

impl Services {
    /// Define a type in `catalogue`. 409 if it has one of that name.
    pub async fn create_event_type(&self, catalogue: &Catalogue, new: NewEventType) -> Result<EventTypeDefinition> {
        if new.name.is_hookwise() {
            return Err(reserved(&new.name).into());
        }
        let now = self.now();
        let def = EventTypeDefinition {
            name: new.name,
            tenant_id: catalogue.tenant().cloned(),
            description: new.description,
            schema: new.schema,
            example: new.example,
            validate: new.validate,
            deprecated: new.deprecated,
            created_at: now,
            updated_at: now,
        };
        check_definition(&def)?;
        match self.ports.store.put_event_type(&def, None).await {
            Ok(()) => {}
            Err(PortError::ConditionFailed(_)) => {
                return Err(Error::conflict(format!(
                    "event type `{}` is defined already: change it with PATCH",
                    def.name
                )))
            }
            Err(e) => return Err(e.into()),
        }
        self.forget_event_types();
        Ok(def)
    }

    /// Change a type of `catalogue` (not one it inherits from the deployment's).
    pub async fn update_event_type(
        &self,
        catalogue: &Catalogue,
        name: &EventType,
        patch: EventTypePatch,
    ) -> Result<EventTypeDefinition> {
        if name.is_hookwise() {
            return Err(reserved(name).into());
        }
        let mut def = self
            .ports
            .store
            .event_type(catalogue.tenant(), name)
            .await?
            .ok_or_else(|| Error::not_found("event type", name))?;
        let read_at = def.updated_at;
        if let Some(d) = patch.description {
            def.description = d;
        }
        if let Some(schema) = patch.schema {
            def.schema = schema;
        }
        if let Some(example) = patch.example {
            def.example = example;
        }
        if let Some(v) = patch.validate {
            def.validate = v;
        }
        if let Some(d) = patch.deprecated {
            def.deprecated = d;
        }
        def.updated_at = super::subscriptions::next_version(read_at, self.now());
        check_definition(&def)?;
        match self.ports.store.put_event_type(&def, Some(read_at)).await {
            Ok(()) => {}
            Err(PortError::ConditionFailed(_)) => {
                return Err(Error::conflict(format!(
                    "event type `{name}` changed while this change was made: read it again"
                )))
            }
            Err(e) => return Err(e.into()),
        }
        self.forget_event_types();
        Ok(def)
    }

    /// A type as `tenant`'s events meet it: its own definition, else the deployment's.
    pub async fn event_type_for(&self, tenant: &Tenant, name: &EventType) -> Result<EventTypeDefinition> {
        self.definition_met(&tenant.id, name)
            .await?
            .ok_or_else(|| Error::not_found("event type", name))
    }

    /// The definition `tenant`'s events of this type meet: Hookwise's own, its own, else the
    /// deployment's.
    async fn definition_met(&self, tenant: &TenantId, name: &EventType) -> Result<Option<EventTypeDefinition>> {
        if name.is_hookwise() {
            return Ok(super::builtin_event_type(name));
        }
        match self.ports.store.event_type(Some(tenant), name).await? {
            Some(own) => Ok(Some(own)),
            None => Ok(self.ports.store.event_type(None, name).await?),
        }
    }

    /// Refuse a subscription to a type that does not exist: 422 `unknown_event_type`, naming
    /// each. Under `hookwise.` only Hookwise's own exist; in a strict catalogue
    /// (`Deployment::strict_catalogue`) only the types `tenant`'s catalogue defines. A pattern
    /// (`*`, `invoice.*`) names types to come, and is not checked.
    pub(super) async fn check_subscribed_types(&self, tenant: &TenantId, filters: &[EventTypeFilter]) -> Result<()> {
        let strict = self.kept_deployment().await?.strict_catalogue;
        let mut unknown = Vec::new();
        for name in filters.iter().filter_map(EventTypeFilter::exact) {
            let known = if name.is_hookwise() {
                super::builtin_event_type(&name).is_some()
            } else {
                !strict || self.definition_met(tenant, &name).await?.is_some()
            };
            if !known {
                unknown.push(format!("`{name}`"));
            }
        }
        if unknown.is_empty() {
            return Ok(());
        }
        let how = match strict {
            true => "the catalogue is strict: define a type first (POST /v1/event-types)",
            false => "Hookwise's own types are listed by GET /v1/event-types",
        };
        Err(ValidationError::new(
            "unknown_event_type",
            format!("the catalogue does not define {}; {how}", unknown.join(", ")),
        )
        .into())
    }

    /// A type of the deployment's catalogue.
    pub async fn deployment_event_type(&self, name: &EventType) -> Result<EventTypeDefinition> {
        if name.is_hookwise() {
            return super::builtin_event_type(name).ok_or_else(|| Error::not_found("event type", name));
        }
        self.ports
            .store
            .event_type(None, name)
            .await?
            .ok_or_else(|| Error::not_found("event type", name))
    }

    /// A page of `catalogue` in name order, after `after`; a tenant's includes the
    /// deployment's types it does not define itself. `limit` 0 means 50; at most 100.
    pub async fn list_event_types(
        &self,
        catalogue: &Catalogue,
        after: Option<&EventType>,
        limit: u32,
    ) -> Result<(Vec<EventTypeDefinition>, Option<EventType>)> {
        if limit > Self::MAX_PAGE {
            return Err(ValidationError::new("invalid_limit", format!("limit must be 1 to {}", Self::MAX_PAGE)).into());
        }
        let limit = if limit == 0 { Self::DEFAULT_PAGE } else { limit };
        let mut own = self
            .ports
            .store
            .list_event_types(catalogue.tenant(), after, limit)
            .await?;
        let mut shared = match catalogue {
            // The deployment's, merged by name: the tenant's own win.
            Catalogue::Tenant(_) => self.ports.store.list_event_types(None, after, limit).await?,
            Catalogue::Deployment => Vec::new(),
        };
        // And Hookwise's own, in every catalogue (no one else may define them).
        shared.extend(
            super::builtin_event_types()
                .into_iter()
                .filter(|d| after.is_none_or(|a| &d.name > a)),
        );
        for def in shared {
            if !own.iter().any(|o| o.name == def.name) {
                own.push(def);
            }
        }
        own.sort_by(|a, b| a.name.cmp(&b.name));
        own.truncate(limit as usize);
        let next = (own.len() == limit as usize)
            .then(|| own.last().map(|d| d.name.clone()))
            .flatten();
        Ok((own, next))
    }

    /// Refuse `payload` if its type's definition (the tenant's, else the deployment's) has a
    /// schema it does not match and validation on: 422 `payload_invalid`, naming where (a
    /// JSON Pointer into the payload) and which keyword failed.
    pub(super) async fn check_payload(
        &self,
        tenant: &TenantId,
        event_type: &EventType,
        payload: &serde_json::Value,
    ) -> Result<()> {
        let Some(resolved) = self.kept_event_type(tenant, event_type).await? else {
            return Ok(());
        };
        let Some(validator) = resolved.validator.as_ref() else {
            return Ok(());
        };
        let errors: Vec<String> = validator
            .iter_errors(payload)
            .take(MAX_REPORTED)
            .map(|e| {
                format!(
                    "`{}`: {} (keyword `{}`)",
                    pointer(&e.instance_path().to_string()),
                    e,
                    e.kind().keyword()
                )
            })
            .collect();
        if errors.is_empty() {
            return Ok(());
        }
        Err(ValidationError::new(
            "payload_invalid",
            format!(
                "the payload does not match the schema of `{event_type}` in the catalogue: {}",
                errors.join("; ")
            ),
        )
        .into())
    }

    /// Read and keep the definitions `tenant`'s events of these types meet, a few at once, so
    /// that a batch of many types waits for one round of reads, not one per type.
    pub(super) async fn read_event_types(
        &self,
        tenant: &TenantId,
        types: std::collections::HashSet<&EventType>,
    ) -> Result<()> {
        use futures::StreamExt;
        const AT_ONCE: usize = 8;
        let reads: Vec<_> = types.into_iter().map(|t| self.kept_event_type(tenant, t)).collect();
        let read: Vec<Result<_>> = futures::stream::iter(reads).buffer_unordered(AT_ONCE).collect().await;
        read.into_iter().try_for_each(|r| r.map(drop))
    }

    /// The definition `tenant`'s events of this type meet, compiled, or none: as kept for
    /// the lookups' time to live, or read (the tenant's, then the deployment's) and compiled.
    async fn kept_event_type(&self, tenant: &TenantId, name: &EventType) -> Result<Option<Arc<Resolved>>> {
        let key = (tenant.clone(), name.clone());
        if let Some(kept) = self.lookups.event_types.get(&key, self.kept_after()) {
            return Ok(kept);
        }
        let read_in = self.lookups.generation();
        let resolved = self.definition_met(tenant, name).await?.map(|definition| {
            // Checked when written; one that no longer compiles (a newer build's) validates nothing.
            let validator = definition
                .schema
                .as_ref()
                .filter(|_| definition.validate)
                .and_then(|s| compile(s).ok());
            Arc::new(Resolved { validator })
        });
        let l = &self.lookups;
        l.event_types
            .put(key, resolved.clone(), self.now(), &l.generation, read_in);
        Ok(resolved)
    }
}

pub(super) fn reserved(name: &EventType) -> ValidationError {
    ValidationError::new(
        "reserved_event_type",
        format!("`{name}`: the types under `{HOOKWISE_PREFIX}` are Hookwise's own"),
    )
}

/// A schema compiled: for the draft its `$schema` names, else 2020-12. Its `pattern`s run on
/// the `regex` engine, in time linear in the text (no backreference or lookaround, so no
/// pattern can make an ingest backtrack for seconds), and compile to a bounded size.
fn compile(schema: &serde_json::Value) -> std::result::Result<jsonschema::Validator, String> {
    const REGEX_BYTES: usize = 1 << 20;
    let patterns = jsonschema::PatternOptions::regex()
        .size_limit(REGEX_BYTES)
        .dfa_size_limit(REGEX_BYTES);
    jsonschema::options()
        .with_pattern_options(patterns)
        .build(schema)
        .map_err(|e| e.to_string())
}

/// Where in the payload: the root reads as `/`.
fn pointer(path: &str) -> &str {
    if path.is_empty() {
        "/"
    } else {
        path
    }
}

/// A definition that can be stored: its description's length, its schema compiles and is
/// not too large, its example is a payload (an object) that matches it.
fn check_definition(def: &EventTypeDefinition) -> Result<(), ValidationError> {
    if def.description.chars().count() > MAX_TYPE_DESCRIPTION_LEN {
        return Err(ValidationError::new(
            "invalid_description",
            format!("a description is at most {MAX_TYPE_DESCRIPTION_LEN} characters"),
        ));
    }
    let validator = match &def.schema {
        None => None,
        Some(schema) => {
            let size = schema.to_string().len();
            if size > MAX_SCHEMA_BYTES {
                return Err(ValidationError::new(
                    "invalid_schema",
                    format!("the schema is {size} bytes; at most {} KB", MAX_SCHEMA_BYTES / 1024),
                ));
            }
            if !schema.is_object() && !schema.is_boolean() {
                return Err(ValidationError::new(
                    "invalid_schema",
                    "a schema is a JSON object (or true or false)",
                ));
            }
            Some(compile(schema).map_err(|why| {
                ValidationError::new(
                    "invalid_schema",
                    format!("not a valid JSON Schema (draft 2020-12): {why}"),
                )
            })?)
        }
    };
    if let Some(example) = &def.example {
        if !example.is_object() {
            return Err(ValidationError::new(
                "invalid_example",
                "an example is a payload: a JSON object",
            ));
        }
        let size = example.to_string().len();
        if size > MAX_EXAMPLE_BYTES {
            return Err(ValidationError::new(
                "invalid_example",
                format!("the example is {size} bytes; at most {} KB", MAX_EXAMPLE_BYTES / 1024),
            ));
        }
        if let Some(validator) = &validator {
            if let Some(e) = validator.iter_errors(example).next() {
                return Err(ValidationError::new(
                    "invalid_example",
                    format!(
                        "the example does not match the schema: `{}`: {e} (keyword `{}`)",
                        pointer(&e.instance_path().to_string()),
                        e.kind().keyword()
                    ),
                ));
            }
        }
    }
    Ok(())
}
