#!/usr/bin/env python3
"""Fails if template.yaml, as SAM's transform expands it, has a dependency cycle.

cfn-lint and `sam validate --lint` pass a template whose resources wait on each other in a
loop (an alias waits on its deployment group through UpdatePolicy, the group names its
alarms, an alarm names a function...), which CloudFormation then refuses at deploy time. This
runs SAM's own translator (samtranslator, from aws-sam-cli) on the template and walks every
Ref, GetAtt, Sub, DependsOn and UpdatePolicy between the resulting resources.

The AWS::LanguageExtensions transform runs on AWS, not here: its one use in the template
(Fn::If in DeletionPolicy and UpdateReplacePolicy) names no resource, so those attributes
are dropped before translating.
"""
import os
import re
import sys

from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
template = yaml_parse(open(sys.argv[1] if len(sys.argv) > 1 else "template.yaml").read())
template["Transform"] = "AWS::Serverless-2016-10-31"
for resource in template["Resources"].values():
    for policy in ("DeletionPolicy", "UpdateReplacePolicy"):
        if isinstance(resource.get(policy), dict):
            resource[policy] = "Retain"
    if resource.get("Properties", {}).get("CodeUri") == ".":
        resource["Properties"]["CodeUri"] = "s3://bucket/key"  # sam build's upload, not here


class NoManagedPolicies:
    def load(self):
        return {}


resources = transform(template, {"SenderEmail": "hooks@acme.io"}, NoManagedPolicies())["Resources"]


def named(value, found):
    """Every logical id `value` refers to."""
    if isinstance(value, dict):
        for key, inner in value.items():
            if key == "Ref" and isinstance(inner, str):
                found.add(inner.split(".")[0])
            elif key == "Fn::GetAtt":
                found.add(inner[0] if isinstance(inner, list) else inner.split(".")[0])
            elif key == "Fn::Sub":
                text = inner if isinstance(inner, str) else inner[0]
                found.update(m.split(".")[0] for m in re.findall(r"\$\{([^}!]+)\}", text))
                named(inner, found)
            else:
                named(inner, found)
    elif isinstance(value, list):
        for inner in value:
            named(inner, found)
    return found


deps = {}
for rid, resource in resources.items():
    found = named(resource.get("Properties", {}), set()) | named(resource.get("UpdatePolicy", {}), set())
    depends = resource.get("DependsOn", [])
    found |= {depends} if isinstance(depends, str) else set(depends)
    deps[rid] = sorted(found & resources.keys())

state, path = {}, []


def visit(rid):
    state[rid] = "open"
    path.append(rid)
    for dep in deps[rid]:
        if state.get(dep) == "open":
            sys.exit("template-cycles: a dependency cycle: " + " -> ".join(path[path.index(dep):] + [dep]))
        if dep not in state:
            visit(dep)
    state[rid] = "done"
    path.pop()


for rid in resources:
    if rid not in state:
        visit(rid)
print(f"template-cycles: {len(resources)} resources after SAM's transform, no dependency cycle")
