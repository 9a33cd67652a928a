#!/bin/sh
# vecbridge container entrypoint: make sure every folder the service writes exists and is writable
# by this user (uid 10001, not root), then run the command. A folder bind-mounted from the host
# keeps the host's owner; say so plainly instead of failing later inside a fit or an index write.
set -eu
for dir in "${VECBRIDGE_DATA_DIR:-/data}" ${VECBRIDGE_ARTIFACT_DIR:+"$VECBRIDGE_ARTIFACT_DIR"}; do
    mkdir -p "$dir" 2>/dev/null || true
    probe="$dir/.vecbridge-write-test.$$"
    if ! touch "$probe" 2>/dev/null; then
        echo "vecbridge: $dir is not writable by uid $(id -u); give it to that user on the host" \
             "(chown -R $(id -u):$(id -g) <folder mounted at $dir>) or use a named volume" >&2
        exit 73
    fi
    rm -f "$probe"
done
exec "$@"
