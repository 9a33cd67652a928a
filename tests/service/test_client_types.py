"""What a type checker sees of ``service.client``: each call of :class:`Client` returns its result and each call of
:class:`AsyncClient` a coroutine of it (``service.client_core.Driven``), and the packages say they are typed."""

from __future__ import annotations

import inspect
import tomllib
from pathlib import Path

from service.client import AsyncClient, Client

ROOT = Path(__file__).resolve().parents[2]

# the README's client examples, and a few annotations that hold only if the types are the calls' results
README_EXAMPLES = '''
import asyncio

import numpy as np

from service.client import AsyncClient, Client, NotFoundError

Xs = Xt = queries = np.random.rand(8, 384)
vb = Client("http://127.0.0.1:8000", api_key="KEY")
vb.list_maps()
Y = vb.transform("demo-minilm-e5", np.random.rand(8, 384))
Y, used = vb.transform("demo-minilm-e5@prod", np.random.rand(8, 384), with_versions=True)
job = vb.fit("mine", "minilm", "e5", Xs, Xt, method="procrustes", paired=True)
vb.wait(job["id"], progress=lambda j: print(j["progress"]))
vb.search("docs-e5", queries, space="minilm", k=5)["results"]
try:
    vb.transform("nope", Y)
except NotFoundError as e:
    print(e.status, e.message, e.request_id)
maps: list[dict] = vb.list_maps()
done: dict = vb.wait(job["id"])


async def handler(queries):
    async with AsyncClient("http://127.0.0.1:8000", api_key="KEY") as vb:
        Y, hits = await asyncio.gather(vb.transform("demo-minilm-e5", queries),
                                       vb.search("docs-e5", queries, space="minilm", k=5))
        job = await vb.fit("mine", "minilm", "e5", Xs, Xt, method="procrustes", paired=True)
        await vb.wait(job["id"])
        spaces: list[dict] = await vb.list_spaces()
        return hits["results"], spaces
'''

# mistakes a type checker must report: the types are not Any
MISTAKES = '''
from service.client import AsyncClient, Client

vb = Client("http://127.0.0.1:8000")
n: int = vb.list_maps()
vb.wait("j", timout=3)


async def f(a: AsyncClient) -> None:
    d: dict = a.get_map("m")
'''


def test_readme_client_examples_type_check_and_mistakes_are_reported(tmp_path, monkeypatch):
    """QA: mypy / basedpyright saw every Client and AsyncClient method as returning a generator (``call`` was typed
    ``Callable[..., Gen]``), so the README's own ``vb.wait(job["id"])``, ``vb.search(...)["results"]`` and
    ``await vb.fit(...)`` were errors; without ``py.typed`` mypy treated the installed packages as untyped.
    mypy is in the dev extra, so CI runs this (it used to skip where mypy was absent)."""
    from mypy import api
    (tmp_path / "readme_client.py").write_text(README_EXAMPLES)
    (tmp_path / "mistakes.py").write_text(MISTAKES)
    monkeypatch.setenv("MYPYPATH", str(ROOT))

    def check(name: str) -> str:  # the user's files only: the packages' own findings are not the user's
        out, err, _ = api.run(["--follow-imports=silent", "--check-untyped-defs", "--no-error-summary",
                               "--cache-dir", str(tmp_path / ".mypy"), str(tmp_path / name)])
        return out + err

    assert check("readme_client.py") == ""
    found = check("mistakes.py")
    assert 'expression has type "list[dict[Any, Any]]", variable has type "int"' in found
    assert 'Unexpected keyword argument "timout"' in found
    assert 'expression has type "Coroutine[Any, Any, dict[Any, Any]]", variable has type "dict[Any, Any]"' in found


def test_every_call_declares_what_it_returns():
    """A call without a return annotation (``transform``, ``embed``) was typed by pyright as the generator its
    body is: the annotation is what ``Driven`` gives the clients' methods."""
    calls = [n for n, f in vars(Client).items() if inspect.isfunction(f) and hasattr(f, "__wrapped__")]
    calls += [n for c in Client.__mro__[1:] for n, f in vars(c).items() if getattr(f, "__vecbridge_call__", False)]
    assert {"transform", "embed", "search", "wait", "fit", "get_version"} <= set(calls)
    for name in set(calls):
        for cls in (Client, AsyncClient):
            assert inspect.signature(getattr(cls, name)).return_annotation is not inspect.Signature.empty, name
    assert inspect.iscoroutinefunction(AsyncClient.wait) and not inspect.iscoroutinefunction(Client.wait)


def test_the_packages_are_marked_typed_and_installed_so():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for package in ("align", "service"):
        assert (ROOT / package / "py.typed").is_file()
        assert "py.typed" in data.get(package, [])
