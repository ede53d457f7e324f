//! Content filters: which events a subscription receives, written as an AWS EventBridge event
//! pattern and evaluated against the envelope the subscriber gets,
//! `{"id": …, "type": …, "timestamp": …, "data": {…}}`.
//!
//! ```json
//! {"type": [{"prefix": "invoice."}],
//!  "data": {"currency": ["EUR"], "amount": [{"numeric": [">=", 100]}]}}
//! ```
//!
//! A pattern is an object. Each key names a field of the envelope and holds either a nested
//! pattern (descend into that field) or a list of matchers. Every key must match; any one
//! matcher of a list is enough. Where the envelope holds an array, one element matching is
//! enough. The matchers:
//!
//! - exact values: `"EUR"`, `100` (also matches `100.0`), `true`, `false`, `null`;
//! - `{"prefix": "inv_"}`, `{"suffix": ".pdf"}`, `{"equals-ignore-case": "eur"}`: strings only;
//! - `{"anything-but": v}`, `v` a string, a number, a list of strings or of numbers,
//!   `{"prefix": …}` or `{"suffix": …}`: a present value that `v` does not match;
//! - `{"numeric": [">=", 100]}`, `{"numeric": [">", 0, "<=", 5]}`: numbers only;
//! - `{"exists": true}`, `{"exists": false}`.
//!
//! `"$or": [pattern, pattern, …]` at any level matches when one of its patterns does, AND-ed
//! with the keys beside it. Not supported: `wildcard`, `cidr`, and the `equals-ignore-case`
//! forms of `prefix`, `suffix` and `anything-but`.
//!
//! As in EventBridge, a missing field matches only `{"exists": false}` (never `anything-but`),
//! an empty array counts as missing, and `null` is a value: `[null]` and `{"exists": true}`
//! match it. Unlike EventBridge, whose `exists` sees only leaf values, `{"exists": true}` also
//! matches a field holding an object, so "has a `refund`" needs no knowledge of its insides.

use std::fmt::Display;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

use crate::error::ValidationError;

const CODE: &str = "invalid_filter";
const MAX_DEPTH: usize = 10;
const MAX_MATCHERS: usize = 100;
const MAX_BYTES: usize = 4096;
const MAX_STRING_CHARS: usize = 256;
const MATCHER_KEYS: &str = "`prefix`, `suffix`, `equals-ignore-case`, `anything-but`, `numeric` or `exists`";
const NUMERIC_PAIRS: &str =
    "a numeric range needs an operator and a number in pairs, such as [\">=\", 100] or [\">\", 0, \"<=\", 5]";

type Parsed<T> = Result<T, ValidationError>;

/// A validated EventBridge-style event pattern.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "serde_json::Value", into = "serde_json::Value")]
pub struct ContentFilter {
    json: Value,
    compiled: Pattern,
}

impl ContentFilter {
    pub fn parse(pattern: Value) -> Result<Self, ValidationError> {
        let compiled = Parser::default().top(&pattern)?;
        check_size(&pattern)?;
        Ok(Self {
            json: pattern,
            compiled,
        })
    }

    /// Whether the envelope a subscriber would receive passes this filter.
    pub fn matches(&self, envelope: &Value) -> bool {
        self.compiled.matches(envelope.as_object())
    }

    /// The pattern as it was given.
    pub fn as_json(&self) -> &Value {
        &self.json
    }
}

impl TryFrom<Value> for ContentFilter {
    type Error = ValidationError;

    fn try_from(pattern: Value) -> Result<Self, Self::Error> {
        Self::parse(pattern)
    }
}

impl From<ContentFilter> for Value {
    fn from(filter: ContentFilter) -> Self {
        filter.json
    }
}

// ---- The compiled form ----

#[derive(Debug, Clone, PartialEq)]
struct Pattern {
    fields: Vec<(String, Node)>,
    /// The alternatives of this object's `$or`; empty when it has none.
    any_of: Vec<Pattern>,
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Nested(Pattern),
    AnyOf(Vec<Matcher>),
}

#[derive(Debug, Clone, PartialEq)]
enum Matcher {
    Exact(Literal),
    Prefix(String),
    Suffix(String),
    EqualsIgnoreCase(String),
    AnythingBut(Exclusion),
    Numeric(Range),
    Exists(bool),
}

#[derive(Debug, Clone, PartialEq)]
enum Literal {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
}

#[derive(Debug, Clone, PartialEq)]
enum Exclusion {
    Values(Vec<Literal>),
    Prefix(String),
    Suffix(String),
}

#[derive(Debug, Clone, PartialEq)]
struct Range {
    lower: Option<Bound>,
    upper: Option<Bound>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Bound {
    value: f64,
    inclusive: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Eq,
    Lt,
    Le,
    Gt,
    Ge,
}

// ---- Matching ----
//
// Recursion follows the pattern (at most `MAX_DEPTH` levels), never the envelope, so no
// envelope can exhaust the stack.

impl Pattern {
    /// `object` is `None` when the field is absent or not an object: every field inside is then
    /// absent, which `{"exists": false}` still matches.
    fn matches(&self, object: Option<&Map<String, Value>>) -> bool {
        self.fields
            .iter()
            .all(|(key, node)| node.matches(object.and_then(|o| o.get(key))))
            && (self.any_of.is_empty() || self.any_of.iter().any(|p| p.matches(object)))
    }
}

impl Node {
    fn matches(&self, field: Option<&Value>) -> bool {
        let values = values_of(field);
        match self {
            Node::Nested(pattern) if values.is_empty() => pattern.matches(None),
            // Each element on its own: `{"sku": …, "qty": …}` must hold within one line item.
            Node::Nested(pattern) => values.iter().any(|v| pattern.matches(v.as_object())),
            Node::AnyOf(matchers) => matchers.iter().any(|m| m.matches(&values)),
        }
    }
}

/// What a field holds, as EventBridge sees it: nothing when absent, the elements of an array
/// (nested arrays flattened, so an empty array holds nothing), else the value itself.
fn values_of(field: Option<&Value>) -> Vec<&Value> {
    let mut values = Vec::new();
    let mut pending: Vec<&Value> = field.into_iter().collect();
    while let Some(value) = pending.pop() {
        match value {
            Value::Array(items) => pending.extend(items.iter().rev()),
            other => values.push(other),
        }
    }
    values
}

impl Matcher {
    fn matches(&self, values: &[&Value]) -> bool {
        match self {
            // Any present value counts, null and objects included (see the module's docs).
            Matcher::Exists(present) => values.is_empty() != *present,
            _ => values.iter().any(|v| self.matches_value(v)),
        }
    }

    fn matches_value(&self, value: &Value) -> bool {
        match self {
            Matcher::Exact(literal) => literal.matches(value),
            Matcher::Prefix(prefix) => value.as_str().is_some_and(|s| s.starts_with(prefix.as_str())),
            Matcher::Suffix(suffix) => value.as_str().is_some_and(|s| s.ends_with(suffix.as_str())),
            Matcher::EqualsIgnoreCase(expected) => value.as_str().is_some_and(|s| eq_ignore_case(s, expected)),
            // A value, not a structure: an object is never "anything but" a string.
            Matcher::AnythingBut(excluded) => !value.is_object() && !excluded.matches(value),
            Matcher::Numeric(range) => value.as_f64().is_some_and(|n| range.contains(n)),
            // Decided on the field as a whole in `matches`; a value on its own is present.
            Matcher::Exists(present) => *present,
        }
    }
}

impl Literal {
    fn matches(&self, value: &Value) -> bool {
        match (self, value) {
            (Literal::Null, Value::Null) => true,
            (Literal::Bool(a), Value::Bool(b)) => a == b,
            (Literal::Number(a), Value::Number(b)) => numbers_equal(a, b),
            (Literal::String(a), Value::String(b)) => a == b,
            _ => false,
        }
    }
}

impl Exclusion {
    fn matches(&self, value: &Value) -> bool {
        match self {
            Exclusion::Values(literals) => literals.iter().any(|l| l.matches(value)),
            Exclusion::Prefix(prefix) => value.as_str().is_some_and(|s| s.starts_with(prefix.as_str())),
            Exclusion::Suffix(suffix) => value.as_str().is_some_and(|s| s.ends_with(suffix.as_str())),
        }
    }
}

impl Range {
    fn contains(&self, n: f64) -> bool {
        let above = |b: Bound| if b.inclusive { n >= b.value } else { n > b.value };
        let below = |b: Bound| if b.inclusive { n <= b.value } else { n < b.value };
        self.lower.is_none_or(above) && self.upper.is_none_or(below)
    }
}

/// Integers compare exactly (ids beyond 2^53 stay distinct); anything else as floats, so
/// `100` equals `100.0`.
fn numbers_equal(a: &Number, b: &Number) -> bool {
    match (integer(a), integer(b)) {
        (Some(a), Some(b)) => a == b,
        _ => a.as_f64() == b.as_f64(),
    }
}

fn integer(n: &Number) -> Option<i128> {
    n.as_i64().map(i128::from).or_else(|| n.as_u64().map(i128::from))
}

fn eq_ignore_case(a: &str, b: &str) -> bool {
    a.chars()
        .flat_map(char::to_lowercase)
        .eq(b.chars().flat_map(char::to_lowercase))
}

// ---- Parsing and validation ----

#[derive(Default)]
struct Parser {
    matchers: usize,
}

impl Parser {
    fn top(&mut self, pattern: &Value) -> Parsed<Pattern> {
        match pattern {
            Value::Object(map) if !map.is_empty() => self.pattern(map, "", 1),
            Value::Object(_) => Err(refuse(
                "",
                "a filter names at least one field, such as {\"type\": [\"invoice.paid\"]}; to receive every event, \
                 set no filter",
            )),
            other => Err(refuse(
                "",
                format!(
                    "a filter is a JSON object, such as {{\"type\": [\"invoice.paid\"]}}, not {}",
                    describe(other)
                ),
            )),
        }
    }

    fn pattern(&mut self, map: &Map<String, Value>, path: &str, depth: usize) -> Parsed<Pattern> {
        if depth > MAX_DEPTH {
            return Err(refuse(path, format!("a filter nests at most {MAX_DEPTH} objects deep")));
        }
        if map.is_empty() {
            return Err(refuse(
                path,
                "an empty object names no field to match; add one or remove it",
            ));
        }
        let mut pattern = Pattern {
            fields: Vec::new(),
            any_of: Vec::new(),
        };
        for (key, value) in map {
            check_length(path, key, "a field name")?;
            let here = join(path, key);
            if key == "$or" {
                pattern.any_of = self.any_of(value, &here, depth)?;
            } else {
                pattern.fields.push((key.clone(), self.node(value, &here, depth)?));
            }
        }
        Ok(pattern)
    }

    fn node(&mut self, value: &Value, path: &str, depth: usize) -> Parsed<Node> {
        match value {
            Value::Object(map) => Ok(Node::Nested(self.pattern(map, path, depth + 1)?)),
            Value::Array(items) if items.is_empty() => Err(refuse(
                path,
                "an empty list of matchers matches nothing; add at least one, such as [\"EUR\"]",
            )),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, item)| self.matcher(item, &format!("{path}[{i}]")))
                .collect::<Parsed<Vec<_>>>()
                .map(Node::AnyOf),
            scalar => Err(refuse(
                path,
                format!("the values to match go in a list: write [{scalar}] rather than {scalar}"),
            )),
        }
    }

    fn any_of(&mut self, value: &Value, path: &str, depth: usize) -> Parsed<Vec<Pattern>> {
        let items = match value {
            Value::Array(items) if items.len() >= 2 => items,
            Value::Array(items) => {
                return Err(refuse(
                    path,
                    format!("`$or` needs at least two patterns, found {}", items.len()),
                ))
            }
            other => {
                return Err(refuse(
                    path,
                    format!(
                    "`$or` takes a list of patterns, such as [{{\"type\": [\"a\"]}}, {{\"type\": [\"b\"]}}], not {}",
                    describe(other)
                ),
                ))
            }
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let here = format!("{path}[{i}]");
                match item {
                    Value::Object(map) => self.pattern(map, &here, depth + 1),
                    other => Err(refuse(
                        &here,
                        format!("each pattern of `$or` is an object, not {}", describe(other)),
                    )),
                }
            })
            .collect()
    }

    fn matcher(&mut self, value: &Value, path: &str) -> Parsed<Matcher> {
        self.matchers += 1;
        if self.matchers > MAX_MATCHERS {
            return Err(refuse(
                path,
                format!("a filter holds at most {MAX_MATCHERS} matchers; simplify it or split the subscription"),
            ));
        }
        match value {
            Value::Object(map) => operator(map, path),
            Value::Array(_) => Err(refuse(
                path,
                "a matcher cannot be a list; put the values side by side instead, such as [\"EUR\", \"USD\"]",
            )),
            scalar => literal(scalar, path).map(Matcher::Exact),
        }
    }
}

fn operator(map: &Map<String, Value>, path: &str) -> Parsed<Matcher> {
    let (key, arg) = single_entry(map, path)?;
    match key {
        "prefix" => string_arg(key, arg, path).map(Matcher::Prefix),
        "suffix" => string_arg(key, arg, path).map(Matcher::Suffix),
        "equals-ignore-case" => string_arg(key, arg, path).map(Matcher::EqualsIgnoreCase),
        "anything-but" => exclusion(arg, path).map(Matcher::AnythingBut),
        "numeric" => range(arg, path).map(Matcher::Numeric),
        "exists" => match arg {
            Value::Bool(present) => Ok(Matcher::Exists(*present)),
            other => Err(refuse(
                path,
                format!("`exists` takes true or false, not {}", describe(other)),
            )),
        },
        other => Err(refuse(
            path,
            format!("`{other}` is not a supported matcher; use {MATCHER_KEYS}"),
        )),
    }
}

fn single_entry<'a>(map: &'a Map<String, Value>, path: &str) -> Parsed<(&'a str, &'a Value)> {
    let mut entries = map.iter();
    match (entries.next(), entries.next()) {
        (Some((key, arg)), None) => Ok((key.as_str(), arg)),
        _ if map.is_empty() => Err(refuse(
            path,
            format!("a matcher object has exactly one key ({MATCHER_KEYS}); this one is empty"),
        )),
        _ => {
            let keys: Vec<String> = map.keys().map(|k| format!("`{k}`")).collect();
            Err(refuse(
                path,
                format!(
                    "a matcher object has exactly one key ({MATCHER_KEYS}), this one has {}: {}; to accept either \
                     of two conditions, list them side by side: [{{\"prefix\": \"a\"}}, {{\"suffix\": \"b\"}}]",
                    keys.len(),
                    keys.join(", ")
                ),
            ))
        }
    }
}

fn string_arg(key: &str, arg: &Value, path: &str) -> Parsed<String> {
    match arg {
        Value::String(s) => {
            check_length(path, s, &format!("the `{key}` string"))?;
            Ok(s.clone())
        }
        other => Err(refuse(
            path,
            format!(
                "`{key}` takes a string, such as {{\"{key}\": \"abc\"}}, not {}",
                describe(other)
            ),
        )),
    }
}

fn literal(value: &Value, path: &str) -> Parsed<Literal> {
    match value {
        Value::Null => Ok(Literal::Null),
        Value::Bool(b) => Ok(Literal::Bool(*b)),
        Value::Number(n) if n.as_f64().is_some_and(f64::is_finite) => Ok(Literal::Number(n.clone())),
        Value::Number(n) => Err(refuse(path, format!("{n} is not a finite number"))),
        Value::String(s) => {
            check_length(path, s, "a string to match")?;
            Ok(Literal::String(s.clone()))
        }
        other => Err(refuse(
            path,
            format!("expected a string, number, boolean or null, not {}", describe(other)),
        )),
    }
}

fn exclusion(arg: &Value, path: &str) -> Parsed<Exclusion> {
    const FORMS: &str =
        "`anything-but` takes a string, a number, a list of strings or of numbers, {\"prefix\": \"…\"} or {\"suffix\": \"…\"}";
    match arg {
        Value::String(_) | Value::Number(_) => Ok(Exclusion::Values(vec![literal(arg, path)?])),
        Value::Array(items) => exclusion_list(items, path),
        Value::Object(map) => match single_entry(map, path)? {
            ("prefix", inner) => string_arg("prefix", inner, path).map(Exclusion::Prefix),
            ("suffix", inner) => string_arg("suffix", inner, path).map(Exclusion::Suffix),
            (other, _) => Err(refuse(path, format!("`{other}` cannot follow `anything-but`; {FORMS}"))),
        },
        other => Err(refuse(path, format!("{FORMS}, not {}", describe(other)))),
    }
}

fn exclusion_list(items: &[Value], path: &str) -> Parsed<Exclusion> {
    let all_strings = items.iter().all(Value::is_string);
    let all_numbers = items.iter().all(Value::is_number);
    if items.is_empty() || !(all_strings || all_numbers) {
        return Err(refuse(
            path,
            "the list of `anything-but` holds one or more values, all strings or all numbers, such as \
             [\"draft\", \"void\"]",
        ));
    }
    items
        .iter()
        .map(|item| literal(item, path))
        .collect::<Parsed<Vec<_>>>()
        .map(Exclusion::Values)
}

fn range(arg: &Value, path: &str) -> Parsed<Range> {
    let comparisons = match arg {
        Value::Array(items) if items.len() == 2 || items.len() == 4 => items
            .chunks(2)
            .map(|pair| comparison(pair, path))
            .collect::<Parsed<Vec<_>>>()?,
        _ => return Err(refuse(path, NUMERIC_PAIRS)),
    };
    match comparisons.as_slice() {
        [(op, n)] => Ok(one_sided(*op, *n)),
        [(low_op, low), (high_op, high)] => two_sided((*low_op, *low), (*high_op, *high), path),
        _ => Err(refuse(path, NUMERIC_PAIRS)),
    }
}

fn comparison(pair: &[Value], path: &str) -> Parsed<(Op, f64)> {
    let [op, n] = pair else {
        return Err(refuse(path, NUMERIC_PAIRS));
    };
    let op = match op.as_str() {
        Some("=") => Op::Eq,
        Some("<") => Op::Lt,
        Some("<=") => Op::Le,
        Some(">") => Op::Gt,
        Some(">=") => Op::Ge,
        Some(other) => {
            return Err(refuse(
                path,
                format!("`{other}` is not a numeric operator; use =, <, <=, > or >="),
            ))
        }
        None => return Err(refuse(path, NUMERIC_PAIRS)),
    };
    match n.as_f64() {
        Some(n) if n.is_finite() => Ok((op, n)),
        Some(_) => Err(refuse(path, format!("{n} is not a finite number"))),
        None if n.is_string() => Err(refuse(
            path,
            format!("`numeric` compares with numbers, and {n} is a string; write it without quotes"),
        )),
        None => Err(refuse(path, NUMERIC_PAIRS)),
    }
}

fn one_sided(op: Op, n: f64) -> Range {
    let bound = |inclusive| Some(Bound { value: n, inclusive });
    match op {
        Op::Eq => Range {
            lower: bound(true),
            upper: bound(true),
        },
        Op::Lt | Op::Le => Range {
            lower: None,
            upper: bound(op == Op::Le),
        },
        Op::Gt | Op::Ge => Range {
            lower: bound(op == Op::Ge),
            upper: None,
        },
    }
}

fn two_sided(low: (Op, f64), high: (Op, f64), path: &str) -> Parsed<Range> {
    let (Op::Gt | Op::Ge, Op::Lt | Op::Le) = (low.0, high.0) else {
        return Err(refuse(
            path,
            "a two-sided range gives the lower bound (> or >=) first, then the upper one (< or <=), such as \
             [\">\", 0, \"<=\", 5]",
        ));
    };
    if low.1 >= high.1 {
        return Err(refuse(
            path,
            format!("the lower bound {} must be less than the upper bound {}", low.1, high.1),
        ));
    }
    Ok(Range {
        lower: one_sided(low.0, low.1).lower,
        upper: one_sided(high.0, high.1).upper,
    })
}

fn check_length(path: &str, s: &str, what: &str) -> Parsed<()> {
    let chars = s.chars().count();
    if chars > MAX_STRING_CHARS {
        return Err(refuse(
            path,
            format!("{what} is {chars} characters long; at most {MAX_STRING_CHARS} are allowed"),
        ));
    }
    Ok(())
}

fn check_size(pattern: &Value) -> Parsed<()> {
    let bytes = serde_json::to_vec(pattern)
        .map_err(|e| refuse("", format!("the filter does not serialize as JSON: {e}")))?
        .len();
    if bytes > MAX_BYTES {
        return Err(refuse(
            "",
            format!("the filter is {bytes} bytes of JSON; at most {MAX_BYTES} are allowed"),
        ));
    }
    Ok(())
}

/// `path` names where in the pattern, such as `data.amount[0]`; empty for the filter itself,
/// whose messages say so in their own words.
fn refuse(path: &str, what: impl Display) -> ValidationError {
    let message = if path.is_empty() {
        what.to_string()
    } else {
        format!("`{path}`: {what}")
    };
    ValidationError::new(CODE, message)
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn filter(pattern: Value) -> ContentFilter {
        ContentFilter::parse(pattern).expect("a valid filter")
    }

    fn data_matches(pattern: Value, data: Value) -> bool {
        filter(pattern).matches(&json!({"id": "evt_1", "type": "invoice.paid", "data": data}))
    }

    /// The message of a refused pattern, after checking its code.
    fn refused(pattern: Value) -> String {
        let err = ContentFilter::parse(pattern).expect_err("a refused filter");
        assert_eq!(err.code, "invalid_filter");
        err.message
    }

    fn assert_refused(pattern: Value, expected: &[&str]) {
        let message = refused(pattern);
        for part in expected {
            assert!(message.contains(part), "`{message}` should contain `{part}`");
        }
    }

    // ---- The issue's example ----

    #[test]
    fn issue_example_matches_euro_invoices_of_at_least_100() {
        let f = filter(json!({"data": {"currency": ["EUR"], "amount": [{"numeric": [">=", 100]}]}}));
        assert!(f.matches(&json!({"type": "invoice.paid", "data": {"currency": "EUR", "amount": 150}})));
        assert!(!f.matches(&json!({"type": "invoice.paid", "data": {"currency": "EUR", "amount": 99}})));
        assert!(!f.matches(&json!({"type": "invoice.paid", "data": {"currency": "USD", "amount": 150}})));
    }

    // ---- Exact values ----

    #[test]
    fn exact_string() {
        assert!(filter(json!({"type": ["invoice.paid"]})).matches(&json!({"type": "invoice.paid"})));
        assert!(!filter(json!({"type": ["invoice.paid"]})).matches(&json!({"type": "invoice.void"})));
        assert!(!filter(json!({"type": ["invoice.paid"]})).matches(&json!({"type": "Invoice.Paid"})));
        assert!(!filter(json!({"type": ["invoice.paid"]})).matches(&json!({})));
    }

    #[test]
    fn numbers_compare_numerically_not_as_text() {
        assert!(data_matches(json!({"data": {"n": [100]}}), json!({"n": 100.0})));
        assert!(data_matches(json!({"data": {"n": [100.0]}}), json!({"n": 100})));
        assert!(data_matches(json!({"data": {"n": [1e2]}}), json!({"n": 100})));
        assert!(!data_matches(json!({"data": {"n": [100]}}), json!({"n": 100.5})));
        assert!(!data_matches(json!({"data": {"n": [100]}}), json!({"n": "100"})));
        assert!(!data_matches(json!({"data": {"n": ["100"]}}), json!({"n": 100})));
        assert!(!data_matches(
            json!({"data": {"n": [u64::MAX]}}),
            json!({"n": u64::MAX - 1})
        ));
        assert!(data_matches(json!({"data": {"n": [-7]}}), json!({"n": -7})));
    }

    #[test]
    fn booleans() {
        assert!(data_matches(json!({"data": {"live": [true]}}), json!({"live": true})));
        assert!(!data_matches(json!({"data": {"live": [true]}}), json!({"live": false})));
        assert!(!data_matches(
            json!({"data": {"live": [true]}}),
            json!({"live": "true"})
        ));
        assert!(data_matches(json!({"data": {"live": [false]}}), json!({"live": false})));
    }

    #[test]
    fn null_matches_a_present_null_only() {
        let pattern = json!({"data": {"refund": [null]}});
        assert!(data_matches(pattern.clone(), json!({"refund": null})));
        assert!(!data_matches(pattern.clone(), json!({})));
        assert!(!data_matches(pattern.clone(), json!({"refund": ""})));
        assert!(!data_matches(
            json!({"data": {"refund": [""]}}),
            json!({"refund": null})
        ));
    }

    #[test]
    fn several_values_in_a_list_are_alternatives() {
        let pattern = json!({"data": {"currency": ["EUR", "USD"]}});
        assert!(data_matches(pattern.clone(), json!({"currency": "EUR"})));
        assert!(data_matches(pattern.clone(), json!({"currency": "USD"})));
        assert!(!data_matches(pattern, json!({"currency": "GBP"})));
    }

    // ---- String matchers ----

    #[test]
    fn prefix() {
        let f = filter(json!({"type": [{"prefix": "invoice."}]}));
        assert!(f.matches(&json!({"type": "invoice.paid"})));
        assert!(!f.matches(&json!({"type": "charge.invoice.paid"})));
        assert!(!f.matches(&json!({"type": 12})));
        assert!(!f.matches(&json!({})));
    }

    #[test]
    fn suffix() {
        let f = filter(json!({"data": {"file": [{"suffix": ".pdf"}]}}));
        assert!(f.matches(&json!({"data": {"file": "a/b.pdf"}})));
        assert!(!f.matches(&json!({"data": {"file": "a/b.pdf.png"}})));
        assert!(!f.matches(&json!({"data": {"file": null}})));
    }

    #[test]
    fn equals_ignore_case() {
        let f = filter(json!({"data": {"currency": [{"equals-ignore-case": "eur"}]}}));
        assert!(f.matches(&json!({"data": {"currency": "EUR"}})));
        assert!(f.matches(&json!({"data": {"currency": "Eur"}})));
        assert!(!f.matches(&json!({"data": {"currency": "EURO"}})));
        assert!(!f.matches(&json!({"data": {"currency": 1}})));
        let accents = filter(json!({"data": {"city": [{"equals-ignore-case": "ÉCOLE"}]}}));
        assert!(accents.matches(&json!({"data": {"city": "école"}})));
    }

    // ---- anything-but ----

    #[test]
    fn anything_but_a_string() {
        let pattern = json!({"data": {"status": [{"anything-but": "draft"}]}});
        assert!(data_matches(pattern.clone(), json!({"status": "open"})));
        assert!(!data_matches(pattern.clone(), json!({"status": "draft"})));
        assert!(data_matches(pattern.clone(), json!({"status": 3})));
        assert!(data_matches(pattern.clone(), json!({"status": null})));
        assert!(!data_matches(pattern.clone(), json!({"status": {"draft": true}})));
    }

    #[test]
    fn anything_but_never_matches_a_missing_field() {
        let pattern = json!({"data": {"status": [{"anything-but": "draft"}]}});
        assert!(!data_matches(pattern.clone(), json!({})));
        assert!(!data_matches(pattern.clone(), json!({"status": []})));
        assert!(!filter(pattern).matches(&json!({"type": "invoice.paid"})));
    }

    #[test]
    fn anything_but_numbers_and_lists() {
        let number = json!({"data": {"code": [{"anything-but": 404}]}});
        assert!(data_matches(number.clone(), json!({"code": 500})));
        assert!(!data_matches(number.clone(), json!({"code": 404.0})));
        let numbers = json!({"data": {"code": [{"anything-but": [404, 410]}]}});
        assert!(!data_matches(numbers.clone(), json!({"code": 410})));
        assert!(data_matches(numbers, json!({"code": 200})));
        let strings = json!({"data": {"status": [{"anything-but": ["draft", "void"]}]}});
        assert!(!data_matches(strings.clone(), json!({"status": "void"})));
        assert!(data_matches(strings, json!({"status": "paid"})));
    }

    #[test]
    fn anything_but_prefix_and_suffix() {
        let prefix = json!({"data": {"region": [{"anything-but": {"prefix": "us-"}}]}});
        assert!(data_matches(prefix.clone(), json!({"region": "eu-west-1"})));
        assert!(!data_matches(prefix.clone(), json!({"region": "us-east-1"})));
        assert!(!data_matches(prefix, json!({})));
        let suffix = json!({"data": {"file": [{"anything-but": {"suffix": ".png"}}]}});
        assert!(data_matches(suffix.clone(), json!({"file": "a.pdf"})));
        assert!(!data_matches(suffix, json!({"file": "a.png"})));
    }

    // ---- numeric ----

    #[test]
    fn numeric_single_comparisons() {
        // (operator, bound, matches 99, matches 100, matches 101)
        let cases = [
            ("=", 100, false, true, false),
            ("<", 100, true, false, false),
            ("<=", 100, true, true, false),
            (">", 100, false, false, true),
            (">=", 100, false, true, true),
        ];
        for (op, bound, at_99, at_100, at_101) in cases {
            let pattern = json!({"data": {"amount": [{"numeric": [op, bound]}]}});
            for (amount, expected) in [(99.0, at_99), (100.0, at_100), (101.0, at_101)] {
                assert_eq!(
                    data_matches(pattern.clone(), json!({"amount": amount})),
                    expected,
                    "{op} {bound} vs {amount}"
                );
            }
        }
        assert!(data_matches(
            json!({"data": {"amount": [{"numeric": ["=", 100]}]}}),
            json!({"amount": 100})
        ));
        assert!(data_matches(
            json!({"data": {"amount": [{"numeric": ["=", 100.0]}]}}),
            json!({"amount": 100})
        ));
    }

    #[test]
    fn numeric_ranges_and_bounds() {
        let pattern = json!({"data": {"amount": [{"numeric": [">", 0, "<=", 5]}]}});
        assert!(!data_matches(pattern.clone(), json!({"amount": 0})));
        assert!(data_matches(pattern.clone(), json!({"amount": 0.001})));
        assert!(data_matches(pattern.clone(), json!({"amount": 5})));
        assert!(!data_matches(pattern.clone(), json!({"amount": 5.0001})));
        let closed = json!({"data": {"amount": [{"numeric": [">=", 0, "<", 5]}]}});
        assert!(data_matches(closed.clone(), json!({"amount": 0})));
        assert!(!data_matches(closed, json!({"amount": 5})));
    }

    #[test]
    fn numeric_matches_json_numbers_only() {
        let pattern = json!({"data": {"amount": [{"numeric": [">", 0]}]}});
        assert!(!data_matches(pattern.clone(), json!({"amount": "150"})));
        assert!(!data_matches(pattern.clone(), json!({"amount": true})));
        assert!(!data_matches(pattern.clone(), json!({"amount": null})));
        assert!(!data_matches(pattern, json!({})));
    }

    // ---- exists ----

    #[test]
    fn exists_true_matches_any_present_value_null_included() {
        let pattern = json!({"data": {"refund": [{"exists": true}]}});
        assert!(data_matches(pattern.clone(), json!({"refund": "re_1"})));
        assert!(data_matches(pattern.clone(), json!({"refund": null})));
        assert!(data_matches(pattern.clone(), json!({"refund": {"id": 1}})));
        assert!(data_matches(pattern.clone(), json!({"refund": [0]})));
        assert!(!data_matches(pattern.clone(), json!({"refund": []})));
        assert!(!data_matches(pattern, json!({})));
    }

    #[test]
    fn exists_false_matches_a_missing_field_only() {
        let pattern = json!({"data": {"refund": [{"exists": false}]}});
        assert!(data_matches(pattern.clone(), json!({})));
        assert!(data_matches(pattern.clone(), json!({"refund": []})));
        assert!(!data_matches(pattern.clone(), json!({"refund": null})));
        assert!(!data_matches(pattern.clone(), json!({"refund": "re_1"})));
        // No `data` at all, or a `data` that is no object: `data.refund` is missing too.
        let f = filter(pattern);
        assert!(f.matches(&json!({"type": "invoice.paid"})));
        assert!(f.matches(&json!({"type": "invoice.paid", "data": "text"})));
    }

    // ---- Arrays in the envelope ----

    #[test]
    fn an_array_field_matches_if_any_element_does() {
        let pattern = json!({"data": {"tags": ["vip"]}});
        assert!(data_matches(pattern.clone(), json!({"tags": ["new", "vip"]})));
        assert!(data_matches(pattern.clone(), json!({"tags": [["vip"]]})));
        assert!(!data_matches(pattern.clone(), json!({"tags": ["new"]})));
        assert!(!data_matches(pattern, json!({"tags": []})));
        let numeric = json!({"data": {"amounts": [{"numeric": [">", 100]}]}});
        assert!(data_matches(numeric.clone(), json!({"amounts": [1, 2, 300]})));
        assert!(!data_matches(numeric, json!({"amounts": [1, 2, 3]})));
        // EventBridge's rule applies to anything-but as well: one other element is enough.
        let but = json!({"data": {"tags": [{"anything-but": "test"}]}});
        assert!(data_matches(but.clone(), json!({"tags": ["test", "live"]})));
        assert!(!data_matches(but, json!({"tags": ["test"]})));
    }

    #[test]
    fn a_nested_pattern_over_an_array_of_objects_needs_one_element_matching_whole() {
        let pattern = json!({"data": {"lines": {"sku": ["A"], "qty": [{"numeric": [">", 1]}]}}});
        assert!(data_matches(
            pattern.clone(),
            json!({"lines": [{"sku": "B", "qty": 5}, {"sku": "A", "qty": 2}]})
        ));
        assert!(!data_matches(
            pattern.clone(),
            json!({"lines": [{"sku": "A", "qty": 1}, {"sku": "B", "qty": 5}]})
        ));
        assert!(!data_matches(pattern, json!({"lines": []})));
    }

    // ---- Nesting ----

    #[test]
    fn nested_fields_and_all_keys_must_match() {
        let pattern = json!({
            "type": [{"prefix": "invoice."}],
            "data": {"customer": {"country": ["FR", "DE"], "tier": ["gold"]}}
        });
        let event = |kind: &str, country: &str| json!({"type": kind, "data": {"customer": {"country": country, "tier": "gold"}}});
        let f = filter(pattern);
        assert!(f.matches(&event("invoice.paid", "FR")));
        assert!(!f.matches(&event("charge.paid", "FR")));
        assert!(!f.matches(&event("invoice.paid", "US")));
        assert!(!f.matches(&json!({"type": "invoice.paid", "data": {"customer": "FR"}})));
        assert!(!f.matches(&json!({"type": "invoice.paid"})));
    }

    #[test]
    fn an_envelope_that_is_no_object_matches_only_absence() {
        assert!(!filter(json!({"type": ["a"]})).matches(&json!("a")));
        assert!(!filter(json!({"type": ["a"]})).matches(&json!(null)));
        assert!(filter(json!({"type": [{"exists": false}]})).matches(&json!([1, 2])));
    }

    // ---- $or ----

    #[test]
    fn or_needs_one_alternative_and_every_sibling() {
        let f = filter(json!({
            "type": ["invoice.paid"],
            "$or": [
                {"data": {"amount": [{"numeric": [">", 1000]}]}},
                {"data": {"customer": {"tier": ["gold"]}}}
            ]
        }));
        let event = |kind: &str, amount: i64, tier: &str| json!({"type": kind, "data": {"amount": amount, "customer": {"tier": tier}}});
        assert!(f.matches(&event("invoice.paid", 5000, "basic")));
        assert!(f.matches(&event("invoice.paid", 10, "gold")));
        assert!(!f.matches(&event("invoice.paid", 10, "basic")));
        assert!(!f.matches(&event("invoice.void", 5000, "gold")));
    }

    #[test]
    fn nested_or_and_or_inside_a_field() {
        let f = filter(json!({
            "$or": [
                {"type": ["invoice.void"]},
                {"$or": [{"data": {"x": [1]}}, {"data": {"y": [2]}}]}
            ]
        }));
        assert!(f.matches(&json!({"type": "invoice.void"})));
        assert!(f.matches(&json!({"type": "other", "data": {"x": 1}})));
        assert!(f.matches(&json!({"type": "other", "data": {"y": 2}})));
        assert!(!f.matches(&json!({"type": "other", "data": {"x": 2, "y": 1}})));

        let inner = filter(json!({"data": {"$or": [{"a": ["1"]}, {"b": [{"exists": true}]}], "c": [true]}}));
        assert!(inner.matches(&json!({"data": {"a": "1", "c": true}})));
        assert!(inner.matches(&json!({"data": {"b": null, "c": true}})));
        assert!(!inner.matches(&json!({"data": {"b": null, "c": false}})));
        assert!(!inner.matches(&json!({"data": {"a": "2", "c": true}})));
    }

    // ---- Serde and accessors ----

    #[test]
    fn keeps_the_original_json_and_round_trips() {
        let pattern = json!({"data": {"amount": [{"numeric": [">", 0, "<=", 5]}]}, "type": ["a"]});
        let f = filter(pattern.clone());
        assert_eq!(f.as_json(), &pattern);
        assert_eq!(Value::from(f.clone()), pattern);
        assert_eq!(ContentFilter::try_from(pattern.clone()), Ok(f.clone()));
        let text = serde_json::to_string(&f).expect("serializes");
        assert_eq!(serde_json::from_str::<Value>(&text).expect("json"), pattern);
        assert_eq!(serde_json::from_str::<ContentFilter>(&text).expect("deserializes"), f);
    }

    #[test]
    fn deserializing_an_invalid_filter_fails_with_its_message() {
        let err = serde_json::from_str::<ContentFilter>(r#"{"type": "invoice.paid"}"#).expect_err("refused");
        assert!(
            err.to_string().contains("`type`: the values to match go in a list"),
            "{err}"
        );
    }

    // ---- Validation ----

    #[test]
    fn refuses_a_filter_that_is_not_a_non_empty_object() {
        assert_refused(json!({}), &["at least one field"]);
        assert_refused(json!(["invoice.paid"]), &["a filter is a JSON object", "not a list"]);
        assert_refused(json!("invoice.paid"), &["not a string"]);
        assert_refused(json!(null), &["not null"]);
    }

    #[test]
    fn refuses_a_bare_value_in_place_of_a_list() {
        assert_refused(
            json!({"data": {"currency": "EUR"}}),
            &["`data.currency`", "write [\"EUR\"] rather than \"EUR\""],
        );
        assert_refused(json!({"data": {"amount": 5}}), &["`data.amount`", "[5]"]);
    }

    #[test]
    fn refuses_empty_lists_and_empty_objects() {
        assert_refused(
            json!({"data": {"currency": []}}),
            &["`data.currency`", "empty list of matchers"],
        );
        assert_refused(json!({"type": ["a"], "data": {}}), &["`data`", "empty object"]);
        assert_refused(
            json!({"data": {"x": [{}]}}),
            &["`data.x[0]`", "exactly one key", "this one is empty"],
        );
    }

    #[test]
    fn refuses_unknown_matchers_naming_the_supported_ones() {
        for key in ["wildcard", "cidr", "contains"] {
            let message = refused(json!({"data": {"ip": [{key: "x"}]}}));
            assert!(message.starts_with("`data.ip[0]`: "), "{message}");
            assert!(
                message.contains(&format!("`{key}` is not a supported matcher")),
                "{message}"
            );
            assert!(message.contains(MATCHER_KEYS), "{message}");
        }
    }

    #[test]
    fn refuses_a_matcher_object_with_several_keys() {
        assert_refused(
            json!({"type": [{"prefix": "a", "suffix": "b"}]}),
            &[
                "`type[0]`",
                "exactly one key",
                "has 2: `prefix`, `suffix`;",
                "side by side",
            ],
        );
    }

    #[test]
    fn refuses_nested_lists_and_non_string_string_matchers() {
        assert_refused(json!({"type": [["a", "b"]]}), &["`type[0]`", "cannot be a list"]);
        assert_refused(
            json!({"type": [{"prefix": 5}]}),
            &["`type[0]`", "`prefix` takes a string", "not a number"],
        );
        assert_refused(
            json!({"type": [{"suffix": {"equals-ignore-case": ".png"}}]}),
            &["`type[0]`", "`suffix` takes a string", "not an object"],
        );
        assert_refused(
            json!({"type": [{"equals-ignore-case": null}]}),
            &["`equals-ignore-case` takes a string"],
        );
    }

    #[test]
    fn refuses_malformed_anything_but() {
        let expect = |arg: Value, parts: &[&str]| {
            assert_refused(json!({"data": {"s": ["x", {"anything-but": arg}]}}), parts);
        };
        expect(json!([]), &["`data.s[1]`", "all strings or all numbers"]);
        expect(json!(["a", 1]), &["`data.s[1]`", "all strings or all numbers"]);
        expect(json!([null]), &["all strings or all numbers"]);
        expect(
            json!(true),
            &["`data.s[1]`", "`anything-but` takes a string", "not a boolean"],
        );
        expect(json!({"wildcard": "*x"}), &["`wildcard` cannot follow `anything-but`"]);
        expect(json!({"prefix": 1}), &["`prefix` takes a string"]);
    }

    #[test]
    fn refuses_malformed_numeric() {
        let expect = |arg: Value, parts: &[&str]| {
            assert_refused(json!({"data": {"amount": [{"numeric": arg}]}}), parts);
        };
        let pairs = "a numeric range needs an operator and a number in pairs, such as [\">=\", 100]";
        expect(json!(100), &["`data.amount[0]`", pairs]);
        expect(json!([">="]), &["`data.amount[0]`", pairs]);
        expect(json!([">", 1, "<"]), &[pairs]);
        expect(json!([100, ">="]), &[pairs]);
        expect(
            json!(["=>", 100]),
            &["`data.amount[0]`", "`=>` is not a numeric operator"],
        );
        expect(json!([">=", "100"]), &["`data.amount[0]`", "\"100\" is a string"]);
        expect(
            json!(["<", 5, ">", 0]),
            &["`data.amount[0]`", "lower bound (> or >=) first"],
        );
        expect(json!(["=", 5, "<", 9]), &["lower bound (> or >=) first"]);
        expect(
            json!([">", 5, "<", 5]),
            &["`data.amount[0]`", "lower bound 5 must be less than the upper bound 5"],
        );
        expect(
            json!([">", 9, "<", 1]),
            &["lower bound 9 must be less than the upper bound 1"],
        );
    }

    #[test]
    fn refuses_exists_without_a_boolean() {
        assert_refused(
            json!({"data": {"refund": [{"exists": "true"}]}}),
            &["`data.refund[0]`", "`exists` takes true or false, not a string"],
        );
        assert_refused(json!({"data": {"refund": [{"exists": 1}]}}), &["not a number"]);
    }

    #[test]
    fn refuses_malformed_or() {
        assert_refused(
            json!({"$or": [{"type": ["a"]}]}),
            &["`$or`", "at least two patterns, found 1"],
        );
        assert_refused(
            json!({"$or": {"type": ["a"]}}),
            &["`$or`", "takes a list of patterns", "not an object"],
        );
        assert_refused(
            json!({"data": {"$or": [{"a": [1]}, ["b"]]}}),
            &["`data.$or[1]`", "each pattern of `$or` is an object, not a list"],
        );
        assert_refused(json!({"$or": [{"a": [1]}, {}]}), &["`$or[1]`", "empty object"]);
        assert_refused(
            json!({"$or": [{"a": [1]}, {"b": "x"}]}),
            &["`$or[1].b`", "go in a list"],
        );
    }

    #[test]
    fn refuses_nesting_deeper_than_ten_levels() {
        let nest = |levels: usize| (1..levels).fold(json!({"leaf": [1]}), |inner, _| json!({"a": inner}));
        assert!(ContentFilter::parse(nest(10)).is_ok());
        let path = std::iter::repeat_n("a", 10).collect::<Vec<_>>().join(".");
        assert_refused(nest(11), &[&format!("`{path}`"), "at most 10 objects deep"]);
        // Each pattern of `$or` is a level too.
        let or_nest = (1..11).fold(json!({"leaf": [1]}), |inner, _| json!({"$or": [inner, {"b": [1]}]}));
        assert_refused(or_nest, &["at most 10 objects deep"]);
    }

    #[test]
    fn refuses_more_than_a_hundred_matchers() {
        let values = |n: usize| Value::Array((0..n).map(|i| json!(i)).collect());
        assert!(ContentFilter::parse(json!({"data": {"a": values(60), "b": values(40)}})).is_ok());
        assert_refused(
            json!({"data": {"a": values(60), "b": values(41)}}),
            &["`data.b[40]`", "at most 100 matchers"],
        );
    }

    #[test]
    fn refuses_long_strings_and_field_names() {
        let long = "x".repeat(257);
        assert!(ContentFilter::parse(json!({"type": ["x".repeat(256)]})).is_ok());
        assert_refused(
            json!({"type": [long.clone()]}),
            &["`type[0]`", "257 characters long; at most 256"],
        );
        assert_refused(
            json!({"type": [{"prefix": long.clone()}]}),
            &["`type[0]`", "the `prefix` string is 257"],
        );
        assert_refused(
            json!({"data": {long.clone(): [1]}}),
            &["`data`", "a field name is 257 characters"],
        );
        assert_refused(json!({long: [1]}), &["a field name is 257 characters"]);
        // Characters, not bytes: 200 two-byte characters are fine.
        assert!(ContentFilter::parse(json!({"type": ["é".repeat(200)]})).is_ok());
    }

    #[test]
    fn refuses_filters_over_4096_bytes() {
        let fields: Map<String, Value> = (0..20).map(|i| (format!("f{i}"), json!(["y".repeat(250)]))).collect();
        let message = refused(json!({"data": fields}));
        assert!(message.contains("bytes of JSON; at most 4096 are allowed"), "{message}");
    }

    // ---- Properties ----

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            "[a-zA-Z0-9_.é-]{0,10}".prop_map(Value::from),
        ];
        leaf.prop_recursive(5, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec(
                    (
                        "type|data|amount|currency|status|tags|refund|lines|sku|[a-z]{1,3}",
                        inner
                    ),
                    0..6
                )
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
            ]
        })
    }

    fn every_kind_of_matcher() -> ContentFilter {
        filter(json!({
            "type": [{"prefix": "invoice."}, {"suffix": ".paid"}, "charge.failed"],
            "data": {
                "currency": [{"equals-ignore-case": "eur"}, {"anything-but": ["USD", "GBP"]}],
                "amount": [{"numeric": [">", 0, "<=", 1000]}, {"anything-but": 5}, 100],
                "refund": [{"exists": false}, null, true],
                "lines": {"sku": [{"anything-but": {"prefix": "test-"}}], "qty": [{"exists": true}]},
                "$or": [
                    {"status": ["paid"]},
                    {"$or": [{"tags": ["vip"]}, {"tags": [{"anything-but": {"suffix": "x"}}]}]}
                ]
            }
        }))
    }

    fn a_valid_pattern() -> impl Strategy<Value = Value> {
        // Cents rather than any float: serde_json parses short decimals exactly.
        let cents = (-100_000_000i64..100_000_000).prop_map(|c| c as f64 / 100.0);
        (
            "[a-z]{1,8}",
            "[a-zA-Z0-9 ._-]{0,20}",
            cents,
            any::<i64>(),
            any::<bool>(),
        )
            .prop_map(|(field, text, number, integer, flag)| {
                json!({
                    "type": [text.clone(), {"prefix": text.clone()}],
                    "data": {
                        field: [{"numeric": [">=", number]}, integer, {"anything-but": [text]}],
                        "flag": [flag, {"exists": flag}]
                    },
                    "$or": [{"id": [{"suffix": "1"}]}, {"id": [{"numeric": ["<", number]}]}]
                })
            })
    }

    proptest! {
        #[test]
        fn matching_never_panics_and_filters_round_trip_through_serde(
            envelope in any_json(),
            data in any_json(),
            pattern in a_valid_pattern(),
        ) {
            let fixed = every_kind_of_matcher();
            fixed.matches(&envelope);
            fixed.matches(&json!({"id": "evt_1", "type": "invoice.paid", "data": data}));

            let f = ContentFilter::parse(pattern).expect("the strategy makes valid patterns");
            let text = serde_json::to_string(&f).expect("serializes");
            let back: ContentFilter = serde_json::from_str(&text).expect("deserializes");
            prop_assert_eq!(&back, &f);
            prop_assert_eq!(back.matches(&envelope), f.matches(&envelope));
        }
    }
}
