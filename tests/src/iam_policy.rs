//! IAM as AWS evaluates it, for the calls a test recorded ([`RecordedCall`]): each function's
//! role policies read from `template.yaml` with their resources resolved to ARNs, what each
//! call must be allowed (the action and resource AWS authorises it as), and whether the
//! function's policy allows that.
//!
//! moto checks a request's IAM action but not its resource, so a call on a table, index or
//! queue the policy does not name passes there and is refused on AWS. This is the check the
//! emulator cannot make. What AWS authorises a call as (the Service Authorization Reference):
//! - DynamoDB: the operation's action on the table's ARN, or on `table/T/index/I` for a
//!   Query or Scan of an index; `BatchGetItem` and `BatchWriteItem` on each table they name;
//!   `TransactWriteItems` as its items' actions (`PutItem`, `UpdateItem`, `DeleteItem`,
//!   `ConditionCheckItem`), `TransactGetItems` as `GetItem`, each on its item's table.
//! - SQS: the action on the queue's ARN; the `*Batch` operations as their single forms.
//! - SES v2: `ses:SendEmail` on the identity the mail is sent from: the address identity,
//!   as the tests verify it (AWS checks the domain's instead where only the domain is
//!   verified, and in the SES sandbox the recipients' identities too).
//! - KMS: the action on the key's ARN. Hookwise names its key by ARN in every call (a call
//!   without one, authorised on whatever key its ciphertext names, is not passed).

use std::collections::BTreeMap;

use serde_json::Value;
use serde_yaml_ng::Value as Yaml;

use crate::fault_proxy::{RecordedCall, Service};

/// What the template's intrinsics resolve to: the stack's pseudo parameters, its parameters,
/// and the resources made for it.
#[derive(Debug, Clone)]
pub struct Stack {
    pub region: String,
    pub account: String,
    pub stack_name: String,
    parameters: BTreeMap<String, String>,
    /// Per logical id: what `!Ref` gives, and its attributes (`Arn`, `QueueName`).
    resources: BTreeMap<String, (String, BTreeMap<String, String>)>,
}

impl Stack {
    pub fn new(region: &str, account: &str, stack_name: &str) -> Self {
        Self {
            region: region.to_owned(),
            account: account.to_owned(),
            stack_name: stack_name.to_owned(),
            parameters: BTreeMap::new(),
            resources: BTreeMap::new(),
        }
    }

    /// A parameter's value (the others take the template's defaults).
    pub fn parameter(mut self, name: &str, value: &str) -> Self {
        self.parameters.insert(name.to_owned(), value.to_owned());
        self
    }

    /// A DynamoDB table made as `logical_id`, named `name`.
    pub fn table(mut self, logical_id: &str, name: &str) -> Self {
        let arn = format!("arn:aws:dynamodb:{}:{}:table/{name}", self.region, self.account);
        self.resources
            .insert(logical_id.to_owned(), (name.to_owned(), attributes([("Arn", arn)])));
        self
    }

    /// An SQS queue made as `logical_id`, at `url`.
    pub fn queue(mut self, logical_id: &str, url: &str) -> Self {
        let name = queue_name(url);
        let arn = format!("arn:aws:sqs:{}:{}:{name}", self.region, self.account);
        let attrs = attributes([("Arn", arn), ("QueueName", name.to_owned())]);
        self.resources.insert(logical_id.to_owned(), (url.to_owned(), attrs));
        self
    }

    /// A KMS key made as `logical_id`, with this ARN.
    pub fn key(mut self, logical_id: &str, arn: &str) -> Self {
        let id = arn.rsplit('/').next().unwrap_or(arn).to_owned();
        self.resources
            .insert(logical_id.to_owned(), (id, attributes([("Arn", arn.to_owned())])));
        self
    }

    /// The ARN of a table, queue or key this stack was told of.
    pub fn arn(&self, logical_id: &str) -> String {
        self.resources
            .get(logical_id)
            .and_then(|(_, attrs)| attrs.get("Arn"))
            .unwrap_or_else(|| panic!("{logical_id} was not provisioned"))
            .clone()
    }

    fn pseudo(&self, name: &str) -> Option<String> {
        Some(match name {
            "AWS::Region" => self.region.clone(),
            "AWS::AccountId" => self.account.clone(),
            "AWS::StackName" => self.stack_name.clone(),
            "AWS::Partition" => "aws".to_owned(),
            "AWS::URLSuffix" => "amazonaws.com".to_owned(),
            _ => return None,
        })
    }

    /// `!Ref name`: a pseudo parameter, a parameter (given, or the template's default), or a
    /// resource. A resource this stack was not told of resolves to a name no call uses.
    fn reference(&self, template: &Yaml, name: &str) -> String {
        if let Some(v) = self.pseudo(name).or_else(|| self.parameters.get(name).cloned()) {
            return v;
        }
        let parameter = &template["Parameters"][name];
        if !parameter.is_null() {
            return scalar(&parameter["Default"])
                .unwrap_or_else(|| panic!("parameter {name} has no value and no default"));
        }
        assert!(
            !template["Resources"][name].is_null(),
            "!Ref {name}: no such parameter or resource"
        );
        match self.resources.get(name) {
            Some((reference, _)) => reference.clone(),
            None => format!("unprovisioned:{name}"),
        }
    }

    fn attribute(&self, template: &Yaml, id: &str, attribute: &str) -> String {
        assert!(
            !template["Resources"][id].is_null(),
            "!GetAtt {id}.{attribute}: no such resource"
        );
        match self.resources.get(id) {
            Some((_, attrs)) => attrs
                .get(attribute)
                .unwrap_or_else(|| panic!("!GetAtt {id}.{attribute}: not known for {id}"))
                .clone(),
            None => format!("unprovisioned:{id}.{attribute}"),
        }
    }

    /// A value with its intrinsics resolved: a string, or a list (`!Split`, a sequence).
    fn resolve(&self, template: &Yaml, value: &Yaml) -> Resolved {
        match value {
            Yaml::Sequence(items) => Resolved::List(items.iter().map(|v| self.resolve(template, v).one()).collect()),
            Yaml::Tagged(tagged) => {
                let tag = tagged.tag.to_string();
                let inner = &tagged.value;
                match tag.trim_start_matches('!') {
                    "Ref" => Resolved::One(self.reference(template, inner.as_str().expect("!Ref <name>"))),
                    "GetAtt" => {
                        let (id, attr) = match inner {
                            Yaml::String(s) => s.split_once('.').expect("!GetAtt Id.Attribute"),
                            Yaml::Sequence(l) => (l[0].as_str().unwrap(), l[1].as_str().unwrap()),
                            other => panic!("!GetAtt {other:?}"),
                        };
                        Resolved::One(self.attribute(template, id, attr))
                    }
                    "Sub" => {
                        let (text, vars) = match inner {
                            Yaml::String(s) => (s.as_str(), BTreeMap::new()),
                            Yaml::Sequence(l) => {
                                let vars = l[1]
                                    .as_mapping()
                                    .expect("!Sub [text, {vars}]")
                                    .iter()
                                    .map(|(k, v)| {
                                        let name = k.as_str().unwrap().to_owned();
                                        (name, self.resolve(template, v).one())
                                    })
                                    .collect();
                                (l[0].as_str().expect("!Sub [text, ...]"), vars)
                            }
                            other => panic!("!Sub {other:?}"),
                        };
                        Resolved::One(self.substitute(template, text, &vars))
                    }
                    "Select" => {
                        let l = inner.as_sequence().expect("!Select [i, list]");
                        let index = scalar(&l[0]).and_then(|i| i.parse::<usize>().ok()).unwrap();
                        let list = self.resolve(template, &l[1]).list();
                        Resolved::One(list.get(index).cloned().expect("!Select: index out of range"))
                    }
                    "Split" => {
                        let l = inner.as_sequence().expect("!Split [delimiter, text]");
                        let delimiter = l[0].as_str().unwrap();
                        let text = self.resolve(template, &l[1]).one();
                        Resolved::List(text.split(delimiter).map(str::to_owned).collect())
                    }
                    "Join" => {
                        let l = inner.as_sequence().expect("!Join [delimiter, list]");
                        let list = self.resolve(template, &l[1]).list();
                        Resolved::One(list.join(l[0].as_str().unwrap()))
                    }
                    "If" => {
                        let l = inner.as_sequence().expect("!If [condition, then, else]");
                        let name = l[0].as_str().expect("!If [condition name, ...]");
                        let chosen = if self.condition(template, name) { &l[1] } else { &l[2] };
                        self.resolve(template, chosen)
                    }
                    other => panic!("the intrinsic !{other} is not resolved here: add it to iam_policy.rs"),
                }
            }
            Yaml::Mapping(_) => panic!("long-form intrinsics are not resolved here: {value:?}"),
            other => Resolved::One(scalar(other).unwrap_or_else(|| panic!("not a value: {other:?}"))),
        }
    }

    /// Whether the template's condition `name` holds for this stack's parameters.
    fn condition(&self, template: &Yaml, name: &str) -> bool {
        let definition = &template["Conditions"][name];
        assert!(!definition.is_null(), "no condition {name}");
        self.holds(template, definition)
    }

    /// A condition function: `!Equals`, `!Not`, `!And`, `!Or`, `!Condition`.
    fn holds(&self, template: &Yaml, value: &Yaml) -> bool {
        let Yaml::Tagged(tagged) = value else {
            panic!("a condition is a condition function: {value:?}")
        };
        let args = || tagged.value.as_sequence().expect("a condition function's list");
        match tagged.tag.to_string().trim_start_matches('!') {
            "Equals" => {
                let l = args();
                self.resolve(template, &l[0]).one() == self.resolve(template, &l[1]).one()
            }
            "Not" => !self.holds(template, &args()[0]),
            "And" => args().iter().all(|c| self.holds(template, c)),
            "Or" => args().iter().any(|c| self.holds(template, c)),
            "Condition" => self.condition(template, tagged.value.as_str().expect("!Condition <name>")),
            other => panic!("the condition function !{other} is not evaluated here: add it to iam_policy.rs"),
        }
    }

    /// `${Name}`, `${Id.Attribute}` and `${!Literal}` in a `!Sub` text.
    fn substitute(&self, template: &Yaml, text: &str, vars: &BTreeMap<String, String>) -> String {
        let mut out = String::new();
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let end = rest[start..].find('}').expect("an unclosed ${ in !Sub") + start;
            let name = &rest[start + 2..end];
            let value = if let Some(literal) = name.strip_prefix('!') {
                format!("${{{literal}}}")
            } else if let Some(v) = vars.get(name) {
                v.clone()
            } else if let Some((id, attr)) = name.split_once('.') {
                self.attribute(template, id, attr)
            } else {
                self.reference(template, name)
            };
            out.push_str(&value);
            rest = &rest[end + 1..];
        }
        out.push_str(rest);
        out
    }
}

enum Resolved {
    One(String),
    List(Vec<String>),
}

impl Resolved {
    fn one(self) -> String {
        match self {
            Resolved::One(s) => s,
            Resolved::List(l) => panic!("a list where one value belongs: {l:?}"),
        }
    }

    fn list(self) -> Vec<String> {
        match self {
            Resolved::One(s) => vec![s],
            Resolved::List(l) => l,
        }
    }
}

fn attributes<const N: usize>(pairs: [(&str, String); N]) -> BTreeMap<String, String> {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

fn scalar(v: &Yaml) -> Option<String> {
    match v {
        Yaml::String(s) => Some(s.clone()),
        Yaml::Number(n) => Some(n.to_string()),
        Yaml::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The last path segment of a queue URL: its name.
fn queue_name(url: &str) -> &str {
    url.trim_end_matches('/').rsplit('/').next().unwrap_or_default()
}

/// One statement of a policy, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    pub allow: bool,
    pub actions: Vec<String>,
    pub resources: Vec<String>,
}

/// A role's inline policies, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub role: String,
    pub statements: Vec<Statement>,
}

impl Policy {
    /// As IAM decides within one account: an explicit deny wins, then any allow; else denied.
    pub fn allows(&self, action: &str, resource: &str) -> bool {
        let matches = |s: &&Statement| {
            s.actions
                .iter()
                .any(|a| wildcard_match(&a.to_ascii_lowercase(), &action.to_ascii_lowercase()))
                && s.resources.iter().any(|r| wildcard_match(r, resource))
        };
        let matching: Vec<&Statement> = self.statements.iter().filter(matches).collect();
        matching.iter().any(|s| s.allow) && !matching.iter().any(|s| !s.allow)
    }
}

/// IAM's pattern match: `*` any run of characters, `?` any one.
pub fn wildcard_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    // Classic two-pointer glob with backtracking to the last `*`.
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// Each function's role policy in `template` (YAML text), by its binary's name
/// (`Metadata.BuildProperties.Binary`), resolved for `stack`.
pub fn function_policies(template: &str, stack: &Stack) -> BTreeMap<String, Policy> {
    let doc: Yaml = serde_yaml_ng::from_str(template).expect("the template parses");
    let mut policies = BTreeMap::new();
    let resources = doc["Resources"].as_mapping().expect("Resources");
    for (_, resource) in resources {
        if resource["Type"].as_str() != Some("AWS::Serverless::Function") {
            continue;
        }
        let binary = resource["Metadata"]["BuildProperties"]["Binary"]
            .as_str()
            .expect("a function's Metadata.BuildProperties.Binary");
        let properties = &resource["Properties"];
        assert!(
            properties["Policies"].is_null(),
            "{binary}: SAM's Policies are not read here; the functions use a Role"
        );
        let role = match &properties["Role"] {
            Yaml::Tagged(t) => t.value.as_str().unwrap().trim_end_matches(".Arn").to_owned(),
            other => panic!("{binary}'s Role is not !GetAtt <role>.Arn: {other:?}"),
        };
        let role_properties = &doc["Resources"][role.as_str()]["Properties"];
        assert!(
            role_properties["ManagedPolicyArns"].is_null(),
            "{role}: managed policies are not read here"
        );
        let mut statements = Vec::new();
        for policy in role_properties["Policies"].as_sequence().expect("the role's Policies") {
            for statement in policy["PolicyDocument"]["Statement"].as_sequence().expect("Statement") {
                assert!(
                    statement["NotAction"].is_null()
                        && statement["NotResource"].is_null()
                        && statement["Condition"].is_null(),
                    "{role}: NotAction, NotResource and Condition are not read here"
                );
                let allow = match statement["Effect"].as_str() {
                    Some("Allow") => true,
                    Some("Deny") => false,
                    other => panic!("{role}: Effect {other:?}"),
                };
                let actions = stack.resolve(&doc, &statement["Action"]).list();
                let resources = stack.resolve(&doc, &statement["Resource"]).list();
                statements.push(Statement {
                    allow,
                    actions,
                    resources,
                });
            }
        }
        statements.extend(key_policy_grants(&doc, stack, &role));
        policies.insert(binary.to_owned(), Policy { role, statements });
    }
    policies
}

/// What the template's KMS keys' policies grant `role` by naming it (`!GetAtt <role>.Arn`):
/// KMS allows those uses of the key whatever the role's own policies say. A key policy's
/// `Resource: "*"` is the key itself.
fn key_policy_grants(doc: &Yaml, stack: &Stack, role: &str) -> Vec<Statement> {
    let mut grants = Vec::new();
    for (id, resource) in doc["Resources"].as_mapping().expect("Resources") {
        if resource["Type"].as_str() != Some("AWS::KMS::Key") {
            continue;
        }
        let id = id.as_str().expect("a logical id");
        let key = stack.attribute(doc, id, "Arn");
        for statement in resource["Properties"]["KeyPolicy"]["Statement"]
            .as_sequence()
            .expect("the key policy's Statement")
        {
            let names_role = match &statement["Principal"]["AWS"] {
                Yaml::Tagged(t) => t.value.as_str() == Some(&format!("{role}.Arn")),
                _ => false,
            };
            if !names_role {
                continue;
            }
            assert!(
                statement["NotAction"].is_null() && statement["Condition"].is_null(),
                "{id}: NotAction and Condition for {role} are not read here"
            );
            grants.push(Statement {
                allow: statement["Effect"].as_str() == Some("Allow"),
                actions: stack.resolve(doc, &statement["Action"]).list(),
                resources: vec![key.clone()],
            });
        }
    }
    grants
}

/// An action on a resource that a call must be allowed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Need {
    pub action: String,
    pub resource: String,
}

/// What AWS authorises `call` as (see the module's note), in `region` and `account`.
pub fn needs(call: &RecordedCall, region: &str, account: &str) -> Vec<Need> {
    let p = &call.params;
    let need = |action: &str, resource: String| Need {
        action: action.to_owned(),
        resource,
    };
    match call.service {
        Service::DynamoDb => {
            let table = |name: &str| format!("arn:aws:dynamodb:{region}:{account}:table/{name}");
            let named = |v: &Value| table(v.as_str().unwrap_or("?"));
            let op = call.operation.as_str();
            match op {
                // Unreadable: a need nothing allows, so the call is not passed unchecked.
                "BatchGetItem" | "BatchWriteItem" | "TransactWriteItems" | "TransactGetItems"
                    if !p["RequestItems"].is_object() && !p["TransactItems"].is_array() =>
                {
                    vec![need(&format!("dynamodb:{op}"), "unreadable request".into())]
                }
                "BatchGetItem" | "BatchWriteItem" => p["RequestItems"]
                    .as_object()
                    .map(|tables| {
                        tables
                            .keys()
                            .map(|t| need(&format!("dynamodb:{op}"), table(t)))
                            .collect()
                    })
                    .unwrap_or_default(),
                "TransactWriteItems" | "TransactGetItems" => p["TransactItems"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|item| item.as_object().into_iter().flatten())
                    .map(|(kind, body)| {
                        let action = match kind.as_str() {
                            "Put" => "dynamodb:PutItem",
                            "Update" => "dynamodb:UpdateItem",
                            "Delete" => "dynamodb:DeleteItem",
                            "ConditionCheck" => "dynamodb:ConditionCheckItem",
                            "Get" => "dynamodb:GetItem",
                            other => panic!("a transaction item of kind {other}"),
                        };
                        need(action, named(&body["TableName"]))
                    })
                    .collect(),
                _ => {
                    let mut resource = named(&p["TableName"]);
                    if let Some(index) = p["IndexName"].as_str() {
                        resource = format!("{resource}/index/{index}");
                    }
                    vec![need(&format!("dynamodb:{op}"), resource)]
                }
            }
        }
        Service::Sqs => {
            let action = match call.operation.as_str() {
                "SendMessageBatch" => "SendMessage",
                "DeleteMessageBatch" => "DeleteMessage",
                "ChangeMessageVisibilityBatch" => "ChangeMessageVisibility",
                other => other,
            };
            let resource = match p["QueueUrl"].as_str() {
                Some(url) => format!("arn:aws:sqs:{region}:{account}:{}", queue_name(url)),
                None => "*".to_owned(),
            };
            vec![need(&format!("sqs:{action}"), resource)]
        }
        Service::Ses => {
            let from = p["FromEmailAddress"].as_str().unwrap_or("?");
            // `Name <address>` or the address alone.
            let address = from
                .rsplit_once('<')
                .map_or(from, |(_, a)| a.trim_end_matches('>'))
                .trim();
            let mut needs = vec![need(
                &format!("ses:{}", call.operation),
                format!("arn:aws:ses:{region}:{account}:identity/{address}"),
            )];
            if let Some(set) = p["ConfigurationSetName"].as_str() {
                needs.push(need(
                    &format!("ses:{}", call.operation),
                    format!("arn:aws:ses:{region}:{account}:configuration-set/{set}"),
                ));
            }
            needs
        }
        Service::Kms => {
            let resource = match p["KeyId"].as_str() {
                Some(arn) if arn.starts_with("arn:") => arn.to_owned(),
                Some(id) => format!("arn:aws:kms:{region}:{account}:key/{id}"),
                None => "no KeyId".to_owned(),
            };
            vec![need(&format!("kms:{}", call.operation), resource)]
        }
        Service::Other => vec![need(&format!("unknown:{}", call.operation), "*".to_owned())],
    }
}

/// One (function, action, resource) and how many calls needed it.
pub type Grants = BTreeMap<(String, Need), u64>;

/// Every call signed by one of `functions` (access key → binary) checked against that
/// function's policy: the (function, need) pairs seen, and one line per problem (a need the
/// policy does not allow, an answer of AccessDenied, a call signed by no known key).
pub fn check(
    calls: &[RecordedCall],
    functions: &BTreeMap<String, String>,
    policies: &BTreeMap<String, Policy>,
    stack: &Stack,
) -> (Grants, Vec<String>) {
    let mut seen = Grants::new();
    let mut problems: Vec<String> = Vec::new();
    for call in calls {
        // moto answers a refusal 403 with a body the SDKs find no code in; a 403 is a refusal
        // unless it is SQS's throttling.
        let denied = call.error.as_deref().is_some_and(|e| e.starts_with("AccessDenied"))
            || (call.status == 403 && call.error.as_deref() != Some("RequestThrottled"));
        let Some(function) = functions.get(&call.access_key) else {
            if denied {
                problems.push(format!(
                    "{} {} by key {:?} was answered {:?}",
                    call.service, call.operation, call.access_key, call.error
                ));
            }
            continue;
        };
        if denied {
            problems.push(format!(
                "{function}: {} {} was answered {} (status {})",
                call.service,
                call.operation,
                call.error.as_deref().unwrap_or("no code"),
                call.status
            ));
        }
        let policy = &policies[function];
        for need in needs(call, &stack.region, &stack.account) {
            if !policy.allows(&need.action, &need.resource) {
                problems.push(format!(
                    "{function} ({}): {} on {} is not allowed",
                    policy.role, need.action, need.resource
                ));
            }
            *seen.entry((function.clone(), need)).or_default() += 1;
        }
    }
    (seen, counted(problems))
}

/// Each line once, in the order first seen, with how often it was seen when more than once.
fn counted(lines: Vec<String>) -> Vec<String> {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for line in lines {
        match counts.iter_mut().find(|(l, _)| *l == line) {
            Some((_, n)) => *n += 1,
            None => counts.push((line, 1)),
        }
    }
    counts
        .into_iter()
        .map(|(line, n)| if n > 1 { format!("{line} ({n} calls)") } else { line })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TEMPLATE: &str = r#"
Parameters:
  SenderEmail: {Type: String}
  Other: {Type: String, Default: x}
Resources:
  MainTable: {Type: AWS::DynamoDB::Table}
  SchedulerTable: {Type: AWS::DynamoDB::Table}
  DeliveryQueue: {Type: AWS::SQS::Queue}
  Logs: {Type: AWS::Logs::LogGroup}
  DeliverFunction:
    Type: AWS::Serverless::Function
    Metadata: {BuildProperties: {Binary: hookwise-deliver}}
    Properties: {Role: !GetAtt DeliverRole.Arn}
  DeliverRole:
    Type: AWS::IAM::Role
    Properties:
      Policies:
        - PolicyDocument:
            Statement:
              - Effect: Allow
                Action: [dynamodb:GetItem, dynamodb:PutItem, dynamodb:UpdateItem]
                Resource: !GetAtt MainTable.Arn
              - Effect: Allow
                Action: [dynamodb:Query]
                Resource: !Sub "${MainTable.Arn}/index/by-tenant"
              - Effect: Allow
                Action: [dynamodb:PutItem]
                Resource: !GetAtt SchedulerTable.Arn
              - Effect: Allow
                Action: [sqs:SendMessage]
                Resource: [!GetAtt DeliveryQueue.Arn]
              - Effect: Allow
                Action: [ses:SendEmail]
                Resource:
                  - !Sub "arn:${AWS::Partition}:ses:${AWS::Region}:${AWS::AccountId}:identity/${SenderEmail}"
                  - !Sub
                    - "arn:${AWS::Partition}:ses:${AWS::Region}:${AWS::AccountId}:identity/${Domain}"
                    - Domain: !Select [1, !Split ["@", !Ref SenderEmail]]
              - Effect: Allow
                Action: [logs:PutLogEvents]
                Resource: !GetAtt Logs.Arn
"#;

    fn stack() -> Stack {
        Stack::new("us-east-1", "123456789012", "s")
            .parameter("SenderEmail", "hooks@example.com")
            .table("MainTable", "s-main")
            .table("SchedulerTable", "s-scheduler")
            .queue("DeliveryQueue", "http://127.0.0.1:5000/123456789012/s-delivery")
    }

    fn call(service: Service, operation: &str, params: Value) -> RecordedCall {
        RecordedCall {
            access_key: "AKDELIVER".into(),
            service,
            operation: operation.into(),
            params,
            status: 200,
            error: None,
        }
    }

    fn problems_of(calls: &[RecordedCall]) -> Vec<String> {
        let stack = stack();
        let policies = function_policies(TEMPLATE, &stack);
        let functions = BTreeMap::from([("AKDELIVER".to_owned(), "hookwise-deliver".to_owned())]);
        check(calls, &functions, &policies, &stack).1
    }

    #[test]
    fn given_a_template_then_its_arns_resolve_through_sub_select_and_split() {
        let policies = function_policies(TEMPLATE, &stack());
        let p = &policies["hookwise-deliver"];
        assert_eq!(p.role, "DeliverRole");
        assert_eq!(
            p.statements[1].resources,
            ["arn:aws:dynamodb:us-east-1:123456789012:table/s-main/index/by-tenant"]
        );
        assert_eq!(
            p.statements[4].resources,
            [
                "arn:aws:ses:us-east-1:123456789012:identity/hooks@example.com",
                "arn:aws:ses:us-east-1:123456789012:identity/example.com"
            ]
        );
        assert_eq!(
            p.statements[3].resources,
            ["arn:aws:sqs:us-east-1:123456789012:s-delivery"]
        );
        // Not provisioned by the test: resolves to nothing a call names.
        assert_eq!(p.statements[5].resources, ["unprovisioned:Logs.Arn"]);
    }

    #[test]
    fn given_the_stack_reveals_secrets_then_and_only_then_the_ingest_function_may_decrypt() {
        let template = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../template.yaml")).unwrap();
        let key = "arn:aws:kms:us-east-1:123456789012:key/k-1";
        let decrypts = |reveal: Option<&str>| {
            let mut stack = Stack::new("us-east-1", "123456789012", "s")
                .parameter("SenderEmail", "hooks@example.com")
                .key("SecretsKey", key);
            if let Some(value) = reveal {
                stack = stack.parameter("RevealSecrets", value);
            }
            let policies = function_policies(&template, &stack);
            let may = |f: &str| policies[f].allows("kms:Decrypt", key);
            (may("hookwise-ingest"), may("hookwise-deliver"))
        };
        assert_eq!(decrypts(None), (false, true), "by default only Deliver opens a secret");
        assert_eq!(decrypts(Some("false")), (false, true));
        assert_eq!(decrypts(Some("true")), (true, true));
    }

    #[test]
    fn given_a_query_on_a_table_granted_only_puts_then_it_is_a_problem() {
        let query = call(
            Service::DynamoDb,
            "Query",
            json!({"TableName": "s-scheduler", "KeyConditionExpression": "bucket = :b"}),
        );
        assert_eq!(
            problems_of(&[query]),
            ["hookwise-deliver (DeliverRole): dynamodb:Query on arn:aws:dynamodb:us-east-1:123456789012:table/s-scheduler is not allowed"]
        );
    }

    #[test]
    fn given_a_query_then_an_index_is_its_own_resource() {
        let on_index = |index: &str| {
            call(
                Service::DynamoDb,
                "Query",
                json!({"TableName": "s-main", "IndexName": index}),
            )
        };
        assert!(problems_of(&[on_index("by-tenant")]).is_empty());
        let problems = problems_of(&[on_index("overdue")]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("table/s-main/index/overdue"), "{problems:?}");
    }

    #[test]
    fn given_a_transaction_then_each_item_needs_its_own_action_on_its_table() {
        let tx = call(
            Service::DynamoDb,
            "TransactWriteItems",
            json!({"TransactItems": [
                {"Put": {"TableName": "s-main"}},
                {"Update": {"TableName": "s-scheduler"}},
                {"ConditionCheck": {"TableName": "s-main"}},
            ]}),
        );
        let problems = problems_of(&[tx]);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].contains("dynamodb:UpdateItem on arn:aws:dynamodb:us-east-1:123456789012:table/s-scheduler")
        );
        assert!(problems[1].contains("dynamodb:ConditionCheckItem"));
    }

    #[test]
    fn given_batches_then_each_table_and_the_single_sqs_action_are_checked() {
        let write = call(
            Service::DynamoDb,
            "BatchWriteItem",
            json!({"RequestItems": {"s-scheduler": []}}),
        );
        let send = call(
            Service::Sqs,
            "SendMessageBatch",
            json!({"QueueUrl": "http://127.0.0.1:5000/123456789012/s-delivery"}),
        );
        let elsewhere = call(
            Service::Sqs,
            "SendMessage",
            json!({"QueueUrl": "http://127.0.0.1:5000/123456789012/s-dead-letter"}),
        );
        let problems = problems_of(&[write, send, elsewhere]);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("dynamodb:BatchWriteItem"));
        assert!(problems[1].contains("sqs:SendMessage on arn:aws:sqs:us-east-1:123456789012:s-dead-letter"));
    }

    #[test]
    fn given_a_batch_whose_request_cannot_be_read_then_it_is_a_problem_not_a_pass() {
        let write = call(Service::DynamoDb, "BatchWriteItem", Value::Null);
        let tx = call(Service::DynamoDb, "TransactWriteItems", Value::Null);
        assert_eq!(problems_of(&[write, tx]).len(), 2);
    }

    #[test]
    fn given_an_email_then_its_sender_identity_is_the_resource() {
        let mail = |from: &str| call(Service::Ses, "SendEmail", json!({"FromEmailAddress": from}));
        assert!(problems_of(&[mail("Hookwise <hooks@example.com>")]).is_empty());
        assert_eq!(problems_of(&[mail("other@example.org")]).len(), 1);
    }

    #[test]
    fn given_an_answer_of_access_denied_then_it_is_a_problem_even_when_the_policy_allows_it() {
        let mut get = call(Service::DynamoDb, "GetItem", json!({"TableName": "s-main"}));
        get.status = 400;
        get.error = Some("AccessDeniedException".into());
        let problems = problems_of(&[get]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("AccessDeniedException"));
    }

    #[test]
    fn wildcards_match_as_iam_matches() {
        assert!(wildcard_match("*", "anything"));
        assert!(wildcard_match("arn:aws:s3:::b/*", "arn:aws:s3:::b/k/x"));
        assert!(wildcard_match("dynamodb:get?tem", "dynamodb:getitem"));
        assert!(!wildcard_match("arn:t/main", "arn:t/main/index/x"));
        assert!(!wildcard_match("a*b", "ac"));
    }
}
