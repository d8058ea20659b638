"""CEL's syntax, read only to bound what a condition costs (apps/policies/cost.py).

`cel.compile` decides whether a condition is valid, but its program exposes no syntax
tree. So this module reads the same grammar (cel-spec's CEL.g4, as the Rust `cel`
crate behind `common-expression-language` implements it, macros included) into a
small tree of its own. It runs after `cel.compile` accepted the text, so it need not
diagnose every error; what it must not do is read an accepted condition differently.
Whatever it does not know (optional syntax `.?` and `[?`, message literals, a leading
dot) it refuses with a `SyntaxRefusal`: a rule the cost check cannot read is not saved.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MACROS_WITH_VARIABLE = {"all", "exists", "exists_one", "existsOne", "map", "filter"}
# The parser gives up past this depth, as the Rust parser does (its limit is 96).
MAX_DEPTH = 96


class SyntaxRefusal(Exception):
    """A condition the cost check cannot read; `column` is 1-based."""

    def __init__(self, message: str, column: int) -> None:
        super().__init__(f"{message} (column {column})")
        self.column = column


# ---------------------------------------------------------------- the tree


@dataclass(frozen=True, slots=True)
class Node:
    column: int


@dataclass(frozen=True, slots=True)
class Literal(Node):
    kind: str  # int, uint, double, string, bytes, bool, null
    value: Any


@dataclass(frozen=True, slots=True)
class Ident(Node):
    name: str


@dataclass(frozen=True, slots=True)
class Select(Node):
    operand: Node
    field: str
    test: bool = False  # has(operand.field)


@dataclass(frozen=True, slots=True)
class Index(Node):
    operand: Node
    index: Node


@dataclass(frozen=True, slots=True)
class Call(Node):
    function: str
    target: Node | None  # receiver style, target.function(args)
    args: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class ListLiteral(Node):
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class MapLiteral(Node):
    entries: tuple[tuple[Node, Node], ...]


@dataclass(frozen=True, slots=True)
class Unary(Node):
    op: str  # ! or -
    operand: Node


@dataclass(frozen=True, slots=True)
class Binary(Node):
    op: str
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Ternary(Node):
    condition: Node
    then: Node
    otherwise: Node


@dataclass(frozen=True, slots=True)
class Comprehension(Node):
    """A macro over a list or map: `range.macro(variable, *args)`."""

    macro: str  # all, exists, exists_one, map, filter
    range: Node
    variable: str
    args: tuple[Node, ...]  # the body; map's three-argument form: (filter, transform)


# ---------------------------------------------------------------- tokens


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # int, uint, double, string, bytes, ident, escaped, op, end
    text: str
    value: Any
    column: int


HEX = set("0123456789abcdefABCDEF")
SIMPLE_ESCAPES = {
    "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
    '"': '"', "'": "'", "\\": "\\", "?": "?", "`": "`",
}  # fmt: skip


SKIP = re.compile(r"(?:[ \t\r\n\f]+|//[^\n]*)+")
NUMBER = re.compile(
    r"(?P<hex>0[xX][0-9a-fA-F]+)(?P<hex_uint>[uU])?"
    r"|(?P<double>\d+\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\.\d+(?:[eE][+-]?\d+)?)"
    r"|(?P<int>\d+)(?P<uint>[uU])?"
)
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ESCAPED_IDENTIFIER = re.compile(r"`[A-Za-z0-9_.\-/ ]+`")
OPERATOR = re.compile(r"==|!=|<=|>=|&&|\|\||[<>!\-+*/%?:.,\[\]{}()]")


def tokens(text: str) -> list[Token]:
    """CEL.g4's lexer rules; a longer match wins, as in ANTLR (`1.5` is one number)."""
    found: list[Token] = []
    i = 0
    while True:
        skipped = SKIP.match(text, i)
        if skipped:
            i = skipped.end()
        if i >= len(text):
            break
        c = text[i]
        prefix = _string_prefix(text, i) if c in "bBrR\"'" else None
        if prefix is not None:
            token, i = _string(text, i, prefix)
        elif number := NUMBER.match(text, i):
            token, i = _number(number), number.end()
        elif name := IDENTIFIER.match(text, i):
            token, i = Token("ident", name.group(), None, i + 1), name.end()
        elif escaped := ESCAPED_IDENTIFIER.match(text, i):
            token = Token("escaped", escaped.group(), escaped.group()[1:-1], i + 1)
            i = escaped.end()
        elif op := OPERATOR.match(text, i):
            token, i = Token("op", op.group(), None, i + 1), op.end()
        else:
            raise SyntaxRefusal(f"an unexpected character {c!r}", i + 1)
        found.append(token)
    found.append(Token("end", "", None, len(text) + 1))
    return found


def _string_prefix(text: str, i: int) -> str | None:
    """`b`, `r`, `br` (any case) or nothing right before a quote start a string."""
    for length in (2, 1, 0):
        prefix = text[i : i + length]
        quoted = text[i + length : i + length + 1] in ("'", '"')
        if quoted and len(prefix) == length and prefix.lower() in ("b", "r", "br", ""):
            return prefix.lower()
    return None


def _number(match: re.Match[str]) -> Token:
    column = match.start() + 1
    if match["hex"]:
        kind = "uint" if match["hex_uint"] else "int"
        return Token(kind, match.group(), int(match["hex"], 16), column)
    if match["double"]:
        return Token("double", match.group(), float(match["double"]), column)
    return Token("uint" if match["uint"] else "int", match.group(), int(match["int"]), column)


def _string(text: str, i: int, prefix: str) -> tuple[Token, int]:
    """A string or bytes literal starting at i (prefix included); its decoded value."""
    start = i
    i += len(prefix)
    raw, is_bytes = "r" in prefix, "b" in prefix
    quote = text[i] * 3 if text.startswith(text[i] * 3, i) else text[i]
    i += len(quote)
    chars: list[str] = []
    octets: list[int] = []  # bytes literals: \x and octal escapes are single bytes
    while True:
        if i >= len(text):
            raise SyntaxRefusal("an unterminated string", start + 1)
        if text.startswith(quote, i):
            i += len(quote)
            break
        c = text[i]
        if len(quote) == 1 and c in "\r\n":
            raise SyntaxRefusal("a line break inside a one-line string", i + 1)
        if c == "\\" and not raw:
            piece, octet, i = _escape(text, i)
            if octet is not None and is_bytes:
                octets.append(octet)
            else:
                octets.extend(piece.encode("utf-8", "surrogatepass"))
            chars.append(piece)
        else:
            chars.append(c)
            octets.extend(c.encode("utf-8", "surrogatepass"))
            i += 1
    if is_bytes:
        return Token("bytes", text[start:i], bytes(octets), start + 1), i
    return Token("string", text[start:i], "".join(chars), start + 1), i


def _escape(text: str, i: int) -> tuple[str, int | None, int]:
    """The character an escape stands for, the byte it is in a bytes literal, the next index."""
    c = text[i + 1 : i + 2]
    if c in SIMPLE_ESCAPES and c:
        return SIMPLE_ESCAPES[c], None, i + 2
    if c in ("x", "X") and _all_in(text[i + 2 : i + 4], HEX, 2):
        value = int(text[i + 2 : i + 4], 16)
        return chr(value), value, i + 4
    if c == "u" and _all_in(text[i + 2 : i + 6], HEX, 4):
        return chr(int(text[i + 2 : i + 6], 16)), None, i + 6
    if c == "U" and _all_in(text[i + 2 : i + 10], HEX, 8):
        value = int(text[i + 2 : i + 10], 16)
        if value > 0x10FFFF:
            raise SyntaxRefusal("an escape beyond Unicode", i + 1)
        return chr(value), None, i + 10
    if c in "0123" and c and _all_in(text[i + 2 : i + 4], set("01234567"), 2):
        value = int(text[i + 1 : i + 4], 8)
        return chr(value), value, i + 4
    raise SyntaxRefusal("an unknown escape sequence", i + 1)


def _all_in(piece: str, allowed: set[str], length: int) -> bool:
    return len(piece) == length and all(c in allowed for c in piece)


# ---------------------------------------------------------------- the parser


def parse(text: str) -> Node:
    return _Parser(tokens(text)).start()


class _Parser:
    """Recursive descent in CEL.g4's precedence, lowest first: ?:, ||, &&, relations
    (<, <=, >=, >, ==, !=, in), + and -, *, / and %, unary ! and -, member access."""

    def __init__(self, found: list[Token]) -> None:
        self.tokens = found
        self.at = 0
        self.depth = 0

    # ---- helpers

    @property
    def token(self) -> Token:
        return self.tokens[self.at]

    def next(self) -> Token:
        token = self.tokens[self.at]
        self.at += 1
        return token

    def accept(self, op: str) -> Token | None:
        if self.token.kind == "op" and self.token.text == op:
            return self.next()
        return None

    def expect(self, op: str) -> Token:
        token = self.accept(op)
        if token is None:
            raise SyntaxRefusal(f"expected {op!r}", self.token.column)
        return token

    def deeper(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise SyntaxRefusal(f"more than {MAX_DEPTH} levels of nesting", self.token.column)

    # ---- grammar

    def start(self) -> Node:
        node = self.expr()
        if self.token.kind != "end":
            raise SyntaxRefusal("unexpected text after the expression", self.token.column)
        return node

    def expr(self) -> Node:
        self.deeper()
        node = self.binary(0)
        question = self.accept("?")
        if question is not None:
            then = self.binary(0)
            self.expect(":")
            node = Ternary(question.column, node, then, self.expr())
        self.depth -= 1
        return node

    PRECEDENCE = {
        "||": 0, "&&": 1,
        "<": 2, "<=": 2, ">=": 2, ">": 2, "==": 2, "!=": 2, "in": 2,
        "+": 3, "-": 3, "*": 4, "/": 4, "%": 4,
    }  # fmt: skip

    def binary(self, lowest: int) -> Node:
        """Precedence climbing: left-associative, one Python frame per operand nested right."""
        node = self.unary()
        while True:
            token = self.token
            level = self.PRECEDENCE.get(token.text, -1) if token.kind in ("op", "ident") else -1
            if level < lowest or (token.kind == "ident" and token.text != "in"):
                return node
            self.next()
            node = Binary(token.column, token.text, node, self.binary(level + 1))

    def unary(self) -> Node:
        """`!` and `-` repeated (cel accepts a thousand): built without recursing."""
        ops: list[Token] = []
        while self.token.kind == "op" and self.token.text in ("!", "-"):
            ops.append(self.next())
        node = self.member()
        for token in reversed(ops):
            node = Unary(token.column, token.text, node)
        return node

    def member(self) -> Node:
        node = self.primary()
        while True:
            token = self.token
            if self.accept("."):
                if self.accept("?"):
                    raise SyntaxRefusal(
                        "optional field selection (.?) is not supported", token.column
                    )
                name = self.next()
                if name.kind == "escaped":
                    node = Select(name.column, node, name.value)
                elif name.kind != "ident":
                    raise SyntaxRefusal("expected a field name after '.'", name.column)
                elif self.accept("("):
                    node = self.call(name, node, self.arguments(")"))
                elif self.token.kind == "op" and self.token.text == "{":
                    raise SyntaxRefusal("message literals are not supported", name.column)
                else:
                    node = Select(name.column, node, name.text)
            elif self.accept("["):
                if self.accept("?"):
                    raise SyntaxRefusal("optional indexing ([?) is not supported", token.column)
                index = self.expr()
                self.expect("]")
                node = Index(token.column, node, index)
            else:
                return node

    def primary(self) -> Node:
        token = self.next()
        if token.kind in ("int", "uint", "double", "string", "bytes"):
            return Literal(token.column, token.kind, token.value)
        if token.kind == "ident":
            if token.text in ("true", "false"):
                return Literal(token.column, "bool", token.text == "true")
            if token.text == "null":
                return Literal(token.column, "null", None)
            if token.text == "in":
                raise SyntaxRefusal("unexpected 'in'", token.column)
            if self.accept("("):
                return self.call(token, None, self.arguments(")"))
            if self.token.kind == "op" and self.token.text == "{":
                raise SyntaxRefusal("message literals are not supported", token.column)
            return Ident(token.column, token.text)
        if token.kind == "op":
            if token.text == "(":
                node = self.expr()
                self.expect(")")
                return node
            if token.text == "[":
                items = self.arguments("]", optional_elements=True)
                return ListLiteral(token.column, tuple(items))
            if token.text == "{":
                return MapLiteral(token.column, tuple(self.entries()))
            if token.text == ".":
                raise SyntaxRefusal("a leading '.' is not supported", token.column)
        raise SyntaxRefusal(f"unexpected {token.text or 'end'!r}", token.column)

    def arguments(self, close: str, optional_elements: bool = False) -> list[Node]:
        """Comma-separated expressions up to `close`; a trailing comma only in literals."""
        items: list[Node] = []
        while not self.accept(close):
            if items:
                self.expect(",")
                if optional_elements and self.accept(close):
                    break
            if optional_elements and self.token.kind == "op" and self.token.text == "?":
                raise SyntaxRefusal("optional list elements are not supported", self.token.column)
            self.deeper()
            items.append(self.expr())
            self.depth -= 1
        return items

    def entries(self) -> list[tuple[Node, Node]]:
        entries: list[tuple[Node, Node]] = []
        while not self.accept("}"):
            if entries:
                self.expect(",")
                if self.accept("}"):
                    break
            if self.token.kind == "op" and self.token.text == "?":
                raise SyntaxRefusal("optional map entries are not supported", self.token.column)
            key = self.expr()
            self.expect(":")
            entries.append((key, self.expr()))
        return entries

    def call(self, name: Token, target: Node | None, args: list[Node]) -> Node:
        """A function call, or a macro as cel-rust expands them (find_expander)."""
        function = name.text
        if function == "has" and target is None and len(args) == 1:
            (select,) = args
            if not isinstance(select, Select):
                raise SyntaxRefusal("has() takes a field selection", name.column)
            return Select(select.column, select.operand, select.field, test=True)
        arity_fits = len(args) == 2 or (function == "map" and len(args) == 3)
        if function in MACROS_WITH_VARIABLE and target is not None and arity_fits:
            variable = args[0]
            if not isinstance(variable, Ident):
                raise SyntaxRefusal(f"{function}() needs a variable name first", name.column)
            macro = "exists_one" if function == "existsOne" else function
            return Comprehension(name.column, macro, target, variable.name, tuple(args[1:]))
        return Call(name.column, function, target, tuple(args))
