#!/usr/bin/env bash
# The crates' layers, checked (run by the test command; fails on a violation):
#   ragstream-core        records, tokens, chunkers, pure query steps, contracts: no dataflow, broker,
#                         index engine, model runtime or async runtime, and nothing from the crates above;
#   ragstream-operators   timely operators and adapters: may use the core, never topologies or the binary;
#                         its operators (ingest/, query/) never import its adapters (io/);
#   ragstream-topologies  wiring and config: may use operators and core, never the binary.
set -euo pipefail
cd "$(dirname "$0")/../../.."
failed=0
fail() {
  echo "LAYER VIOLATION: $*" >&2
  failed=1
}

banned='^(timely|differential-dataflow|rdkafka|rdkafka-sys|qdrant-edge|qdrant-client|ort|ort-sys|candle-core|tokio|tonic|tokenizers|prometheus)$'
core_deps="$(cargo tree -p ragstream-core -e normal --prefix none --format '{p}' | awk '{print $1}' | sort -u)"
if bad="$(grep -E "$banned" <<<"$core_deps")"; then
  fail "ragstream-core depends on: $(tr '\n' ' ' <<<"$bad")"
fi
if bad="$(grep -E '^ragstream-(operators|topologies)$|^ragstream$' <<<"$core_deps")"; then
  fail "ragstream-core depends on a crate above it: $(tr '\n' ' ' <<<"$bad")"
fi
operator_deps="$(cargo tree -p ragstream-operators -e normal --prefix none --format '{p}' | awk '{print $1}' | sort -u)"
if bad="$(grep -E '^ragstream-topologies$|^ragstream$' <<<"$operator_deps")"; then
  fail "ragstream-operators depends on a crate above it: $(tr '\n' ' ' <<<"$bad")"
fi

# Paths as well as manifests: a `use` of a crate above (or of a banned crate) in a layer's sources.
check_sources() {
  local dir="$1" pattern="$2" what="$3"
  local hits
  if hits="$(grep -rnE "$pattern" "$dir" --include='*.rs')"; then
    fail "$what:"$'\n'"$hits"
  fi
}
check_sources operators/core/src '\b(ragstream_operators|ragstream_topologies|timely|differential_dataflow|rdkafka|qdrant_edge|qdrant_client|ort|tokio|tokenizers|prometheus)::' \
  "ragstream-core's sources name a crate outside its layer"
check_sources operators/src '\bragstream_topologies::|\bragstream::' "ragstream-operators' sources name a crate above it"
check_sources topologies/src '\bragstream::' "ragstream-topologies' sources name the binary"
# Inside ragstream-operators the adapters (io/: Kafka and file sources and sinks) sit above the
# operators: an operator sees them only through traits of the core or of its own module
# (`DlqSink`, `query::publish::ContextSink`).
if hits="$(grep -rnE '\b(crate|super)::io\b|super::super::io\b' operators/src --include='*.rs' | grep -v '^operators/src/io/')"; then
  fail "an operator imports an adapter (io/):"$'\n'"$hits"
fi

# The default build (the README's run command) compiles none of the components behind features.
default_deps="$(cargo tree -p ragstream -e normal,build --prefix none --format '{p}' | awk '{print $1}' | sort -u)"
if bad="$(grep -E '^(rdkafka|rdkafka-sys|qdrant-client|prost|rmcp|lopdf|html5ever|zip|quick-xml|tiny_http)$' <<<"$default_deps")"; then
  fail "the default build compiles a component's crates (name its feature): $(tr '\n' ' ' <<<"$bad")"
fi
if [ "$failed" -ne 0 ]; then
  exit 1
fi
echo "layers: core ($(wc -l <<<"$core_deps") crates, none of timely, Kafka, Qdrant, ONNX Runtime, tokio) < operators < topologies < binary; the default build $(wc -l <<<"$default_deps") crates, none of Kafka, the Qdrant client, MCP, the file readers"
