//! The dead-letter handler: make sure the delivery is dead, then tell its owner once, or in
//! one digest when many die together (a storm must not become an email storm).

use std::collections::BTreeMap;

use super::Services;
use crate::error::{PortError, Result};
use crate::model::*;
use crate::ports::{DeliveryTask, NoticeClaim, OutgoingEmail};
use crate::state::{is_due_attempt, next_task};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeadLetterReport {
    /// Deliveries told about (in single emails or digests).
    pub notified: usize,
    pub emails: usize,
    /// Deliveries that were not dead (the queue had given up on their message) and went
    /// back on their schedule.
    pub rescheduled: usize,
}

/// One dead delivery with what the email says about it.
struct Notice {
    delivery: Delivery,
    url: String,
    attempts: Vec<Attempt>,
}

impl Services {
    #[tracing::instrument(name = "dead_letters", skip_all, fields(messages = tasks.len()))]
    pub async fn handle_dead_letters(&self, tasks: &[DeliveryTask]) -> Result<DeadLetterReport> {
        let store = &self.ports.store;
        let mut by_owner: BTreeMap<String, (Email, Vec<Notice>)> = BTreeMap::new();
        let mut report = DeadLetterReport::default();
        let mut held = 0;
        let mut seen = std::collections::HashSet::new();
        let now = self.now();
        let stale_before = now - chrono::Duration::from_std(self.config.notice_claim_timeout).unwrap_or_default();
        for task in tasks {
            if !seen.insert((&task.delivery_id, task.round)) {
                continue; // a copy of a message in this batch: the same notice
            }
            let Some(delivery) = store.get_delivery(&task.delivery_id).await? else {
                continue;
            };
            if delivery.round != task.round {
                continue; // replayed since: this round's death is old news
            }
            if is_due_attempt(&delivery, task) {
                // Not dead: the queue gave up on the message after failed receives (timeouts,
                // throttling, a crash), which is no verdict on the delivery. Back on its
                // schedule it goes, due now or when it was due.
                let due = delivery.next_attempt_at.unwrap_or(self.now()).max(self.now());
                self.schedule_attempt(next_task(&delivery), due).await?;
                tracing::warn!(
                    delivery_id = %delivery.id, event_id = %delivery.event_id, tenant_id = %delivery.tenant_id,
                    attempt = task.attempt, %due,
                    "the queue gave up on this delivery's message after failed receives; it is back on its schedule"
                );
                report.rescheduled += 1;
                continue;
            }
            if delivery.status != DeliveryStatus::Dead {
                continue;
            }
            match store
                .claim_dead_notice(&delivery.id, delivery.round, now, stale_before)
                .await?
            {
                NoticeClaim::Claimed => {}
                NoticeClaim::Sent => continue,
                NoticeClaim::Held => {
                    // Another handler is sending it (or died doing so: its claim goes stale).
                    held += 1;
                    continue;
                }
            }
            tracing::info!(
                delivery_id = %delivery.id, event_id = %delivery.event_id, tenant_id = %delivery.tenant_id,
                round = delivery.round, "dead delivery; its owner will be told"
            );
            let sub = store
                .get_subscription(&delivery.tenant_id, &delivery.subscription_id)
                .await?;
            let tenant = store.get_tenant(&delivery.tenant_id).await?;
            let Some(to) = sub
                .as_ref()
                .and_then(|s| s.owner_email.clone())
                .or(tenant.map(|t| t.owner_email))
            else {
                tracing::warn!(delivery_id = %delivery.id, "dead delivery has no owner to tell");
                continue;
            };
            let attempts = store
                .attempts(&delivery.id)
                .await?
                .into_iter()
                .filter(|a| a.round == delivery.round)
                .collect();
            let url = sub.map_or_else(|| "(deleted subscription)".to_owned(), |s| s.url.to_string());
            by_owner
                .entry(to.to_string())
                .or_insert_with(|| (to, Vec::new()))
                .1
                .push(Notice {
                    delivery,
                    url,
                    attempts,
                });
        }

        // Each email with the notices it carries. One that cannot be sent gives its claims
        // back for the next try (the batch is redelivered) and stops no other owner's.
        let mut failed = None;
        for (_, (to, notices)) in by_owner {
            let emails: Vec<(OutgoingEmail, &[Notice])> = if notices.len() >= self.config.digest_threshold {
                vec![(self.digest_email(&to, &notices), &notices[..])]
            } else {
                notices
                    .iter()
                    .map(|n| (self.dead_email(&to, n), std::slice::from_ref(n)))
                    .collect()
            };
            for (email, told) in &emails {
                match self.ports.mailer.send(email).await {
                    Ok(()) => {
                        for n in told.iter() {
                            store.mark_dead_notice_sent(&n.delivery.id, n.delivery.round).await?;
                        }
                        report.notified += told.len();
                        report.emails += 1;
                    }
                    Err(error) => {
                        tracing::warn!(to = %email.to, %error, notices = told.len(),
                            "a dead-delivery email failed; its notices go again with the batch");
                        for n in told.iter() {
                            store.release_dead_notice(&n.delivery.id, n.delivery.round).await?;
                        }
                        failed.get_or_insert(error);
                    }
                }
            }
        }
        match failed {
            Some(error) => Err(error.into()),
            // Back with the batch until the other claim is sent or has gone stale.
            None if held > 0 => Err(PortError::retryable(
                "dead letters",
                format!("{held} notice(s) claimed by another handler and not sent yet"),
            )
            .into()),
            None => Ok(report),
        }
    }

    fn replay_hint(&self, d: &Delivery) -> String {
        format!(
            "  Replay it from the dashboard ({api}/dashboard), or:\n  curl -X POST -H \"Authorization: Bearer $HOOKWISE_API_KEY\" {api}/v1/deliveries/{id}/replay\n",
            api = self.config.public_api_url.trim_end_matches('/'),
            id = d.id
        )
    }

    fn dead_email(&self, to: &Email, n: &Notice) -> OutgoingEmail {
        let d = &n.delivery;
        let mut text = format!(
            "A webhook could not be delivered and Hookwise has stopped retrying it.\n\n\
             Event:        {} ({})\nDelivery:     {}\nEndpoint:     {}\nAttempts:     {}\nLast result:  {}\n\nAttempts:\n",
            d.event_id,
            d.event_type,
            d.id,
            n.url,
            d.attempts,
            d.last_error.as_deref().unwrap_or("-"),
        );
        for a in &n.attempts {
            text.push_str(&format!(
                "  #{} at {}: {}\n",
                a.attempt,
                a.started_at.to_rfc3339(),
                attempt_result(a)
            ));
        }
        text.push('\n');
        text.push_str(&self.replay_hint(d));
        OutgoingEmail {
            to: to.clone(),
            subject: format!("[Hookwise] Delivery of {} to {} failed", d.event_type, n.url),
            text,
        }
    }

    fn digest_email(&self, to: &Email, notices: &[Notice]) -> OutgoingEmail {
        let mut text = format!(
            "{} webhook deliveries could not be delivered and Hookwise has stopped retrying them.\n\n",
            notices.len()
        );
        for n in notices {
            let d = &n.delivery;
            text.push_str(&format!(
                "- Event {} ({}) to {}: {} attempts, last result {}\n",
                d.event_id,
                d.event_type,
                n.url,
                d.attempts,
                d.last_error.as_deref().unwrap_or("-")
            ));
            text.push_str(&self.replay_hint(d));
        }
        OutgoingEmail {
            to: to.clone(),
            subject: format!("[Hookwise] {} webhook deliveries failed", notices.len()),
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
