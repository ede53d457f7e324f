#!/usr/bin/env bash
# Lint template.yaml with cfn-lint and `sam validate --lint`; both must be clean.
# Installs both from PyPI into the current Python if they are missing. Needs no AWS
# credentials: sam only needs a region.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
need=()
command -v cfn-lint >/dev/null 2>&1 || need+=(cfn-lint)
command -v sam >/dev/null 2>&1 || need+=(aws-sam-cli)
if ((${#need[@]})); then
  echo "lint-template: installing ${need[*]} from PyPI" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check "${need[@]}"
  hash -r
fi

export AWS_DEFAULT_REGION=${AWS_DEFAULT_REGION:-us-east-1}
export SAM_CLI_TELEMETRY=0

echo "lint-template: cfn-lint $(cfn-lint --version 2>&1 | tail -n1)"
cfn-lint template.yaml
echo "lint-template: sam validate --lint"
sam validate --lint --template-file template.yaml --region "$AWS_DEFAULT_REGION"
echo "lint-template: template.yaml is clean"
