//! Tables and queues made from `template.yaml`'s own definitions, for moto, DynamoDB Local
//! and LocalStack (tests, `hookwise dev` on AWS APIs), so the template and the code cannot
//! drift: a key or index the code needs and the template lacks fails there first.
//!
//! The template is read as plain YAML: CloudFormation's short tags (`!Ref`, `!GetAtt`,
//! `!Sub`) parse as tagged values, and a property that is not a literal is left to its
//! default.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection, ProjectionType,
    ScalarAttributeType, TimeToLiveSpecification,
};
use aws_sdk_sqs::types::QueueAttributeName;
use hookwise_core::PortError;
use serde_yaml_ng::Value;

use crate::config::{AwsClients, AwsConfig};
use crate::error::classify;

/// The logical ids `template.yaml` gives the resources the adapters use.
pub const MAIN_TABLE: &str = "MainTable";
pub const SCHEDULER_TABLE: &str = "SchedulerTable";
pub const DELIVERY_QUEUE: &str = "DeliveryQueue";
pub const DEAD_LETTER_QUEUE: &str = "DeadLetterQueue";
pub const PARKED_QUEUE: &str = "ParkedQueue";

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("template.yaml is not YAML: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
    #[error("template.yaml: {0}")]
    Shape(String),
}

fn shape(msg: impl Into<String>) -> TemplateError {
    TemplateError::Shape(msg.into())
}

#[derive(Debug, Clone, PartialEq)]
pub struct KeySpec {
    pub attribute: String,
    pub key_type: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct IndexSpec {
    pub name: String,
    pub keys: Vec<KeySpec>,
    pub projection_type: String,
    pub non_key_attributes: Vec<String>,
}

/// An `AWS::DynamoDB::Table`'s schema.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSpec {
    pub keys: Vec<KeySpec>,
    /// Attribute name and type (`S`, `N`, `B`).
    pub attributes: Vec<(String, String)>,
    pub indexes: Vec<IndexSpec>,
    pub ttl_attribute: Option<String>,
}

/// An `AWS::SQS::Queue`'s settings.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QueueSpec {
    pub visibility_timeout: Option<i64>,
    pub message_retention_period: Option<i64>,
    /// The logical id of the dead-letter queue and `maxReceiveCount`.
    pub redrive: Option<(String, i64)>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct TemplateResources {
    pub tables: BTreeMap<String, TableSpec>,
    pub queues: BTreeMap<String, QueueSpec>,
}

/// A tag's inner value (`!Ref X` → `X`), any other value as it is.
fn untag(v: &Value) -> &Value {
    match v {
        Value::Tagged(t) => &t.value,
        other => other,
    }
}

fn literal_str(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        _ => None,
    }
}

fn literal_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn field<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    v.get(name)
}

fn seq(v: Option<&Value>) -> &[Value] {
    v.and_then(Value::as_sequence).map(Vec::as_slice).unwrap_or(&[])
}

fn keys(v: Option<&Value>, owner: &str) -> Result<Vec<KeySpec>, TemplateError> {
    let keys: Vec<KeySpec> = seq(v)
        .iter()
        .map(|k| {
            Ok(KeySpec {
                attribute: field(k, "AttributeName")
                    .and_then(literal_str)
                    .ok_or_else(|| shape(format!("{owner}: a key without AttributeName")))?,
                key_type: field(k, "KeyType")
                    .and_then(literal_str)
                    .ok_or_else(|| shape(format!("{owner}: a key without KeyType")))?,
            })
        })
        .collect::<Result<_, TemplateError>>()?;
    if keys.is_empty() {
        return Err(shape(format!("{owner} has no KeySchema")));
    }
    Ok(keys)
}

impl TemplateResources {
    pub fn parse(yaml: &str) -> Result<Self, TemplateError> {
        let doc: Value = serde_yaml_ng::from_str(yaml)?;
        let resources = field(&doc, "Resources")
            .and_then(Value::as_mapping)
            .ok_or_else(|| shape("no Resources"))?;
        let mut out = TemplateResources::default();
        for (id, res) in resources {
            let id = id
                .as_str()
                .ok_or_else(|| shape("a resource id that is not a string"))?
                .to_owned();
            let props = field(res, "Properties").cloned().unwrap_or(Value::Null);
            match field(res, "Type").and_then(Value::as_str) {
                Some("AWS::DynamoDB::Table") => {
                    let attributes = seq(field(&props, "AttributeDefinitions"))
                        .iter()
                        .map(|a| {
                            let name = field(a, "AttributeName").and_then(literal_str);
                            let ty = field(a, "AttributeType").and_then(literal_str);
                            name.zip(ty).ok_or_else(|| {
                                shape(format!(
                                    "{id}: an attribute definition needs AttributeName and AttributeType"
                                ))
                            })
                        })
                        .collect::<Result<_, _>>()?;
                    let indexes = seq(field(&props, "GlobalSecondaryIndexes"))
                        .iter()
                        .map(|g| {
                            let name = field(g, "IndexName")
                                .and_then(literal_str)
                                .ok_or_else(|| shape(format!("{id}: an index without IndexName")))?;
                            let projection = field(g, "Projection");
                            Ok(IndexSpec {
                                keys: keys(field(g, "KeySchema"), &format!("{id}.{name}"))?,
                                projection_type: projection
                                    .and_then(|p| field(p, "ProjectionType"))
                                    .and_then(literal_str)
                                    .unwrap_or_else(|| "ALL".into()),
                                non_key_attributes: seq(projection.and_then(|p| field(p, "NonKeyAttributes")))
                                    .iter()
                                    .filter_map(literal_str)
                                    .collect(),
                                name,
                            })
                        })
                        .collect::<Result<_, TemplateError>>()?;
                    let ttl = field(&props, "TimeToLiveSpecification")
                        .filter(|t| field(t, "Enabled").and_then(Value::as_bool).unwrap_or(false))
                        .and_then(|t| field(t, "AttributeName"))
                        .and_then(literal_str);
                    let table = TableSpec {
                        keys: keys(field(&props, "KeySchema"), &id)?,
                        attributes,
                        indexes,
                        ttl_attribute: ttl,
                    };
                    out.tables.insert(id, table);
                }
                Some("AWS::SQS::Queue") => {
                    let redrive = field(&props, "RedrivePolicy").map(|r| {
                        // `deadLetterTargetArn: !GetAtt DeadLetterQueue.Arn`
                        let target = field(r, "deadLetterTargetArn").map(untag).and_then(|t| match t {
                            Value::String(s) => Some(s.split('.').next().unwrap_or(s).to_owned()),
                            Value::Sequence(parts) => parts.first().and_then(literal_str),
                            _ => None,
                        });
                        let count = field(r, "maxReceiveCount").and_then(literal_i64).unwrap_or(5);
                        target.map(|t| (t, count))
                    });
                    let redrive = match redrive {
                        Some(None) => {
                            return Err(shape(format!(
                                "{id}: RedrivePolicy.deadLetterTargetArn must be !GetAtt <queue>.Arn"
                            )))
                        }
                        Some(r) => r,
                        None => None,
                    };
                    out.queues.insert(
                        id,
                        QueueSpec {
                            visibility_timeout: field(&props, "VisibilityTimeout").and_then(literal_i64),
                            message_retention_period: field(&props, "MessageRetentionPeriod").and_then(literal_i64),
                            redrive,
                        },
                    );
                }
                _ => {}
            }
        }
        Ok(out)
    }

    pub fn table(&self, id: &str) -> Result<&TableSpec, TemplateError> {
        self.tables
            .get(id)
            .ok_or_else(|| shape(format!("no AWS::DynamoDB::Table named {id}")))
    }

    pub fn queue(&self, id: &str) -> Result<&QueueSpec, TemplateError> {
        self.queues
            .get(id)
            .ok_or_else(|| shape(format!("no AWS::SQS::Queue named {id}")))
    }
}

fn key_elements(keys: &[KeySpec]) -> Result<Vec<KeySchemaElement>, PortError> {
    keys.iter()
        .map(|k| {
            KeySchemaElement::builder()
                .attribute_name(&k.attribute)
                .key_type(KeyType::from(k.key_type.as_str()))
                .build()
                .map_err(|e| PortError::permanent("key schema", e))
        })
        .collect()
}

impl TableSpec {
    /// Create the table as `name`, on demand, and turn its TTL on.
    pub async fn create(&self, client: &aws_sdk_dynamodb::Client, name: &str) -> Result<(), PortError> {
        let attributes = self
            .attributes
            .iter()
            .map(|(n, t)| {
                AttributeDefinition::builder()
                    .attribute_name(n)
                    .attribute_type(ScalarAttributeType::from(t.as_str()))
                    .build()
                    .map_err(|e| PortError::permanent("attribute definition", e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let indexes = self
            .indexes
            .iter()
            .map(|i| {
                let projection = Projection::builder()
                    .projection_type(ProjectionType::from(i.projection_type.as_str()))
                    .set_non_key_attributes((!i.non_key_attributes.is_empty()).then(|| i.non_key_attributes.clone()))
                    .build();
                GlobalSecondaryIndex::builder()
                    .index_name(&i.name)
                    .set_key_schema(Some(key_elements(&i.keys)?))
                    .projection(projection)
                    .build()
                    .map_err(|e| PortError::permanent("index", e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        client
            .create_table()
            .table_name(name)
            .billing_mode(BillingMode::PayPerRequest)
            .set_attribute_definitions(Some(attributes))
            .set_key_schema(Some(key_elements(&self.keys)?))
            .set_global_secondary_indexes((!indexes.is_empty()).then_some(indexes))
            .send()
            .await
            .map_err(|e| classify(&format!("create table {name}"), e))?;
        if let Some(attr) = &self.ttl_attribute {
            let spec = TimeToLiveSpecification::builder()
                .attribute_name(attr)
                .enabled(true)
                .build()
                .map_err(|e| PortError::permanent("ttl", e))?;
            client
                .update_time_to_live()
                .table_name(name)
                .time_to_live_specification(spec)
                .send()
                .await
                .map_err(|e| classify(&format!("enable TTL on {name}"), e))?;
        }
        Ok(())
    }
}

/// Create the queue as `name` (its dead-letter queue, by logical id, already in `urls`);
/// returns its URL.
async fn create_queue(
    client: &aws_sdk_sqs::Client,
    spec: &QueueSpec,
    name: &str,
    dlq_arns: &HashMap<String, String>,
) -> Result<String, PortError> {
    let mut req = client.create_queue().queue_name(name);
    if let Some(v) = spec.visibility_timeout {
        req = req.attributes(QueueAttributeName::VisibilityTimeout, v.to_string());
    }
    if let Some(v) = spec.message_retention_period {
        req = req.attributes(QueueAttributeName::MessageRetentionPeriod, v.to_string());
    }
    if let Some((dlq, max)) = &spec.redrive {
        let arn = dlq_arns.get(dlq).ok_or_else(|| {
            PortError::permanent("create queue", format!("its dead-letter queue {dlq} is not created"))
        })?;
        let policy = serde_json::json!({"deadLetterTargetArn": arn, "maxReceiveCount": max.to_string()});
        req = req.attributes(QueueAttributeName::RedrivePolicy, policy.to_string());
    }
    let out = req
        .send()
        .await
        .map_err(|e| classify(&format!("create queue {name}"), e))?;
    out.queue_url
        .ok_or_else(|| PortError::permanent("create queue", "no QueueUrl in the answer"))
}

async fn queue_arn(client: &aws_sdk_sqs::Client, url: &str) -> Result<String, PortError> {
    let out = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| classify("queue arn", e))?;
    out.attributes
        .and_then(|mut a| a.remove(&QueueAttributeName::QueueArn))
        .ok_or_else(|| PortError::permanent("queue arn", format!("no QueueArn for {url}")))
}

/// What [`provision`] made.
#[derive(Debug, Clone)]
pub struct Provisioned {
    pub table: String,
    pub scheduler_table: String,
    pub delivery_queue_url: String,
    pub dead_letter_queue_url: String,
    /// The ARN of the KMS key that seals signing secrets.
    pub secrets_key: String,
}

impl Provisioned {
    /// The adapters' configuration for these resources (SQS's delay limit, 30 days' retention).
    pub fn config(&self, sender_email: &str) -> AwsConfig {
        AwsConfig {
            table: self.table.clone(),
            scheduler_table: self.scheduler_table.clone(),
            delivery_queue_url: self.delivery_queue_url.clone(),
            dead_letter_queue_url: self.dead_letter_queue_url.clone(),
            sender_email: sender_email.to_owned(),
            secrets_key: self.secrets_key.clone(),
            queue_max_delay_seconds: crate::config::SQS_MAX_DELAY_SECONDS,
            retention: crate::config::retention_days(crate::config::DEFAULT_RETENTION_DAYS),
        }
    }
}

/// Both tables and the three queues as the template defines them, named `{prefix}-main`,
/// `{prefix}-scheduler`, `{prefix}-delivery`, `{prefix}-dead-letter` and `{prefix}-parked`,
/// and a KMS key for the signing secrets. The tables are created concurrently, then each
/// queue after the one it redrives to.
pub async fn provision(
    clients: &AwsClients,
    resources: &TemplateResources,
    prefix: &str,
) -> Result<Provisioned, Box<dyn std::error::Error + Send + Sync>> {
    let main = resources.table(MAIN_TABLE)?;
    let scheduler = resources.table(SCHEDULER_TABLE)?;
    let delivery = resources.queue(DELIVERY_QUEUE)?;
    let dead = resources.queue(DEAD_LETTER_QUEUE)?;
    let parked = resources.queue(PARKED_QUEUE)?;
    let names = Provisioned {
        table: format!("{prefix}-main"),
        scheduler_table: format!("{prefix}-scheduler"),
        delivery_queue_url: String::new(),
        dead_letter_queue_url: String::new(),
        secrets_key: create_key(clients, prefix).await?,
    };
    let (a, b) = futures::join!(
        main.create(&clients.dynamodb, &names.table),
        scheduler.create(&clients.dynamodb, &names.scheduler_table)
    );
    a?;
    b?;
    // Each queue after the one it redrives to.
    let parked_url = create_queue(&clients.sqs, parked, &format!("{prefix}-parked"), &HashMap::new()).await?;
    let mut arns = HashMap::from([(PARKED_QUEUE.to_owned(), queue_arn(&clients.sqs, &parked_url).await?)]);
    let dead_url = create_queue(&clients.sqs, dead, &format!("{prefix}-dead-letter"), &arns).await?;
    arns.insert(DEAD_LETTER_QUEUE.to_owned(), queue_arn(&clients.sqs, &dead_url).await?);
    let delivery_url = create_queue(&clients.sqs, delivery, &format!("{prefix}-delivery"), &arns).await?;
    Ok(Provisioned {
        delivery_queue_url: delivery_url,
        dead_letter_queue_url: dead_url,
        ..names
    })
}

/// A symmetric KMS key for the signing secrets (the template's `SecretsKey`): its ARN.
async fn create_key(clients: &AwsClients, prefix: &str) -> Result<String, PortError> {
    let out = clients
        .kms
        .create_key()
        .description(format!("{prefix}: Hookwise signing secrets"))
        .send()
        .await
        .map_err(|e| classify("create the secrets key", e))?;
    out.key_metadata()
        .and_then(|m| m.arn())
        .map(str::to_owned)
        .ok_or_else(|| PortError::permanent("create the secrets key", "KMS answered no key ARN"))
}

/// Make `email` a verified SES v2 identity (moto and LocalStack verify at once; real SES
/// sends a confirmation mail first).
pub async fn verify_sender(clients: &AwsClients, email: &str) -> Result<(), PortError> {
    clients
        .sesv2
        .create_email_identity()
        .email_identity(email)
        .send()
        .await
        .map_err(|e| classify("verify the sender", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real template.yaml.
    fn the_template() -> Value {
        let yaml = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../template.yaml")).unwrap();
        serde_yaml_ng::from_str(&yaml).unwrap()
    }

    /// A function's role (`Role: !GetAtt <role>.Arn`): its logical id, and the role.
    fn role_of<'a>(doc: &'a Value, id: &str, function: &'a Value) -> (&'a str, &'a Value) {
        let role_id = untag(&function["Properties"]["Role"])
            .as_str()
            .and_then(|r| r.strip_suffix(".Arn"))
            .unwrap_or_else(|| panic!("{id} has `Role: !GetAtt <role>.Arn`"));
        (role_id, &doc["Resources"][role_id])
    }

    /// A property of a resource in the real template.yaml, as a number.
    fn template_number(resource: &str, property: &str) -> u64 {
        the_template()["Resources"][resource]["Properties"][property]
            .as_u64()
            .unwrap_or_else(|| panic!("{resource}.{property} is a number in template.yaml"))
    }

    #[test]
    fn the_templates_timeouts_hold_the_longest_delivery_and_the_visibility_timeouts_are_six_times_them() {
        let deliver = template_number("DeliverFunction", "Timeout");
        let longest_post = u64::from(hookwise_core::model::MAX_TIMEOUT_MS) / 1000;
        let margin = hookwise_core::services::DEADLINE_MARGIN.as_secs();
        let reads = crate::config::SDK_OPERATION_TIMEOUT.as_secs();
        assert!(
            deliver >= longest_post + margin + reads,
            "Deliver's {deliver} s holds a {longest_post} s POST"
        );
        assert!(
            margin >= 3 * crate::config::SDK_OPERATION_TIMEOUT.as_secs(),
            "three writes fit in the margin"
        );
        assert!(template_number("DeliveryQueue", "VisibilityTimeout") >= 6 * deliver);
        let dead_letter = template_number("DeadLetterFunction", "Timeout");
        assert!(template_number("DeadLetterQueue", "VisibilityTimeout") >= 6 * dead_letter);
        // A tick never outlives its lease: the function is stopped before the lease expires.
        let lease = hookwise_core::services::Config::default().scheduler_lease.as_secs();
        assert!(
            lease > template_number("SchedulerFunction", "Timeout"),
            "the scheduler's lease ({lease} s) outlasts its function's timeout"
        );
    }

    /// A stack deletes whole unless its data is protected: tables and queues are kept when the
    /// stack goes (or a change replaces them) only where `TableDeletionProtection` is on, and
    /// the log groups, whose names the next deploy of the stack takes again, never are.
    #[test]
    fn the_templates_data_is_kept_only_when_protected_and_its_log_groups_never() {
        let doc = the_template();
        let protected: Value = serde_yaml_ng::from_str("!If [Protected, Retain, Delete]").unwrap();
        assert_eq!(
            serde_yaml_ng::to_string(&doc["Conditions"]["Protected"])
                .unwrap()
                .trim(),
            "!Equals\n- !Ref TableDeletionProtection\n- 'true'"
        );
        let mut kept = Vec::new();
        for (id, resource) in doc["Resources"].as_mapping().unwrap() {
            let id = id.as_str().unwrap();
            let policies = (&resource["DeletionPolicy"], &resource["UpdateReplacePolicy"]);
            match resource["Type"].as_str().unwrap() {
                // The key with the tables: their secrets open with no other.
                "AWS::DynamoDB::Table" | "AWS::SQS::Queue" | "AWS::KMS::Key" => {
                    assert_eq!(policies, (&protected, &protected), "{id}");
                    kept.push(id);
                }
                "AWS::Logs::LogGroup" => {
                    let delete = Value::String("Delete".into());
                    assert!(
                        [&delete, &Value::Null].contains(&policies.0) && [&delete, &Value::Null].contains(&policies.1),
                        "{id} is kept: {policies:?}"
                    );
                }
                _ => assert!(resource["DeletionPolicy"].is_null(), "{id} has a DeletionPolicy"),
            }
        }
        assert_eq!(kept.len(), 6, "{kept:?}");
    }

    /// An alarm that adds several metrics fills each with 0: CloudWatch's metric math has no
    /// value where one series has none (an idle function emits no `Errors`, a metric that
    /// counts only failures none at all), and the sum would be missing, the alarm never raised.
    #[test]
    fn the_templates_alarms_that_add_metrics_fill_each_one() {
        let doc = the_template();
        for (id, resource) in doc["Resources"].as_mapping().unwrap() {
            let metrics = seq(Some(&resource["Properties"]["Metrics"]));
            let Some(expression) = metrics.iter().find_map(|m| m["Expression"].as_str()) else {
                continue;
            };
            if !expression.contains('+') {
                continue;
            }
            for term in expression.split('+').map(str::trim) {
                let filled = term
                    .strip_prefix("FILL(")
                    .and_then(|t| t.strip_suffix(", 0)"))
                    .is_some_and(|inner| metrics.iter().any(|m| m["Id"].as_str() == Some(inner)));
                assert!(filled, "{id:?}: `{term}` in `{expression}` is not FILL(<metric id>, 0)");
            }
        }
    }

    /// Every function that emails owners points their replay instructions at the deployed
    /// API (its custom domain, where it has one), not at the local default: the ones whose
    /// role may send email.
    #[test]
    fn the_templates_functions_that_send_email_know_the_public_api_url() {
        let doc = the_template();
        let resources = doc["Resources"].as_mapping().unwrap();
        let mut senders = Vec::new();
        for (id, resource) in resources {
            if resource["Type"].as_str() != Some("AWS::Serverless::Function") {
                continue;
            }
            let id = id.as_str().unwrap().to_owned();
            let (_, role) = role_of(&doc, &id, resource);
            let sends = role["Properties"]["Policies"]
                .as_sequence()
                .unwrap()
                .iter()
                .flat_map(|p| p["PolicyDocument"]["Statement"].as_sequence().unwrap())
                .any(|s| {
                    seq(Some(&s["Action"]))
                        .iter()
                        .any(|a| a.as_str() == Some("ses:SendEmail"))
                });
            if sends {
                let vars = &resource["Properties"]["Environment"]["Variables"];
                assert_eq!(
                    vars[crate::config::env::PUBLIC_API_URL],
                    doc["Outputs"]["ApiUrl"]["Value"],
                    "{id} sends email: its replay links must point where the stack says its API is"
                );
                senders.push(id);
            }
        }
        senders.sort();
        assert_eq!(senders, ["DeadLetterFunction", "DeliverFunction", "SchedulerFunction"]);
    }

    /// Least privilege: every function has a role of the template's own, with no managed
    /// policy (SAM's, and the ones it attaches to a function without a role, grant more than a
    /// function calls: `DynamoDBCrudPolicy` every write on every index, the SQS execution role
    /// every queue); each action named, each resource named, but X-Ray's, which has no
    /// resource-level permissions.
    #[test]
    fn the_templates_function_roles_name_every_action_and_resource_without_wildcards() {
        let doc = the_template();
        let resources = doc["Resources"].as_mapping().unwrap();
        let mut functions = 0;
        for (id, resource) in resources {
            if resource["Type"].as_str() != Some("AWS::Serverless::Function") {
                continue;
            }
            functions += 1;
            let id = id.as_str().unwrap();
            assert!(
                resource["Properties"]["Policies"].is_null(),
                "{id}: Policies beside its role"
            );
            let (role_id, role) = role_of(&doc, id, resource);
            assert_eq!(role["Type"].as_str(), Some("AWS::IAM::Role"), "{id}'s role");
            assert!(
                role["Properties"]["ManagedPolicyArns"].is_null(),
                "{role_id}: a managed policy"
            );
            let policies = role["Properties"]["Policies"]
                .as_sequence()
                .unwrap_or_else(|| panic!("{role_id} lists its Policies"));
            for policy in policies {
                let statements = policy["PolicyDocument"]["Statement"]
                    .as_sequence()
                    .unwrap_or_else(|| panic!("{role_id}: {policy:?} has no Statement list"));
                for statement in statements {
                    assert_eq!(statement["Effect"].as_str(), Some("Allow"), "{role_id}: {statement:?}");
                    let actions: Vec<&str> = statement["Action"]
                        .as_sequence()
                        .unwrap_or_else(|| panic!("{role_id}: Action is a list: {statement:?}"))
                        .iter()
                        .map(|a| a.as_str().unwrap_or_else(|| panic!("{role_id}: {a:?}")))
                        .collect();
                    for action in &actions {
                        assert!(
                            !action.contains('*') && action.contains(':'),
                            "{role_id}: the action {action} is not one named action"
                        );
                    }
                    let resources: Vec<&Value> = match &statement["Resource"] {
                        Value::Sequence(list) => list.iter().collect(),
                        Value::Null => panic!("{role_id}: a statement without Resource"),
                        one => vec![one],
                    };
                    let xray_only = actions.iter().all(|a| a.starts_with("xray:"));
                    for resource in resources {
                        assert!(
                            resource.as_str() != Some("*") || xray_only,
                            "{role_id}: {actions:?} on every resource"
                        );
                    }
                }
            }
        }
        assert_eq!(functions, 4);
    }

    /// The signing secrets' key: only Deliver's role may decrypt, by the key's own policy, so
    /// that no IAM policy in the account (an administrator's included) can grant it; the
    /// account keeps every other use, so the key stays manageable; and no role's own policy
    /// names KMS (a key policy naming a role and that role's policy naming the key would be
    /// a dependency cycle).
    #[test]
    fn the_templates_secrets_key_lets_deliver_alone_decrypt_and_ingest_only_where_secrets_are_revealed() {
        let doc = the_template();
        let key = &doc["Resources"]["SecretsKey"];
        assert_eq!(key["Type"].as_str(), Some("AWS::KMS::Key"));
        assert_eq!(key["Properties"]["EnableKeyRotation"].as_bool(), Some(true));
        let (mut decrypters, mut revealers) = (Vec::new(), Vec::new());
        for statement in key["Properties"]["KeyPolicy"]["Statement"].as_sequence().unwrap() {
            assert_eq!(statement["Effect"].as_str(), Some("Allow"), "{statement:?}");
            let principal = untag(&statement["Principal"]["AWS"]).as_str().unwrap().to_owned();
            let names = |v: &Value| -> Vec<String> {
                match v {
                    Value::Sequence(list) => list.iter().map(|a| a.as_str().unwrap_or("*").to_owned()).collect(),
                    one => vec![one.as_str().unwrap_or("*").to_owned()],
                }
            };
            if principal.ends_with(":root") {
                assert_eq!(
                    names(&statement["NotAction"]),
                    ["kms:Decrypt", "kms:ReEncrypt*", "kms:CreateGrant"],
                    "the account's statement withholds decrypting and what leads there"
                );
                continue;
            }
            // Decrypting, or what leads there: re-encrypting under a key of one's own, a grant.
            let opens = |action: &String| {
                let action = action.to_ascii_lowercase();
                action.contains('*') || ["kms:decrypt", "kms:creategrant"].contains(&action.as_str())
            };
            // Only `RevealSecrets` may add decrypting, as `!If [RevealsSecrets, with, without]`.
            let action = &statement["Action"];
            if let Value::Tagged(t) = action {
                let branches = t.value.as_sequence().unwrap();
                assert_eq!(t.tag.to_string(), "!If", "{action:?}");
                assert_eq!(branches[0].as_str(), Some("RevealsSecrets"), "{action:?}");
                assert!(
                    !names(&branches[2]).iter().any(opens),
                    "without it, {principal} does not decrypt"
                );
                if names(&branches[1]).iter().any(opens) {
                    revealers.push(principal);
                }
                continue;
            }
            if names(action).iter().any(opens) {
                decrypters.push(principal);
            }
        }
        assert_eq!(decrypters, ["DeliverRole.Arn"]);
        assert_eq!(revealers, ["IngestRole.Arn"], "Ingest decrypts only to reveal a secret");
        for (id, resource) in doc["Resources"].as_mapping().unwrap() {
            if resource["Type"].as_str() == Some("AWS::IAM::Role") {
                let text = serde_yaml_ng::to_string(&resource["Properties"]["Policies"]).unwrap();
                assert!(!text.contains("kms:"), "{id:?}'s policy names KMS");
            }
        }
    }

    /// Every alarm tells the topic, but the ones CodeDeploy watches during a deployment (a
    /// function's `DeploymentPreference` names them: they go off on one error, which the
    /// errors alarm reports when it lasts); and the dashboard's body is JSON once `!Sub` has
    /// put the names in (CloudFormation would take a broken body and the console show nothing).
    #[test]
    fn the_templates_alarms_reach_the_topic_and_its_dashboard_is_json() {
        let doc = the_template();
        let resources = doc["Resources"].as_mapping().unwrap();
        let rollbacks: Vec<&str> = resources
            .values()
            .flat_map(|r| seq(Some(&r["Properties"]["DeploymentPreference"]["Alarms"])))
            .filter_map(|a| untag(a).as_str())
            .collect();
        assert_eq!(rollbacks.len(), 4, "each function's deployment watches an alarm");
        let mut alarms = 0;
        for (id, resource) in resources {
            match resource["Type"].as_str() {
                Some("AWS::CloudWatch::Alarm") if rollbacks.contains(&id.as_str().unwrap()) => {}
                Some("AWS::CloudWatch::Alarm") => {
                    alarms += 1;
                    let actions = resource["Properties"]["AlarmActions"].as_sequence();
                    assert!(
                        actions.is_some_and(|a| a.iter().any(|t| untag(t).as_str() == Some("AlarmTopic"))),
                        "{id:?} tells AlarmTopic"
                    );
                }
                Some("AWS::CloudWatch::Dashboard") => {
                    let body = untag(&resource["Properties"]["DashboardBody"]).as_str().unwrap();
                    let mut substituted = String::new();
                    let mut rest = body;
                    while let Some(start) = rest.find("${") {
                        substituted.push_str(&rest[..start]);
                        substituted.push_str("name");
                        rest = &rest[start + rest[start..].find('}').unwrap() + 1..];
                    }
                    substituted.push_str(rest);
                    let json: serde_json::Value = serde_json::from_str(&substituted).expect("the dashboard is JSON");
                    assert!(json["widgets"].as_array().is_some_and(|w| !w.is_empty()));
                }
                _ => {}
            }
        }
        assert!(alarms >= 9, "{alarms} alarms");
    }

    const SAMPLE: &str = r#"
Transform: AWS::Serverless-2016-10-31
Parameters:
  Timeout: {Type: Number, Default: 30}
Resources:
  T:
    Type: AWS::DynamoDB::Table
    Properties:
      TableName: !Sub "${AWS::StackName}-t"
      AttributeDefinitions:
        - {AttributeName: pk, AttributeType: S}
        - {AttributeName: g, AttributeType: S}
      KeySchema: [{AttributeName: pk, KeyType: HASH}]
      GlobalSecondaryIndexes:
        - IndexName: by-g
          KeySchema: [{AttributeName: g, KeyType: HASH}]
          Projection: {ProjectionType: KEYS_ONLY}
      TimeToLiveSpecification: {AttributeName: ttl, Enabled: true}
  Dlq:
    Type: AWS::SQS::Queue
  Q:
    Type: AWS::SQS::Queue
    Properties:
      VisibilityTimeout: 180
      DelaySeconds: !Ref Timeout
      RedrivePolicy:
        deadLetterTargetArn: !GetAtt Dlq.Arn
        maxReceiveCount: 4
  Fn:
    Type: AWS::Serverless::Function
    Properties: {Handler: bootstrap}
"#;

    #[test]
    fn tables_and_queues_are_read_through_cloudformation_tags() {
        let r = TemplateResources::parse(SAMPLE).unwrap();
        let t = r.table("T").unwrap();
        assert_eq!(
            t.keys,
            vec![KeySpec {
                attribute: "pk".into(),
                key_type: "HASH".into()
            }]
        );
        assert_eq!(t.attributes.len(), 2);
        assert_eq!(t.indexes[0].name, "by-g");
        assert_eq!(t.indexes[0].projection_type, "KEYS_ONLY");
        assert_eq!(t.ttl_attribute.as_deref(), Some("ttl"));
        let q = r.queue("Q").unwrap();
        assert_eq!(q.visibility_timeout, Some(180));
        assert_eq!(q.redrive, Some(("Dlq".into(), 4)));
        assert_eq!(r.queue("Dlq").unwrap(), &QueueSpec::default());
        assert!(r.table("Fn").is_err());
    }

    #[test]
    fn the_projects_template_defines_what_the_adapters_use() {
        let yaml = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../template.yaml"))
            .expect("template.yaml at the workspace root");
        let r = TemplateResources::parse(&yaml).unwrap();
        let main = r.table(MAIN_TABLE).unwrap();
        let names: Vec<&str> = main.indexes.iter().map(|i| i.name.as_str()).collect();
        for index in [
            crate::store::INDEX_BY_TENANT,
            crate::store::INDEX_BY_TENANT_STATUS,
            crate::store::INDEX_BY_SUBSCRIPTION,
            crate::store::INDEX_OVERDUE,
        ] {
            assert!(names.contains(&index), "MainTable lacks the index {index}");
        }
        assert_eq!(main.ttl_attribute.as_deref(), Some(crate::store::TTL_ATTRIBUTE));
        let sched = r.table(SCHEDULER_TABLE).unwrap();
        assert_eq!(sched.keys[0].attribute, crate::scheduler::PARTITION_KEY);
        assert_eq!(sched.keys[1].attribute, crate::scheduler::SORT_KEY);
        let q = r.queue(DELIVERY_QUEUE).unwrap();
        assert_eq!(q.redrive.as_ref().map(|r| r.0.as_str()), Some(DEAD_LETTER_QUEUE));
        r.queue(DEAD_LETTER_QUEUE).unwrap();
    }
}
