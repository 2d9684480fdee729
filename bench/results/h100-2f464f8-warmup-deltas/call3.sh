SERVE_ARGS="--rates 8,inf,inf" SERVE_TIMEOUT=470 bash bench/h200_run.sh serve
