"""What tests/processes/test_docs.py and tests/unit/test_docs.py share."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

from hooklane import cli

ROOT = Path(__file__).resolve().parents[1]


DOCS = ROOT / "docs"


PAGES = [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def code_lines(text: str) -> list[str]:
    """Lines of fenced code blocks, continuation lines joined."""
    lines: list[str] = []
    fenced = False
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced, pending = not fenced, ""
            continue
        if not fenced:
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    return lines


def command_of(line: str) -> list[str] | None:
    """The arguments of a `hooklane` command line (after any VAR=value
    assignments), optional `[--x ...]` groups left out; None if the line
    runs something else."""
    line = re.sub(r"\s\[-[^\]]*\]", "", line)
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        words.pop(0)
    if not words or words[0] != "hooklane":
        return None
    # `hooklane worker &`: the shell's, run in the background
    return words[1:-1] if words[-1] == "&" else words[1:]


def documented_commands() -> list[tuple[str, list[str], bool]]:
    """(page, arguments, complete): command lines in code blocks are
    complete; `hooklane ...` in the text may leave arguments out."""
    found = []
    for page in PAGES:
        text = read(page)
        for line in code_lines(text):
            args = command_of(line)
            if args is not None:
                found.append((page.name, args, True))
        for span in re.findall(r"`(hooklane [^`]+)`", text):
            args = command_of(span.replace("\n", " ").split("|")[0])
            if args is not None:
                found.append((page.name, args, False))
    return found


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def subcommand_path(args: list[str]) -> tuple[str, ...]:
    """The subcommands an argument list names, checked one level at a time.
    Raises ValueError on a word that is no subcommand where one is due."""
    parser = cli._parser()
    path: list[str] = []
    for word in args:
        choices = subparsers(parser)
        if not choices or word.startswith("-"):
            break
        if word not in choices:
            raise ValueError(f"hooklane {' '.join(path)}: no subcommand {word!r} (has {sorted(choices)})")
        parser = choices[word]
        path.append(word)
    return tuple(path)
