# HTTP at the engine's default max_num_seqs (server and offline engine alike), three rates.
set -u
export OUT
bash bench/h200_run.sh env 2>&1 | tail -2
SERVE_ARGS="--rates 8,16,inf,inf" SERVE_TIMEOUT=545 bash bench/h200_run.sh serve 2>&1 | tail -12
echo "=== done $(date +%T)"
