#!/usr/bin/env bash
# Installs the Qdrant server the server backend's tests run against into a cache directory, once, and
# prints the binary's path. Takes $QDRANT_BIN when set; otherwise unpacks the prebuilt server that
# ../shared/bin/ ships beside this checkout (built from Qdrant's public source; checksums verified by its
# own script). Exits 3 when neither exists (no Qdrant server package is on the registries this project
# can reach).
#   RAGSTREAM_CACHE  cache root (default ~/.cache/ragstream)
#   QDRANT_BIN       a Qdrant server binary to use instead
set -euo pipefail
if [ -n "${QDRANT_BIN:-}" ]; then
  [ -x "$QDRANT_BIN" ] || { echo "install-qdrant: QDRANT_BIN=$QDRANT_BIN is not executable" >&2; exit 1; }
  echo "$QDRANT_BIN"
  exit 0
fi
shipped="$(cd "$(dirname "$0")/../../../.." && pwd)/shared/bin/install-qdrant.sh"
if [ -x "$shipped" ]; then
  exec "$shipped"
fi
echo "install-qdrant: no Qdrant server (set QDRANT_BIN, or place ../shared/bin/install-qdrant.sh)" >&2
exit 3
