#!/usr/bin/env bash
# Runs a command inside a memory cgroup of LIMIT bytes (page cache included, as a container's limit
# counts it) and, on exit, prints the cgroup's peak usage and failure count to stderr as one JSON line.
# Needs a writable cgroup hierarchy (v2 or the v1 memory controller), e.g. root in a container.
#   ./deploy/scripts/bench/memory-limit.sh 4G ragstream bench volume ...
# With the bench scripts: RAGSTREAM_MEMORY_LIMIT=4G ./deploy/scripts/bench/volume.sh
set -euo pipefail
limit="$1"
shift
bytes="$(numfmt --from=iec "$limit")"
name="ragstream-limit-$$"
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  group="/sys/fs/cgroup/$name"
  mkdir "$group"
  echo "$bytes" >"$group/memory.max"
  echo 0 >"$group/memory.swap.max" 2>/dev/null || true
  peak_file="$group/memory.peak"
  fail_file="$group/memory.events"
else
  group="/sys/fs/cgroup/memory/$name"
  mkdir "$group"
  echo "$bytes" >"$group/memory.limit_in_bytes"
  peak_file="$group/memory.max_usage_in_bytes"
  fail_file="$group/memory.failcnt"
fi
# The child joins the group before it execs the command, so everything the command allocates counts.
(echo "$BASHPID" >"$group/cgroup.procs" && exec "$@") &
child=$!
trap 'kill "$child" 2>/dev/null || true' INT TERM
status=0
wait "$child" || status=$?
peak="$(cat "$peak_file" 2>/dev/null || echo 0)"
failures="$(tr '\n' ' ' <"$fail_file" 2>/dev/null || true)"
printf '{"memory_limit_mib": %d, "cgroup_peak_mib": %d, "cgroup_failures": "%s"}\n' \
  "$((bytes / 1048576))" "$((peak / 1048576))" "$failures" >&2
rmdir "$group" 2>/dev/null || true
exit "$status"
