//! The email outbox: `Mailer` writes each message as a row and as an RFC 5322 `.eml` file
//! under `<data-dir>/outbox/`, where a person (or a test) can open it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use chrono::{DateTime, Utc};
use hookwise_core::model::Email;
use hookwise_core::ports::{Mailer, OutgoingEmail, PortResult};
use hookwise_core::PortError;
use rusqlite::params;

use crate::{db_err, from_nanos, nanos, LocalBackend};

/// A mail in the outbox.
#[derive(Debug, Clone, PartialEq)]
pub struct SentEmail {
    /// The `Message-ID` header, with its angle brackets.
    pub message_id: String,
    pub sent_at: DateTime<Utc>,
    pub from: String,
    pub to: Email,
    pub subject: String,
    pub text: String,
    /// The `.eml` file, unless the backend is in memory.
    pub path: Option<PathBuf>,
}

impl LocalBackend {
    /// Every mail sent so far, oldest first.
    pub async fn outbox(&self) -> PortResult<Vec<SentEmail>> {
        let dir = self.inner.outbox_dir.clone();
        self.with_conn("read the outbox", move |conn| {
            let err = |e| db_err("read the outbox", e);
            let mut stmt = conn
                .prepare_cached(
                    "SELECT message_id, sent_at, from_addr, to_addr, subject, body, file FROM outbox ORDER BY id",
                )
                .map_err(err)?;
            let rows = stmt
                .query_map([], |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, i64>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, String>(3)?,
                        row.get::<_, String>(4)?,
                        row.get::<_, String>(5)?,
                        row.get::<_, Option<String>>(6)?,
                    ))
                })
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(err)?;
            rows.into_iter()
                .map(|(message_id, sent_at, from, to, subject, text, file)| {
                    Ok(SentEmail {
                        message_id,
                        sent_at: from_nanos(sent_at),
                        from,
                        to: Email::parse(&to).map_err(|e| PortError::permanent("decode a stored email address", e))?,
                        subject,
                        text,
                        path: match (&dir, file) {
                            (Some(dir), Some(file)) => Some(dir.join(file)),
                            _ => None,
                        },
                    })
                })
                .collect()
        })
        .await
    }
}

#[async_trait]
impl Mailer for LocalBackend {
    async fn send(&self, email: &OutgoingEmail) -> PortResult<()> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let now = self.now();
        let sent_at = nanos(now);
        let from = self.inner.config.mail_from.clone();
        // Unique without asking the database: time, process and a counter.
        let unique = format!(
            "{sent_at}.{}.{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let message_id = format!("<{unique}@{}>", domain_of(&from));
        let file = format!("{}-{unique}.eml", now.format("%Y%m%dT%H%M%S"));

        // The file first, then the row: a row never names a missing file, and a failed
        // insert takes its file away again.
        let path = self.inner.outbox_dir.as_ref().map(|dir| dir.join(&file));
        if let Some(path) = &path {
            let eml = format_eml(&from, email, now, &message_id);
            let tmp = path.with_extension("eml.tmp");
            let written = tokio::task::spawn_blocking({
                let (tmp, path) = (tmp.clone(), path.clone());
                // Written beside, then renamed: a reader never sees half a message.
                move || std::fs::write(&tmp, eml).and_then(|()| std::fs::rename(&tmp, &path))
            })
            .await
            .map_err(|e| PortError::permanent("write an outbox file", e))?;
            written.map_err(|e| PortError::retryable(format!("write {}", path.display()), e))?;
        }
        let email = email.clone();
        let file = path.as_ref().map(|_| file);
        let inserted = self
            .with_conn_kept("send email to the outbox", move |conn| {
                conn.prepare_cached(
                    "INSERT INTO outbox (message_id, sent_at, from_addr, to_addr, subject, body, file)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        message_id,
                        sent_at,
                        from,
                        email.to.as_str(),
                        email.subject,
                        email.text,
                        file
                    ])
                })
                .map_err(|e| db_err("send email to the outbox", e))?;
                Ok(())
            })
            .await;
        if let (Err(_), Some(path)) = (&inserted, &path) {
            let _ = std::fs::remove_file(path);
        }
        inserted
    }
}

fn domain_of(address: &str) -> &str {
    let addr = address.rsplit('<').next().unwrap_or(address).trim_end_matches('>');
    addr.rsplit_once('@')
        .map(|(_, d)| d)
        .filter(|d| !d.is_empty())
        .unwrap_or("hookwise.local")
}

/// RFC 5322 with a UTF-8 plain-text body (RFC 6532/2045 `8bit`), CRLF line ends.
fn format_eml(from: &str, email: &OutgoingEmail, date: DateTime<Utc>, message_id: &str) -> String {
    let body = email
        .text
        .replace("\r\n", "\n")
        .replace('\r', "\n")
        .replace('\n', "\r\n");
    format!(
        "From: {from}\r\nTo: {to}\r\nSubject: {subject}\r\nDate: {date}\r\nMessage-ID: {message_id}\r\n\
         MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n{body}{end}",
        from = header_value(from),
        to = email.to.as_str(),
        subject = header_value(&email.subject),
        date = date.to_rfc2822(),
        end = if body.ends_with("\r\n") { "" } else { "\r\n" },
    )
}

/// One header line: no line breaks (header injection), and non-ASCII as an RFC 2047
/// encoded word.
fn header_value(value: &str) -> String {
    let flat: String = value.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if flat.is_ascii() {
        flat
    } else {
        format!("=?UTF-8?B?{}?=", B64.encode(flat.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_lose_line_breaks_and_encode_non_ascii() {
        assert_eq!(header_value("Dead\r\nBcc: x@y.com"), "Dead  Bcc: x@y.com");
        let encoded = header_value("Zustellung fehlgeschlagen: Café");
        assert!(encoded.starts_with("=?UTF-8?B?") && encoded.ends_with("?="));
        let inner = &encoded["=?UTF-8?B?".len()..encoded.len() - 2];
        assert_eq!(B64.decode(inner).unwrap(), "Zustellung fehlgeschlagen: Café".as_bytes());
    }

    #[test]
    fn the_message_id_domain_comes_from_the_sender() {
        assert_eq!(domain_of("Hookwise <hookwise@example.org>"), "example.org");
        assert_eq!(domain_of("ops@example.com"), "example.com");
        assert_eq!(domain_of("nobody"), "hookwise.local");
    }
}
