//! The customer portal: `POST /v1/portal-sessions` mints a link that opens the dashboard in
//! portal mode (`/portal`), scoped to one tenant; the link carries its token after `#`, so it
//! never reaches a server log, and the page keeps it in `sessionStorage`. The portal page may
//! be framed by the origins the deployment allows (`frame-ancestors`), and carries the
//! deployment's name, accent colour and logo ([`PortalConfig`]), all served from here.

use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, HOST};
use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use chrono::{DateTime, Utc};
use hookwise_core::model::PortalSessionId;
use hookwise_core::services::Caller;
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ApiResult};
use super::extract::{acting_for, path_id, ApiJson, Identified, PathId};
use super::ApiState;

/// The portal's settings, from the deployment's environment (`from_env`).
#[derive(Debug, Clone, Default)]
pub struct PortalConfig {
    /// Origins that may frame the portal (`https://app.example.com`); none: no framing.
    pub frame_ancestors: Vec<String>,
    /// Shown in the portal's header; "Hookwise" if unset.
    pub name: Option<String>,
    /// `#rgb` or `#rrggbb`.
    pub accent: Option<String>,
    /// A `data:image/...` URL (nothing is fetched from elsewhere).
    pub logo: Option<String>,
    /// Where links point (`HOOKWISE_PUBLIC_API_URL`, as in the owners' emails); unset, the
    /// host each request came to.
    pub public_url: Option<String>,
}

pub const FRAME_ANCESTORS_VAR: &str = "HOOKWISE_PORTAL_FRAME_ANCESTORS";
pub const NAME_VAR: &str = "HOOKWISE_PORTAL_NAME";
pub const ACCENT_VAR: &str = "HOOKWISE_PORTAL_ACCENT";
pub const LOGO_VAR: &str = "HOOKWISE_PORTAL_LOGO";
pub const PUBLIC_URL_VAR: &str = "HOOKWISE_PUBLIC_API_URL";

impl PortalConfig {
    /// From `HOOKWISE_PORTAL_FRAME_ANCESTORS` (origins, space-separated), `_NAME`, `_ACCENT`,
    /// `_LOGO` and `HOOKWISE_PUBLIC_API_URL`; each checked, so a bad value stops the start-up.
    pub fn from_env() -> Result<Self, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let config = Self {
            frame_ancestors: var(FRAME_ANCESTORS_VAR)
                .map(|v| v.split_whitespace().map(str::to_owned).collect())
                .unwrap_or_default(),
            name: var(NAME_VAR),
            accent: var(ACCENT_VAR),
            logo: var(LOGO_VAR),
            public_url: var(PUBLIC_URL_VAR).map(|u| u.trim_end_matches('/').to_owned()),
        };
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), String> {
        for origin in &self.frame_ancestors {
            if !is_origin(origin) {
                return Err(format!(
                    "{FRAME_ANCESTORS_VAR}: `{origin}` is not an origin (`https://app.example.com`, `http://127.0.0.1:3000`)"
                ));
            }
        }
        if let Some(url) = &self.public_url {
            if !is_origin(url) {
                return Err(format!(
                    "{PUBLIC_URL_VAR}: `{url}` is not an origin (`https://hooks.example.com`)"
                ));
            }
        }
        if let Some(accent) = &self.accent {
            let hex = accent.strip_prefix('#').unwrap_or_default();
            if !matches!(hex.len(), 3 | 6) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!("{ACCENT_VAR}: `{accent}` is not a colour (`#0b7285`)"));
            }
        }
        if let Some(logo) = &self.logo {
            let ok = logo.starts_with("data:image/") && !logo.contains(['"', '\'', ' ', '<', '>']);
            if !ok {
                return Err(format!("{LOGO_VAR}: a logo is a `data:image/...` URL"));
            }
        }
        if self.name.as_ref().is_some_and(|n| n.chars().count() > 80) {
            return Err(format!("{NAME_VAR}: at most 80 characters"));
        }
        Ok(())
    }

    /// The portal page's `frame-ancestors`: the origins allowed, or none.
    fn frame_ancestors(&self) -> String {
        match self.frame_ancestors.is_empty() {
            true => "'none'".into(),
            false => self.frame_ancestors.join(" "),
        }
    }
}

/// `scheme://host[:port]`, nothing more: safe in a header and a CSP.
fn is_origin(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("https://").or_else(|| s.strip_prefix("http://")) else {
        return false;
    };
    !rest.is_empty()
        && rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
}

/// `POST /v1/portal-sessions`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewPortalSession {
    /// 60 to 86 400; default 3 600.
    ttl_seconds: Option<u32>,
    #[serde(default)]
    read_only: bool,
}

#[derive(Debug, Serialize)]
pub struct PortalSessionView {
    pub id: PortalSessionId,
    /// The link to hand the customer: the portal, its token (and `read_only=1` for a
    /// read-only one) after `#`.
    pub url: String,
    pub read_only: bool,
    pub expires_at: DateTime<Utc>,
}

/// A link for a tenant's customer: minted by a tenant's key for its own tenant, or by an
/// operator key for the tenant `Hookwise-Tenant` names. Not by a portal session.
pub async fn create_session(
    State(s): State<ApiState>,
    headers: HeaderMap,
    Identified { caller, named }: Identified,
    ApiJson(body): ApiJson<NewPortalSession>,
) -> ApiResult<(StatusCode, Json<PortalSessionView>)> {
    not_from_portal(&caller)?;
    let tenant = acting_for(&s, caller, named.as_ref()).await?;
    let ttl = body.ttl_seconds.map(|t| chrono::Duration::seconds(t.into()));
    let (session, token) = s.services.create_portal_session(&tenant, ttl, body.read_only).await?;
    let origin = match &s.portal.public_url {
        Some(url) => url.clone(),
        None => request_origin(&headers)?,
    };
    Ok((
        StatusCode::CREATED,
        Json(PortalSessionView {
            id: session.id,
            // The mode rides along for the page to hide what it may not do (the API refuses it
            // all the same).
            url: format!(
                "{origin}/portal#token={token}{}",
                if session.read_only { "&read_only=1" } else { "" }
            ),
            read_only: session.read_only,
            expires_at: session.valid_until,
        }),
    ))
}

/// `DELETE /v1/portal-sessions/{id}`: that link answers 401 from now on.
pub async fn revoke_session(
    State(s): State<ApiState>,
    Identified { caller, named }: Identified,
    PathId(id): PathId,
) -> ApiResult<StatusCode> {
    not_from_portal(&caller)?;
    let tenant = acting_for(&s, caller, named.as_ref()).await?;
    let id = path_id(&id, PortalSessionId::parse)?;
    s.services.revoke_portal_session(&tenant.id, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/portal-sessions`: every link of the tenant made until now answers 401.
pub async fn revoke_sessions(
    State(s): State<ApiState>,
    Identified { caller, named }: Identified,
) -> ApiResult<StatusCode> {
    not_from_portal(&caller)?;
    let tenant = acting_for(&s, caller, named.as_ref()).await?;
    s.services.revoke_portal_sessions(&tenant.id).await?;
    Ok(StatusCode::NO_CONTENT)
}

fn not_from_portal(caller: &Caller) -> Result<(), ApiError> {
    match caller {
        Caller::Portal { .. } => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "portal_cannot_mint",
            "a portal session cannot make or revoke portal sessions",
        )),
        _ => Ok(()),
    }
}

/// The origin the request came to: `X-Forwarded-Proto` (else http on a loopback host, https
/// elsewhere) and `Host`.
fn request_origin(headers: &HeaderMap) -> Result<String, ApiError> {
    let host = headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| is_origin(&format!("http://{h}")))
        .ok_or_else(|| {
            ApiError::bad_request(
                "no_host",
                "the request has no usable Host header to build the link from (set HOOKWISE_PUBLIC_API_URL)",
            )
        })?;
    let loopback = host.starts_with("127.") || host.starts_with("localhost") || host.starts_with("[::1]");
    let scheme = match headers.get("x-forwarded-proto").and_then(|p| p.to_str().ok()) {
        Some(p @ ("http" | "https")) => p,
        _ if loopback => "http",
        _ => "https",
    };
    Ok(format!("{scheme}://{host}"))
}

/// The portal page: the dashboard's, in portal mode, framed only by the allowed origins.
pub async fn page(State(s): State<ApiState>) -> impl IntoResponse {
    let csp = super::dashboard::csp(&s.portal.frame_ancestors());
    super::dashboard::page_with(csp)
}

/// The deployment's name, accent colour and logo, for the portal page; and whether it shows
/// a signing secret again after it is made, for the dashboard's Reveal button.
pub async fn branding(State(s): State<ApiState>) -> impl IntoResponse {
    let body = serde_json::json!({
        "name": s.portal.name.as_deref().unwrap_or("Hookwise"),
        "accent": s.portal.accent,
        "logo": s.portal.logo,
        "reveals_secrets": s.services.reveals_secrets(),
    });
    (
        [
            (CONTENT_TYPE, "application/json"),
            (CACHE_CONTROL, "no-cache"),
            (HeaderName::from_static("x-content-type-options"), "nosniff"),
        ],
        body.to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_no_public_url_then_a_link_starts_with_the_host_the_request_came_to() {
        let headers = |host: &str, proto: Option<&str>| {
            let mut h = HeaderMap::new();
            h.insert(HOST, host.parse().unwrap());
            if let Some(p) = proto {
                h.insert("x-forwarded-proto", p.parse().unwrap());
            }
            h
        };
        assert_eq!(
            request_origin(&headers("127.0.0.1:8080", None)).unwrap(),
            "http://127.0.0.1:8080"
        );
        assert_eq!(
            request_origin(&headers("abc.execute-api.eu-west-1.amazonaws.com", None)).unwrap(),
            "https://abc.execute-api.eu-west-1.amazonaws.com"
        );
        assert_eq!(
            request_origin(&headers("hooks.example.com", Some("http"))).unwrap(),
            "http://hooks.example.com"
        );
        assert!(request_origin(&headers("evil.example.com/x#", None)).is_err());
    }

    #[test]
    fn given_settings_then_only_origins_colours_and_data_logos_are_taken() {
        let good = PortalConfig {
            frame_ancestors: vec!["https://app.example.com".into(), "http://127.0.0.1:3000".into()],
            accent: Some("#0b7285".into()),
            logo: Some("data:image/svg+xml;base64,PHN2Zy8+".into()),
            ..PortalConfig::default()
        };
        assert!(good.check().is_ok());
        assert_eq!(good.frame_ancestors(), "https://app.example.com http://127.0.0.1:3000");
        assert_eq!(PortalConfig::default().frame_ancestors(), "'none'");
        for bad in [
            PortalConfig {
                frame_ancestors: vec!["https://a.example.com; script-src *".into()],
                ..PortalConfig::default()
            },
            PortalConfig {
                frame_ancestors: vec!["*".into()],
                ..PortalConfig::default()
            },
            PortalConfig {
                accent: Some("red; x".into()),
                ..PortalConfig::default()
            },
            PortalConfig {
                logo: Some("https://cdn.example.com/logo.png".into()),
                ..PortalConfig::default()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
