//! The services on the AWS adapters, from a [`FunctionConfig`]: what every function (and
//! `hookwise tenant create --aws`) builds once per process.

use std::sync::Arc;

use hookwise_core::ports::{Sender, SystemClock};
use hookwise_core::services::Services;
use rand::SeedableRng;

use crate::{AwsAdapters, AwsClients, FunctionConfig};

impl FunctionConfig {
    /// The services on these tables and queues, with SDK clients from the standard chain
    /// (which honours `AWS_ENDPOINT_URL`). A host that never POSTs passes
    /// [`hookwise_core::ports::NoSender`].
    pub async fn services(&self, sender: Arc<dyn Sender>) -> Services {
        let clients = AwsClients::from_env().await;
        let ports = AwsAdapters::new(&clients, &self.aws()).ports(sender, Arc::new(SystemClock));
        Services::new(ports, self.service_config(), rand::rngs::StdRng::from_os_rng())
    }
}
