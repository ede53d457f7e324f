//! The event-type catalogue: the types a deployment (its operator) or a tenant defines, each
//! with a description, and optionally a JSON Schema of its payload and an example.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{EventType, TenantId};

/// One defined event type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventTypeDefinition {
    pub name: EventType,
    /// Whose it is: a tenant's own, or (`None`) the deployment's, for every tenant. A tenant's
    /// definition of a name the deployment also defines is the one its events meet.
    pub tenant_id: Option<TenantId>,
    pub description: String,
    /// A JSON Schema (draft 2020-12) of the payload. Stored as its JSON text, so every store
    /// reads it back exactly.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "json_as_text")]
    pub schema: Option<serde_json::Value>,
    /// A payload of this type (valid against the schema): what a test send of the type sends.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "json_as_text")]
    pub example: Option<serde_json::Value>,
    /// Whether an event of this type must match the schema to be accepted.
    pub validate: bool,
    pub deprecated: bool,
    pub created_at: DateTime<Utc>,
    /// Its version: a change is written only over the copy it was made from.
    pub updated_at: DateTime<Utc>,
}

/// An optional JSON value as its text in the stored document.
mod json_as_text {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<serde_json::Value>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => s.serialize_str(&v.to_string()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| serde_json::from_str(&text).map_err(D::Error::custom))
            .transpose()
    }
}
