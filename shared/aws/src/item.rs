//! Domain values as DynamoDB items: serde into JSON, JSON into attribute values. Items stay
//! readable in the console and conditions can name `status`, `round` and `attempts`.

use std::collections::HashMap;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{DateTime, Utc};
use hookwise_core::health::{EndpointHealth, HealthSample};
use hookwise_core::PortError;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Number, Value};

pub(crate) type Item = HashMap<String, AttributeValue>;

pub(crate) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub(crate) fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// Which of `shards` an id falls in: FNV-1a, stable across builds (unlike std's hasher).
pub(crate) fn spread(id: &str, shards: u32) -> u32 {
    let h = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (h % u64::from(shards)) as u32
}

/// A retention as the TTL arithmetic takes it (a month, if it does not fit).
pub(crate) fn ttl_retention(retention: std::time::Duration) -> chrono::Duration {
    chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::days(30))
}

/// The TTL attribute's value of an item kept `retention` after `from`: epoch seconds.
pub(crate) fn expires_at(from: DateTime<Utc>, retention: chrono::Duration) -> AttributeValue {
    n((from + retention).timestamp())
}

/// A fixed-width UTC time (nanoseconds), so times sort as strings in keys.
pub(crate) fn sortable_time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.9fZ").to_string()
}

fn to_attr(v: Value) -> AttributeValue {
    match v {
        Value::Null => AttributeValue::Null(true),
        Value::Bool(b) => AttributeValue::Bool(b),
        Value::Number(num) => AttributeValue::N(num.to_string()),
        Value::String(st) => AttributeValue::S(st),
        Value::Array(xs) => AttributeValue::L(xs.into_iter().map(to_attr).collect()),
        Value::Object(m) => AttributeValue::M(m.into_iter().map(|(k, v)| (k, to_attr(v))).collect()),
    }
}

fn from_attr(a: &AttributeValue) -> Result<Value, String> {
    Ok(match a {
        AttributeValue::Null(_) => Value::Null,
        AttributeValue::Bool(b) => Value::Bool(*b),
        AttributeValue::S(st) => Value::String(st.clone()),
        AttributeValue::N(num) => Value::Number(parse_number(num)?),
        AttributeValue::L(xs) => Value::Array(xs.iter().map(from_attr).collect::<Result<_, _>>()?),
        AttributeValue::M(m) => Value::Object(
            m.iter()
                .map(|(k, v)| Ok((k.clone(), from_attr(v)?)))
                .collect::<Result<_, String>>()?,
        ),
        other => return Err(format!("unexpected attribute type {other:?}")),
    })
}

fn parse_number(num: &str) -> Result<Number, String> {
    if let Ok(i) = num.parse::<i64>() {
        return Ok(i.into());
    }
    if let Ok(u) = num.parse::<u64>() {
        return Ok(u.into());
    }
    num.parse::<f64>()
        .ok()
        .and_then(Number::from_f64)
        .ok_or_else(|| format!("`{num}` is not a number"))
}

/// A struct's fields as attributes; `None` fields are left out rather than stored as NULL.
pub(crate) fn to_item<T: Serialize>(value: &T) -> Item {
    match serde_json::to_value(value).expect("domain types serialise to JSON") {
        Value::Object(m) => m
            .into_iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k, to_attr(v)))
            .collect(),
        other => panic!("a domain record serialises to an object, not {other}"),
    }
}

/// The JSON object an item holds (key attributes included: serde ignores them).
/// A payload as the event item stores it: deflated (`payload_z`, binary) when that is
/// smaller, which JSON nearly always is (a 1.5 KB order payload fits a 1 KB write unit with
/// the rest of the item), else as its JSON text (`payload`). Never as a DynamoDB map: a
/// number such as 1.0 would come back as 1.
pub(crate) fn payload_attr(payload: &Value) -> (&'static str, AttributeValue) {
    use std::io::Write;
    let text = payload.to_string();
    let mut z = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
    let deflated = z.write_all(text.as_bytes()).and_then(|()| z.finish());
    match deflated {
        Ok(bytes) if bytes.len() < text.len() => (PAYLOAD_DEFLATED, AttributeValue::B(Blob::new(bytes))),
        _ => (PAYLOAD_TEXT, s(text)),
    }
}

pub(crate) const PAYLOAD_TEXT: &str = "payload";
pub(crate) const PAYLOAD_DEFLATED: &str = "payload_z";

/// The payload [`payload_attr`] stored, taken out of the item.
pub(crate) fn take_payload(item: &mut Item) -> Result<Value, PortError> {
    use std::io::Read;
    let text = match (item.remove(PAYLOAD_DEFLATED), item.remove(PAYLOAD_TEXT)) {
        (Some(AttributeValue::B(bytes)), _) => {
            let mut text = String::new();
            flate2::read::DeflateDecoder::new(bytes.as_ref())
                .read_to_string(&mut text)
                .map_err(|e| corrupt(PAYLOAD_DEFLATED, e.to_string()))?;
            text
        }
        (None, Some(AttributeValue::S(text))) => text,
        _ => return Err(corrupt("payload", "missing, or neither deflated bytes nor JSON text")),
    };
    serde_json::from_str(&text).map_err(|e| corrupt("payload", e.to_string()))
}

/// An attribute value's size as DynamoDB counts it: strings and binaries by their bytes,
/// numbers by about one byte per two digits, and a few bytes more per list or map element.
pub(crate) fn attribute_size(v: &AttributeValue) -> usize {
    match v {
        AttributeValue::S(text) => text.len(),
        AttributeValue::N(num) => num.len().div_ceil(2) + 1,
        AttributeValue::B(bytes) => bytes.as_ref().len(),
        AttributeValue::L(xs) => 3 + xs.iter().map(|x| 1 + attribute_size(x)).sum::<usize>(),
        AttributeValue::M(m) => 3 + m.iter().map(|(k, x)| 1 + k.len() + attribute_size(x)).sum::<usize>(),
        AttributeValue::Ss(xs) => xs.iter().map(String::len).sum(),
        _ => 1,
    }
}

pub(crate) fn to_json(item: &Item) -> Result<Map<String, Value>, PortError> {
    item.iter()
        .map(|(k, v)| Ok((k.clone(), from_attr(v).map_err(|e| corrupt(k, e))?)))
        .collect()
}

pub(crate) fn from_json<T: DeserializeOwned>(m: Map<String, Value>) -> Result<T, PortError> {
    serde_json::from_value(Value::Object(m)).map_err(|e| corrupt(std::any::type_name::<T>(), e.to_string()))
}

pub(crate) fn from_item<T: DeserializeOwned>(item: &Item) -> Result<T, PortError> {
    from_json(to_json(item)?)
}

pub(crate) fn corrupt(what: &str, why: impl Into<String>) -> PortError {
    PortError::permanent(format!("stored item does not decode ({what})"), why.into())
}

/// A string attribute, or a corrupt-item error.
pub(crate) fn get_s<'a>(item: &'a Item, name: &str) -> Result<&'a str, PortError> {
    match item.get(name) {
        Some(AttributeValue::S(v)) => Ok(v),
        _ => Err(corrupt(name, "missing or not a string")),
    }
}

pub(crate) fn get_n<T: std::str::FromStr>(item: &Item, name: &str) -> Result<T, PortError> {
    match item.get(name) {
        Some(AttributeValue::N(v)) => v.parse().map_err(|_| corrupt(name, format!("`{v}` is out of range"))),
        _ => Err(corrupt(name, "missing or not a number")),
    }
}

/// Endpoint health as one binary attribute, 13 bytes a sample (seconds as `i64`, nanoseconds
/// as `u32`, both big-endian, then 1 for success or 0): a full window of 50 samples stays
/// under the 1 KB of one write unit (as a list of maps it took three), and it is rewritten
/// after every attempt.
pub(crate) fn health_to_attr(health: &EndpointHealth) -> AttributeValue {
    let mut bytes = Vec::with_capacity(health.samples.len() * HEALTH_SAMPLE_BYTES);
    for h in &health.samples {
        bytes.extend_from_slice(&h.at.timestamp().to_be_bytes());
        bytes.extend_from_slice(&h.at.timestamp_subsec_nanos().to_be_bytes());
        bytes.push(u8::from(h.success));
    }
    AttributeValue::B(Blob::new(bytes))
}

const HEALTH_SAMPLE_BYTES: usize = 13;

pub(crate) fn health_from_attr(item: &Item, name: &str) -> Result<EndpointHealth, PortError> {
    let Some(AttributeValue::B(blob)) = item.get(name) else {
        return Err(corrupt(name, "missing or not binary"));
    };
    let bytes = blob.as_ref();
    if bytes.len() % HEALTH_SAMPLE_BYTES != 0 {
        return Err(corrupt(
            name,
            format!("{} bytes is not a whole number of samples", bytes.len()),
        ));
    }
    let sample = |c: &[u8]| -> Option<HealthSample> {
        let secs = i64::from_be_bytes(c[0..8].try_into().ok()?);
        let nanos = u32::from_be_bytes(c[8..12].try_into().ok()?);
        Some(HealthSample {
            at: DateTime::from_timestamp(secs, nanos)?,
            success: c[12] != 0,
        })
    };
    let samples: Vec<HealthSample> = bytes
        .chunks_exact(HEALTH_SAMPLE_BYTES)
        .map(|c| sample(c).ok_or_else(|| corrupt(name, "a sample's time is out of range")))
        .collect::<Result<_, _>>()?;
    let last_success_at = match item.get("last_success") {
        Some(AttributeValue::N(nanos)) => nanos.parse().ok().map(DateTime::from_timestamp_nanos),
        _ => None,
    };
    // A save before `last_success` was kept: the window's latest success is the best known.
    let last_success_at = last_success_at.or_else(|| samples_last_success(&samples));
    Ok(EndpointHealth {
        samples,
        last_success_at,
        version: health_version(item),
    })
}

/// The saves an endpoint's health item has had (0: none, or saved before versions were kept).
pub(crate) fn health_version(item: &Item) -> u64 {
    match item.get("version") {
        Some(AttributeValue::N(v)) => v.parse().unwrap_or(0),
        _ => 0,
    }
}

fn samples_last_success(samples: &[HealthSample]) -> Option<DateTime<Utc>> {
    samples.iter().filter(|s| s.success).map(|s| s.at).max()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[test]
    fn a_payload_is_stored_deflated_when_that_is_smaller_and_comes_back_exactly() {
        let order = serde_json::json!({"lines": (0..20).map(|i| serde_json::json!({"sku": format!("SKU-{i}"),
            "price": 1.0, "qty": i})).collect::<Vec<_>>()});
        let (name, attr) = payload_attr(&order);
        assert_eq!(name, PAYLOAD_DEFLATED);
        let AttributeValue::B(bytes) = &attr else {
            panic!("not binary: {attr:?}")
        };
        assert!(bytes.as_ref().len() * 3 < order.to_string().len(), "barely deflated");
        let mut item = Item::from([(name.to_owned(), attr)]);
        // 1.0 stays 1.0: the text is what was sent.
        assert_eq!(take_payload(&mut item).unwrap().to_string(), order.to_string());
        assert!(item.is_empty());

        // Too short to gain: kept as text. Items written before deflating read as before.
        let tiny = serde_json::json!({"a": 1});
        let (name, attr) = payload_attr(&tiny);
        assert_eq!((name, &attr), (PAYLOAD_TEXT, &s(r#"{"a":1}"#)));
        let mut item = Item::from([(name.to_owned(), attr)]);
        assert_eq!(take_payload(&mut item).unwrap(), tiny);

        let mut broken = Item::from([(PAYLOAD_DEFLATED.to_owned(), AttributeValue::B(Blob::new(vec![0xff; 8])))]);
        assert!(take_payload(&mut broken).is_err());
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Sample {
        a: u32,
        b: Option<String>,
        c: f64,
        d: Vec<Value>,
        e: i64,
    }

    #[test]
    fn records_round_trip_through_attributes_without_their_none_fields() {
        let v = Sample {
            a: 7,
            b: None,
            c: 61.25,
            d: vec![Value::Null, Value::Bool(true), "x".into()],
            e: -3,
        };
        let item = to_item(&v);
        assert!(!item.contains_key("b"));
        assert_eq!(item["c"], AttributeValue::N("61.25".into()));
        assert_eq!(from_item::<Sample>(&item).unwrap(), v);
    }

    #[test]
    fn a_whole_float_read_back_as_an_integer_still_decodes_as_a_float() {
        // DynamoDB normalises `60.0` to `60`.
        let mut item = to_item(&Sample {
            a: 1,
            b: Some("y".into()),
            c: 60.0,
            d: vec![],
            e: 0,
        });
        item.insert("c".into(), AttributeValue::N("60".into()));
        assert_eq!(from_item::<Sample>(&item).unwrap().c, 60.0);
    }

    #[test]
    fn a_full_health_window_round_trips_in_under_one_write_unit() {
        let start: DateTime<Utc> = "2030-06-01T12:00:00.123456789Z".parse().unwrap();
        let mut health = EndpointHealth::default();
        for i in 0..hookwise_core::health::HEALTH_WINDOW {
            health.record(HealthSample {
                at: start + chrono::Duration::seconds(i as i64 * 37),
                success: i % 3 != 0,
            });
        }
        let item = Item::from([("samples".to_owned(), health_to_attr(&health))]);
        let AttributeValue::B(bytes) = &item["samples"] else {
            panic!("binary")
        };
        assert!(bytes.as_ref().len() < 1000, "{} bytes", bytes.as_ref().len());
        assert_eq!(health_from_attr(&item, "samples").unwrap(), health);

        let empty = Item::from([("samples".to_owned(), health_to_attr(&EndpointHealth::default()))]);
        assert_eq!(health_from_attr(&empty, "samples").unwrap(), EndpointHealth::default());
        let torn = Item::from([("samples".to_owned(), AttributeValue::B(Blob::new(vec![0; 12])))]);
        assert!(health_from_attr(&torn, "samples").is_err());
        assert!(health_from_attr(&Item::new(), "samples").is_err());
    }

    #[test]
    fn sortable_times_have_a_fixed_width() {
        let a: DateTime<Utc> = "2030-06-01T12:00:00Z".parse().unwrap();
        let b = a + chrono::Duration::nanoseconds(1);
        assert_eq!(sortable_time(a).len(), sortable_time(b).len());
        assert!(sortable_time(a) < sortable_time(b));
    }
}
