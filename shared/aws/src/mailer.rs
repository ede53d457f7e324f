//! Email through SES v2 `SendEmail`, from the configured sender identity.

use async_trait::async_trait;
use aws_sdk_sesv2::types::{Body, Content, Destination, EmailContent, Message};
use aws_sdk_sesv2::Client;
use hookwise_core::ports::{Mailer, OutgoingEmail, PortResult};
use hookwise_core::PortError;

use crate::error::classify;
use crate::lazy_client::LazyClient;

#[derive(Clone, Debug)]
pub struct SesMailer {
    client: LazyClient<Client>,
    from: String,
}

fn text(data: &str) -> Result<Content, PortError> {
    Content::builder()
        .data(data)
        .charset("UTF-8")
        .build()
        .map_err(|e| PortError::permanent("building an email", e))
}

impl SesMailer {
    pub fn new(client: impl Into<LazyClient<Client>>, from: &str) -> Self {
        Self {
            client: client.into(),
            from: from.to_owned(),
        }
    }

    pub fn from_address(&self) -> &str {
        &self.from
    }
}

#[async_trait]
impl Mailer for SesMailer {
    async fn send(&self, email: &OutgoingEmail) -> PortResult<()> {
        let message = Message::builder()
            .subject(text(&email.subject)?)
            .body(Body::builder().text(text(&email.text)?).build())
            .build();
        self.client
            .send_email()
            .from_email_address(&self.from)
            .destination(Destination::builder().to_addresses(email.to.as_str()).build())
            .content(EmailContent::builder().simple(message).build())
            .send()
            .await
            .map_err(|e| classify("send email", e))?;
        Ok(())
    }
}
