"""What a careful user runs into on the real engines, and the one clear error each gets.

Milvus Lite (its own server process), PostgreSQL + pgvector (pgserver wheel) and Qdrant local mode;
servers from ``tests/_vectordb_servers.py``. Small generated collections: these are refusals, not
quality checks (that is ``test_vectordb_engines.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
from _servers import free_port
from _vectordb_servers import milvus_url, pg_url  # noqa: F401  (module-scoped server fixtures)

import align
from service.vectordb import VectorDBError, open_store
from service.vectordb.__main__ import main as vectordb_main


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 24)).astype(np.float32)
    Y = X @ np.linalg.qr(rng.normal(size=(24, 24)))[0][:, :16]
    m = align.fit_procrustes(X[200:], Y[200:])
    return X[:200], m


@pytest.mark.parametrize("url", ["milvus://127.0.0.1:{port}", "postgresql://postgres@127.0.0.1:{port}/postgres",
                                 "qdrant://127.0.0.1:{port}"])
def test_an_unreachable_server_is_one_error_of_its_kind(url, tmp_path, capsys):
    url = url.format(port=free_port())
    with pytest.raises(VectorDBError, match="cannot connect"):
        open_store(url)
    rc = vectordb_main(["migrate", "--store", url, "--source", "a", "--target", "b", "--map", "m.npz",
                        "--checkpoint", str(tmp_path / "ck.json")])
    assert rc == 2 and "cannot connect" in capsys.readouterr().err  # exit 2 (act on it), not 3 (a bug)


def test_milvus_lite_file_in_a_new_folder_is_created(tmp_path):
    pytest.importorskip("milvus_lite")
    with open_store(f"milvus://{tmp_path}/new/docs.db") as s:  # the README's milvus:///tmp/vb-demo/docs.db
        assert not s.exists("docs")
    assert (tmp_path / "new" / "docs.db").exists()
