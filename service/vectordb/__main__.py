"""``python -m service.vectordb migrate …``: run one resumable migration from the command line.

    python -m service.vectordb migrate --store milvus://127.0.0.1:19530 --source docs_a --target docs_b \\
        --map artifacts/a_to_b.npz --checkpoint docs.ckpt.json [--alias docs] [--batch-size 2000] [--pause 0]

``--map`` is an artifact path, or a registry ref with ``--registry URL --artifact-dir DIR``.
Run the same command again after a crash: it resumes after the last checkpointed id.
Prints one JSON line per batch (progress) and one with the final report. Exit codes: 0 done,
2 bad input / mismatch, 1 other failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from align.exceptions import VecbridgeError

from . import FileCheckpoint, migrate, open_store


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m service.vectordb")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("migrate", help="transform every stored vector through a map into a new collection")
    m.add_argument("--store", default=None,
                   help="milvus://host:port | postgresql://... | qdrant://host:port (default: VECBRIDGE_VECTORDB_URL)")
    m.add_argument("--source", required=True)
    m.add_argument("--target", required=True)
    m.add_argument("--map", required=True, help="artifact path or registry ref")
    m.add_argument("--registry", default=None, help="registry URL (for a ref)")
    m.add_argument("--artifact-dir", default=None)
    m.add_argument("--checkpoint", required=True, help="JSON checkpoint file")
    m.add_argument("--alias", default=None)
    m.add_argument("--batch-size", type=int, default=2000)
    m.add_argument("--pause", type=float, default=0.0, help="seconds to pause after each batch (spare a busy database)")
    m.add_argument("--index", default=None, help="pgvector only: hnsw | ivfflat | none")
    args = ap.parse_args(argv)
    if args.store is None:
        from service.config import get_settings

        args.store = get_settings().vectordb_url
        if not args.store:
            ap.error("give --store, or set VECBRIDGE_VECTORDB_URL")

    registry = None
    if args.registry:
        from service.registry import open_registry

        registry = open_registry(args.registry, args.artifact_dir)
    kw = {}
    if args.index is not None and args.store.startswith(("postgresql://", "postgres://")):
        kw["index"] = None if args.index == "none" else args.index

    def progress(p):
        print(json.dumps({"done": p.done, "total": p.total, "last_id": p.last_id, "rows_per_s": round(p.rows_per_s, 1)}),
              flush=True)
        if args.pause > 0:
            time.sleep(args.pause)

    try:
        store = open_store(args.store, **kw)
        rep = migrate(store, args.source, args.target, args.map, registry=registry, alias=args.alias,
                      batch_size=args.batch_size, checkpoint=FileCheckpoint(args.checkpoint), progress=progress)
    except (VecbridgeError, ValueError, LookupError) as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), file=sys.stderr, flush=True)
        return 2
    print(json.dumps({"report": rep.to_dict()}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
