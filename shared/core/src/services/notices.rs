//! Owners' emails about dead deliveries. A storm must not become an email storm: an owner gets
//! at most one email per digest window (`Config::digest_window`). The first death after a
//! quiet window is told at once; the ones after it wait for the window to pass and go out
//! together, in one digest that counts them, lists the first ones, and says how to replay
//! them all (a recover since the first death, per subscription).
//!
//! An email is claimed, sent, then finished (its notices marked sent); one that fails gives
//! its claim back, to be tried again after a window, and a claim left by a handler that died
//! goes stale after `Config::notice_claim_timeout`. Either way the scheduler's tick sends it
//! later ([`Services::send_due_digests`]). So each dead round is told once, and every owner at
//! least once.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use chrono::{DateTime, Utc};

use super::Services;
use crate::error::Result;
use crate::metrics;
use crate::model::*;
use crate::ports::{DeadNotice, DigestClaim, OutgoingEmail};

/// A digest lists this many deliveries one by one; the rest are counted.
pub const DIGEST_LISTED: usize = 50;
/// Owners whose emails are looked for per query.
const PAGE: u32 = 100;
/// The shortest wait before a failed email is tried again (with a window of 0).
const MIN_RETRY: chrono::Duration = chrono::Duration::seconds(30);
/// Tries of the record of an email sent, a throttled or failed one tried again.
const RECORD_TRIES: u32 = 5;

impl Services {
    /// Record an email sent (`finish_digest`), a retryable failure tried again a few times
    /// over a second or two: the mail service has no idempotency key, so a record that does
    /// not land is the email sent again.
    async fn record_sent(&self, claim: &DigestClaim) -> Result<()> {
        let mut backoff = chrono::Duration::milliseconds(50);
        for _ in 1..RECORD_TRIES {
            match self.ports.store.finish_digest(claim).await {
                Err(crate::PortError::Retryable { what, source }) => {
                    tracing::warn!(%what, error = %source, "the record of an email sent failed; trying it again");
                    self.ports.clock.sleep_until(self.now() + backoff).await;
                    backoff = backoff * 2;
                }
                other => return Ok(other?),
            }
        }
        Ok(self.ports.store.finish_digest(claim).await?)
    }
    /// Send `owner`'s email if their window is open and notices wait: how many deliveries it
    /// told of, or `None` if it was not theirs to send now.
    pub(crate) async fn send_digest(&self, owner: &Email) -> Result<Option<usize>> {
        let store = &self.ports.store;
        let (now, window_start, stale_before) = self.digest_times();
        let Some(claim) = store.claim_digest(owner, now, window_start, stale_before).await? else {
            return Ok(None);
        };
        let sent = match self.notice_email(&claim).await {
            Ok(email) => self.send_email(&email).await,
            Err(error) => Err(error),
        };
        match sent {
            Ok(()) => {
                self.record_sent(&claim).await?;
                tracing::info!(to = %owner, deliveries = claim.notices.len(), "dead-delivery email sent");
                Ok(Some(claim.notices.len()))
            }
            Err(error) => {
                // Tried again after a window: an owner whose emails keep failing does not
                // take the place of the others tick after tick.
                let retry_at = now + chrono::Duration::from_std(self.config.digest_window).unwrap_or_default();
                store.release_digest(&claim, retry_at.max(now + MIN_RETRY)).await?;
                Err(error)
            }
        }
    }

    /// The scheduler's part: every owner whose window has opened on waiting notices gets their
    /// email, within the tick's budget. How many emails went out.
    pub(crate) async fn send_due_digests(&self, until: Instant) -> Result<usize> {
        let (now, window_start, _) = self.digest_times();
        let owners = self.ports.store.due_digests(now, window_start, PAGE).await?;
        let mut emails = 0;
        for owner in &owners {
            if Instant::now() >= until {
                break;
            }
            match self.send_digest(owner).await {
                Ok(Some(_)) => emails += 1,
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(to = %owner, %error, "a dead-delivery email failed; the next tick tries again")
                }
            }
        }
        Ok(emails)
    }

    /// Send one email, counting a failure ([`metrics::EMAIL_FAILURES`]): every email an
    /// owner gets goes through here.
    pub(crate) async fn send_email(&self, email: &OutgoingEmail) -> Result<()> {
        let sent = self.ports.mailer.send(email).await;
        if sent.is_err() {
            self.metrics.count(metrics::EMAIL_FAILURES, 1);
        }
        Ok(sent?)
    }

    /// Now, the start of a window ending now, and the time before which a claim is stale.
    fn digest_times(&self) -> (DateTime<Utc>, DateTime<Utc>, DateTime<Utc>) {
        let now = self.now();
        let ago = |d: std::time::Duration| now - chrono::Duration::from_std(d).unwrap_or_default();
        (
            now,
            ago(self.config.digest_window),
            ago(self.config.notice_claim_timeout),
        )
    }

    async fn notice_email(&self, claim: &DigestClaim) -> Result<OutgoingEmail> {
        let mut listed = Vec::new();
        let mut urls: HashMap<SubscriptionId, String> = HashMap::new();
        for notice in claim.notices.iter().take(DIGEST_LISTED) {
            if !urls.contains_key(&notice.subscription_id) {
                let url = self
                    .ports
                    .store
                    .get_subscription(&notice.tenant_id, &notice.subscription_id)
                    .await?
                    .map_or_else(|| "(deleted subscription)".to_owned(), |s| s.url.to_string());
                urls.insert(notice.subscription_id.clone(), url);
            }
            let delivery = self.ports.store.get_delivery(&notice.delivery_id).await?;
            listed.push((notice, delivery));
        }
        let url = |n: &DeadNotice| urls[&n.subscription_id].as_str();
        if let [(notice, Some(delivery))] = &listed[..] {
            let attempts = self
                .ports
                .store
                .attempts(&delivery.id)
                .await?
                .into_iter()
                .filter(|a| a.round == notice.round)
                .collect::<Vec<_>>();
            return Ok(self.dead_email(&claim.owner, delivery, url(notice), &attempts));
        }
        Ok(self.digest_email(claim, &listed, url))
    }

    /// The one email a subscription's owner gets when Hookwise disables it for failing.
    pub(super) fn disabled_email(
        &self,
        sub: &Subscription,
        to: Email,
        since: DateTime<Utc>,
        hours: u32,
    ) -> OutgoingEmail {
        let api = self.api_url();
        let since = since.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let text = format!(
            "Hookwise has disabled your subscription {id} to {url}: its endpoint has not answered \
             a webhook with success since {since} ({hours} hours, the subscription's \
             auto_disable_after_hours). New events create no deliveries for it, and the \
             deliveries still retrying go dead.\n\n\
             Once the endpoint works again, re-enable it, then send what it missed:\n  \
             curl -X PATCH -H \"Authorization: Bearer $HOOKWISE_API_KEY\" -H \"Content-Type: application/json\" \
             -d '{{\"status\":\"active\"}}' {api}/v1/subscriptions/{id}\n  \
             curl -X POST -H \"Authorization: Bearer $HOOKWISE_API_KEY\" -H \"Content-Type: application/json\" \
             -d '{{\"since\":\"{since}\"}}' {api}/v1/subscriptions/{id}/recover\n",
            id = sub.id,
            url = sub.url,
        );
        OutgoingEmail {
            to,
            subject: format!(
                "[Hookwise] Subscription to {} disabled: its endpoint keeps failing",
                sub.url
            ),
            text,
        }
    }

    fn replay_hint(&self, id: &DeliveryId) -> String {
        format!(
            "  Replay it from the dashboard ({api}/dashboard), or:\n  curl -X POST -H \"Authorization: Bearer $HOOKWISE_API_KEY\" {api}/v1/deliveries/{id}/replay\n",
            api = self.api_url(),
        )
    }

    fn api_url(&self) -> &str {
        self.config.public_api_url.trim_end_matches('/')
    }

    fn dead_email(&self, to: &Email, d: &Delivery, url: &str, attempts: &[Attempt]) -> OutgoingEmail {
        let mut text = format!(
            "A webhook could not be delivered and Hookwise has stopped retrying it.\n\n\
             Event:        {} ({})\nDelivery:     {}\nEndpoint:     {}\nAttempts:     {}\nLast result:  {}\n\nAttempts:\n",
            d.event_id,
            d.event_type,
            d.id,
            url,
            d.attempts,
            d.last_error.as_deref().unwrap_or("-"),
        );
        for a in attempts {
            text.push_str(&format!(
                "  #{} at {}: {}\n",
                a.attempt,
                a.started_at.to_rfc3339(),
                attempt_result(a)
            ));
        }
        text.push('\n');
        text.push_str(&self.replay_hint(&d.id));
        OutgoingEmail {
            to: to.clone(),
            subject: format!("[Hookwise] Delivery of {} to {} failed", d.event_type, url),
            text,
        }
    }

    fn digest_email<'a>(
        &self,
        claim: &DigestClaim,
        listed: &[(&DeadNotice, Option<Delivery>)],
        url: impl Fn(&DeadNotice) -> &'a str,
    ) -> OutgoingEmail {
        let count = claim.notices.len();
        let first = claim.notices.first().map(|n| n.died_at);
        let mut text = format!(
            "{count} webhook deliveries could not be delivered and Hookwise has stopped retrying them{}.\n\n",
            first
                .map(|t| format!(" (the first at {})", t.to_rfc3339()))
                .unwrap_or_default()
        );
        for (notice, delivery) in listed {
            match delivery {
                Some(d) => text.push_str(&format!(
                    "- Event {} ({}) to {}: {} attempts, last result {}\n",
                    d.event_id,
                    d.event_type,
                    url(notice),
                    d.attempts,
                    d.last_error.as_deref().unwrap_or("-")
                )),
                None => text.push_str(&format!("- Delivery to {} (no longer kept)\n", url(notice))),
            }
            text.push_str(&format!(
                "  {}/v1/deliveries/{}/replay\n",
                self.api_url(),
                notice.delivery_id
            ));
        }
        if count > listed.len() {
            text.push_str(&format!("- and {} more\n", count - listed.len()));
        }
        // Each subscription's first death here: a recover since then replays them all.
        let mut since: BTreeMap<&SubscriptionId, DateTime<Utc>> = BTreeMap::new();
        for n in &claim.notices {
            since
                .entry(&n.subscription_id)
                .and_modify(|t| *t = (*t).min(n.died_at))
                .or_insert(n.died_at);
        }
        text.push_str(&format!(
            "\nReplay one from the dashboard ({api}/dashboard) or with a POST to its replay link above \
             (-H \"Authorization: Bearer $HOOKWISE_API_KEY\"). Replay them all, per subscription:\n",
            api = self.api_url()
        ));
        for (sub, t) in since {
            text.push_str(&format!(
                "  curl -X POST -H \"Authorization: Bearer $HOOKWISE_API_KEY\" -H \"Content-Type: application/json\" \
                 -d '{{\"since\":\"{}\"}}' {}/v1/subscriptions/{sub}/recover\n",
                t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                self.api_url()
            ));
        }
        OutgoingEmail {
            to: claim.owner.clone(),
            subject: format!("[Hookwise] {count} webhook deliveries failed"),
            text,
        }
    }
}

fn attempt_result(a: &Attempt) -> String {
    match (&a.error, a.status_code) {
        (Some(e), _) => e.clone(),
        (None, Some(code)) => format!("HTTP {code}"),
        (None, None) => "no response".into(),
    }
}
