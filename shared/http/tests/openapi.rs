//! The checked-in OpenAPI document and the Router are kept in step: every route the Router
//! serves is documented, every documented operation is served, and `/v1/openapi.json`
//! serves the document itself.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use hookwise_core::services::{Config, Services};
use hookwise_core::testing::memory::{status_outcome, Harness, ScriptedSender};
use hookwise_http::api::{OPENAPI_JSON, ROUTES};
use hookwise_http::{router, ApiState};
use rand::SeedableRng;
use serde_json::Value;
use tower::ServiceExt;

const METHODS: [&str; 8] = ["get", "put", "post", "delete", "patch", "head", "options", "trace"];

fn document() -> Value {
    serde_json::from_str(OPENAPI_JSON).expect("openapi.json is JSON")
}

/// Every `(METHOD, path)` the document describes.
fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in METHODS {
            if item.get(method).is_some() {
                ops.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    ops
}

fn served() -> BTreeSet<(String, String)> {
    ROUTES.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect()
}

#[test]
fn given_the_router_and_the_document_then_every_route_is_documented_and_every_documented_route_is_served() {
    let doc = document();
    let (documented, served) = (documented(&doc), served());
    let undocumented: Vec<_> = served.difference(&documented).collect();
    let unserved: Vec<_> = documented.difference(&served).collect();
    assert!(
        undocumented.is_empty(),
        "routes missing from shared/http/openapi.json: {undocumented:?}"
    );
    assert!(
        unserved.is_empty(),
        "documented but not in the Router's route table: {unserved:?}"
    );
    assert_eq!(ROUTES.len(), served.len(), "a route is listed twice");
}

#[test]
fn given_the_document_then_it_is_openapi_3_1_with_unique_operation_ids_and_declared_path_parameters() {
    let doc = document();
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.1.")),
        "{}",
        doc["openapi"]
    );
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
    let mut ids = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        let in_template: BTreeSet<String> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
            .map(str::to_owned)
            .collect();
        for method in METHODS {
            let Some(op) = item.get(method) else { continue };
            let id = op["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path} has no operationId"));
            assert!(ids.insert(id.to_owned()), "operationId {id} is used twice");
            assert!(
                op["responses"].as_object().is_some_and(|r| !r.is_empty()),
                "{method} {path} documents no response"
            );
            let declared: BTreeSet<String> = item["parameters"]
                .as_array()
                .into_iter()
                .chain(op["parameters"].as_array())
                .flatten()
                .filter(|p| p["in"] == "path")
                .map(|p| p["name"].as_str().unwrap().to_owned())
                .collect();
            assert_eq!(declared, in_template, "{method} {path}: path parameters");
        }
    }
}

/// Resolve a local `$ref` such as `#/components/schemas/Error`.
fn resolve<'a>(doc: &'a Value, reference: &str) -> Option<&'a Value> {
    doc.pointer(reference.strip_prefix('#')?)
}

fn refs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => out.push(r.clone()),
                    _ => refs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

#[test]
fn given_the_document_then_every_reference_and_link_resolves() {
    let doc = document();
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(!all.is_empty());
    for r in &all {
        assert!(resolve(&doc, r).is_some(), "dangling $ref {r}");
    }
    let ids: BTreeSet<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|item| METHODS.iter().filter_map(|m| item.get(*m)))
        .filter_map(|op| op["operationId"].as_str())
        .collect();
    let mut links = 0;
    for item in doc["paths"].as_object().unwrap().values() {
        for op in METHODS.iter().filter_map(|m| item.get(*m)) {
            for response in op["responses"].as_object().unwrap().values() {
                for link in response["links"].as_object().into_iter().flat_map(|l| l.values()) {
                    links += 1;
                    let target = link["operationId"].as_str().unwrap();
                    assert!(ids.contains(target), "a link to unknown operation {target}");
                }
            }
        }
    }
    assert!(links > 0, "the document links created resources to their reads");
}

/// A well-formed id of the kind a path segment names, that names nothing.
fn fill(path: &str) -> String {
    let prefix = match path.split('/').nth(2) {
        Some("subscriptions") => "sub_",
        Some("events") => "evt_",
        Some("deliveries") => "dlv_",
        _ => return path.to_owned(),
    };
    path.replace("{id}", &format!("{prefix}01JD0000000000000000000000"))
}

#[tokio::test]
async fn given_each_route_in_the_table_then_the_router_answers_it_rather_than_its_fallbacks() {
    let harness = Harness::new(ScriptedSender::new(|_, _| status_outcome(200)));
    let (_, key) = harness.tenant("a@example.com").await;
    let services = Services::new(
        harness.services.ports().clone(),
        Config::default(),
        rand::rngs::StdRng::seed_from_u64(1),
    );
    let app = router(ApiState::new(Arc::new(services)));
    for (method, path) in ROUTES {
        let uri = fill(path);
        let req = Request::builder()
            .method(*method)
            .uri(&uri)
            .header(header::AUTHORIZATION, format!("Bearer {key}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from("{}"))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {uri}: {text}");
        assert!(
            !text.contains("no route for"),
            "{method} {uri} fell through to the fallback: {text}"
        );
        assert!(!status.is_server_error(), "{method} {uri}: {status} {text}");
    }
}

#[tokio::test]
async fn given_no_key_then_v1_openapi_json_serves_the_checked_in_document() {
    let harness = Harness::new(ScriptedSender::new(|_, _| status_outcome(200)));
    let app = router(ApiState::new(Arc::new(Services::new(
        harness.services.ports().clone(),
        Config::default(),
        rand::rngs::StdRng::seed_from_u64(1),
    ))));
    let resp = app
        .oneshot(Request::get("/v1/openapi.json").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    let on_disk =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json")).expect("the checked-in document");
    assert_eq!(String::from_utf8(bytes.to_vec()).unwrap(), on_disk);
}
