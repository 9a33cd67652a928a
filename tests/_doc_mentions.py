"""What the documentation names, read mechanically (no tests here; tests/test_docs_truth.py checks it).

A document is split into *code* (fenced and indented Markdown blocks, the commented command lines of the
Dockerfile and docker-compose.yml, their instructions) and *spans* (Markdown `inline code`, also inside code
comments); prose is never read as a command. From those come the mentions: ``vecbridge ...`` and ``python -m
service.vectordb ...`` command lines, bare ``--options``, HTTP routes, repository paths and dotted Python names.
``VECBRIDGE_*`` variables are read from the whole text (the name is unambiguous anywhere).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "ARCHITECTURE.md", "RELIABILITY.md", "SCALING.md", "docker-compose.yml", "Dockerfile")
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD")
#: single-segment absolute paths that are folders (Linux's, the image's), never routes
FOLDERS = {"/proc", "/sys", "/dev", "/tmp", "/run", "/srv", "/home", "/etc", "/opt", "/usr", "/var", "/data",
           "/artifacts", "/backups"}


@dataclass(frozen=True)
class Piece:
    """A run of code or an inline span: ``kind`` is ``shell``, ``python``, ``text`` (an output block) or ``span``."""

    line: int
    kind: str
    text: str
    context: str = ""  # a comment's: the code before it on its line


def _spans(text: str, first_line: int) -> list[Piece]:
    """The inline code spans of ``text`` (a paragraph or a comment; a span may wrap lines)."""
    out = []
    for m in re.finditer(r"`([^`]+)`", text):
        line = first_line + text.count("\n", 0, m.start())
        out.append(Piece(line, "span", " ".join(m.group(1).split())))
    return out


def _shell_comment(line: str) -> tuple[str, str]:
    """``(code, comment)`` of a shell line: a ``#`` at the start or after white space outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i + 1:]
    return line, ""


def _code_lines(lines: list[tuple[int, str]], kind: str) -> list[Piece]:
    """Pieces of a code block: shell lines joined over ``\\`` continuations, comments as spans and as
    ``comment`` pieces (their ``--options`` are read, their prose is not)."""
    out: list[Piece] = []
    if kind != "shell":
        out += [Piece(n, kind, t) for n, t in lines]
        for n, t in lines:
            if kind == "python" and "#" in t:
                out += _spans(t.split("#", 1)[1], n)
        return out
    pending, start = "", 0
    for n, raw in lines:
        code, comment = _shell_comment(raw)
        if comment:
            out += _spans(comment, n)
            out.append(Piece(n, "comment", comment, code))
        if not pending:
            start = n
        if code.rstrip().endswith("\\"):
            pending += code.rstrip()[:-1] + " "
            continue
        out.append(Piece(start, "shell", pending + code))
        pending = ""
    if pending:
        out.append(Piece(start, "shell", pending))
    return out


def markdown_pieces(text: str) -> list[Piece]:
    lines = text.split("\n")
    out: list[Piece] = []
    block: list[tuple[int, str]] | None = None
    lang = ""
    para: list[tuple[int, str]] = []

    def flush_para():
        if para:
            out.extend(_spans("\n".join(t for _, t in para), para[0][0]))
            para.clear()

    prev_blank, indented = True, False
    for n, line in enumerate(lines, 1):
        fence = re.match(r"\s*```(\w*)", line)
        if block is not None:
            if fence:
                kind = "python" if lang == "python" else "shell" if lang in ("bash", "sh", "shell") else "text"
                out.extend(_code_lines(block, kind))
                block = None
            else:
                block.append((n, line))
            continue
        if fence:
            flush_para()
            block, lang = [], fence.group(1)
            continue
        if line.startswith("    ") and (prev_blank or indented) and line.strip():
            flush_para()
            indented = True
            out.extend(_code_lines([(n, line.strip())], "shell"))
            continue
        indented = indented and not line.strip()
        prev_blank = not line.strip()
        if prev_blank:
            flush_para()
        else:
            para.append((n, line))
    flush_para()
    return out


def config_pieces(text: str, dockerfile: bool) -> list[Piece]:
    """Dockerfile / compose: comment lines indented past ``#`` are command lines (``#   docker run ...``), other
    comments are prose (their spans are read); Dockerfile instructions are commands (``CMD [...]`` exec form)."""
    out: list[Piece] = []
    run: list[tuple[int, str]] = []  # consecutive command lines of comments (a command may continue over them)
    for n, line in enumerate(text.split("\n"), 1):
        s = line.strip()
        if s.startswith("#") and s[1:].startswith("  "):
            run.append((n, s[1:].strip()))
            continue
        out += _code_lines(run, "shell")
        run = []
        if s.startswith("#"):
            out += _spans(s[1:], n)
            continue
        m = re.match(r"(?:RUN|CMD|ENTRYPOINT)\s+(.*)", s) if dockerfile else None
        if m:
            arg = m.group(1)
            try:
                cmd = json.loads(arg)
                arg = shlex.join(cmd) if isinstance(cmd, list) and cmd and cmd[0] != "python" else ""
            except ValueError:
                pass
            out.append(Piece(n, "shell", arg))
    return out + _code_lines(run, "shell")


def pieces(name: str, text: str | None = None) -> list[Piece]:
    text = (ROOT / name).read_text() if text is None else text
    if name.endswith(".md"):
        return markdown_pieces(text)
    return config_pieces(text, dockerfile=name == "Dockerfile")


# --- commands ---------------------------------------------------------------------------------------------------

_SEPARATORS = {";", "&&", "||", "|", "(", ")", "&", "$(", "`"}
_WRAPPERS = {"nice", "time", "exec", "env", "sudo"}


def tokens(text: str) -> list[str]:
    lex = shlex.shlex(text, posix=True, punctuation_chars=";&|()")
    lex.whitespace_split = True
    try:
        out = list(lex)
    except ValueError:  # an unbalanced quote in a span: plain words are good enough
        out = text.split()
    return [t.strip("[]") for t in out if t.strip("[]")]


def simple_commands(text: str) -> list[list[str]]:
    """The simple commands of a shell line, each without its leading ``VAR=value`` words and wrappers
    (``nice -n 10``, ``env``)."""
    out, cur = [], []
    for t in tokens(text) + [";"]:
        if t in _SEPARATORS or set(t) <= set(";&|()"):
            while cur and (re.fullmatch(r"[A-Za-z_]\w*=.*", cur[0]) or cur[0] in _WRAPPERS):
                cur = cur[3:] if cur[0] == "nice" and cur[1:2] == ["-n"] else cur[1:]
            if cur[:3] == ["docker", "compose", "exec"] or cur[:2] == ["docker", "exec"]:
                rest = cur[3 if cur[1] == "compose" else 2:]
                while rest and rest[0].startswith("-"):
                    rest = rest[1:]
                cur = rest[1:]  # the command run in the container (after the service's name)
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(t)
    return out


def is_option(tok: str) -> bool:
    return bool(re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", tok))


def option_words(text: str) -> list[str]:
    """The ``--option`` words of a comment or a bare span (``--queries/--relevant`` gives both)."""
    out = []
    for t in re.findall(r"(?<![\w-])--[A-Za-z][\w-]*(?:/--[A-Za-z][\w-]*)*", text):
        out += t.split("/")
    return out


# --- routes, paths, names ---------------------------------------------------------------------------------------

_ROUTE_END = r"(?:\{[^{}\s]*\}|[^\s`'\",;)\]{}])*"
ROUTE_RES = (
    re.compile(rf"\b(?P<method>{'|'.join(METHODS)}) (?P<path>/{_ROUTE_END})"),
    re.compile(rf"(?<![\w.:/{{}}-])(?P<path>/v1/{_ROUTE_END})"),
    re.compile(rf"(?:https?://)?(?:localhost|127\.0\.0\.1|\[::1\]):(?:\d+|%s)(?P<path>/{_ROUTE_END})"),
)
PATH_RE = re.compile(r"(?<![\w./-])((?:align|service|benchmarks|tests|scripts|docs|docker|\.ci)/[\w./*<>-]*"
                     r"(?:::\w+)*)")
TEST_FILE_RE = re.compile(r"(?<![\w./-])((?:\w+/)*test_\w+\.py(?:::\w+)*|::test_\w+)")
RESULT_FILE_RE = re.compile(r"^[\w.*-]+_\d{4}-\d{2}-\d{2}[\w*.-]*\.(?:md|json)$")
NAME_RE = re.compile(r"(?<![\w./-])((?:align|service)(?:\.\w+)+)")
IMPORT_RE = re.compile(r"\bfrom\s+((?:align|service)[\w.]*)\s+import\s+\(?([\w, ]+)")
VARIABLE_RE = re.compile(r"\bVECBRIDGE_[A-Z0-9_]*[A-Z0-9]\b(?![<*])")


def expand_braces(path: str) -> list[str]:
    """``/v1/{maps,steers}/{name}`` -> both paths (a ``{a,b}`` with a comma is an alternation, not a template)."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", path)
    if not m:
        return [path]
    return [p for alt in m.group(1).split(",") for p in expand_braces(path[:m.start()] + alt + path[m.end():])]


def route_mentions(piece: Piece) -> list[tuple[str | None, str]]:
    """``(method or None, path)`` of every HTTP route a piece names; a span that is a single ``/word`` is a route
    (``/readyz``), other absolute paths in code are files."""
    found: dict[int, tuple[str | None, str]] = {}
    for rx in ROUTE_RES:
        for m in rx.finditer(piece.text):
            start = m.start("path")
            method = m.groupdict().get("method")
            if start not in found or method:
                found[start] = (method, m.group("path"))
    if piece.kind == "span" and re.fullmatch(r"/[a-z][\w-]*", piece.text) and piece.text not in FOLDERS:
        found.setdefault(0, (None, piece.text))
    out = []
    for method, path in found.values():
        path = re.split(r"[?#]", path)[0].rstrip(".:")
        out += [(method, p) for p in expand_braces(path)]
    return out
