#!/usr/bin/env bash
# Lint template.yaml with cfn-lint, cfn-lint with the serverless rules of cfn-lint-serverless,
# `sam validate --lint`, and what neither sees (scripts/template-cycles.py: no dependency cycle
# after SAM's transform; the parameters' patterns on examples); all must be clean (a suppression in the template names its rule
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
echo "lint-template: no dependency cycle after SAM's transform"
"$PY" scripts/template-cycles.py template.yaml 2> >(grep -v "Feature Toggle Config" >&2)
echo "lint-template: AllowedTargetCidrs takes private ranges and refuses loopback and link-local ones"
"$PY" - <<'EOF'
import re, sys
import yaml  # PyYAML, which aws-sam-cli depends on

class Loader(yaml.SafeLoader):
    pass

Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
pattern = yaml.load(open("template.yaml"), Loader=Loader)["Parameters"]["AllowedTargetCidrs"]["AllowedPattern"]
allowed = ["", "10.0.0.0/8", "10.1.2.0/24, 192.168.0.0/16", "172.16.0.0/12", "100.64.0.0/10",
           "169.253.0.0/16", "fd00::/16", "2001:db8::/32"]
refused = ["127.0.0.0/8", "127.0.0.1/32", "169.254.169.254/32", "169.254.0.0/16", "169.0.0.0/8",
           "0.0.0.0/0", "126.0.0.0/7", "::1/128", "fe80::/10", "fe80::1/128", "febf::/16", "::/0",
           "8000::/1", "10.0.0.0/8,127.0.0.1/32", "10.0.0.0"]
wrong = [c for c in allowed if not re.fullmatch(pattern, c)] + [c for c in refused if re.fullmatch(pattern, c)]
if wrong:
    sys.exit(f"lint-template: AllowedTargetCidrs' pattern is wrong about {wrong}")
EOF
echo "lint-template: SenderEmail and AlarmEmail refuse samconfig.toml's placeholders"
"$PY" - <<'EOF'
import re, sys, tomllib
import yaml

class Loader(yaml.SafeLoader):
    pass

Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
params = yaml.load(open("template.yaml"), Loader=Loader)["Parameters"]
overrides = tomllib.load(open("samconfig.toml", "rb"))["prod"]["deploy"]["parameters"]["parameter_overrides"]
placeholders = dict(o.split("=", 1) for o in overrides if o.split("=", 1)[0] in ("SenderEmail", "AlarmEmail"))
wrong = [f"{name}={value} is taken" for name, value in placeholders.items()
         if re.fullmatch(params[name]["AllowedPattern"], value)]
wrong += [f"{name}={value} is refused" for name in ("SenderEmail", "AlarmEmail")
          for value in ("hooks@acme.io", "ops+alarms@mail.acme.co.uk")
          if not re.fullmatch(params[name]["AllowedPattern"], value)]
if re.fullmatch(params["AlarmEmail"]["AllowedPattern"], "") is None:
    wrong.append("AlarmEmail= (none) is refused")
if len(placeholders) != 2 or wrong:
    sys.exit(f"lint-template: the address patterns are wrong: {placeholders} {wrong}")
EOF
echo "lint-template: template.yaml is clean"
