//! Identifiers: a short type prefix and a ULID, so ids sort by creation time and say what
//! they name (`evt_01J...`). Generated from a caller's RNG: the core has none of its own.

use std::time::SystemTime;

use chrono::{DateTime, Utc};
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::error::ValidationError;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            pub const PREFIX: &'static str = $prefix;

            /// A new id whose time part is `now`.
            pub fn generate(now: DateTime<Utc>, rng: &mut impl Rng) -> Self {
                let ulid = ulid::Ulid::from_datetime_with_source(SystemTime::from(now), rng);
                Self(format!("{}{}", $prefix, ulid))
            }

            pub fn parse(s: &str) -> Result<Self, ValidationError> {
                let rest = s.strip_prefix($prefix).ok_or_else(|| {
                    ValidationError::new("invalid_id", format!("`{s}` is not a {} id (they start with `{}`)", stringify!($name), $prefix))
                })?;
                ulid::Ulid::from_string(rest).map_err(|_| {
                    ValidationError::new("invalid_id", format!("`{s}` is not a well-formed {} id", stringify!($name)))
                })?;
                Ok(Self(s.to_owned()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl TryFrom<String> for $name {
            type Error = ValidationError;
            fn try_from(s: String) -> Result<Self, Self::Error> {
                Self::parse(&s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = ValidationError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s)
            }
        }
    };
}

/// A tenant: one customer account, owner of API keys and subscriptions. Its id is the one
/// an operator chose for it (the customer's own account id, `acct_123`), or `ten_` and a ULID
/// when none was chosen: 1 to 64 letters, digits, `_` or `-`, from a letter or digit on (no
/// character the stores use to join keys).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TenantId(String);

impl TenantId {
    pub const PREFIX: &'static str = "ten_";
    pub const MAX_LEN: usize = 64;

    /// A new id whose time part is `now`.
    pub fn generate(now: DateTime<Utc>, rng: &mut impl Rng) -> Self {
        let ulid = ulid::Ulid::from_datetime_with_source(SystemTime::from(now), rng);
        Self(format!("{}{ulid}", Self::PREFIX))
    }

    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let well_formed = (1..=Self::MAX_LEN).contains(&s.len())
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !well_formed {
            return Err(ValidationError::new(
                "invalid_id",
                format!(
                    "`{s}` is not a tenant id: 1 to {} letters, digits, `_` or `-`, starting with a letter or digit",
                    Self::MAX_LEN
                ),
            ));
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TenantId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for TenantId {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<TenantId> for String {
    fn from(id: TenantId) -> String {
        id.0
    }
}

impl std::str::FromStr for TenantId {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

id_type!(/// A subscription: an endpoint URL and the event types it wants.
    SubscriptionId, "sub_");
id_type!(/// An event as a service handed it to Hookwise; also the `webhook-id` on the wire.
    EventId, "evt_");
id_type!(/// One event going to one subscription.
    DeliveryId, "dlv_");
id_type!(/// A customer's portal session.
    PortalSessionId, "ps_");

impl EventId {
    /// The id of the tenant's event with this `Idempotency-Key`: the same key always gives
    /// the same id, so a store can make the event's own write the key check (a conditional
    /// put of an id that is taken) instead of keeping a marker beside it. A SHA-256 of the
    /// tenant and the key, so its time part is no time: keyed events' ids do not sort by
    /// creation (nothing lists events by id; deliveries have ids of their own).
    pub fn for_key(tenant: &TenantId, key: &str) -> Self {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new()
            .chain_update(tenant.as_str())
            .chain_update([0])
            .chain_update(key)
            .finalize();
        Self(format!("{}{}", Self::PREFIX, ulid_of(&digest)))
    }
}

impl DeliveryId {
    /// The id of an event's delivery to a subscription: the same pair always gives the same
    /// id, so a re-run of an ingest (the client's retry with its key) names, and queues, the
    /// deliveries the first run did, not new ones that will never exist. Its time part is the
    /// event id's and the rest a SHA-256 of the pair: deliveries sort by their event, so the
    /// embedded store appends them to its indexes instead of writing a page at random for each
    /// (a keyed event's id has no time part, and neither then have its deliveries').
    pub fn for_event(event: &EventId, subscription: &SubscriptionId) -> Self {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new()
            .chain_update(event.as_str())
            .chain_update([0])
            .chain_update(subscription.as_str())
            .finalize();
        let random = u128::from_be_bytes(digest[..16].try_into().expect("a SHA-256 has 32 bytes"));
        Self(format!(
            "{}{}",
            Self::PREFIX,
            ulid::Ulid::from_parts(event.ulid().timestamp_ms(), random)
        ))
    }
}

impl EventId {
    fn ulid(&self) -> ulid::Ulid {
        ulid::Ulid::from_string(&self.0[Self::PREFIX.len()..]).expect("an event id holds a ULID after its prefix")
    }
}

/// A ULID made of a hash's first 16 bytes.
fn ulid_of(digest: &[u8]) -> ulid::Ulid {
    ulid::Ulid::from_bytes(digest[..16].try_into().expect("a SHA-256 has 32 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn a_key_gives_one_event_id_per_tenant() {
        let a = TenantId::parse("ten_01J0000000000000000000000A").unwrap();
        let b = TenantId::parse("ten_01J0000000000000000000000B").unwrap();
        let id = EventId::for_key(&a, "order-1042-paid");
        assert_eq!(EventId::parse(id.as_str()).unwrap(), id);
        assert_eq!(EventId::for_key(&a, "order-1042-paid"), id);
        assert_ne!(EventId::for_key(&a, "order-1043-paid"), id);
        assert_ne!(EventId::for_key(&b, "order-1042-paid"), id);
    }

    #[test]
    fn a_tenant_id_is_chosen_or_generated_and_holds_no_key_separator() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let generated = TenantId::generate(Utc::now(), &mut rng);
        assert_eq!(TenantId::parse(generated.as_str()).unwrap(), generated);
        for good in ["acct_123", "A", "7-eleven", &"a".repeat(64)] {
            assert_eq!(TenantId::parse(good).unwrap().as_str(), good);
        }
        for bad in [
            "",
            "_acct",
            "-acct",
            "acct#1",
            "acct|1",
            "acct 1",
            "acct/1",
            "accté",
            &"a".repeat(65),
        ] {
            let err = TenantId::parse(bad).unwrap_err();
            assert_eq!(err.code, "invalid_id", "{bad:?}");
        }
    }

    #[test]
    fn an_event_and_a_subscription_give_one_delivery_id() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (e, f) = (
            EventId::generate(Utc::now(), &mut rng),
            EventId::generate(Utc::now(), &mut rng),
        );
        let (s, t) = (
            SubscriptionId::generate(Utc::now(), &mut rng),
            SubscriptionId::generate(Utc::now(), &mut rng),
        );
        let id = DeliveryId::for_event(&e, &s);
        assert_eq!(DeliveryId::parse(id.as_str()).unwrap(), id);
        assert_eq!(DeliveryId::for_event(&e, &s), id);
        assert_ne!(DeliveryId::for_event(&e, &t), id);
        assert_ne!(DeliveryId::for_event(&f, &s), id);
    }

    #[test]
    fn deliveries_sort_by_their_events_creation() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let now = Utc::now();
        let earlier = EventId::generate(now, &mut rng);
        let later = EventId::generate(now + chrono::Duration::milliseconds(1), &mut rng);
        let subs: Vec<_> = (0..20).map(|_| SubscriptionId::generate(now, &mut rng)).collect();
        for (s, t) in subs.iter().zip(subs.iter().rev()) {
            assert!(DeliveryId::for_event(&earlier, s) < DeliveryId::for_event(&later, t));
        }
    }

    #[test]
    fn generated_ids_parse_back_and_carry_their_prefix() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let id = EventId::generate(Utc::now(), &mut rng);
        assert!(id.as_str().starts_with("evt_"));
        assert_eq!(EventId::parse(id.as_str()).unwrap(), id);
    }

    #[test]
    fn ids_of_another_kind_or_garbage_are_rejected() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let id = EventId::generate(Utc::now(), &mut rng);
        assert!(DeliveryId::parse(id.as_str()).is_err());
        assert!(EventId::parse("evt_nope").is_err());
    }
}
