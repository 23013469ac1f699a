"""The docs kept true by test: README.md and docs/*.md say only what the code does now.

* **Python blocks run.** Every fenced ````python`` block is executed, each in a fresh namespace, with the
  working directory a scratch folder that links the repository's top-level entries (so a block reads
  ``golden/…`` or ``refimpl/models/…`` as a user in a clone would, and the files it writes land in the
  scratch folder). The models are the built-in ones (``builtin:kjv``, ``builtin:tiny``). A block that
  cannot run here (a 20 GB file, a live server) says so on the line right above its fence, in the one
  visible convention ``<!-- not run: REASON -->``; the reason must be given (and the block still parses).
* **Names exist.** Every backticked dotted name rooted at one of the repository's packages
  (``refimpl.model.trunk.forward``, ``kernels.ggml.simd.fma32``, ``train.run.consistency_loss``) resolves:
  the longest importable module prefix, then ``getattr`` for the rest. Every backticked repository path
  (``kernels/ggml/build.py``, ``golden/``, ``tests/test_trunk.py::test_name``; globs match at least one
  file) exists, and so does every bare ``NAME.py``. llama.cpp's own paths that share a top-level name with
  ours (``tools/server/``) and its scripts are listed below (:data:`LLAMA_CPP_TOOLS`, :data:`LLAMA_CPP_SCRIPTS`).
* **Commands parse.** Every ``refimpl …`` line of a shell block in README.md and docs/*.md, and every backticked
  ``refimpl …`` in README.md, parses against :func:`refimpl.cli.build_parser` and passes
  :func:`refimpl.cli.common.check_numerics` — parsed only, never run. A placeholder written in capitals
  (``MODEL.gguf``, ``FILE``) is a value like any other. A usage line (``[-n N]``, ``[--jobs J | --cluster ADDRESS]``)
  is checked for its subcommand and every flag it names; README.md's shell blocks hold commands, not usage lines.
* **Links and references.** Markdown links to repository files (and their ``#anchor``) and every section named by
  its title (``docs/numerics.md, "Configurations"``) exist.
* **Reading orders.** Each package folder's ``__init__`` docstring names every module of the folder, and
  README.md's layout tree every package folder of ``refimpl/`` and ``kernels/``.
* **performance.md stays current**: at most 300 lines (history lives in git and CHANGELOG.md).

Cost: the name, path and command checks take about a second; the python blocks load the built-in
models (a few seconds each, numba's cache warm).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: The marker for a block that is deliberately not run: ``<!-- not run: REASON -->``, the last line with text above the fence.
NOT_RUN = re.compile(r"<!--\s*not run:(.*?)-->", re.S)

#: The repository's importable top-level packages: a backticked dotted name starting with one of these is checked.
PACKAGES = ("refimpl", "kernels", "train", "hf", "bench", "tests")

#: The repository's top-level folders and files: a backticked path starting with one of these is checked.
TOP = sorted(p.name for p in ROOT.iterdir() if not p.name.startswith(".") and p.name not in ("build", "dist"))

#: llama.cpp's own tree has a ``tools/`` folder too; these of its folders are named in the docs and are not ours.
LLAMA_CPP_TOOLS = ("tools/server/", "tools/perplexity/")
#: llama.cpp's scripts the docs name by their bare file name.
LLAMA_CPP_SCRIPTS = {"convert_hf_to_gguf.py"}

PERFORMANCE_MAX_LINES = 300


@dataclasses.dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    not_run: str | None  # the reason given by <!-- not run: REASON -->, "" when the marker has none, None: no marker

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def fenced_blocks(doc: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file (fences may be indented, as inside a list item)."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2), i
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1  # the closing fence
        above = next((line for line in reversed(lines[:start]) if line.strip()), "")  # the nearest line with text
        marks = NOT_RUN.findall(above)
        blocks.append(Block(doc, start + 1, lang, "\n".join(body) + "\n", marks[-1].strip() if marks else None))
    return blocks


def prose(doc: Path) -> str:
    """The text of a Markdown file outside its fenced blocks (fences may be indented)."""
    out, fenced = [], False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if re.match(r"^\s*```", line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return "\n".join(out)


def inline_code(doc: Path) -> list[str]:
    """Every backticked span of the prose (``` `` ``-delimited spans included)."""
    text = prose(doc)
    return [m.group(2).strip() for m in re.finditer(r"(`+)(.+?)\1", text, re.S)]


PY_BLOCKS = [b for doc in DOCS for b in fenced_blocks(doc) if b.lang == "python"]


# -- Python blocks ------------------------------------------------------------------------------------


def test_every_python_block_is_run_or_says_why_not():
    assert PY_BLOCKS, "no python blocks found: the parser is broken"
    for b in PY_BLOCKS:
        if b.not_run is not None:
            assert len(b.not_run) >= 10, f"{b.where}: '<!-- not run: … -->' must give the reason, got {b.not_run!r}"
        ast.parse(b.code, filename=b.where)  # not-run blocks are still Python


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A folder that links every top-level entry of the repository: relative reads find the clone's files,
    writes of new files stay here."""
    d = tmp_path_factory.mktemp("docs")
    for p in ROOT.iterdir():
        if p.name != ".git":
            (d / p.name).symlink_to(p)
    return d


@pytest.mark.parametrize("block", [b for b in PY_BLOCKS if b.not_run is None], ids=lambda b: b.where)
def test_python_block_runs(block, scratch, monkeypatch):
    if "llama_trace" in block.code or "llama_cpp" in block.code:  # the oracle extra: skipped without it, failed under CI=true
        from conftest import require_llama_cpp

        require_llama_cpp()
    monkeypatch.chdir(scratch)
    monkeypatch.syspath_prepend(str(ROOT))
    namespace = {"__name__": "__docs__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.code, block.where, "exec"), namespace)


# -- names and paths ----------------------------------------------------------------------------------

_DOTTED = re.compile(r"^((?:%s)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?:\(.*\))?$" % "|".join(PACKAGES))
_PATH = re.compile(r"^((?:%s)(?:/[^\s`:]*)?)(?:::[A-Za-z_][\w\[\]-]*)?$" % "|".join(re.escape(t) for t in TOP))


def resolve(dotted: str):
    """Import the longest importable module prefix of ``dotted``, then getattr the rest. When the module needs
    an optional dependency that is not installed (``train`` needs torch), the name is looked up in the module's
    source instead: a top-level ``def``, ``class`` or assignment of that name."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
                if exc.name and exc.name.split(".")[0] not in PACKAGES:  # an optional dependency is missing
                    return defined_in_source(parts)
                raise  # a module of ours imports one of ours that is missing: a real error
            continue
        for attr in parts[n:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def defined_in_source(parts: list[str]):
    """The source file of the longest module prefix of ``parts``, read: the next name must be defined at its top."""
    for n in range(len(parts), 0, -1):
        path = ROOT.joinpath(*parts[:n])
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if path.is_file():
            module, rest = ".".join(parts[:n]), parts[n:]
            break
    else:
        raise ModuleNotFoundError(".".join(parts))
    if not rest:
        return path
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            top.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                top.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            top.update((a.asname or a.name).split(".")[0] for a in node.names)
    if rest[0] not in top:
        raise AttributeError(f"{module} (read, not imported: an optional dependency is missing) defines no {rest[0]!r}")
    return path


#: GGUF metadata keys the fixtures write (``refimpl.fixture.seed``, …) share the package's name; they are
#: checked against the source that writes or reads them, not imported.
GGUF_KEY_PREFIX = "refimpl.fixture."


def is_fixture_key(name: str) -> bool:
    if not name.startswith(GGUF_KEY_PREFIX):
        return False
    source = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "refimpl" / "fixtures").glob("*.py"))
    return name in source


def named(kind: str) -> list[tuple[str, str]]:
    """(doc, name) for every backticked dotted name (kind "dotted") or repository path (kind "path")."""
    out = []
    for doc in DOCS:
        for span in inline_code(doc):
            m = (_DOTTED if kind == "dotted" else _PATH).match(span)
            if m and (kind == "dotted" or "/" in m.group(1)):
                out.append((str(doc.relative_to(ROOT)), m.group(1)))
    return sorted(set(out))


def test_every_dotted_name_exists():
    names = named("dotted")
    assert len(names) > 20, names
    missing = []
    for doc, name in names:
        if is_fixture_key(name):
            continue
        try:
            resolve(name)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{doc}: `{name}` ({type(exc).__name__}: {exc})")
    assert not missing, "names the docs give that do not exist:\n" + "\n".join(missing)


def test_every_repository_path_exists():
    paths = named("path")
    assert len(paths) > 20, paths
    missing = []
    for doc, path in paths:
        if "__pycache__" in path:  # made by the first run, not part of a clone
            continue
        if path.startswith(LLAMA_CPP_TOOLS):
            assert not (ROOT / path.split("/")[0] / path.split("/")[1]).exists(), f"{path}: now a folder of ours too"
            continue
        if any(c in path for c in "*?["):
            ok = any(ROOT.glob(path))
        else:
            ok = (ROOT / path).exists()
        if not ok:
            missing.append(f"{doc}: `{path}`")
    assert not missing, "paths the docs give that do not exist:\n" + "\n".join(missing)


def test_every_python_file_named_exists():
    """A bare ``name.py`` in backticks (``trunk.py``, ``actdots_iq.py``) names a file of the repository."""
    ours = {p.name for top in TOP if (ROOT / top).is_dir() for p in (ROOT / top).rglob("*.py")} | set(TOP) | LLAMA_CPP_SCRIPTS
    missing = sorted({f"{doc.relative_to(ROOT)}: `{span}`" for doc in DOCS for span in inline_code(doc)
                      if re.fullmatch(r"[A-Za-z_][\w-]*\.py", span) and span not in ours})
    assert not missing, "python files the docs name that are nowhere in the repository:\n" + "\n".join(missing)


# -- links and section references ---------------------------------------------------------------------


def sections(doc: Path, lead_ins: bool = True) -> list[str]:
    """The names a reference can point to: every heading, and (``lead_ins``) every bold lead-in of a line or
    bullet (``* **Batch invariance.** …``)."""
    out = []
    for line in prose(doc).splitlines():
        if m := re.match(r"^#{1,6}\s+(.*)", line):
            out.append(m.group(1).strip())
        elif lead_ins and (m := re.match(r"^\s*(?:[*-]\s+|\d+\.\s+)?\*\*([^*]+)\*\*", line)):
            out.append(m.group(1).strip().rstrip("."))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but hyphens dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_and_section_reference_exists():
    """Markdown links to files of the repository (and their ``#anchor``), and the docs' references to a section
    by its name, ``docs/numerics.md, "Configurations"``, point at something that exists."""
    bad = []
    for doc in DOCS:
        text = prose(doc)
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            f = (doc.parent / path).resolve() if path else doc
            if not f.exists():
                bad.append(f"{doc.relative_to(ROOT)}: ({target}): no such file")
            elif anchor and f.suffix == ".md" and anchor not in {slug(h) for h in sections(f, lead_ins=False)}:
                bad.append(f"{doc.relative_to(ROOT)}: ({target}): no such heading")
        for m in re.finditer(r"(?:docs/)?([\w-]+\.md)[,:]? (?:§[\w.]+ )?\"([^\"]+)\"", text):
            name, section = m.group(1), " ".join(m.group(2).split())
            f = ROOT / "docs" / name if (ROOT / "docs" / name).exists() else ROOT / name
            if not f.exists():
                bad.append(f"{doc.relative_to(ROOT)}: {name}: no such file")
            elif not any(section.lower() in " ".join(h.split()).lower() for h in sections(f)):
                bad.append(f'{doc.relative_to(ROOT)}: {name}, "{section}": no such section')
    assert not bad, "links and references to nothing:\n" + "\n".join(bad)


# -- shell commands -----------------------------------------------------------------------------------


def refimpl_commands() -> list[tuple[str, str]]:
    """(where, command line) for every ``refimpl …`` line of a shell block (continuation lines joined,
    comments, pipes and redirections cut off) and every backticked ``refimpl …`` of README.md."""
    out = []
    for doc in DOCS:
        for b in fenced_blocks(doc):
            if b.lang not in ("bash", "sh", "shell", "console"):
                continue
            text = b.code.replace("\\\n", " ")
            for k, line in enumerate(text.splitlines()):
                line = re.sub(r"^\$\s+", "", line.strip())
                if not line.startswith("refimpl "):
                    continue
                out.append((f"{b.where}+{k + 1}", line))
    for span in inline_code(ROOT / "README.md"):  # and the README's inline commands and usage lines
        span = span.replace("\\|", "|")  # a table cell's escaped bar
        if span.startswith("refimpl ") and "\n" not in span:
            out.append((f"README.md `{span[:40]}`", span))
    return out


def argv_of(line: str) -> list[str]:
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    argv = []
    for tok in lex:
        if tok in ("|", "||", "&&", ";", ">", ">>", "<", "2>", "&", "2>&1"):
            break
        argv.append(tok)
    assert argv[0] == "refimpl", argv
    return argv[1:]


def test_readme_has_refimpl_commands():
    assert any(w.startswith("README.md:") for w, _ in refimpl_commands())


def is_synopsis(line: str) -> bool:
    """A usage line (``refimpl golden make MODEL --prompts FILE [-n N] [--jobs J | --cluster ADDRESS]``), not a command."""
    return bool(re.search(r"\s\[-|\s\[[A-Z]", line))


def subcommand_parser(parser, words: list[str]):
    """The (sub)parser ``words`` lead to (``golden make``, ``plot audit``), and the words left."""
    import argparse

    while words:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or words[0] not in subs[0].choices:
            break
        parser, words = subs[0].choices[words[0]], words[1:]
    return parser, words


@pytest.mark.parametrize("where,line", refimpl_commands(), ids=[w for w, _ in refimpl_commands()])
def test_refimpl_command_parses(where, line):
    """A command parses as written; a usage line's subcommands and every flag it names exist."""
    from refimpl.cli import build_parser
    from refimpl.cli.common import check_numerics
    from refimpl.errors import RefimplError

    words = line.split()[1:]
    if all(w.replace("|", "").isalpha() and w.islower() for w in words):  # a command's name alone (`refimpl golden make|check`)
        for alternative in words[-1].split("|"):
            parser, left = subcommand_parser(build_parser(), [*words[:-1], alternative])
            assert not left, f"{where}: `{line}`: no command {' '.join(words[:-1] + [alternative])}"
        return
    if is_synopsis(line):
        parser, _ = subcommand_parser(build_parser(), line.split()[1:])
        assert parser.prog != "refimpl", f"{where}: `{line}`: no such command"
        flags = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", line.split(" ", 1)[1]))
        unknown = sorted(f for f in flags if f not in parser._option_string_actions)
        assert not unknown, f"{where}: `{line}`: {parser.prog} has no {', '.join(unknown)}"
        return
    try:
        args = build_parser().parse_args(argv_of(line))
        check_numerics(args)
    except (RefimplError, SystemExit) as exc:
        pytest.fail(f"{where}: `{line}` does not parse: {exc}")


def test_readme_commands_are_commands():
    """README.md shows commands a user can paste, not usage lines."""
    assert not [line for where, line in refimpl_commands() if where.startswith("README.md:") and is_synopsis(line)]


# -- performance.md -----------------------------------------------------------------------------------


def test_performance_doc_is_current_tables_only():
    lines = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= PERFORMANCE_MAX_LINES, f"docs/performance.md has {len(lines)} lines (at most {PERFORMANCE_MAX_LINES}: current figures only; history lives in git and CHANGELOG.md)"


# -- package docstrings -------------------------------------------------------------------------------


def test_every_package_docstring_names_its_modules():
    """Each folder's ``__init__`` states its reading order: every module of the folder is in it."""
    missing = []
    for init in sorted([*ROOT.glob("refimpl/*/__init__.py"), *ROOT.glob("kernels/*/__init__.py"), ROOT / "kernels" / "__init__.py"]):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        for mod in sorted(p.stem for p in init.parent.glob("*.py") if p.stem != "__init__"):
            if not re.search(rf"\b{mod}\b", doc):
                missing.append(f"{init.relative_to(ROOT)}: {mod}")
    assert not missing, "modules their package's docstring leaves out:\n" + "\n".join(missing)


def test_readme_layout_names_every_folder():
    """README.md's layout tree lists every package folder of refimpl/ and kernels/."""
    trees = [b.code for b in fenced_blocks(ROOT / "README.md") if b.code.startswith("refimpl/\n")]
    assert len(trees) == 1, "README.md: the layout tree (a block starting 'refimpl/') is missing"
    tree = trees[0].split("kernels/\n")
    assert len(tree) == 2, "README.md: the layout tree has no 'kernels/' part"
    missing = [f"{top}/{d.name}/" for top, part in zip(("refimpl", "kernels"), tree)
               for d in sorted((ROOT / top).iterdir()) if (d / "__init__.py").is_file()
               if not re.search(rf"^\s+{d.name}/", part, re.M)]
    assert not missing, f"README.md's layout tree leaves out {', '.join(missing)}"


def test_the_parser_reads_blocks_and_the_not_run_marker(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("text `refimpl.errors.RefimplError`\n\n<!-- not run: needs a 20 GB model file -->\n```python\nx = 1\n```\n\n"
                   "<!-- not run: -->\n```python\ny = 2\n```\n\n```python\nz = 3\n```\n  ```bash\n  refimpl run -n 2\n  ```\n",
                   encoding="utf-8")
    blocks = fenced_blocks(doc)
    assert [(b.lang, b.code, b.not_run) for b in blocks] == [
        ("python", "x = 1\n", "needs a 20 GB model file"), ("python", "y = 2\n", ""), ("python", "z = 3\n", None),
        ("bash", "refimpl run -n 2\n", None)]
    assert inline_code(doc) == ["refimpl.errors.RefimplError"]


def test_kernels_doc_names_every_module():
    """docs/kernels.md's layout table names every module of ``kernels/`` (the drift of issue 37: a flat layout
    described long after the folders came)."""
    text = (ROOT / "docs" / "kernels.md").read_text(encoding="utf-8")
    missing = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "kernels").rglob("*.py"))
               if p.name != "__init__.py" and "__pycache__" not in p.parts and f"`{p.name}`" not in text
               and f"`{p.relative_to(ROOT).as_posix()}`" not in text]
    assert not missing, "docs/kernels.md leaves out " + ", ".join(missing)
