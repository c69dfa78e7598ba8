#!/usr/bin/env bash
# Benchmark of `make run` (no KUBECONFIG: the local control plane, the
# node unless NODE=0, the registry, Crossplane core and the packages),
# ROUNDS times in a row: each run to "ready for kubectl", then Ctrl-C
# (SIGINT to its process group) and a wait for it to stop. Per round it
# prints the time make run gives each stage (how long it took, and when it
# ended since make began) and the time to ready; then the rounds' times to
# ready and their median, with the load average before and after. The
# first round warms what the tree changed (the packages, bin/
# local-control-plane); a warm run is a later one. Not a test: it
# prints figures. Needs root for the node (NODE=0 for none); the tools
# are built first when missing (minutes, cold), outside any round.
#
#   hack/bench-run.sh [ROUNDS]        (make bench-run ROUNDS=3 [NODE=0])
# shellcheck source=hack/bench-env.sh
source "$(dirname "$0")/bench-env.sh"

rounds=${1:-3}
node_arg=()
[ "${NODE:-}" = 0 ] && node_arg=(NODE=0)
# A registry port of its own, so a make run of yours on 127.0.0.1:5000
# and this never collide.
port=$((20000 + RANDOM % 20000))
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

bash hack/controlplane-bins.sh >/dev/null
bash hack/crossplane-bins.sh all >/dev/null
if [ "${NODE:-}" != 0 ]; then
  bash hack/node-bins.sh >/dev/null
  bash hack/squid-image.sh >/dev/null
fi

load() { cut -d' ' -f1-3 /proc/loadavg; }

# stages LOG: one line per stage make run printed it had finished:
# "NAME|TOOK|AT" (seconds), and "ready||AT". The packages stage ends when
# the control plane is up; what it took is the build's own time.
stages() {
  sed -n -E \
    -e '/^make run \[[0-9]+\/[0-9]+\] packages: /{s/^.* in ([0-9.]+)s \([0-9.]+s; ([0-9.]+)s since make run began\)$/packages|\1|\2/p;d;}' \
    -e 's/^make run \[[0-9]+\/[0-9]+\] ([^:]+): .*\(([0-9.]+)s; ([0-9.]+)s since make run began\)$/\1|\2|\3/p' \
    -e 's/^make run \[[0-9]+\/[0-9]+\] (node): .* Ready in ([0-9.]+)s .*$/\1|\2|/p' \
    -e 's/^make run: ready for kubectl in ([0-9.]+)s since make run began\.$/ready||\1/p' "$1"
}

readies=()
echo "bench-run: $rounds rounds of make run ${node_arg[*]} (registry 127.0.0.1:$port); load average $(load) (1, 5, 15 min) on $(nproc) cores"
for r in $(seq 1 "$rounds"); do
  log=$logs/round-$r.log
  setsid make --no-print-directory run "${node_arg[@]}" RUN_XPKG_REPO="127.0.0.1:$port/egressproxy" >"$log" 2>&1 </dev/null &
  pid=$!
  deadline=$((SECONDS + 1800))
  until grep -q '^Ctrl-C stops everything' "$log"; do
    if ! kill -0 "$pid" 2>/dev/null || [ $SECONDS -gt $deadline ]; then
      echo "bench-run: round $r: make run ended or took over 30 minutes before it was ready; its output:" >&2
      cat "$log" >&2
      kill -INT -- "-$pid" 2>/dev/null || true
      exit 1
    fi
    sleep 0.2
  done
  t=$SECONDS
  kill -INT -- "-$pid"
  wait "$pid" || true
  stopped=$((SECONDS - t))
  echo "round $r (load $(load)):"
  while IFS='|' read -r name took at; do
    name=${name%% (*}
    if [ "$name" = ready ]; then
      printf '  %-40s %7s  %7.1fs\n' "ready for kubectl" "" "$at"
      readies+=("$at")
    elif [ -n "$at" ]; then
      printf '  %-40s %6.1fs  %7.1fs\n' "$name" "$took" "$at"
    else
      printf '  %-40s %6.1fs\n' "$name" "$took"
    fi
  done < <(stages "$log")
  printf '  %-40s %6ds\n' "stop (Ctrl-C to make's exit)" "$stopped"
done
sorted=$(printf '%s\n' "${readies[@]}" | sort -g)
median=$(echo "$sorted" | sed -n "$(( (${#readies[@]} + 1) / 2 ))p")
echo "bench-run: ready for kubectl in ${readies[*]} s (round 1 first); median ${median}s; load average $(load)"
echo "  (columns: what the stage took, and when it ended since make run began)"
