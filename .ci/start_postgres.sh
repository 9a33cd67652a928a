#!/usr/bin/env bash
# Start a throw-away PostgreSQL server for the registry tests and print the variables to use.
#
#   eval "$(bash .ci/start_postgres.sh)"      # exports VECBRIDGE_TEST_POSTGRES_URL and VECBRIDGE_TEST_PGDATA
#   ... run tests ...
#   bash .ci/start_postgres.sh stop "$VECBRIDGE_TEST_PGDATA"
#
# Creates a cluster in a temporary folder (owned by the 'postgres' user when run as root, since
# the server refuses to run as root), listens on a free localhost port with a private socket
# directory, trust authentication for local connections only, and creates database vecbridge_test.
# Everything else goes to stderr, so only the export lines reach stdout.
set -euo pipefail

find_bin() {
  local name=$1
  for d in /usr/lib/postgresql/*/bin /usr/local/bin /usr/bin; do
    if [ -x "$d/$name" ]; then echo "$d/$name"; return 0; fi
  done
  command -v "$name" || { echo "start_postgres: $name not found (apt-get install -y postgresql)" >&2; return 1; }
}

as_pg() {  # run a command as the server's user
  if [ "$(id -u)" = 0 ]; then
    su postgres -s /bin/sh -c "$*"
  else
    sh -c "$*"
  fi
}

if ! find_bin pg_ctl >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "start_postgres: installing Debian's postgresql" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql) >&2
fi
PG_CTL=$(find_bin pg_ctl)

if [ "${1:-}" = stop ]; then
  dir=${2:?usage: start_postgres.sh stop PGDATA}
  as_pg "'$PG_CTL' -D '$dir/data' -m fast -w stop" >&2 || true
  rm -rf "$dir"
  exit 0
fi

INITDB=$(find_bin initdb)
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  useradd --system --home-dir /nonexistent --shell /usr/sbin/nologin postgres >&2
fi

dir=$(mktemp -d /tmp/vecbridge-pg.XXXXXX)
chmod 755 "$dir"
[ "$(id -u)" = 0 ] && chown postgres "$dir"

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

as_pg "'$INITDB' -D '$dir/data' -U postgres -A trust -E UTF8 --no-sync" >&2
as_pg "'$PG_CTL' -D '$dir/data' -l '$dir/server.log' -w -t 60 start \
  -o \"-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200\"" >&2
as_pg "psql -h 127.0.0.1 -p $port -U postgres -d postgres -v ON_ERROR_STOP=1 -qc 'CREATE DATABASE vecbridge_test'" >&2

echo "export VECBRIDGE_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:$port/vecbridge_test"
echo "export VECBRIDGE_TEST_PGDATA=$dir"
