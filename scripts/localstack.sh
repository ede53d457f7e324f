#!/usr/bin/env bash
# LocalStack's SQS, for `tests/tests/dev_aws_e2e.rs`: LocalStack run on the host ("host mode":
# its Python runtime in a venv, no Docker), with SQS only, on 127.0.0.1 on a free port.
# Installs what is missing from PyPI into .hookwise/localstack/ (once; a second run is fast).
#
#   scripts/localstack.sh run -- cargo test -p hookwise-tests --test dev_aws_e2e
#       start it, export its URL, run the command, stop it (whatever happens)
#   scripts/aws-test-services.sh run -- scripts/localstack.sh run -- cargo test ...
#       with moto and DynamoDB Local too (the LocalStack test keeps its tables on the latter)
#   source scripts/localstack.sh && localstack_start && ...; localstack_stop
#
# Exports HOOKWISE_TEST_LOCALSTACK_URL and HOOKWISE_TEST_REQUIRE_LOCALSTACK=1 (so the test
# fails, rather than skips, if the URL is missing), and HOOKWISE_TEST_LOCALSTACK_PID.
#
# Why only SQS, and why this version:
# - LocalStack 4.14.0 (February 2026) is the last release of the free Community edition.
#   From 2026.3.0 on (calendar versions) every start needs a LOCALSTACK_AUTH_TOKEN, which
#   means an account and a licence check over the network: neither exists here.
# - Its DynamoDB is DynamoDB Local, which it downloads (with a JVM) at start-up: impossible
#   offline, so the tables go on our own DynamoDB Local (scripts/aws-test-services.sh). Its
#   free edition has no SES v2, so `hookwise dev --aws --log-email` prints the emails.
#   LocalStack's SQS is its own pure-Python provider (not moto's): nothing to download.
# - The Python package is localstack-core with its `base-runtime` extra (the gateway and
#   the AWS protocol layer), 180 MB; the `runtime` extra (500 MB: moto-ext, awscli, jpype,
#   OpenSearch clients...) is for the other services. Its dependencies are pinned to the
#   release's own lock file (requirements-base-runtime.txt of the v4.14.0 tag, below):
#   today's break it (cbor2 6 has no `cbor2._decoder`, and no runtime component loads).
# - Python 3.13 or newer, as in LocalStack's image: 4.14's code imports
#   `warnings.deprecated`, which 3.12 lacks (its SQS provider then fails to load).
#   pyenv's 3.13 is taken when `python3.13` is not on PATH; LOCALSTACK_PYTHON overrides.
# - `python -m localstack.runtime.main` is what the image runs, and what
#   `localstack start --host` (the CLI's host mode) amounts to since 3.6; the CLI package
#   itself is not needed.

_ls_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCALSTACK_VERSION=4.14.0
LOCALSTACK_DIR="${LOCALSTACK_DIR:-$_ls_root/.hookwise/localstack}"
LOCALSTACK_VENV="$LOCALSTACK_DIR/venv-$LOCALSTACK_VERSION"

_ls_log() { echo "localstack: $*" >&2; }

_ls_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# An interpreter >= 3.13: LOCALSTACK_PYTHON, python3.13+ on PATH, or pyenv's newest 3.13+.
_ls_python() {
  local c candidates=()
  [[ -n "${LOCALSTACK_PYTHON:-}" ]] && candidates+=("$LOCALSTACK_PYTHON")
  candidates+=(python3.13 python3.14 python3)
  local pyenv_root="${PYENV_ROOT:-$HOME/.pyenv}"
  while IFS= read -r c; do candidates+=("$c"); done < <(
    compgen -G "$pyenv_root/versions/3.1[3-9]*/bin/python" | sort -V -r)
  for c in "${candidates[@]}"; do
    # A pyenv shim for a version that is not selected exits non-zero here, so it is skipped.
    if "$c" -c 'import sys; sys.exit(sys.version_info < (3, 13))' >/dev/null 2>&1; then
      "$c" -c 'import sys; print(sys.executable)'
      return 0
    fi
  done
  return 1
}

# The release's lock of its base runtime (requirements-base-runtime.txt at tag v4.14.0).
_ls_constraints() {
  cat <<'EOF'
annotated-types==0.7.0
asn1crypto==1.5.1
attrs==25.4.0
awscrt==0.31.2
boto3==1.42.54
botocore==1.42.54
cachetools==7.0.1
cbor2==5.8.0
certifi==2026.1.4
cffi==2.0.0
charset-normalizer==3.4.4
click==8.3.1
constantly==23.10.4
cryptography==46.0.5
dill==0.3.6
dnslib==0.9.26
dnspython==2.8.0
docker==7.1.0
h11==0.16.0
h2==4.3.0
hpack==4.1.0
hypercorn==0.18.0
hyperframe==6.1.0
hyperlink==21.0.0
idna==3.11
incremental==24.11.0
isodate==0.7.2
jmespath==1.1.0
jsonpatch==1.33
jsonpointer==3.0.0
jsonschema==4.26.0
jsonschema-path==0.3.4
jsonschema-specifications==2025.9.1
lazy-object-proxy==1.12.0
localstack-twisted==25.5.0
markdown-it-py==4.0.0
markupsafe==3.0.3
mdurl==0.1.2
more-itertools==10.8.0
openapi-core==0.22.0
openapi-schema-validator==0.6.3
openapi-spec-validator==0.7.2
packaging==26.0
pathable==0.4.4
plux==1.14.0
priority==1.3.0
psutil==7.2.2
pycparser==3.0
pydantic==2.12.5
pydantic-core==2.41.5
pygments==2.19.2
pyopenssl==25.3.0
python-dateutil==2.9.0.post0
python-dotenv==1.2.1
pyyaml==6.0.3
readerwriterlock==1.0.9
referencing==0.36.2
requests==2.32.5
requests-aws4auth==1.3.1
rfc3339-validator==0.1.4
rich==14.3.3
rolo==0.8.1
rpds-py==0.30.0
s3transfer==0.16.0
semver==3.0.4
six==1.17.0
typing-extensions==4.15.0
typing-inspection==0.4.2
urllib3==2.6.3
werkzeug==3.1.6
wsproto==1.3.2
xmltodict==1.0.4
zope-interface==8.2
EOF
}

# Installed means: the venv's marker is there (written last, once SQS's provider imported)
# and its interpreter still runs (a pyenv version removed breaks the venv).
_ls_installed() {
  [[ "$(cat "$LOCALSTACK_VENV/.hookwise-installed" 2>/dev/null)" == "$LOCALSTACK_VERSION" ]] &&
    "$LOCALSTACK_VENV/bin/python" -c 'import localstack' >/dev/null 2>&1
}

localstack_install() {
  mkdir -p "$LOCALSTACK_DIR" || return 1
  _ls_installed && return 0
  (
    # One install at a time (two test runs may start together).
    if command -v flock >/dev/null 2>&1; then flock 9; fi
    _ls_installed && exit 0
    local python
    python=$(_ls_python) || {
      _ls_log "needs Python >= 3.13 (python3.13 on PATH, a pyenv 3.13, or LOCALSTACK_PYTHON)"
      exit 1
    }
    _ls_log "installing localstack-core[base-runtime]==$LOCALSTACK_VERSION from PyPI into $LOCALSTACK_VENV ($python)"
    rm -rf "$LOCALSTACK_VENV"
    "$python" -m venv "$LOCALSTACK_VENV" || exit 1
    _ls_constraints >"$LOCALSTACK_VENV/constraints.txt"
    "$LOCALSTACK_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
      -c "$LOCALSTACK_VENV/constraints.txt" "localstack-core[base-runtime]==$LOCALSTACK_VERSION" || exit 1
    "$LOCALSTACK_VENV/bin/python" -c 'import localstack.services.sqs.provider' || exit 1
    # The index of the AWS service specs, built once here as LocalStack's image builds it
    # (`python -m localstack.aws.spec`, into its static libs); each run links it in. Without
    # it the first request builds it, and takes over 5 s on 2 busy cores: longer than the
    # AWS SDK's timeout, so `dev --aws --provision`'s first CreateQueue failed.
    mkdir -p "$LOCALSTACK_VENV/fs/usr/lib/localstack" || exit 1
    OVERRIDE_IN_DOCKER=0 FILESYSTEM_ROOT="$LOCALSTACK_VENV/fs" \
      "$LOCALSTACK_VENV/bin/python" -m localstack.aws.spec || exit 1
    echo "$LOCALSTACK_VERSION" >"$LOCALSTACK_VENV/.hookwise-installed"
  ) 9>"$LOCALSTACK_DIR/install.lock"
}

# One SQS ListQueues call (the JSON protocol; LocalStack takes any signature).
_ls_list_queues() {
  curl -sf --max-time 30 "$1/" -H 'content-type: application/x-amz-json-1.0' \
    -H 'x-amz-target: AmazonSQS.ListQueues' \
    -H 'authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=0' \
    -d '{}'
}

localstack_start() {
  localstack_install || { _ls_log "install failed"; return 1; }
  local port
  port=$(_ls_free_port) || return 1
  LOCALSTACK_RUN_DIR="$LOCALSTACK_DIR/run-$port"
  rm -rf "$LOCALSTACK_RUN_DIR"
  mkdir -p "$LOCALSTACK_RUN_DIR/fs/usr/lib" || return 1
  ln -s "$LOCALSTACK_VENV/fs/usr/lib/localstack" "$LOCALSTACK_RUN_DIR/fs/usr/lib/localstack"
  # OVERRIDE_IN_DOCKER=0: this machine is itself a container (/.dockerenv), which LocalStack
  #   would take for its own image, writing to /var/lib/localstack and /tmp/localstack;
  #   FILESYSTEM_ROOT keeps all it writes in the run's directory instead.
  # LOCALSTACK_HOST and SQS_ENDPOINT_STRATEGY=path: the queue URLs it hands out name
  #   127.0.0.1 and this port, not sqs.<region>.localhost.localstack.cloud (public DNS for
  #   127.0.0.1, unresolvable offline; the SDK ignores a queue URL's host, but people don't).
  # DNS_ADDRESS=0 (no DNS server, which would look for an upstream one), DISABLE_EVENTS=1
  #   (no analytics), SKIP_SSL_CERT_DOWNLOAD=1 (a self-signed certificate): nothing leaves
  #   127.0.0.1. No auth token: the Community edition takes none.
  # Its own process group (setsid, or already one as a job of an interactive shell), so that
  # stopping it stops whatever it started.
  local t0
  t0=$(date +%s%N)
  env -u LOCALSTACK_AUTH_TOKEN -u LOCALSTACK_API_KEY -u PERSISTENCE -u DEBUG \
    OVERRIDE_IN_DOCKER=0 \
    FILESYSTEM_ROOT="$LOCALSTACK_RUN_DIR/fs" \
    GATEWAY_LISTEN="127.0.0.1:$port" \
    LOCALSTACK_HOST="127.0.0.1:$port" \
    SERVICES=sqs \
    EAGER_SERVICE_LOADING=1 \
    SQS_ENDPOINT_STRATEGY=path \
    SQS_DISABLE_CLOUDWATCH_METRICS=1 \
    DNS_ADDRESS=0 \
    DISABLE_EVENTS=1 \
    SKIP_SSL_CERT_DOWNLOAD=1 \
    "$LOCALSTACK_VENV/bin/python" -c '
import os, sys
try:
    os.setsid()
except OSError:
    pass
os.execv(sys.executable, [sys.executable, "-m", "localstack.runtime.main"])' \
    >"$LOCALSTACK_RUN_DIR/localstack.log" 2>&1 </dev/null &
  LOCALSTACK_PID=$!

  # Ready when its health endpoint says SQS is running (or available: loaded on demand),
  # and it has answered one SQS call (ListQueues: the first call loads the protocol layer).
  local url="http://127.0.0.1:$port" health=""
  for _ in $(seq 1 240); do
    if ! kill -0 "$LOCALSTACK_PID" 2>/dev/null; then
      _ls_log "LocalStack exited before it was ready; its log:"; tail -n 40 "$LOCALSTACK_RUN_DIR/localstack.log" >&2
      localstack_stop; return 1
    fi
    health=$(curl -s --max-time 2 "$url/_localstack/health" || true)
    if [[ "$health" =~ \"sqs\":\ *\"(running|available)\" ]]; then break; fi
    if [[ "$health" =~ \"sqs\":\ *\"error\" ]]; then
      _ls_log "SQS failed to load; the log:"; tail -n 40 "$LOCALSTACK_RUN_DIR/localstack.log" >&2
      localstack_stop; return 1
    fi
    health=""
    sleep 0.25
  done
  if [[ -z "$health" ]] || ! _ls_list_queues "$url" >/dev/null; then
    _ls_log "SQS not ready at $url within 60 s; the log:"; tail -n 40 "$LOCALSTACK_RUN_DIR/localstack.log" >&2
    localstack_stop; return 1
  fi

  export HOOKWISE_TEST_LOCALSTACK_URL="$url"
  export HOOKWISE_TEST_REQUIRE_LOCALSTACK=1
  # The pid is for the latency bench's CPU figures (the Python exec'd in place of the launcher).
  export HOOKWISE_TEST_LOCALSTACK_PID="$LOCALSTACK_PID"
  _ls_log "LocalStack $LOCALSTACK_VERSION (SQS) on port $port (pid $LOCALSTACK_PID), ready in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
}

localstack_stop() {
  local pid=${LOCALSTACK_PID:-} target
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
    # The whole group when it leads one (setsid above), else the process alone.
    if [[ "$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')" == "$pid" ]]; then target=-$pid; else target=$pid; fi
    kill -TERM -- "$target" 2>/dev/null
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL -- "$target" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  if [[ -n "${LOCALSTACK_RUN_DIR:-}" && -d "$LOCALSTACK_RUN_DIR" ]]; then
    # Keep the log of a failed run to read; the rest (its state) goes.
    [[ -f "$LOCALSTACK_RUN_DIR/localstack.log" ]] && mv -f "$LOCALSTACK_RUN_DIR/localstack.log" "$LOCALSTACK_DIR/last-run.log"
    rm -rf "$LOCALSTACK_RUN_DIR"
  fi
  unset LOCALSTACK_PID LOCALSTACK_RUN_DIR HOOKWISE_TEST_LOCALSTACK_PID
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  case "${1:-}" in
    run)
      shift
      [[ "${1:-}" == "--" ]] && shift
      (($#)) || { echo "usage: $0 run -- COMMAND..." >&2; exit 2; }
      trap localstack_stop EXIT
      trap 'exit 130' INT TERM
      localstack_start || exit 1
      "$@"
      exit $?
      ;;
    install) localstack_install ;;
    *)
      echo "usage: $0 run -- COMMAND...   (or: $0 install; or source it for localstack_start/stop)" >&2
      exit 2
      ;;
  esac
fi
