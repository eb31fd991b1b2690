"""YAML read at a bounded cost whatever the bytes hold: one document, no
aliases, limited size, depth and count of values. ``hooklane endpoint
apply`` reads a manifest with it, a file anyone may have written."""

from __future__ import annotations

from typing import Any

import yaml

from hooklane.checks import MAX_DEPTH, MAX_NODES
from hooklane.errors import InvalidInput, printable

MAX_MANIFEST_BYTES = 1024 * 1024
# No integer a manifest needs is longer; PyYAML's base-60 integers cost
# quadratic time in their length.
MAX_INT_CHARS = 64


def load_yaml(raw: bytes, source: str) -> Any:
    """One YAML document, without aliases, at most ``MAX_MANIFEST_BYTES``,
    ``MAX_DEPTH`` deep and ``MAX_NODES`` values."""
    return _load(raw, source, many=False)


def load_yaml_documents(raw: bytes, source: str) -> list[Any]:
    """Every document of a YAML stream (``---`` between them), within the
    bounds of ``load_yaml`` for all of them together."""
    documents: list[Any] = _load(raw, source, many=True)
    return documents


def _load(raw: bytes, source: str, *, many: bool) -> Any:
    if len(raw) > MAX_MANIFEST_BYTES:
        raise InvalidInput(source, f"is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(source, f"is not UTF-8 (byte {exc.start})") from None
    if "\x00" in text:
        raise InvalidInput(source, "contains a NUL character")
    try:
        loader = _BoundedLoader(text, source)
        try:
            return loader.load_all_bounded() if many else loader.load_single()
        finally:
            loader.dispose()
    except InvalidInput:
        raise
    except yaml.YAMLError as exc:
        raise InvalidInput(source, f"is not valid YAML: {_yaml_problem(exc)}") from None
    except (ValueError, OverflowError) as exc:
        # Constructors raise these for values like 2024-13-45.
        raise InvalidInput(source, f"holds a value YAML cannot read: {printable(str(exc))[:200]}") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    # Never str(exc): it quotes the document around the problem.
    if isinstance(exc, yaml.reader.ReaderError):
        return f"character #x{exc.character:04x} is not allowed (position {exc.position})"
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{printable(exc.problem or '')[:200]} (line {mark.line + 1}, column {mark.column + 1})"
    return type(exc).__name__


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader without aliases, and with bounded depth and size: through
    aliases a "billion laughs" file of a few hundred bytes expands to
    gigabytes, and PyYAML composes nested nodes recursively."""

    def __init__(self, text: str, source: str) -> None:
        super().__init__(text)
        self.source = source
        self.depth = 0
        self.nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        # PyYAML's stubs leave the parser's methods untyped.
        event = self.peek_event()  # type: ignore[no-untyped-call]
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            raise InvalidInput(self.source, f"uses a YAML alias (line {line}): aliases are not supported")
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise InvalidInput(self.source, f"has more than {MAX_NODES} values")
        nested = isinstance(event, yaml.CollectionStartEvent)
        if nested and self.depth >= MAX_DEPTH:
            raise InvalidInput(self.source, f"nests deeper than {MAX_DEPTH} levels (line {line})")
        self.depth += nested
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= nested

    def load_single(self) -> Any:
        self.get_event()  # type: ignore[no-untyped-call]
        node = None if self.check_event(yaml.StreamEndEvent) else self.compose_document()
        if not self.check_event(yaml.StreamEndEvent):
            raise InvalidInput(self.source, "holds more than one YAML document: one WebhookEndpoint per file")
        return None if node is None else self.construct_document(node)

    def load_all_bounded(self) -> list[Any]:
        self.get_event()  # type: ignore[no-untyped-call]
        documents = []
        while not self.check_event(yaml.StreamEndEvent):
            documents.append(self.construct_document(self.compose_document()))
        return documents

    def construct_bounded_int(self, node: yaml.ScalarNode) -> int:
        if len(node.value) > MAX_INT_CHARS:
            raise InvalidInput(self.source, f"has an integer longer than {MAX_INT_CHARS} characters")
        return self.construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_bounded_int)
