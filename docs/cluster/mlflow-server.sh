#!/usr/bin/env bash
# Start the MLflow tracking server every rlspeed run of the cluster records to, with its
# runs in PostgreSQL and its artifacts (checkpoints, curves, plots) in a folder of this host,
# served through the server (clients need no access to that folder).
#
# Usage (on the host that will serve http://THIS-HOST:5000):
#   MLFLOW_DB=postgresql://rlspeed@db-host:5432/mlflow docs/cluster/mlflow-server.sh
# then, anywhere:  rlspeed ... tracking.uri=http://THIS-HOST:5000
#
# It runs in the foreground (run it under nohup, tmux or a systemd unit); extra arguments go
# to `mlflow server` as they are (e.g. --workers 8).
set -euo pipefail

# The MLflow database (created empty; the server creates its tables). postgresql:// URLs
# are given psycopg 3, the driver rlspeed's cluster extra installs (SQLAlchemy before 2.1
# would pick psycopg2).
MLFLOW_DB=${MLFLOW_DB:?set MLFLOW_DB=postgresql://USER@HOST:PORT/DB (the MLflow database)}
ARTIFACTS=${ARTIFACTS:-$HOME/mlflow-artifacts}
MLFLOW_HOST=${MLFLOW_HOST:-0.0.0.0}   # the interface to listen on (0.0.0.0: all)
MLFLOW_PORT=${MLFLOW_PORT:-5000}
MLFLOW_WORKERS=${MLFLOW_WORKERS:-4}
# The Host headers (NAME:PORT, * as a wildcard) the server answers: MLflow refuses a request
# to any name it was not given ("403 Invalid Host header"), so list the name clients use in
# tracking.uri. Given a list, MLflow drops its own default (localhost and private IPs).
ALLOWED_HOSTS=${ALLOWED_HOSTS:-$(hostname):*,$(hostname -f 2>/dev/null || hostname):*,localhost:*,127.0.0.1:*}

case $MLFLOW_DB in
    postgresql://* | postgres://*) MLFLOW_DB=postgresql+psycopg://${MLFLOW_DB#*://} ;;
esac
mkdir -p "$ARTIFACTS"
# MLflow 3 also starts worker processes for its GenAI jobs by default; rlspeed uses none.
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}
exec mlflow server \
    --backend-store-uri "$MLFLOW_DB" \
    --serve-artifacts --artifacts-destination "$ARTIFACTS" \
    --host "$MLFLOW_HOST" --port "$MLFLOW_PORT" --workers "$MLFLOW_WORKERS" \
    --allowed-hosts "$ALLOWED_HOSTS" \
    "$@"
