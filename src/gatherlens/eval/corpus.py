"""Real text no one here wrote, for `gatherlens eval`.

    >>> text = load_text("austen")                 # Pride and Prejudice (Debian's r-cran-janeaustenr)
    >>> text = load_text("austen:emma")            # another of the six novels
    >>> text = load_text("pydoc")                  # Python's own pydoc topics (always installed)
    >>> text = load_text(path="notes.txt")         # any UTF-8 text file

"austen" needs `apt-get install r-cran-janeaustenr` (R data files, read here without R by
`gatherlens.eval.rdata`); "default" picks it when installed, else the pydoc topics.
"""
from __future__ import annotations

from pathlib import Path

from gatherlens.errors import GatherValueError
from gatherlens.eval.rdata import read_lazyload

__all__ = ["load_text", "AUSTEN_DIR", "AUSTEN_BOOKS", "austen_available"]

AUSTEN_DIR = Path("/usr/lib/R/site-library/janeaustenr/data")
AUSTEN_BOOKS = ("prideprejudice", "emma", "persuasion", "sensesensibility", "mansfieldpark", "northangerabbey")


def austen_available() -> bool:
    """True when Debian's r-cran-janeaustenr data files are installed."""
    return (AUSTEN_DIR / "Rdata.rdx").is_file()


def _austen(book: str) -> str:
    if book not in AUSTEN_BOOKS:
        raise GatherValueError(f"book {book!r} is not one of Jane Austen's novels: {', '.join(AUSTEN_BOOKS)}")
    if not austen_available():
        raise GatherValueError(
            f"Jane Austen's novels are not installed ({AUSTEN_DIR} is missing): "
            f"apt-get install r-cran-janeaustenr, or use --corpus pydoc / --text FILE"
        )
    lines = read_lazyload(AUSTEN_DIR, names=[book])[book]
    return _reflow(line or "" for line in lines)


def _reflow(lines) -> str:
    """Hard-wrapped lines -> paragraphs separated by blank lines."""
    paras, cur = [], []
    for line in lines:
        line = line.strip()
        if line:
            cur.append(line)
        elif cur:
            paras.append(" ".join(cur))
            cur = []
    if cur:
        paras.append(" ".join(cur))
    return "\n\n".join(paras)


def _pydoc() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k].strip() for k in sorted(topics))


def load_text(corpus: str = "default", path: str | Path | None = None) -> str:
    """The text of a corpus ("default", "austen", "austen:BOOK", "pydoc") or of a file."""
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise GatherValueError(f"text file {str(p)!r} does not exist")
        if not p.is_file():   # /dev/null, a pipe, a folder: nothing to read (or a read that never ends)
            kind = "a folder" if p.is_dir() else "not a regular file (a device, a pipe or a socket)"
            raise GatherValueError(f"text file {str(p)!r} is {kind}; give a UTF-8 text file")
        try:
            text = p.read_text(encoding="utf-8-sig")   # a UTF-8 byte-order mark is not text: dropped
        except UnicodeDecodeError as err:
            raise GatherValueError(f"text file {str(p)!r} is not UTF-8 text ({err})") from None
        if not text.strip():
            raise GatherValueError(f"text file {str(p)!r} is empty")
        return text
    name, _, book = corpus.partition(":")
    if name == "default":
        return _austen("prideprejudice") if austen_available() else _pydoc()
    if name == "austen":
        return _austen(book or "prideprejudice")
    if name == "pydoc":
        return _pydoc()
    raise GatherValueError(f"corpus {corpus!r} is not one of: default, austen[:BOOK], pydoc")
