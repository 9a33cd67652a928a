"""Fuzzing: schemathesis against the service's own OpenAPI document, every operation, a valid key.

Bounded: ``MAX_EXAMPLES`` generated requests per operation (positive and negative data), no
shrinking, so the whole module runs in well under two minutes. Every response: no 5xx and
no traceback. Conformance to the document (``content_type_conformance``,
``response_schema_conformance``) is collected per operation and status and asserted once at the end (it currently fails: see
``test_fuzzed_responses_match_their_documented_schema``).
"""

from __future__ import annotations

import time

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis.specs.openapi.checks import (content_type_conformance,  # noqa: E402
                                               response_schema_conformance)

from service.api import create_app  # noqa: E402

from _tiny_lm import tiny_lm  # noqa: E402

from .helpers import W, planted, populate, settings_for  # noqa: E402

MAX_EXAMPLES = 20
CHECKS = [content_type_conformance, response_schema_conformance]
# (operation, status) -> first schema violation seen; filled by test_fuzz_operation, read by the last test.
SCHEMA_MISMATCHES: dict[tuple[str, int], str] = {}
FUZZED: list[str] = []
STATUS_COUNTS: dict[int, int] = {}


def _first_problem(exc: BaseException) -> str:
    subs = getattr(exc, "exceptions", None) or [exc]
    return "; ".join(f"{type(e).__name__}: {str(e).strip().splitlines()[0][:120]}" for e in subs)


def _operations() -> list[tuple[str, str]]:
    from service.config import Settings

    spec = create_app(Settings(demo_on_empty=False)).openapi()
    return [(path, method) for path, ops in spec["paths"].items() for method in ops]


OPERATIONS = _operations()


@pytest.fixture(scope="module")
def schema(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    app = create_app(settings_for(tmp, max_batch=256, max_body_bytes=1_000_000, max_queued_jobs=2,
                                  vectordb_url=f"qdrant://{tmp / 'qdrant'}"))  # the migration routes run for real
    model_tok = tiny_lm()  # the LM routes run for real on a tiny random Llama (seconds), not SmolLM2 (minutes)
    app.state.lm_provider = lambda: model_tok
    s = schemathesis.openapi.from_asgi("/openapi.json", app)  # starts the app's lifespan (kept for the process)
    state = app.state.vb
    populate(state.registry)
    _, Y, _ = planted()
    state.indexes.create("ix", "b", Y[:50], dim=16)
    return s


def _not_ready_while_loading(label: str, r) -> bool:
    """``/readyz``'s documented 503 while the start-up still loads an index (nothing else wrong)."""
    if label != "GET /readyz" or r.status_code != 503:
        return False
    body = r.json()
    rest = {k: v for k, v in body["checks"].items() if k != "indexes"}
    return (body["status"] == "not ready" and body["checks"]["indexes"].get("loading", 0) > 0
            and all(v == "ok" for k, v in rest.items() if k in ("registry", "data_dir")))


def _call(case, label: str):
    """``case.call``; ``/readyz``'s documented 503 while the start-up still loads an index is waited out (up to a
    minute) and the case asked again. Schemathesis ends the lifespan after each test, so each test's first call starts
    the app again, and on a busy machine its background index load outlasted all 20 examples: none was checked."""
    r = case.call(headers=W)
    deadline = time.monotonic() + 60
    while _not_ready_while_loading(label, r) and time.monotonic() < deadline:
        time.sleep(0.05)
        r = case.call(headers=W)
    return r


@pytest.mark.parametrize("path,method", OPERATIONS, ids=[f"{m.upper()} {p}" for p, m in OPERATIONS])
def test_fuzz_operation(schema, path, method):
    op = schema[path][method]
    label = f"{method.upper()} {path}"
    statuses: dict[int, int] = {}

    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy())
    def run(case):
        r = _call(case, label)
        if _not_ready_while_loading(label, r):
            return  # documented, and still loading after a minute: nothing else to check in this answer
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        assert r.status_code < 500, f"{label}: {r.status_code} {r.text[:300]}"
        assert "Traceback" not in r.text
        if (label, r.status_code) not in SCHEMA_MISMATCHES:
            try:
                case.validate_response(r, checks=CHECKS)
            except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - recorded, asserted at the end
                SCHEMA_MISMATCHES[(label, r.status_code)] = _first_problem(exc)

    run()
    FUZZED.append(label)
    for st, n in statuses.items():
        STATUS_COUNTS[st] = STATUS_COUNTS.get(st, 0) + n
    assert sum(statuses.values()) > 0
    assert not any(s >= 500 for s in statuses), statuses


def test_fuzzed_responses_match_their_documented_schema():
    if not FUZZED:
        pytest.skip("run together with test_fuzz_operation")
    print(f"\nfuzzed {len(FUZZED)} operations, {sum(STATUS_COUNTS.values())} requests, statuses "
          f"{dict(sorted(STATUS_COUNTS.items()))}; schema mismatches: {len(SCHEMA_MISMATCHES)}")
    for (op, st), msg in sorted(SCHEMA_MISMATCHES.items()):
        print(f"  {op} -> {st}: {msg}")
    assert not SCHEMA_MISMATCHES, "\n".join(f"{op} -> {st}: {msg}" for (op, st), msg in sorted(SCHEMA_MISMATCHES.items()))
