"""What a CEL condition costs: bounded when it is saved, checked again at every call.

The `cel` library (Rust, through PyO3) holds Python's interpreter lock for the whole of
an evaluation, so while a rule runs, the event loop and every other thread wait: five
comprehensions over 20-element lists nested in one 326-character condition took 6.8 s
a call, and `/healthz` waited as long. The library has no cost limit, so toolhub bounds
the cost itself (RULES_HAVE_A_BOUNDED_COST):

- At save, `analyse` reads the condition (apps/policies/syntax.py) and sums what each
  node costs, as a polynomial in E and C, the values (elements, entries, scalars) and
  the characters of the call's arguments the condition reads: with 8 KB of arguments at
  most, E ≤ 4,096 and C ≤ 8,192. A comprehension costs its range's size times its body
  (the parts of a value sum to the value, so looping over a list and reading each
  element stays linear), map() and filter() also the square of their turns (the library
  copies their result list at every turn), and matches() compiling its pattern
  (apps/policies/patterns.py). It refuses a cost that grows with the square of the
  arguments, a constant part over `LIMIT`, or a part per value or character over
  `PER_VALUE_LIMIT` or `PER_CHAR_LIMIT`, naming the node that is too expensive.
- At every call, `Cost.check` measures the arguments the condition reads and refuses
  (the rule then denies the call, saying why) if converting and evaluating them would
  cost more than `LIMIT`. The library is handed only the variables the condition reads,
  and of `args` only the fields it reads (`Cost.variables`): it converts every variable
  at every evaluation, at 1.4-4.8 µs a string, list or map, which for 8 KB of small lists
  was 6-17 ms a rule, even for `true`.

The costs below are in steps of `STEP_US` (0.25 µs), from what was measured on the
reference machine (2 cores, AMD EPYC, Python 3.13, common-expression-language 0.10.0,
2026-11-29), rounded up: a literal, variable or operator 0.02-0.025 µs; a comprehension's
turn besides its body 0.14-0.41 µs; map() and filter() 40-67 ns times the square of their
turns; a list literal 0.075 µs an item, a map literal 0.16-0.25 µs an entry; 0.1-4 ns a
character compared, searched, counted or copied; converting the arguments 0.07-0.2 µs a
number, 1.4-3.3 µs a string, list or map.

`LIMIT` is 4,000 steps, about 1 ms. bench/conditions.py finds the costliest condition of
each kind the check accepts (nested comprehensions, map() and filter() over literals,
patterns) and times it: 0.36-0.87 ms p50, never above the model's figure; with the
slowest of them on every call of one tenant, another tenant's p99 stayed within 10 % of
the same load under a trivial rule. At 8,000 steps it was 15-18 % above.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from apps.policies import patterns, syntax

STEP_US = 0.25
LIMIT = 4_000  # steps per evaluation: about 1 ms
# Steps all the rules evaluated for one call may take together (about 2 ms): however many
# rules a tenant admin saves, one call holds the interpreter no longer than this.
CALL_LIMIT = 2 * LIMIT
PER_VALUE_LIMIT = 125  # steps per value of the arguments read: 32 values fit in LIMIT
PER_CHAR_LIMIT = 4  # steps per character of the arguments read: 1,000 characters fit
ARGS_BYTES = 8 * 1024  # the runner's MAX_ARGS_BYTES (apps/invocations/requests.py)
MOST_VALUES, MOST_CHARS = ARGS_BYTES // 2, ARGS_BYTES  # `[0,0,...]`, `"aaa..."`

NODE = 0.1  # a literal, variable, operator, field read or function call
ITERATION = 1.6  # one turn of a comprehension, besides its body
ACCUMULATE = 0.36  # map() and filter(): times the square of their turns
LIST_ITEM = 0.4  # building a list literal, per item
MAP_ENTRY = 1.0  # building a map literal, per entry
CHAR = 0.016  # a character compared, searched, counted, copied or parsed (4 ns)
ELEMENT = 0.1  # an element compared or copied
CONVERT_VALUE = 14.0  # handing the library a string, list, map or key of the arguments
CONVERT_SCALAR = 4.0  # a number, boolean or null
CONVERT_CHAR = 0.016

E, C = "E", "C"  # values and characters of the call's arguments the condition reads
VARIABLES = {"args", "tool", "principal", "runId"}
FIXED_VALUES = {"tool": 4, "principal": 1, "runId": 1}  # strings and maps converted in each
TYPE_NAMES = {
    "int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type",
}  # fmt: skip
TIME_GETTERS = {
    "getFullYear", "getMonth", "getDayOfYear", "getDayOfMonth", "getDate", "getDayOfWeek",
    "getHours", "getMinutes", "getSeconds", "getMilliseconds",
}  # fmt: skip
CONVERSIONS = {"int", "uint", "double", "string", "bytes", "timestamp", "duration"}
STRING_TESTS = {"contains", "startsWith", "endsWith"}
KNOWN_FUNCTIONS = (
    "size, contains, startsWith, endsWith, matches, int, uint, double, string, bytes, dyn, "
    "type, timestamp, duration, the time getters (getHours()...) and the macros has, all, "
    "exists, exists_one, map and filter"
)


class TooExpensive(Exception):
    """A condition over the limits, at save or for one call's arguments."""


class Unreadable(Exception):
    """A condition the cost check cannot read (syntax, function or pattern it does not know)."""


def ms(value: float) -> str:
    return f"{value * STEP_US / 1000:,.1f} ms".replace(".0 ms", " ms")


def steps(value: float) -> str:
    digits = len(str(int(value)))
    return f"{round(value, -max(digits - 2, 0)):,.0f}"


# ---------------------------------------------------------------- polynomials

Monomial = tuple[tuple[str, int], ...]


class Poly:
    """A polynomial with non-negative coefficients in E, C and comprehensions' symbols."""

    __slots__ = ("terms",)

    def __init__(self, terms: dict[Monomial, float] | None = None) -> None:
        self.terms = {m: c for m, c in (terms or {}).items() if c}

    @classmethod
    def of(cls, value: float) -> Poly:
        return cls({(): value})

    @classmethod
    def var(cls, symbol: str) -> Poly:
        return cls({((symbol, 1),): 1.0})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Poly) and self.terms == other.terms

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: Poly | float) -> Poly:
        other = other if isinstance(other, Poly) else Poly.of(other)
        if not other.terms:
            return self
        if not self.terms:
            return other
        terms = dict(self.terms)
        for m, c in other.terms.items():
            terms[m] = terms.get(m, 0.0) + c
        return Poly(terms)

    __radd__ = __add__

    def __mul__(self, other: Poly | float) -> Poly:
        if not isinstance(other, Poly):
            return Poly({m: c * other for m, c in self.terms.items()})
        terms: dict[Monomial, float] = {}
        for (m1, c1), (m2, c2) in itertools.product(self.terms.items(), other.terms.items()):
            powers = dict(m1)
            for symbol, power in m2:
                powers[symbol] = powers.get(symbol, 0) + power
            m = tuple(sorted(powers.items()))
            terms[m] = terms.get(m, 0.0) + c1 * c2
        return Poly(terms)

    __rmul__ = __mul__

    def degree(self) -> int:
        """The degree in the arguments' sizes E and C."""
        return max((sum(p for s, p in m if s in (E, C)) for m in self.terms), default=0)

    def constant(self) -> float:
        return self.terms.get((), 0.0)

    def per(self, symbol: str) -> float:
        return self.terms.get(((symbol, 1),), 0.0)

    def split(self, symbols: tuple[str, ...]) -> tuple[Poly, Poly]:
        """(the terms without any of the symbols, the terms with one)."""
        without: dict[Monomial, float] = {}
        with_: dict[Monomial, float] = {}
        for m, c in self.terms.items():
            (with_ if any(s in symbols for s, _ in m) else without)[m] = c
        return Poly(without), Poly(with_)

    def substitute(self, values: dict[str, Poly]) -> Poly:
        total = Poly()
        for m, c in self.terms.items():
            term = Poly({tuple((s, p) for s, p in m if s not in values): c})
            for symbol, power in m:
                for _ in range(power if symbol in values else 0):
                    term = term * values[symbol]
            total = total + term
        return total

    def at(self, values: float, chars: float) -> float:
        """The value for E = values and C = chars (after analysis no other symbol is left;
        a comprehension's symbols count as C)."""
        total = 0.0
        for m, c in self.terms.items():
            for symbol, power in m:
                c *= (values if symbol == E else chars) ** power
            total += c
        return total

    def worst(self) -> float:
        return self.at(MOST_VALUES, MOST_CHARS)

    def most(self, other: Poly) -> Poly:
        """An upper bound of both (coefficients are non-negative)."""
        if self.terms == other.terms:
            return self
        terms = dict(self.terms)
        for m, c in other.terms.items():
            terms[m] = max(terms.get(m, 0.0), c)
        return Poly(terms)

    def least(self, other: Poly) -> Poly:
        """The one that bounds the smaller, at least for large arguments: fewer powers of E
        and C first (a comprehension's element, whose sizes sum to its range's, is smaller
        than the whole arguments)."""

        def rank(p: Poly) -> tuple[int, int, float]:
            total = max((sum(e for _, e in m) for m in p.terms), default=0)
            return p.degree(), total, p.worst()

        return self if rank(self) <= rank(other) else other


ZERO = Poly()
ONE = Poly.of(1)


# ---------------------------------------------------------------- shapes


@dataclass(frozen=True, slots=True)
class Shape:
    """What the analysis knows of a value: its kind and bounds on its sizes.

    `any` is a value of unknown kind, such as the call's arguments: a list or map of at
    most `items` values, or a string of at most `chars` characters, whose parts' sizes
    sum to at most its own.
    """

    kind: str  # scalar, string, bytes, list, map, any
    length: Poly  # characters, items or entries
    items: Poly  # values inside, itself included
    chars: Poly  # characters inside
    element: Shape | None = None  # list items, map values
    key: Shape | None = None  # map keys
    path: tuple[str, ...] | None = None  # this part of `args`, not yet read


SCALAR = Shape("scalar", ZERO, ONE, ZERO)


def scalar() -> Shape:
    return SCALAR


def text(kind: str, length: Poly | float) -> Shape:
    length = length if isinstance(length, Poly) else Poly.of(length)
    return Shape(kind, length, ONE, length)


def data(items: Poly, chars: Poly, path: tuple[str, ...] | None = None) -> Shape:
    return Shape("any", items + chars, items, chars, path=path)


def collection(
    kind: str, length: Poly, items: Poly, chars: Poly, element: Shape, key: Shape | None = None
) -> Shape:
    return Shape(kind, length, ONE + items, chars, element, key)


def join(a: Shape, b: Shape) -> Shape:
    """A value that is one or the other."""
    if a == b:
        return a
    if a.kind != b.kind:
        return data(a.items.most(b.items), a.chars.most(b.chars))
    element = join(a.element, b.element) if a.element and b.element else a.element or b.element
    key = join(a.key, b.key) if a.key and b.key else a.key or b.key
    length, items, chars = a.length.most(b.length), a.items.most(b.items), a.chars.most(b.chars)
    return Shape(a.kind, length, items, chars, element, key)


def substituted(shape: Shape, values: dict[str, Poly]) -> Shape:
    return Shape(
        shape.kind,
        shape.length.substitute(values),
        shape.items.substitute(values),
        shape.chars.substitute(values),
        substituted(shape.element, values) if shape.element else None,
        substituted(shape.key, values) if shape.key else None,
    )


def weight(shape: Shape) -> Poly:
    """Steps to compare the value with another, at most."""
    return ELEMENT * shape.items + CHAR * shape.chars


@dataclass(frozen=True, slots=True)
class Parts:
    """A comprehension's element when it is a part of the arguments: its size symbols,
    whose values over all turns sum to the range's `items` and `chars`."""

    symbols: tuple[str, str]
    items: Poly
    chars: Poly

    def total(self, per_turn: Poly, turns: Poly) -> Poly:
        """Σ over the turns of per_turn(e_k, c_k) ≤ turns · per_turn(0, 0) + the rest with
        e, c at the range's sizes, since Σ e_k^i c_k^j ≤ (Σ e_k)^i (Σ c_k)^j."""
        fixed, varying = per_turn.split(self.symbols)
        items, chars = self.symbols
        return fixed * turns + varying.substitute({items: self.items, chars: self.chars})


def over_turns(per_turn: Poly, turns: Poly, parts: Parts | None) -> Poly:
    return parts.total(per_turn, turns) if parts else per_turn * turns


# ---------------------------------------------------------------- what the condition reads


@dataclass
class Read:
    """The parts of `args` a condition reads: the whole, or some fields (a field read by
    has() alone need only be there)."""

    whole: bool = False
    fields: dict[str, Read] = field(default_factory=dict)

    def at(self, path: Iterable[str]) -> Read:
        read = self
        for key in path:
            read = read.fields.setdefault(key, Read())
        return read


def prune(value: Any, read: Read) -> Any:
    """The value with only what `read` names: the condition answers the same."""
    if read.whole or not isinstance(value, dict):
        return value
    kept = {}
    for key, part in read.fields.items():
        if key in value:
            kept[key] = prune(value[key], part) if part.whole or part.fields else None
    return kept


def measure(value: Any, budget: float) -> tuple[float, int, int]:
    """Steps to convert the value for the library, and its values and characters;
    stops counting once the steps are over the budget (bounded work at every call)."""
    converting, values, chars = 0.0, 0, 0
    stack = [value]
    while stack and converting <= budget:
        item = stack.pop()
        values += 1
        if isinstance(item, str):
            converting += CONVERT_VALUE + CONVERT_CHAR * len(item)
            chars += len(item)
        elif isinstance(item, dict):
            converting += CONVERT_VALUE * (1 + len(item))
            for key, inner in item.items():
                values += 1
                chars += len(str(key))
                stack.append(inner)
        elif isinstance(item, list | tuple):
            converting += CONVERT_VALUE
            stack.extend(item)
        else:
            converting += CONVERT_SCALAR
    return converting, values, chars


@dataclass(frozen=True)
class Cost:
    """A condition's cost: `evaluation` in E and C, the variables it reads, what of `args`."""

    evaluation: Poly
    variables_read: frozenset[str]
    args: Read

    def static(self) -> Poly:
        """Evaluating, and converting the arguments read, at worst."""
        if "args" not in self.variables_read:
            return self.evaluation
        return self.evaluation + CONVERT_VALUE * Poly.var(E) + CONVERT_CHAR * Poly.var(C)

    def worst(self) -> float:
        """Steps for the largest arguments a call may send (the runtime check stops it at LIMIT)."""
        return self.static().worst()

    def variables(self, variables: dict[str, Any]) -> dict[str, Any]:
        """What to hand the library: the variables read, and of `args` the parts read."""
        chosen = {name: variables[name] for name in self.variables_read if name in variables}
        if "args" in chosen:
            chosen["args"] = prune(chosen["args"], self.args)
        return chosen

    def check(self, chosen: dict[str, Any]) -> float:
        """The steps converting `chosen` (from `variables`) and evaluating take; refuses
        when that is over LIMIT."""
        if "args" not in chosen:
            return self.evaluation.at(0, 0)  # constant, and checked at save
        converting, values, chars = measure(chosen["args"], LIMIT)
        total = converting + self.evaluation.at(values, chars)
        if total > LIMIT:
            raise TooExpensive(
                f"the call's arguments are too large for it: the parts of them it reads (at "
                f"least {values:,} values and {chars:,} characters) would take at least "
                f"{steps(total)} steps to convert and evaluate; the limit is {LIMIT:,} (about "
                f"{ms(LIMIT)})"
            )
        return total


# ---------------------------------------------------------------- the analysis


def analyse(expression: str) -> Cost:
    """The condition's cost, or TooExpensive / Unreadable saying why it cannot be saved."""
    try:
        tree = syntax.parse(expression)
        analysis = _Analysis()
        evaluation, _ = analysis.value(tree)
    except syntax.SyntaxRefusal as exc:
        raise Unreadable(str(exc)) from None
    except RecursionError:
        raise Unreadable("it is nested too deeply for the cost check") from None
    for name in analysis.variables_read:  # converted at every evaluation too
        evaluation = evaluation + CONVERT_VALUE * FIXED_VALUES.get(name, 0)
    cost = Cost(evaluation, frozenset(analysis.variables_read), analysis.args)
    _check(None, cost.static())
    return cost


def _check(node: syntax.Node | None, cost: Poly) -> None:
    fixed_ok = cost.degree() < 2 and cost.constant() <= LIMIT
    if fixed_ok and cost.per(E) <= PER_VALUE_LIMIT and cost.per(C) <= PER_CHAR_LIMIT:
        return
    what = describe(node) if node is not None else "its parts together"
    if cost.degree() >= 2:
        raise TooExpensive(
            f"{what} costs more with the square of the call's arguments{why_square(node)}: "
            f"about {steps(cost.worst())} steps for {ARGS_BYTES:,} bytes of them; the limit "
            f"is {LIMIT:,} (about {ms(LIMIT)})"
        )
    if cost.constant() > LIMIT:
        raise TooExpensive(
            f"{what} costs about {steps(cost.constant())} steps on every call; the limit is "
            f"{LIMIT:,} (about {ms(LIMIT)}){advice(node)}"
        )
    if cost.per(E) > PER_VALUE_LIMIT:
        raise TooExpensive(
            f"{what} costs about {steps(cost.per(E))} steps per value (element, entry, "
            f"number or string) of the call's arguments it reads; the limit is "
            f"{PER_VALUE_LIMIT}{advice(node)}"
        )
    if cost.per(C) > PER_CHAR_LIMIT:
        raise TooExpensive(
            f"{what} costs about {cost.per(C):,.1f} steps per character of the call's "
            f"arguments it reads; the limit is {PER_CHAR_LIMIT}{advice(node)}"
        )


def describe(node: syntax.Node) -> str:
    where = f"at column {node.column}"
    match node:
        case syntax.Comprehension():
            return f"{node.macro}() {where}"
        case syntax.Call():
            return f"{node.function}() {where}"
        case syntax.Binary() | syntax.Unary():
            return f"'{node.op}' {where}"
        case syntax.ListLiteral():
            return f"the list {where}"
        case syntax.MapLiteral():
            return f"the map {where}"
        case syntax.Select():
            return f"'.{node.field}' {where}"
        case syntax.Index():
            return f"the index {where}"
        case syntax.Ternary():
            return f"the conditional {where}"
    return f"the expression {where}"


def advice(node: syntax.Node | None) -> str:
    if isinstance(node, syntax.Call) and node.function == "matches":
        return (
            ". The library compiles the pattern at every evaluation, and Unicode classes "
            "(\\w, \\d, \\s, ., \\p{...}, negated or case-insensitive classes) are large: "
            "ASCII ones such as [A-Za-z0-9_], [0-9] or (?-u:\\w) compile in microseconds"
        )
    return ""


def why_square(node: syntax.Node | None) -> str:
    if isinstance(node, syntax.Comprehension) and node.macro in ("map", "filter"):
        return (
            f" ({node.macro}() copies its result list at every turn in this CEL library, "
            "or its body grows with the arguments; over them use all, exists or exists_one)"
        )
    if isinstance(node, syntax.Comprehension):
        return " (its body runs once per element and itself grows with the arguments)"
    return ""


Result = tuple[Poly, Shape]


class _Analysis:
    """Each node's cost and shape, bottom up; the first node over a limit is refused."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Shape]] = []
        self.variables_read: set[str] = set()
        self.args = Read()
        self.symbols = itertools.count(1)

    def value(self, node: syntax.Node) -> Result:
        """A node's cost and shape; a part of `args` that gets here is read whole."""
        cost, shape = self.visit(node)
        if shape.path is not None:
            self.args.at(shape.path).whole = True
            shape = replace(shape, path=None)
        _check(node, cost)
        return cost, shape

    def visit(self, node: syntax.Node) -> Result:
        match node:
            case syntax.Literal():
                kind = node.kind
                return ONE * NODE, text(kind, len(node.value)) if kind in (
                    "string",
                    "bytes",
                ) else scalar()
            case syntax.Ident():
                return ONE * NODE, self.variable(node)
            case syntax.Select():
                return self.select(node)
            case syntax.Index():
                return self.index(node)
            case syntax.Call():
                return self.call(node)
            case syntax.ListLiteral():
                return self.list_literal(node)
            case syntax.MapLiteral():
                return self.map_literal(node)
            case syntax.Unary():
                return self.unary(node)
            case syntax.Binary():
                return self.binary(node)
            case syntax.Ternary():
                return self.ternary(node)
            case syntax.Comprehension():
                return self.comprehension(node)
        raise Unreadable(f"an expression the cost check does not know at column {node.column}")

    def variable(self, node: syntax.Ident) -> Shape:
        for scope in reversed(self.scopes):
            if node.name in scope:
                return scope[node.name]
        if node.name in TYPE_NAMES:
            return scalar()
        if node.name not in VARIABLES:
            raise Unreadable(
                f"{node.name!r} at column {node.column} is not a variable: a condition sees "
                "args, tool, principal and runId"
            )
        self.variables_read.add(node.name)
        if node.name == "args":
            return data(Poly.var(E), Poly.var(C), path=())
        if node.name == "tool":  # id (at most 140 characters), effect, consequenceLevel
            key, value = text("string", 16), text("string", 140)
            return collection("map", Poly.of(3), Poly.of(6), Poly.of(200), value, key)
        return text("string", 160 if node.name == "principal" else 128)

    def part(self, shape: Shape) -> Shape:
        """An element, entry or field of the value (the library refuses other reads)."""
        if shape.kind in ("list", "map") and shape.element is not None:
            return shape.element
        if shape.kind == "any":
            return data(shape.items, shape.chars)
        return scalar()

    def select(self, node: syntax.Select) -> Result:
        cost, operand = self.visit(node.operand)
        if operand.path is None:
            _check(node.operand, cost)
        cost = cost + NODE + CHAR * len(node.field)
        if node.test:  # has(): the field's presence only
            if operand.path is not None:
                self.args.at((*operand.path, node.field))
            return cost, scalar()
        if operand.path is not None:
            return cost, replace(operand, path=(*operand.path, node.field))
        return cost, self.part(operand)

    def index(self, node: syntax.Index) -> Result:
        if isinstance(node.index, syntax.Literal) and node.index.kind == "string":
            cost, operand = self.visit(node.operand)
            if operand.path is not None:  # args["a-b"]: a field, as args.a would be
                path = (*operand.path, node.index.value)
                return cost + NODE * 2, replace(operand, path=path)
            _check(node.operand, cost)
        else:
            cost, operand = self.value(node.operand)
        index_cost, index = self.value(node.index)
        return cost + index_cost + NODE + weight(index), self.part(operand)

    def list_literal(self, node: syntax.ListLiteral) -> Result:
        cost = ONE * NODE + LIST_ITEM * len(node.items)
        items, chars, element = ZERO, ZERO, None
        for item in node.items:
            item_cost, shape = self.value(item)
            cost = cost + item_cost
            items, chars = items + shape.items, chars + shape.chars
            element = shape if element is None else join(element, shape)
        length = Poly.of(len(node.items))
        return cost, collection("list", length, items, chars, element or scalar())

    def map_literal(self, node: syntax.MapLiteral) -> Result:
        cost = ONE * NODE + MAP_ENTRY * len(node.entries)
        items, chars, element, key = ZERO, ZERO, None, None
        for key_node, value_node in node.entries:
            key_cost, key_shape = self.value(key_node)
            value_cost, value_shape = self.value(value_node)
            cost = cost + key_cost + value_cost + weight(key_shape)
            items = items + key_shape.items + value_shape.items
            chars = chars + key_shape.chars + value_shape.chars
            element = value_shape if element is None else join(element, value_shape)
            key = key_shape if key is None else join(key, key_shape)
        length = Poly.of(len(node.entries))
        return cost, collection("map", length, items, chars, element or scalar(), key or scalar())

    def unary(self, node: syntax.Unary) -> Result:
        # `!!!!x` may nest a thousand deep: walk the spine without recursing
        ops: list[syntax.Unary] = []
        inner: syntax.Node = node
        while isinstance(inner, syntax.Unary):
            ops.append(inner)
            inner = inner.operand
        cost, shape = self.value(inner)
        return cost + NODE * len(ops), shape if ops[-1].op == "-" else scalar()

    def binary(self, node: syntax.Binary) -> Result:
        # `a || b || c ...` is a left spine up to a thousand long: walk it without recursing
        spine: list[syntax.Binary] = []
        inner: syntax.Node = node
        while isinstance(inner, syntax.Binary):
            spine.append(inner)
            inner = inner.left
        cost, shape = self.value(inner)
        for link in reversed(spine):
            right_cost, right = self.value(link.right)
            operation_cost, shape = self.operation(link.op, shape, right)
            cost = cost + right_cost + operation_cost
            if link is not node:
                _check(link, cost)
        return cost, shape

    def operation(self, op: str, left: Shape, right: Shape) -> Result:
        if op in ("&&", "||"):
            return ONE * NODE, scalar()
        if op in ("<", "<=", ">", ">=", "==", "!="):
            return ONE * NODE + weight(left).least(weight(right)), scalar()
        if op == "in":
            return self.membership(left, right), scalar()
        if op == "+":
            return self.concatenation(left, right)
        return ONE * NODE, scalar()  # arithmetic: numbers, timestamps, durations

    def membership(self, needle: Shape, haystack: Shape) -> Poly:
        lookup = ONE * NODE + weight(needle)  # a map hashes the key
        if haystack.kind == "list" and haystack.element is not None:
            per_item = ONE * NODE + weight(needle).least(weight(haystack.element))
            return lookup + per_item * haystack.length
        if haystack.kind == "any":  # a list or a map: the list is the dearer
            turns, element, parts = self.iteration(haystack)
            return lookup + over_turns(NODE + weight(needle).least(weight(element)), turns, parts)
        return lookup

    def concatenation(self, left: Shape, right: Shape) -> Result:
        if left.kind == right.kind and left.kind in ("string", "bytes"):
            shape = text(left.kind, left.length + right.length)
            return ONE * NODE + CHAR * shape.length, shape
        if left.kind == right.kind == "list" and left.element and right.element:
            length, element = left.length + right.length, join(left.element, right.element)
            items, chars = left.items + right.items, left.chars + right.chars
            return ONE * NODE + ELEMENT * length, collection("list", length, items, chars, element)
        if "any" in (left.kind, right.kind):
            shape = data(left.items + right.items, left.chars + right.chars)
            return ONE * NODE + weight(shape), shape
        return ONE * NODE, scalar()

    def ternary(self, node: syntax.Ternary) -> Result:
        condition_cost, _ = self.value(node.condition)
        then_cost, then = self.value(node.then)
        otherwise_cost, otherwise = self.value(node.otherwise)
        return condition_cost + NODE + then_cost.most(otherwise_cost), join(then, otherwise)

    # ---- functions

    def call(self, node: syntax.Call) -> Result:
        name, arity = node.function, len(node.args)
        cost = ONE * NODE
        target: Shape | None = None
        if node.target is not None:
            target_cost, target = self.value(node.target)
            cost = cost + target_cost
        if name == "matches" and target is not None and arity == 1:
            return self.matches(node, cost, target)
        args: list[Shape] = []
        for arg in node.args:
            arg_cost, shape = self.value(arg)
            cost = cost + arg_cost
            args.append(shape)
        operands = ([target] if target is not None else []) + args
        if name == "size" and len(operands) == 1:
            return cost + CHAR * operands[0].chars, scalar()  # a string's characters are counted
        if name in STRING_TESTS and target is not None and arity == 1:
            (needle,) = args
            scanned = target.chars + needle.chars
            if name != "contains":
                scanned = target.chars.least(needle.chars)
            return cost + CHAR * scanned, scalar()
        if name in CONVERSIONS | {"dyn", "type"} and node.target is None and arity == 1:
            return self.conversion(name, cost, args[0])
        if name in TIME_GETTERS and target is not None and arity <= 1:
            return cost + sum((CHAR * a.chars for a in args), ZERO), scalar()
        raise Unreadable(
            f"{name}() at column {node.column} is not a function the cost check knows "
            f"(it knows {KNOWN_FUNCTIONS})"
        )

    def conversion(self, name: str, cost: Poly, value: Shape) -> Result:
        if name == "dyn":
            return cost, value
        parsed = cost + CHAR * value.chars + ELEMENT
        if name == "string":
            return parsed, text(name, value.chars + 32)  # a number written out: < 32
        if name == "bytes":
            return parsed, text(name, value.chars * 4)  # UTF-8
        return parsed, scalar()

    def matches(self, node: syntax.Call, cost: Poly, target: Shape) -> Result:
        (pattern_node,) = node.args
        if not (isinstance(pattern_node, syntax.Literal) and pattern_node.kind == "string"):
            raise Unreadable(
                f"matches() at column {node.column} needs its pattern written as a string: "
                "the library compiles the pattern at every evaluation, at a cost known "
                "only for a pattern known in advance"
            )
        try:
            pattern = patterns.cost(pattern_node.value)
        except patterns.PatternRefusal as exc:
            raise Unreadable(
                f"the pattern of matches() at column {node.column} has {exc}"
            ) from None
        return cost + NODE + pattern.compile + pattern.per_char * target.chars, scalar()

    # ---- comprehensions

    def comprehension(self, node: syntax.Comprehension) -> Result:
        range_cost, range_shape = self.value(node.range)
        turns, element, parts = self.iteration(range_shape)
        self.scopes.append({node.variable: element})
        body_cost, shapes = ZERO, list[Shape]()
        for arg in node.args:
            arg_cost, shape = self.value(arg)
            body_cost, shapes = body_cost + arg_cost, [*shapes, shape]
        self.scopes.pop()
        per_turn = ITERATION + body_cost
        cost = range_cost + over_turns(per_turn, turns, parts)
        if node.macro in ("map", "filter"):
            cost = cost + ACCUMULATE * turns * turns
        if cost.constant() > LIMIT and parts is None and turns.degree() == 0:
            raise TooExpensive(
                f"{node.macro}() at column {node.column} runs its body {turns.constant():,.0f} "
                f"times, each about {steps(per_turn.constant())} steps: about "
                f"{steps(cost.constant())} steps on every call; the limit is {LIMIT:,} "
                f"(about {ms(LIMIT)})"
            )
        if node.macro not in ("map", "filter"):
            return cost, scalar()
        produced = shapes[-1] if node.macro == "map" else element
        items = over_turns(produced.items, turns, parts)
        chars = over_turns(produced.chars, turns, parts)
        if parts is not None:
            e, c = parts.symbols
            produced = substituted(produced, {e: parts.items, c: parts.chars})
        return cost, collection("list", turns, items, chars, produced)

    def iteration(self, shape: Shape) -> tuple[Poly, Shape, Parts | None]:
        """Turns over the value, the variable's shape, and its Parts when the value is
        of the arguments (then its elements' sizes sum to the value's)."""
        if shape.kind == "list" and shape.element is not None:
            return shape.length, shape.element, None
        if shape.kind == "map" and shape.key is not None:
            return shape.length, shape.key, None
        if shape.kind == "any":
            number = next(self.symbols)
            e, c = f"e{number}", f"c{number}"
            element = data(Poly.var(e), Poly.var(c))
            return shape.items, element, Parts((e, c), shape.items, shape.chars)
        return ZERO, scalar(), None  # not iterable: the library refuses at once
