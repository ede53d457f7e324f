//! The backend contract suite (the one the SQLite and in-memory backends pass) on the AWS
//! adapters: once with everything on moto server, once with the tables on DynamoDB Local
//! (AWS's own engine) and the queues on moto. Each test gets tables and queues of its own,
//! made from template.yaml's definitions.

mod support;

// The factory skips a test (returning from it) when its endpoint is not configured and the
// test script did not require it; `support::endpoint` says so on stderr.
mod moto {
    hookwise_core::store_contract_tests!({
        let Some(backend) = crate::support::moto_backend().await else {
            return;
        };
        std::future::ready(backend)
    });
}

mod dynamodb_local {
    hookwise_core::store_contract_tests!({
        let Some(backend) = crate::support::dynamodb_local_backend().await else {
            return;
        };
        std::future::ready(backend)
    });
}
