#!/usr/bin/env bash
# Lint template.yaml with cfn-lint, cfn-lint with the serverless rules of cfn-lint-serverless,
# and `sam validate --lint`; all must be clean (a suppression in the template names its rule
# and says why). Installs what is missing from PyPI into the current Python. Needs no AWS
# credentials: sam only needs a region.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
need=()
command -v cfn-lint >/dev/null 2>&1 || need+=(cfn-lint)
command -v sam >/dev/null 2>&1 || need+=(aws-sam-cli)
"$PY" -c 'import cfn_lint_serverless' 2>/dev/null || need+=(cfn-lint-serverless)
if ((${#need[@]})); then
  echo "lint-template: installing ${need[*]} from PyPI" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check "${need[@]}"
  hash -r
fi

export AWS_DEFAULT_REGION=${AWS_DEFAULT_REGION:-us-east-1}
export SAM_CLI_TELEMETRY=0

echo "lint-template: cfn-lint $(cfn-lint --version 2>&1 | tail -n1)"
cfn-lint template.yaml
echo "lint-template: cfn-lint with the serverless rules"
cfn-lint template.yaml --append-rules cfn_lint_serverless.rules
echo "lint-template: sam validate --lint"
sam validate --lint --template-file template.yaml --region "$AWS_DEFAULT_REGION"
echo "lint-template: template.yaml is clean"
