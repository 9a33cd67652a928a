"""``python -m service.vectordb migrate …``: run one resumable migration from the command line.

    python -m service.vectordb migrate --store milvus://127.0.0.1:19530 --source docs_a --target docs_b \\
        --map artifacts/a_to_b.npz --checkpoint docs.ckpt.json [--alias docs] [--batch-size 2000] [--pause 0] \\
        [--overwrite] [--vector-field emb] [--id-field pk] [--text-field body] [--source-space minilm] \\
        [--keep-ids rows_ids.npy --keep-vectors new_pairs.npy]
    python -m service.vectordb status --checkpoint docs.ckpt.json

``--map`` is an artifact path, or a registry ref with ``--registry URL [--artifact-dir DIR]``.
Run the same command again after a crash or Ctrl-C: it resumes after the last checkpointed id.
Prints one JSON line per batch (progress) and one with the final report. ``vecbridge migrate`` is
the same operation with a progress bar (:mod:`service.ops.vectordb`).

Exit codes: 0 done, 2 bad input / mismatch / refused (one JSON line on stderr), 75 retry later (the registry
locked or not answering, or the vector database not answering or lost mid-run: every batch written is
checkpointed, the same command resumes), 130 interrupted (Ctrl-C; SIGTERM 143: the batch in flight is finished and
checkpointed first), 1 other failure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..config import get_settings
from ..errors import exit_code
from ..ops.vectordb import (
    check_artifact_folder,
    checkpoint_status,
    progress_record,
    run_migration,
    stopped_by,
)
from ..registry import open_registry
from . import MigrationInterrupted
from .lost import quiet_client_logs


def _err(exc: BaseException) -> None:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m service.vectordb`` command line (``migrate``, ``status``); the docs' test walks it."""
    ap = argparse.ArgumentParser(prog="python -m service.vectordb")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("migrate", help="transform every stored vector through a map into a new collection")
    m.add_argument("--store", default=None,
                   help="milvus://host:port | postgresql://... | qdrant://host:port (default: VECBRIDGE_VECTORDB_URL)")
    m.add_argument("--source", required=True)
    m.add_argument("--target", required=True)
    m.add_argument("--map", required=True, help="artifact path or registry ref")
    m.add_argument("--registry", default=None, help="registry URL (for a ref)")
    m.add_argument("--artifact-dir", default=None,
                   help="the registry's artifact folder (default: VECBRIDGE_ARTIFACT_DIR, else DATA_DIR/artifacts)")
    m.add_argument("--checkpoint", required=True, help="JSON checkpoint file")
    m.add_argument("--alias", default=None)
    m.add_argument("--batch-size", type=int, default=2000)
    m.add_argument("--pause", type=float, default=0.0, help="seconds to pause after each batch (spare a busy database)")
    m.add_argument("--index", default=None, help="pgvector only: hnsw | ivfflat | none")
    m.add_argument("--overwrite", action="store_true", help="drop an existing target before a fresh start")
    m.add_argument("--dry-run", action="store_true", help="check everything, read and map one batch, write nothing")
    for f in ("id", "vector", "text"):
        m.add_argument(f"--{f}-field", default=None, help=f"name of the {f} field (default: the engine's)")
    m.add_argument("--source-space", default=None, help="the space the source vectors live in (checked)")
    m.add_argument("--target-space", default=None, help="recorded on the target (default: the map's)")
    m.add_argument("--keep-ids", default=None, help="ids of rows re-embedded with the new model (.npy; .json list or "
                                                    "one per line for string ids): written with --keep-vectors")
    m.add_argument("--keep-vectors", default=None, help="their new-model vectors, in --keep-ids' order")
    st = sub.add_parser("status", help="what a checkpoint file says")
    st.add_argument("--checkpoint", required=True)
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    settings = get_settings()
    if args.cmd == "migrate" and args.store is None:  # `status` reads its checkpoint file only: it has no --store
        args.store = settings.vectordb_url
        if not args.store:
            ap.error("give --store, or set VECBRIDGE_VECTORDB_URL")

    try:
        if args.cmd == "status":
            print(json.dumps(checkpoint_status(args.checkpoint, settings.vectordb_url)), flush=True)
            return 0
        registry = artifact_dir = None
        if args.registry:  # no --artifact-dir: the settings' folder, as `vecbridge` reads it (None was a TypeError)
            artifact_dir = (Path(args.artifact_dir).expanduser() if args.artifact_dir
                            else settings.resolved_artifact_dir())
            # a missing folder is refused before the registry opens: that makes it
            check_artifact_folder(artifact_dir, args.map, args.registry, option="--artifact-dir DIR")
            registry = open_registry(args.registry, artifact_dir, path_alias=settings.path_alias)

        def progress(p):
            print(json.dumps(progress_record(p)), flush=True)

        quiet_client_logs(args.store)
        rep = run_migration(store_url=args.store, source=args.source, target=args.target, map_ref=args.map,
                            checkpoint=args.checkpoint, registry=registry, alias=args.alias,
                            batch_size=args.batch_size, overwrite=args.overwrite, pause=args.pause, index=args.index,
                            id_field=args.id_field, vector_field=args.vector_field, text_field=args.text_field,
                            source_space=args.source_space, target_space=args.target_space, progress=progress,
                            api_key=settings.vectordb_api_key, ca_file=settings.vectordb_ca_file,
                            dry_run=args.dry_run, keep_ids=args.keep_ids, keep_vectors=args.keep_vectors,
                            # recorded for the resume command (`vecbridge --artifact-dir A --registry-url R
                            # migrate ...`), as `vecbridge migrate` records them
                            registry_url=args.registry, artifact_dir=artifact_dir,
                            index_wait_s=settings.vectordb_index_wait_s)
    except KeyboardInterrupt:
        exc = MigrationInterrupted("interrupted; run the same command again to resume", 0, 0)
        _err(exc)
        return exit_code(exc)
    except Exception as exc:  # noqa: BLE001 - one line, the exit code of its kind (service.errors.EXIT_CODE)
        _err(exc)  # a migration a signal stopped: 128 + it (143 SIGTERM), as ``vecbridge migrate``
        return stopped_by(exc)[1] if isinstance(exc, MigrationInterrupted) else exit_code(exc)
    print(json.dumps({"report": rep.to_dict()}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
