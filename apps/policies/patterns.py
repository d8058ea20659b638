"""What a `matches()` pattern costs: the library compiles it again at every evaluation.

Rust's `regex` crate cannot backtrack: matching is linear in the text (measured on
8,000 characters: 1-45 ns a character, whatever the pattern, `(a|aa)+b` and
`((((.)*)*)*)*z` included). The cost is in compiling, which `cel` does on every call
of `matches`, with no cache: Unicode classes are large automata. Measured per
evaluation of `"x".matches(p)` (AMD EPYC, 2026-11-29): `a` 3.6 µs, `^[a-z]+$` 12 µs,
`.` 51 µs, `\\d` 81 µs, `\\w` 500 µs, `\\pL` 370 µs, `(?i)\\pL` 586 µs, and every
counted copy adds again: `\\w{100}` 40-55 ms, `\\d{1000}` 30 ms, `.{1000}` 4.5 ms,
`[a-z]{1000}` 0.17 ms. Matching is slowest with a Unicode word boundary on non-ASCII
text (`\\b\\w+\\b$`: 300 ns a character, the lazy DFA gives way to the PikeVM).

So a pattern must be a literal, and its cost is estimated here from its syntax: each
atom has a cost for its first copy (building its class) and for each further copy,
repetitions multiply copies, in steps of `cost.STEP_US` (0.25 µs). Syntax this
reader does not know (verbose mode `(?x)`, nested classes and class set operations,
unknown escapes) is refused: the rule is not saved.
"""

from __future__ import annotations

from dataclasses import dataclass

BASE = 56.0  # building any regex: 14 µs
LITERAL = (0.3, 0.3)  # (first copy, each further copy), in steps
FOLDED_LETTER = (50.0, 50.0)  # a letter under (?i): 12 µs
ASCII_CLASS = (12.0, 1.5)  # [a-z], [[:alpha:]], (?-u:\w)
WIDE_CLASS = (150.0, 30.0)  # ., a negated class, a class under (?i)
SPACE = (200.0, 30.0)  # \s \S
DIGIT = (300.0, 160.0)  # \d
NOT_DIGIT = (750.0, 320.0)  # \D
WORD_BOUNDARY = (30.0, 5.0)  # \b \B
UNICODE_CLASS = (2400.0, 2000.0)  # \w \W \pL \p{...}: 500 µs, and 450 µs each copy
# Matching, per character of the text, in steps.
SCAN = 0.05
SCAN_WIDE = 0.2  # with Unicode classes or (?i)
SCAN_BOUNDARY = 2.0  # with a Unicode word boundary (PikeVM)
MAX_COPIES = 100_000  # a repetition larger than this is refused outright

PERL = {"d": DIGIT, "D": NOT_DIGIT, "s": SPACE, "S": SPACE, "w": UNICODE_CLASS, "W": UNICODE_CLASS}
LITERAL_ESCAPES = set("nrtfva") | set("\\.+*?()|[]{}^$#&-~ ")
HEX_DIGITS = {"x": 2, "u": 4, "U": 8}


class PatternRefusal(Exception):
    """A pattern whose cost this module cannot estimate."""


@dataclass(frozen=True, slots=True)
class PatternCost:
    compile: float  # steps, once per evaluation of matches()
    per_char: float  # steps per character of the text matched


@dataclass(slots=True)
class _Weight:
    first: float = 0.0
    each: float = 0.0

    def add(self, other: _Weight | tuple[float, float]) -> None:
        first, each = (other.first, other.each) if isinstance(other, _Weight) else other
        self.first += first
        self.each += each

    def repeated(self, copies: int) -> _Weight:
        if copies == 0:
            return _Weight()
        return _Weight(self.first + (copies - 1) * self.each, copies * self.each)


@dataclass(slots=True)
class _Flags:
    unicode: bool = True
    fold: bool = False


def cost(pattern: str) -> PatternCost:
    reader = _Reader(pattern)
    weight = reader.alternation(_Flags(), top=True)
    per_char = SCAN_BOUNDARY if reader.boundary else SCAN_WIDE if reader.wide else SCAN
    return PatternCost(BASE + weight.first, per_char)


class _Reader:
    def __init__(self, pattern: str) -> None:
        self.text = pattern
        self.at = 0
        self.wide = False  # Unicode classes or case folding: a slower DFA
        self.boundary = False  # a Unicode word boundary: the PikeVM

    def peek(self, length: int = 1) -> str:
        return self.text[self.at : self.at + length]

    def refuse(self, what: str) -> PatternRefusal:
        return PatternRefusal(f"{what} at position {self.at + 1} of the pattern")

    def alternation(self, flags: _Flags, top: bool = False) -> _Weight:
        total = _Weight()
        flags = _Flags(flags.unicode, flags.fold)  # (?i) inside a group ends with it
        while True:
            total.add(self.sequence(flags))
            if self.peek() == "|":
                self.at += 1
                continue
            if self.peek() == ")" and not top:
                return total
            if self.at >= len(self.text):
                if not top:
                    raise self.refuse("an unclosed group")
                return total
            raise self.refuse(f"an unexpected {self.peek()!r}")

    def sequence(self, flags: _Flags) -> _Weight:
        total = _Weight()
        while self.at < len(self.text) and self.peek() not in ("|", ")"):
            atom = self.atom(flags)
            total.add(atom.repeated(self.repetition()))
        return total

    def repetition(self) -> int:
        """Copies the compiled program holds of the atom just read (1 without repetition)."""
        copies = 1
        while True:
            c = self.peek()
            if c in ("*", "+", "?"):  # a loop or an option over one copy
                self.at += 1
            elif c == "{":
                end = self.text.find("}", self.at)
                body = self.text[self.at + 1 : end] if end > 0 else ""
                low, _, high = body.partition(",")
                if not low.strip().isdigit() or (high.strip() and not high.strip().isdigit()):
                    raise self.refuse("a repetition the cost check cannot read")
                self.at = end + 1
                copies *= int(high) if high.strip() else max(int(low), 1)
            else:
                return copies
            if self.peek() == "?":  # lazy
                self.at += 1
            if copies > MAX_COPIES:
                raise self.refuse(f"a repetition of more than {MAX_COPIES:,} copies")

    def atom(self, flags: _Flags) -> _Weight:
        c = self.peek()
        if c == "(":
            return self.group(flags)
        if c == "[":
            return self.bracket(flags)
        if c == "\\":
            return self.escape(flags)
        self.at += 1
        if c in ("^", "$"):
            return _Weight()
        if c == ".":
            return self.wide_if(flags.unicode, WIDE_CLASS)
        if c in ("*", "+", "?", "{"):
            raise self.refuse("a repetition with nothing to repeat")
        if flags.fold and c.lower() != c.upper():
            self.wide = True
            return _Weight(*FOLDED_LETTER)
        return _Weight(*LITERAL)

    def wide_if(self, unicode: bool, weight: tuple[float, float]) -> _Weight:
        if not unicode:
            return _Weight(*ASCII_CLASS)
        self.wide = True
        return _Weight(*weight)

    def group(self, flags: _Flags) -> _Weight:
        self.at += 1
        inner = _Flags(flags.unicode, flags.fold)
        if self.peek() == "?":
            self.at += 1
            if self.peek(2) == "P<" or (self.peek() == "<" and self.peek(2) != "<="):
                end = self.text.find(">", self.at)
                if end < 0:
                    raise self.refuse("an unclosed group name")
                self.at = end + 1
            else:
                applies_to_rest = self.flag_settings(inner)
                if applies_to_rest:  # (?i) sets the flags for the rest of the enclosing group
                    flags.unicode, flags.fold = inner.unicode, inner.fold
                    return _Weight()
        weight = self.alternation(inner)
        self.at += 1  # the closing parenthesis
        return weight

    def flag_settings(self, flags: _Flags) -> bool:
        """Reads `flags)` or `flags:`; True for `(?flags)`, which applies to what follows."""
        on = True
        while self.at < len(self.text):
            c = self.peek()
            self.at += 1
            if c == ")":
                return True
            if c == ":":
                return False
            if c == "-":
                on = False
            elif c == "i":
                flags.fold = on
            elif c == "u":
                flags.unicode = on
            elif c in "msUR":
                pass
            else:
                raise self.refuse(f"the flag {c!r}, which the cost check does not read")
        raise self.refuse("an unclosed group")

    def escape(self, flags: _Flags) -> _Weight:
        c = self.text[self.at + 1 : self.at + 2]
        self.at += 2
        if c in PERL:
            return self.wide_if(flags.unicode, PERL[c])
        if c in ("p", "P"):
            if self.peek() == "{":
                end = self.text.find("}", self.at)
                if end < 0:
                    raise self.refuse("an unclosed Unicode class")
                self.at = end + 1
            else:
                self.at += 1
            self.wide = True
            return _Weight(*UNICODE_CLASS)
        if c in ("b", "B"):
            if self.peek() == "{":
                raise self.refuse("a word boundary assertion the cost check does not read")
            return self.escape_boundary(flags)
        if c in ("A", "z"):
            return _Weight()
        if c in ("<", ">"):  # start and end of a word
            return self.escape_boundary(flags)
        if c in HEX_DIGITS:
            if self.peek() == "{":
                end = self.text.find("}", self.at)
                if end < 0:
                    raise self.refuse("an unclosed escape")
                self.at = end + 1
            else:
                self.at += HEX_DIGITS[c]
            return self.letter(flags)
        if c in LITERAL_ESCAPES and c:
            return self.letter(flags)
        raise self.refuse(f"the escape \\{c}, which the cost check does not read")

    def escape_boundary(self, flags: _Flags) -> _Weight:
        if not flags.unicode:
            return _Weight()
        self.boundary = True
        return _Weight(*WORD_BOUNDARY)

    def letter(self, flags: _Flags) -> _Weight:
        if flags.fold:
            self.wide = True
            return _Weight(*FOLDED_LETTER)
        return _Weight(*LITERAL)

    def bracket(self, flags: _Flags) -> _Weight:
        """A class: cheap when it holds ASCII only, is not negated and not case folded."""
        self.at += 1
        negated = self.peek() == "^"
        if negated:
            self.at += 1
        heaviest: tuple[float, float] | None = None
        ascii_only = True
        first = True
        while True:
            if self.at >= len(self.text):
                raise self.refuse("an unclosed class")
            c = self.peek()
            if c == "]" and not first:
                self.at += 1
                break
            first = False
            if self.peek(2) in ("&&", "--", "~~"):
                raise self.refuse("a class set operation, which the cost check does not read")
            if self.peek(2) == "[:":
                end = self.text.find(":]", self.at)
                if end < 0:
                    raise self.refuse("an unclosed ASCII class")
                self.at = end + 2
            elif c == "[":
                raise self.refuse("a nested class, which the cost check does not read")
            elif c == "\\":
                e = self.text[self.at + 1 : self.at + 2]
                if e in PERL or e in ("p", "P"):
                    weight = self.escape(flags)
                    candidate = (weight.first, weight.each)
                    if heaviest is None or candidate > heaviest:
                        heaviest = candidate
                else:
                    self.escape(_Flags(flags.unicode, False))
                    if e in ("x", "u", "U"):
                        ascii_only = False
            else:
                if not c.isascii():
                    ascii_only = False
                self.at += 1
        if heaviest is not None and heaviest[0] > WIDE_CLASS[0]:
            return _Weight(*heaviest)
        if flags.unicode and (negated or flags.fold or not ascii_only):
            self.wide = True
            return _Weight(*WIDE_CLASS)
        return _Weight(*(heaviest or ASCII_CLASS))
