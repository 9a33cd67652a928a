"""The documentation names only real things: every ``VECBRIDGE_*`` variable is a setting (or a documented
non-setting the code reads), every ``vecbridge`` command and option exists in the click tree (and ``python -m
service.vectordb``'s parser), every HTTP route with its method exists in the app, every repository path and test
exists, every dotted ``align.`` / ``service.`` name imports. Read from README.md, ARCHITECTURE.md, RELIABILITY.md,
SCALING.md, docker-compose.yml and the Dockerfile (tests/_doc_mentions.py says what counts as a mention), and from
the OpenAPI document and every ``--help`` text. A failure lists every stale mention as ``FILE:LINE: what: why``.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
from functools import lru_cache
from pathlib import Path

import click
import pytest
from _doc_mentions import (
    DOCS,
    IMPORT_RE,
    NAME_RE,
    PATH_RE,
    RESULT_FILE_RE,
    ROOT,
    TEST_FILE_RE,
    VARIABLE_RE,
    Piece,
    is_option,
    markdown_pieces,
    option_words,
    pieces,
    route_mentions,
    simple_commands,
)

#: variables the docs name *because* they are refused (examples of the start-up check); each must stay unknown
REFUSED_EXAMPLES = {"VECBRIDGE_PROT", "VECBRIDGE_LIMITS__MAX_KK"}
#: options of other programs that the docs show beside ours (docker run / docker build)
FOREIGN_OPTIONS = {"--stop-timeout", "--build-arg"}


# --- what exists ------------------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def cli_commands() -> dict[tuple[str, ...], click.Command]:
    """``{("vecbridge", "index", "create"): command}`` of the whole click tree, walked in-process."""
    from service.cli import cli

    ctx = click.Context(cli)
    out = {}

    def walk(cmd, path):
        out[path] = cmd
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), path + (name,))

    walk(cli, ("vecbridge",))
    return out


def click_options(cmd: click.Command) -> dict[str, bool]:
    """``{"--opt": takes a value}`` of a click command, ``--help`` included."""
    out = {"--help": False, "-h": False}
    for p in cmd.params:
        if isinstance(p, click.Option):
            out.update({o: not (p.is_flag or p.count) for o in p.opts})
            out.update({o: False for o in p.secondary_opts})
    return out


@lru_cache(maxsize=1)
def vectordb_commands() -> dict[str, dict[str, bool]]:
    """``{"migrate": {"--store": True, ...}}`` of ``python -m service.vectordb``."""
    from service.vectordb.__main__ import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {name: {o: a.nargs != 0 for a in p._actions for o in a.option_strings}
            for name, p in sub.choices.items()}


@lru_cache(maxsize=1)
def all_options() -> set[str]:
    return ({o for c in cli_commands().values() for o in click_options(c)}
            | {o for opts in vectordb_commands().values() for o in opts})


@lru_cache(maxsize=1)
def app_routes() -> list[tuple[str, frozenset[str], bool]]:
    """``(path template, methods, is a mount)`` of every route of the app (included routers walked)."""
    from service.api.app import create_app
    from service.config import Settings

    app = create_app(Settings(data_dir=ROOT / "var-docs-test-unused", auth_disabled=True))
    out = []

    def walk(routes):
        for r in routes:
            inner = getattr(r, "original_router", None)
            if inner is not None:
                walk(inner.routes)
            elif hasattr(r, "path"):
                methods = set(getattr(r, "methods", None) or ())
                out.append((r.path, frozenset(methods | ({"HEAD"} if "GET" in methods else set())),
                            not hasattr(r, "methods")))

    walk(app.routes)
    return out


def _segments_match(doc: list[str], route: list[str]) -> bool:
    if len(doc) != len(route):
        return False
    for d, r in zip(doc, route):
        if r.startswith("{"):
            continue  # a template matches a concrete name (demo-minilm-e5@prod) or the doc's own template
        if d != r:
            return False
    return True


def route_problem(method: str | None, path: str) -> str | None:
    if method is None and any(t.startswith(path + "/") for t, _, _ in app_routes()):
        return None  # a prefix (the `/v1` API)
    doc = path.rstrip("/").split("/") if path != "/" else [""]
    found = [(methods, mount) for tmpl, methods, mount in app_routes()
             if _segments_match(doc, tmpl.rstrip("/").split("/"))
             or (mount and path.startswith(tmpl.rstrip("/") + "/"))]
    if not found:
        return "no such route in the app"
    if method and not any(mount or method in methods for methods, mount in found):
        takes = ", ".join(sorted(set().union(*(m for m, _ in found))))
        return f"the route exists but not for {method} (it takes {takes})"
    return None


def _settings_names() -> set[str]:
    from service.config import Settings

    out = set()
    for name, field in Settings.model_fields.items():
        out.add(f"VECBRIDGE_{name.upper()}")
        out.add(f"VECBRIDGE_{name.upper()}_FILE")
        sub = field.annotation
        for inner in getattr(sub, "model_fields", {}):
            out.add(f"VECBRIDGE_{name.upper()}__{inner.upper()}")
    return out


@lru_cache(maxsize=1)
def _source_text() -> str:
    files = [p for d in ("service", "tests", "benchmarks", ".ci", "docker") for p in (ROOT / d).rglob("*")
             if p.suffix in ("", ".py", ".sh") and p.is_file() and p.name != Path(__file__).name]
    return "\n".join(p.read_text(errors="replace") for p in files)


def variable_problem(name: str) -> str | None:
    from service.config import unknown_variables

    if name in REFUSED_EXAMPLES:
        return None if unknown_variables([name]) else "shown as a refused name, but it is a setting now"
    if unknown_variables([name]):
        return "names no setting (service/config.py: unknown_variables refuses it)"
    if name not in _settings_names() and name not in _source_text():
        return "not a setting, and no code reads it"
    return None


def resolve_name(dotted: str) -> str | None:
    parts = dotted.split(".")
    if any(p.startswith("_") or len(p) == 1 for p in parts):
        return None  # align._x, align.x: placeholders ("a private name", "a module")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return f"{'.'.join(parts[:parts.index(attr)])} has no attribute {attr!r}"
            obj = getattr(obj, attr)
        return None
    return "no such module"


def path_problem(mention: str, last_file: Path | None) -> tuple[str | None, Path | None]:
    """Why a path mention is stale (None: it exists), and the file it names (for a following ``::test``)."""
    if "<" in mention:
        return None, last_file  # service/ops/<family>.py: a placeholder
    file, *funcs = mention.rstrip(".,:").split("::")
    if not file:
        target = last_file
        if target is None:
            return "a ::test with no file before it on the line", None
    elif "/" in file and file.split("/")[0] in ("align", "service", "benchmarks", "tests", "scripts", "docs",
                                                   "docker", ".ci"):
        hits = sorted(ROOT.glob(file.rstrip("/"))) if "*" in file else [ROOT / file] if (ROOT / file).exists() else []
        if not hits:
            return "no such file or folder", None
        target = hits[0]
    else:  # a test file named from its folder down (test_bad_input.py, reliability/test_storage.py)
        hits = [p for p in (ROOT / "tests").rglob(Path(file).name) if str(p).endswith("/" + file)]
        if len(hits) != 1:
            return ("no such test file under tests/" if not hits else "ambiguous: " +
                    ", ".join(str(h.relative_to(ROOT)) for h in hits)), None
        target = hits[0]
    for f in funcs:
        if not re.search(rf"^\s*(?:async\s+)?def {re.escape(f)}\(", target.read_text(), flags=re.MULTILINE):
            return f"{target.relative_to(ROOT)} has no test {f}", target
    return None, target


# --- commands ---------------------------------------------------------------------------------------------------

def vecbridge_problems(words: list[str]) -> list[str]:
    """Every wrong command or option of one ``vecbridge ...`` command line (its words after ``vecbridge``)."""
    out, path, positional = [], ("vecbridge",), False
    cmds = cli_commands()
    i = 0
    while i < len(words):
        w = words[i]
        opts = click_options(cmds[path])
        if is_option(w):
            name = w.split("=", 1)[0]
            if name not in opts:
                out.append(f"`{' '.join(path)}` has no option {name}")
            i += 2 if opts.get(name) and "=" not in w else 1
            continue
        if isinstance(cmds[path], click.Group) and not positional and w not in ("...", "…"):
            if path + (w,) not in cmds:
                out.append(f"`{' '.join(path)}` has no command {w!r}")
                return out
            path += (w,)
        else:
            positional = True
        i += 1
    return out


def vectordb_problems(words: list[str]) -> list[str]:
    if not words:
        return []
    if words[0] not in vectordb_commands():
        return [f"`python -m service.vectordb` has no command {words[0]!r}"]
    opts = vectordb_commands()[words[0]]
    return [f"`python -m service.vectordb {words[0]}` has no option {w.split('=')[0]}"
            for w in words[1:] if is_option(w) and w.split("=")[0] not in opts | {"--help": False, "-h": False}]


def script_problems(script: str, words: list[str]) -> list[str]:
    path = ROOT / script
    if not path.exists():
        return [f"no such script {script}"]
    text = path.read_text()
    return [f"{script} has no option {w.split('=')[0]}" for w in words
            if w.startswith("--") and is_option(w) and f'"{w.split("=")[0]}"' not in text]


def command_problems(piece: Piece) -> list[str]:
    """Problems of the commands of a shell piece; a span that starts with a top-level command name and carries an
    option (``eval --record``) is read as a ``vecbridge`` command too."""
    out = []
    for words in simple_commands(piece.text):
        head = words[0]
        if head == "vecbridge":
            out += vecbridge_problems(words[1:])
        elif head.startswith("python") and words[1:3] == ["-m", "service.vectordb"]:
            out += vectordb_problems(words[3:])
        elif head.startswith("python") and len(words) > 1 and re.fullmatch(r"(benchmarks|scripts)/\S+\.py", words[1]):
            out += script_problems(words[1], words[2:])
        elif (piece.kind == "span" and ("vecbridge", head) in cli_commands()
              and any(is_option(w) for w in words[1:])):
            out += vecbridge_problems(words)
    return out


def bare_option_problems(piece: Piece, name: str) -> list[str]:
    """``--options`` named alone (a span such as `--output raw`, a comment of a code block) exist somewhere."""
    if piece.kind == "span" and not piece.text.startswith("-"):
        return []
    if name == "Dockerfile" or name.endswith(".yml"):
        return []  # their bare options are docker's
    words = option_words(piece.text)
    for cmd in simple_commands(piece.context)[:1]:  # a comment on a command's line: that command's options
        if cmd[0] == "vecbridge" and not vecbridge_problems(cmd[1:]):
            return vecbridge_problems(cmd[1:] + words)
        if cmd[0].startswith("python") and len(cmd) > 1 and cmd[1].endswith(".py"):
            return script_problems(cmd[1], words)
    return [f"no command has the option {o}" for o in words if o not in all_options() and o not in FOREIGN_OPTIONS]


# --- the audit --------------------------------------------------------------------------------------------------

def audit(name: str, text: str | None = None) -> list[str]:
    """``FILE:LINE: what: why`` for every stale mention in one document (``text`` instead of the file's)."""
    text = (ROOT / name).read_text() if text is None else text
    return audit_pieces(name, text, pieces(name, text))


def audit_pieces(where: str, text: str, ps: list[Piece], own_options: set[str] | None = None) -> list[str]:
    """The problems of a text's pieces; a ``prose`` piece (help texts, OpenAPI descriptions) is read for routes,
    dotted names and, with ``own_options`` (a command's help), the ``--options`` it names."""
    out = []

    def bad(line: int, what: str, why: str | None):
        if why:
            what = " ".join(what.split())
            out.append(f"{where}:{line}: {what if len(what) < 100 else what[:97] + '...'}: {why}")

    for n, line in enumerate(text.split("\n"), 1):
        for v in sorted(set(VARIABLE_RE.findall(line))):
            bad(n, v, variable_problem(v))
    last_test_file: dict[int, Path | None] = {}  # per line: `file.py::a`, `::b` names b of the same file
    for p in ps:
        if p.kind in ("shell", "span"):
            for why in command_problems(p):
                bad(p.line, p.text, why)
        if p.kind in ("span", "comment"):
            for why in bare_option_problems(p, where):
                bad(p.line, p.text, why)
        if p.kind == "prose" and own_options is not None:
            for o in option_words(p.text):
                bad(p.line, o, None if o in own_options else "not an option of this command")
        if p.kind == "comment":
            continue
        for method, path in route_mentions(p):
            bad(p.line, f"{method or 'route'} {path}", route_problem(method, path))
        last = last_test_file.get(p.line)
        found = {m.start(): m.group(1) for rx in (TEST_FILE_RE, PATH_RE) for m in rx.finditer(p.text)}
        for _, mention in sorted(found.items()):
            why, last = path_problem(mention, last)
            bad(p.line, mention, why)
        last_test_file[p.line] = last
        if p.kind == "span" and RESULT_FILE_RE.match(p.text):
            bad(p.line, p.text, None if list((ROOT / "benchmarks" / "results").glob(p.text))
                else "no such file in benchmarks/results/")
        for dotted in sorted(set(NAME_RE.findall(p.text))):
            bad(p.line, dotted, resolve_name(dotted))
        for module, names in IMPORT_RE.findall(p.text):
            for n_ in filter(None, (x.strip().split(" ")[0] for x in names.split(","))):
                bad(p.line, f"from {module} import {n_}", resolve_name(f"{module}.{n_}"))
    return out


def prose_pieces(text: str) -> list[Piece]:
    """A help text or an OpenAPI description: its spans (and blocks), and the rest as one ``prose`` piece."""
    return markdown_pieces(text) + [Piece(1, "prose", re.sub(r"`[^`]*`", " ", text))]


@pytest.mark.parametrize("name", DOCS)
def test_the_document_names_only_real_things(name):
    problems = audit(name)
    assert not problems, f"{len(problems)} stale mention(s) in {name}:\n" + "\n".join(problems)


def test_every_help_text_names_only_real_things():
    """``vecbridge ... --help``: commands, options (a bare ``--x`` is one of this command's), variables, routes."""
    problems = []
    for path, cmd in cli_commands().items():
        texts = [cmd.help or "", cmd.epilog or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
        text = "\n\n".join(t for t in texts if t)
        problems += audit_pieces(" ".join(path) + " --help", text, prose_pieces(text), set(click_options(cmd)))
        for var, doc in re.findall(r"\[env (VECBRIDGE_\w+); default ([^\]]+)\]", text):  # [env X; default Y]
            code = setting_default(var)
            if code is None or (Path(doc) if isinstance(code, Path) else type(code)(doc)) != code:
                problems.append(f"{' '.join(path)} --help: {var} defaults to {code!r}, not {doc}")
    assert not problems, f"{len(problems)} stale mention(s) in --help texts:\n" + "\n".join(problems)


def test_the_openapi_descriptions_name_only_real_things():
    from service.api.app import create_app
    from service.config import Settings

    doc = create_app(Settings(data_dir=ROOT / "var-docs-test-unused", auth_disabled=True)).openapi()
    problems = []

    def walk(node, where):
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("description", "summary") and isinstance(v, str):
                    problems.extend(audit_pieces(f"openapi {where}", v, prose_pieces(v)))
                else:
                    walk(v, f"{where}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}[{i}]")

    walk(doc, "")
    assert not problems, f"{len(problems)} stale mention(s) in the OpenAPI document:\n" + "\n".join(problems)



# --- defaults ---------------------------------------------------------------------------------------------------

UNITS = {"": 1, "s": 1, "chars": 1, "KiB": 2**10, "MiB": 2**20, "Mi": 2**20}
#: a setting named (`x`, `limits.x`, `VECBRIDGE_X`), then its default: "(60 s)", ", default 100 MiB", " is 25"
DEFAULT_CLAIM_RE = re.compile(r"`?(?P<name>VECBRIDGE_[A-Z0-9_]+|limits\.[a-z_]+|[a-z]+(?:_[a-z]+)+)`?"
                              r"(?: \(|, default | is )(?P<value>\d[\d,.]*)(?: ?(?P<unit>MiB|KiB|Mi|s|chars)\b)?")
#: a row of RELIABILITY.md's limits table: | `setting`: what ... | default | beyond |
TABLE_ROW_RE = re.compile(r"^\| `(?P<name>[a-z_.]+)`[^|]*\| (?P<value>[\d,.]+)(?: (?P<unit>MiB|KiB|Mi|s|chars))? \|")


def setting_default(name: str):
    """The code's default of a setting named ``x``, ``limits.x`` or ``VECBRIDGE_X`` (None: not a setting with a
    fixed default -- a default computed per machine, such as ``compute_threads``, is not checked)."""
    from service.config import Settings
    from service.limits import Limits

    if name.startswith("VECBRIDGE_"):
        name = name[len("VECBRIDGE_"):].lower().replace("__", ".")
    model, field = (Limits, name[len("limits."):]) if name.startswith("limits.") else (Settings, name)
    info = model.model_fields.get(field)
    if info is None or info.default_factory is not None:
        return None
    return info.default


def default_problems(where: str, text: str) -> list[str]:
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        for m in [*DEFAULT_CLAIM_RE.finditer(line), *filter(None, [TABLE_ROW_RE.match(line)])]:
            code = setting_default(m.group("name"))
            if not isinstance(code, (int, float)) or isinstance(code, bool):
                continue
            doc = float(m.group("value").replace(",", "").rstrip(".")) * UNITS[m.group("unit") or ""]
            if doc != code:
                out.append(f"{where}:{n}: {m.group(0)}: the default is {code:g}, not {doc:g}")
    return out


@pytest.mark.parametrize("name", DOCS)
def test_the_defaults_the_document_states_are_the_codes(name):
    problems = default_problems(name, (ROOT / name).read_text())
    assert not problems, f"{len(problems)} stale default(s) in {name}:\n" + "\n".join(problems)



def test_reliability_lists_every_limit_with_its_variable_name():
    """README: "one limits table: `/docs` and `RELIABILITY.md` list it, `VECBRIDGE_LIMITS__<FIELD>` tunes it" --
    so each field is named as ``limits.<field>`` in the table (the name that gives its variable)."""
    from service.limits import Limits

    rows = {m.group("name") for line in (ROOT / "RELIABILITY.md").read_text().split("\n")
            if (m := TABLE_ROW_RE.match(line))}
    missing = [f"limits.{f}" for f in Limits.model_fields if f"limits.{f}" not in rows]
    assert not missing, f"RELIABILITY.md's limits table leaves out {missing}"



def test_reliability_states_the_id_ranges_and_setting_ceilings_the_code_enforces():
    """RELIABILITY's limits table said ids 0 <= id < 2^62 after explicit ids stopped at 2^61, and "schema ceiling
    10,000" of max_k after k lost its schema bound: the ids row's figures are MAX_EXPLICIT_ID / MAX_ID, and each
    setting's stated ceiling is its field's ``le``."""
    from service.limits import MAX_EXPLICIT_ID, MAX_ID, Limits

    text = (ROOT / "RELIABILITY.md").read_text()
    ids = re.search(r"^\| index ids[^|]*up to 2\^(\d+) − 1[^|]*\| 0 ≤ id < 2\^(\d+) \|", text, re.M)
    assert ids and (2 ** int(ids[1]), 2 ** int(ids[2])) == (MAX_ID, MAX_EXPLICIT_ID), ids and ids.group(0)
    ceilings = re.findall(r"^\| `limits\.(\w+)`[^|]*\((?:schema ceiling|the setting goes up to) ([\d,]+)", text, re.M)
    assert {name for name, _ in ceilings} >= {"max_k", "lm_max_new_tokens"}, ceilings
    for name, value in ceilings:
        le = [m.le for m in Limits.model_fields[name].metadata if getattr(m, "le", None) is not None]
        assert le == [int(value.replace(",", ""))], (name, value, le)


def python_call_problems(src: str) -> list[str]:
    """Keyword arguments of the calls a Python example makes to align / service objects that their signatures do
    not take (``align.fit_migration(..., unpaired_source=)``, ``Client(...).transform(..., with_versions=)``);
    a name bound by ``x = SomeClass(...)`` or ``with SomeClass(...) as x`` is followed to its class."""
    tree = ast.parse(src)
    env = {"align": importlib.import_module("align")}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("align", "service"):
            mod = importlib.import_module(node.module)
            env.update({a.asname or a.name: getattr(mod, a.name) for a in node.names})

    def resolve(f):
        if isinstance(f, ast.Name):
            return env.get(f.id)
        if isinstance(f, ast.Attribute):
            owner = resolve(f.value)
            return getattr(owner, f.attr, None) if owner is not None else None
        if isinstance(f, ast.Call):
            made = resolve(f.func)
            return made if inspect.isclass(made) else None  # an instance: its class's methods
        return None

    for node in ast.walk(tree):
        bound = ([(t, node.value) for t in node.targets] if isinstance(node, ast.Assign) else
                 [(it.optional_vars, it.context_expr) for it in node.items] if isinstance(node, (ast.With,
                                                                                               ast.AsyncWith)) else [])
        for target, value in bound:
            cls = resolve(value.func) if isinstance(value, ast.Call) else None
            if isinstance(target, ast.Name) and inspect.isclass(cls):
                env[target.id] = cls
    out = []
    for node in ast.walk(tree):
        f = resolve(node.func) if isinstance(node, ast.Call) else None
        try:
            params = inspect.signature(f).parameters if callable(f) else {}
        except (TypeError, ValueError):
            continue
        if params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            out += [f"{ast.unparse(node.func)}() takes no argument {kw.arg}=" for kw in node.keywords
                    if kw.arg and kw.arg not in params]
    return out


@pytest.mark.parametrize("name", [d for d in DOCS if d.endswith(".md")])
def test_the_python_examples_call_with_real_keyword_arguments(name):
    text = (ROOT / name).read_text()
    problems = [f"{name}:{text.count(chr(10), 0, m.start()) + 2}: {p}"
                for m in re.finditer(r"```python\n(.*?)```", text, flags=re.DOTALL)
                for p in python_call_problems(m.group(1))]
    assert not problems, "\n".join(problems)


PLANTED = """
Set `VECBRIDGE_PORTT=9000`, run `vecbridge fit --no-such-option`, `vecbridge registry lst` or `--no-such-flag`;
`GET /v1/mapz` and `DELETE /v1/maps` answer; `service/nothing.py`, `tests/test_docs_truth.py::test_missing` and
`align.no_such_function` hold it.

```bash
vecbridge index create docs --spaze e5 x.npy \\
    --kind flat
python -m service.vectordb migrate --stor qdrant://q:6333
vecbridge backup DEST          # --lnk makes hard links
```

```python
from service.client import NoClient
```
"""
#: (line within PLANTED, the start of the stale mention the audit must report)
PLANTED_MISTAKES = [(2, "VECBRIDGE_PORTT"), (2, "vecbridge fit --no-such-option"), (2, "vecbridge registry lst"),
                    (2, "--no-such-flag"), (3, "GET /v1/mapz"), (3, "DELETE /v1/maps"), (3, "service/nothing.py"),
                    (3, "tests/test_docs_truth.py::test_missing"), (4, "align.no_such_function"),
                    (7, "vecbridge index create docs --spaze"), (9, "python -m service.vectordb migrate --stor"),
                    (10, "--lnk"), (14, "from service.client import NoClient")]


def test_planted_stale_mentions_are_each_reported_with_their_line():
    readme = (ROOT / "README.md").read_text()
    offset = readme.count("\n")
    problems = audit("README.md", readme + PLANTED)
    for line, what in PLANTED_MISTAKES:
        assert any(p.startswith(f"README.md:{offset + line}: {what}") for p in problems), (line, what, problems)
    assert len(problems) == len(PLANTED_MISTAKES), problems
    assert python_call_problems("import align\nalign.select_rows_to_embed(X, 10, methd='kmeans++')\n"
                                "from service.client import Client\nvb = Client('http://h')\n"
                                "vb.transform('m', X, with_version=True)") == [
        "align.select_rows_to_embed() takes no argument methd=", "vb.transform() takes no argument with_version="]


def test_the_readme_says_which_align_errors_are_value_errors():
    """The README called align's whole error tree "all `ValueError`s"; ``SerializationError`` (``load_map`` of a
    missing file, ``map_from_bytes(b'garbage')``), ``NotFittedError`` and ``Cancelled`` are not. Every class it
    names before "`ValueError`s" must be one, and every error class of ``align.exceptions`` that is not one
    must be named after it."""
    import align.exceptions as E

    para = re.search(r"Bad input raises one typed tree.*?\n\n", (ROOT / "README.md").read_text(), flags=re.DOTALL)[0]
    values, rest = para.split("`ValueError`s", 1)
    errors = [c for c in vars(E).values() if isinstance(c, type) and issubclass(c, E.VecbridgeError)]
    assert len(errors) >= 12
    for cls in errors:
        if f"`{cls.__name__}`" in values:
            assert issubclass(cls, ValueError), cls
        if not issubclass(cls, ValueError):
            assert f"`{cls.__name__}`" in rest, cls
    assert issubclass(E.NotFittedError, AttributeError)


def test_a_skipped_docstring_example_is_skipped_whole():
    """``service.client``'s module example marked only its first line ``# doctest: +SKIP``, so
    ``pytest --doctest-modules`` ran the rest and failed on ``NameError: X`` (``service.registry`` and
    ``service.vectordb`` too). In every docstring of align/ and service/, an example block with a skipped line
    skips all of them (or is a plain ``::`` code block)."""
    import ast
    import doctest

    parser, stale = doctest.DocTestParser(), []
    for path in sorted([*(ROOT / "align").rglob("*.py"), *(ROOT / "service").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                examples = parser.get_examples(ast.get_docstring(node, clean=True) or "")
                skipped = [bool(e.options.get(doctest.SKIP)) for e in examples]
                if any(skipped) and not all(skipped):
                    stale.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)}")
    assert not stale, stale
