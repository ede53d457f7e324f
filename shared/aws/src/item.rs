//! Domain values as DynamoDB items: serde into JSON, JSON into attribute values. Items stay
//! readable in the console and conditions can name `status`, `round` and `attempts`.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{DateTime, Utc};
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
        AttributeValue::M(m) => Value::Object(m.iter().map(|(k, v)| Ok((k.clone(), from_attr(v)?))).collect::<Result<_, String>>()?),
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
    num.parse::<f64>().ok().and_then(Number::from_f64).ok_or_else(|| format!("`{num}` is not a number"))
}

/// A struct's fields as attributes; `None` fields are left out rather than stored as NULL.
pub(crate) fn to_item<T: Serialize>(value: &T) -> Item {
    match serde_json::to_value(value).expect("domain types serialise to JSON") {
        Value::Object(m) => m.into_iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k, to_attr(v))).collect(),
        other => panic!("a domain record serialises to an object, not {other}"),
    }
}

/// The JSON object an item holds (key attributes included: serde ignores them).
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

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
        let v = Sample { a: 7, b: None, c: 61.25, d: vec![Value::Null, Value::Bool(true), "x".into()], e: -3 };
        let item = to_item(&v);
        assert!(!item.contains_key("b"));
        assert_eq!(item["c"], AttributeValue::N("61.25".into()));
        assert_eq!(from_item::<Sample>(&item).unwrap(), v);
    }

    #[test]
    fn a_whole_float_read_back_as_an_integer_still_decodes_as_a_float() {
        // DynamoDB normalises `60.0` to `60`.
        let mut item = to_item(&Sample { a: 1, b: Some("y".into()), c: 60.0, d: vec![], e: 0 });
        item.insert("c".into(), AttributeValue::N("60".into()));
        assert_eq!(from_item::<Sample>(&item).unwrap().c, 60.0);
    }

    #[test]
    fn sortable_times_have_a_fixed_width() {
        let a: DateTime<Utc> = "2030-06-01T12:00:00Z".parse().unwrap();
        let b = a + chrono::Duration::nanoseconds(1);
        assert_eq!(sortable_time(a).len(), sortable_time(b).len());
        assert!(sortable_time(a) < sortable_time(b));
    }
}
