#!/usr/bin/env bash
# Run one Optuna study as N sweep workers started from this host (a login node): each worker
# is an `rlspeed -m` process that asks the shared study (PostgreSQL) for trials and runs each
# as a SLURM job (hydra/launcher=submitit_slurm); together they run N_TRIALS trials, no more.
#
# Usage:
#   RLSPEED_DB=postgresql://USER@HOST:PORT/DB MLFLOW_URI=http://MLFLOW-HOST:5000 \
#   [N_WORKERS=2] [N_TRIALS=40] [STUDY=dqn_search] [PARTITION=...] [HPARAMS=dqn_search] \
#   [SWEEP_DIR=...] docs/cluster/sweep.sh [OVERRIDE ...]
#
# OVERRIDEs go to every worker (e.g. backend=torch hydra.launcher.timeout_min=120). Each
# worker writes into SWEEP_DIR/worker<i>/ (its trials' folders, submitit's job logs) and logs
# to SWEEP_DIR/worker<i>.log. The script waits for all workers, prints the study's trial
# counts, and exits 1 if any worker failed. Running it again with the same STUDY and a larger
# N_TRIALS continues the study.
set -euo pipefail

RLSPEED_DB=${RLSPEED_DB:?set RLSPEED_DB=postgresql://USER@HOST:PORT/DB (the Optuna database)}
MLFLOW_URI=${MLFLOW_URI:?set MLFLOW_URI=http://MLFLOW-HOST:PORT (the MLflow server)}
PARTITION=${PARTITION:-}            # empty: the cluster's default partition
N_WORKERS=${N_WORKERS:-2}
N_TRIALS=${N_TRIALS:-40}            # the study's total, across all workers
HPARAMS=${HPARAMS:-dqn_search}      # the search space (conf/hparams/)
STUDY=${STUDY:-$HPARAMS}
SWEEP_DIR=${SWEEP_DIR:-cluster-sweeps/$STUDY/$(date +%Y-%m-%d_%H-%M-%S)}

args=(
    -m "hparams=$HPARAMS"
    hydra/launcher=submitit_slurm
    "hydra.sweeper.storage=$RLSPEED_DB"
    "hydra.sweeper.study_name=$STUDY"
    "hydra.sweeper.n_trials=$N_TRIALS"
    "tracking.uri=$MLFLOW_URI"
    "tracking.experiment=$STUDY"
)
if [[ -n $PARTITION ]]; then
    args+=("hydra.launcher.partition=$PARTITION")
fi

mkdir -p "$SWEEP_DIR"
pids=()
for i in $(seq 1 "$N_WORKERS"); do
    rlspeed "${args[@]}" "hydra.sweep.dir=$SWEEP_DIR/worker$i" "$@" >"$SWEEP_DIR/worker$i.log" 2>&1 &
    pids+=($!)
    echo "worker $i: pid ${pids[-1]}, log $SWEEP_DIR/worker$i.log"
done

failed=0
for i in "${!pids[@]}"; do
    status=0
    wait "${pids[$i]}" || status=$?
    if ((status != 0)); then
        echo "worker $((i + 1)) failed (exit $status); its log ends:" >&2
        tail -n 5 "$SWEEP_DIR/worker$((i + 1)).log" >&2
        failed=1
    fi
done

# The study as the database has it; psycopg 3 is the driver rlspeed's cluster extra installs
# (SQLAlchemy before 2.1 would pick psycopg2 for a plain postgresql:// URL).
db=$RLSPEED_DB
case $db in postgresql://* | postgres://*) db=postgresql+psycopg://${db#*://} ;; esac
python - "$db" "$STUDY" <<'PY'
import collections, sys
import optuna

optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.load_study(study_name=sys.argv[2], storage=sys.argv[1])
trials = study.get_trials(deepcopy=False)
states = collections.Counter(t.state.name for t in trials)
print(f"study {study.study_name}: {len(trials)} trials:", ", ".join(f"{n} {s}" for s, n in sorted(states.items())))
if states["COMPLETE"] and len(study.directions) == 1:
    print(f"best: trial {study.best_trial.number}, value {study.best_value:.4g}, {study.best_params}")
PY
exit "$failed"
