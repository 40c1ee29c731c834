"""Function tasks synthesized from templates, graded from trivial up to HumanEval level.

A small model learns only where it sometimes succeeds. HumanEval alone is out
of reach for a 135M model (its pass rate is ~0 on most problems), so this
source makes function-writing tasks in tiers:

    tier 1  one expression: arithmetic on an argument, a string suffix, a comparison
    tier 2  one pass over a list or string: sums, counts, filters, maps
    tier 3  a loop with state or a small algorithm: runs, primes, digits, encodings

Each template is a family (its tasks share one split, so a held-out family is
never seen in training); its variants differ in constants, characters and
names, drawn from a seeded RNG, so the same seed gives the same tasks. The
hidden tests compare the candidate with the reference implementation on
inputs drawn from the same RNG (expected values computed here, written as
literals), plus the examples the docstring shows. Tasks have the layout of
the HumanEval source: `solution.py` with a stub body, the tests in
`tests/test_solution.py`, the answer a ```python block. The verifier does not
run that test file in the sandbox: it sends the inputs only and compares the
outputs with the expected values on the host (tryloop.rewards.host_check).
"""

from __future__ import annotations

import hashlib
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tryloop.tasks.model import Task, TaskMeta

SOURCE = "functions"
TEST_FILE = "tests/test_solution.py"
TIERS = {1: "easy", 2: "medium", 3: "hard"}   # TaskMeta.tier; the numeric tier is in origin and tags

Gen = Callable[[random.Random], Any]


@dataclass(frozen=True)
class Template:
    """One family. `params` draws the variant's constants; `body` is the reference body (a Python
    expression or statements, formatted with the params); `inputs` draws one argument tuple."""

    family: str
    tier: int
    names: tuple[str, ...]          # function names the variants choose from
    args: str                       # the signature's parameters, e.g. "x: int"
    returns: str
    doc: str                        # docstring, formatted with the params
    body: str                       # reference body, formatted with the params
    inputs: Callable[[random.Random, dict[str, Any]], tuple]
    params: Callable[[random.Random], dict[str, Any]] = lambda rng: {}


def _ints(lo: int, hi: int, n_lo: int = 0, n_hi: int = 8) -> Gen:
    return lambda rng: [rng.randint(lo, hi) for _ in range(rng.randint(n_lo, n_hi))]


def _word(rng: random.Random, lo: int = 1, hi: int = 8) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(lo, hi)))


def _sentence(rng: random.Random) -> str:
    return " ".join(_word(rng, 1, 7) for _ in range(rng.randint(1, 6)))


def _k(lo: int, hi: int) -> Callable[[random.Random], dict[str, Any]]:
    return lambda rng: {"k": rng.randint(lo, hi)}


def _char(rng: random.Random) -> dict[str, Any]:
    return {"c": rng.choice("aeiourstln")}


def _x(lo: int = -50, hi: int = 50) -> Callable[[random.Random, dict], tuple]:
    return lambda rng, p: (rng.randint(lo, hi),)


def _xy(lo: int = -50, hi: int = 50) -> Callable[[random.Random, dict], tuple]:
    return lambda rng, p: (rng.randint(lo, hi), rng.randint(lo, hi))


_xs = lambda lo=-20, hi=20, n_hi=8, n_lo=0: (lambda rng, p: (_ints(lo, hi, n_lo, n_hi)(rng),))  # noqa: E731
_s = lambda rng, p: (_word(rng, 0, 10),)  # noqa: E731
_sent = lambda rng, p: (_sentence(rng),)  # noqa: E731


TEMPLATES: tuple[Template, ...] = (
    # --- tier 1: one expression ----------------------------------------------------------------
    Template("add-constant", 1, ("add_{k}", "plus_{k}", "increase_by_{k}"), "x: int", "int",
             "Return x plus {k}.", "return x + {k}", _x(), _k(2, 99)),
    Template("multiply-constant", 1, ("times_{k}", "multiply_by_{k}", "scale_{k}"), "x: int", "int",
             "Return x multiplied by {k}.", "return x * {k}", _x(), _k(2, 12)),
    Template("affine", 1, ("affine", "line_value", "linear"), "x: int", "int",
             "Return {a} times x plus {b}.", "return {a} * x + {b}", _x(),
             lambda rng: {"a": rng.randint(2, 9), "b": rng.randint(1, 30)}),
    Template("greater-than", 1, ("above_{k}", "is_greater_than_{k}", "exceeds_{k}"), "x: int", "bool",
             "Return True if x is greater than {k}, else False.", "return x > {k}", _x(), _k(-10, 20)),
    Template("divisible", 1, ("divisible_by_{k}", "is_multiple_of_{k}"), "n: int", "bool",
             "Return True if n is divisible by {k}, else False.", "return n % {k} == 0", _x(0, 200), _k(2, 9)),
    Template("square-plus", 1, ("square_plus_{k}", "squared_plus_{k}"), "x: int", "int",
             "Return the square of x plus {k}.", "return x * x + {k}", _x(-20, 20), _k(1, 20)),
    Template("max-of-two", 1, ("larger", "max_of_two", "bigger"), "a: int, b: int", "int",
             "Return the larger of a and b.", "return a if a >= b else b", _xy()),
    Template("abs-difference", 1, ("distance", "abs_difference", "gap"), "a: int, b: int", "int",
             "Return the absolute difference between a and b.", "return abs(a - b)", _xy()),
    Template("add-suffix", 1, ("with_suffix", "add_ending", "append_tag"), "s: str", "str",
             "Return s followed by the text '{suf}'.", "return s + {suf!r}", _s,
             lambda rng: {"suf": rng.choice(["!", "_x", ".txt", "-ok", "ing", "?!"])}),
    Template("repeat-string", 1, ("repeat_{k}", "times_{k}_str", "echo_{k}"), "s: str", "str",
             "Return s repeated {k} times.", "return s * {k}", _s, _k(2, 5)),
    Template("last-digit", 1, ("last_digit", "ones_digit", "final_digit"), "n: int", "int",
             "Return the last decimal digit of the non-negative integer n.", "return n % 10", _x(0, 10000)),
    Template("length-plus", 1, ("length_plus_{k}", "size_plus_{k}"), "s: str", "int",
             "Return the length of s plus {k}.", "return len(s) + {k}", _s, _k(1, 9)),
    Template("upper-case", 1, ("shout", "to_upper", "loud"), "s: str", "str",
             "Return s in upper case.", "return s.upper()", _s),
    Template("is-negative", 1, ("is_negative", "below_zero", "negative"), "x: int", "bool",
             "Return True if x is less than zero, else False.", "return x < 0", _x()),
    Template("half", 1, ("half", "halve", "divide_by_two"), "n: int", "int",
             "Return n divided by 2, rounded down (integer division).", "return n // 2", _x(-100, 100)),
    Template("min-of-three", 1, ("smallest", "min_of_three", "least"), "a: int, b: int, c: int", "int",
             "Return the smallest of a, b and c.", "return min(a, b, c)",
             lambda rng, p: tuple(rng.randint(-50, 50) for _ in range(3))),
    Template("subtract-constant", 1, ("minus_{k}", "subtract_{k}", "decrease_by_{k}"), "x: int", "int",
             "Return x minus {k}.", "return x - {k}", _x(), _k(2, 99)),
    Template("remainder", 1, ("mod_{k}", "remainder_{k}", "leftover_{k}"), "n: int", "int",
             "Return the remainder of the non-negative integer n divided by {k}.", "return n % {k}",
             _x(0, 500), _k(3, 11)),
    Template("equals-constant", 1, ("is_{k}", "equals_{k}", "matches_{k}"), "x: int", "bool",
             "Return True if x equals {k}, else False.", "return x == {k}",
             lambda rng, p: (rng.choice([p["k"], rng.randint(-20, 40)]),), _k(0, 30)),
    Template("in-range", 1, ("between_{a}_and_{b}", "in_range_{a}_{b}"), "x: int", "bool",
             "Return True if x is at least {a} and at most {b}, else False.", "return {a} <= x <= {b}",
             lambda rng, p: (rng.randint(p["a"] - 10, p["b"] + 10),), lambda rng: (lambda a: {"a": a, "b": a + rng.randint(3, 30)})(rng.randint(0, 20))),
    Template("add-prefix", 1, ("with_prefix", "add_start", "prepend_tag"), "s: str", "str",
             "Return the text '{pre}' followed by s.", "return {pre!r} + s", _s,
             lambda rng: {"pre": rng.choice(["re", "un", ">> ", "#", "pre_", "the "])}),
    Template("starts-with", 1, ("starts_with_{c}", "begins_with_{c}"), "s: str", "bool",
             "Return True if s starts with the letter '{c}', else False.", "return s.startswith({c!r})",
             lambda rng, p: (rng.choice([p["c"] + _word(rng, 0, 6), _word(rng, 0, 7)]),), _char),
    Template("ends-with", 1, ("ends_with_{c}", "finishes_with_{c}"), "s: str", "bool",
             "Return True if s ends with the letter '{c}', else False.", "return s.endswith({c!r})",
             lambda rng, p: (rng.choice([_word(rng, 0, 6) + p["c"], _word(rng, 0, 7)]),), _char),
    Template("cap-at", 1, ("cap_{k}", "at_most_{k}", "limit_{k}"), "x: int", "int",
             "Return x if it is at most {k}, otherwise {k}.", "return min(x, {k})", _x(-30, 60), _k(0, 30)),
    Template("at-least", 1, ("floor_{k}", "at_least_{k}", "raise_to_{k}"), "x: int", "int",
             "Return x if it is at least {k}, otherwise {k}.", "return max(x, {k})", _x(-30, 60), _k(-10, 20)),
    Template("power", 1, ("power_{k}", "to_the_{k}", "raise_{k}"), "x: int", "int",
             "Return x to the power {k}.", "return x ** {k}", _x(-9, 9), _k(2, 4)),
    Template("sum-plus", 1, ("sum_plus_{k}", "add_both_plus_{k}"), "a: int, b: int", "int",
             "Return a plus b plus {k}.", "return a + b + {k}", _xy(), _k(1, 50)),
    Template("longer-than", 1, ("longer_than_{k}", "has_over_{k}_chars"), "s: str", "bool",
             "Return True if s has more than {k} characters, else False.", "return len(s) > {k}", _s, _k(1, 8)),
    Template("surround", 1, ("wrap_{name}", "surround_{name}"), "s: str", "str",
             "Return s with '{c}' added at its start and at its end.", "return {c!r} + s + {c!r}", _s,
             lambda rng: (lambda c: {"c": c, "name": {"*": "stars", "|": "bars", "_": "underscores",
                                                       "#": "hashes", "~": "tildes"}[c]})(
                 rng.choice("*|_#~"))),
    Template("percent-of", 1, ("percent_{k}", "share_{k}"), "x: int", "float",
             "Return {k} percent of x as a float (x * {k} / 100).", "return x * {k} / 100", _x(0, 400), _k(5, 90)),
    Template("times-plus", 1, ("times_{a}_minus_{b}", "scale_{a}_down_{b}"), "x: int", "int",
             "Return x multiplied by {a}, minus {b}.", "return x * {a} - {b}", _x(),
             lambda rng: {"a": rng.randint(2, 9), "b": rng.randint(1, 30)}),
    Template("char-at", 1, ("char_{k}", "letter_at_{k}"), "s: str", "str",
             "Return the character of s at index {k} (s is longer than {k}).", "return s[{k}]",
             lambda rng, p: (_word(rng, p["k"] + 1, p["k"] + 7),), _k(0, 4)),
    Template("less-than", 1, ("below_{k}", "is_less_than_{k}", "under_{k}"), "x: int", "bool",
             "Return True if x is less than {k}, else False.", "return x < {k}", _x(), _k(-10, 20)),
    Template("at-most", 1, ("is_at_most_{k}", "no_more_than_{k}", "within_{k}"), "x: int", "bool",
             "Return True if x is at most {k}, else False.", "return x <= {k}", _x(-30, 40), _k(-10, 20)),
    Template("not-equal", 1, ("is_not_{k}", "differs_from_{k}", "other_than_{k}"), "x: int", "bool",
             "Return True if x is not equal to {k}, else False.", "return x != {k}",
             lambda rng, p: (rng.choice([p["k"], rng.randint(-20, 40)]),), _k(0, 30)),
    Template("subtract-from", 1, ("from_{k}", "subtract_from_{k}", "short_of_{k}"), "x: int", "int",
             "Return {k} minus x.", "return {k} - x", _x(), _k(10, 99)),
    Template("integer-divide", 1, ("div_{k}", "divide_by_{k}", "split_{k}_ways"), "n: int", "int",
             "Return n divided by {k}, rounded down (integer division).", "return n // {k}", _x(0, 500), _k(2, 12)),
    Template("not-divisible", 1, ("not_divisible_by_{k}", "indivisible_by_{k}"), "n: int", "bool",
             "Return True if n is not divisible by {k}, else False.", "return n % {k} != 0", _x(0, 200), _k(2, 9)),
    Template("remainder-is", 1, ("leaves_{r}_mod_{k}", "mod_{k}_is_{r}"), "n: int", "bool",
             "Return True if n divided by {k} leaves the remainder {r}, else False.", "return n % {k} == {r}",
             _x(0, 200), lambda rng: (lambda k: {"k": k, "r": rng.randint(0, k - 1)})(rng.randint(3, 9))),
    Template("sum-times", 1, ("sum_times_{k}", "scaled_sum_{k}"), "a: int, b: int", "int",
             "Return the sum of a and b multiplied by {k}.", "return (a + b) * {k}", _xy(), _k(2, 9)),
    Template("difference-times", 1, ("gap_times_{k}", "difference_times_{k}"), "a: int, b: int", "int",
             "Return a minus b, multiplied by {k}.", "return (a - b) * {k}", _xy(), _k(2, 9)),
    Template("product-plus", 1, ("product_plus_{k}", "times_then_add_{k}"), "a: int, b: int", "int",
             "Return a times b plus {k}.", "return a * b + {k}", _xy(-20, 20), _k(1, 30)),
    Template("both-greater", 1, ("both_above_{k}", "both_over_{k}"), "a: int, b: int", "bool",
             "Return True if both a and b are greater than {k}, else False.", "return a > {k} and b > {k}",
             _xy(-20, 40), _k(0, 20)),
    Template("sum-three-plus", 1, ("sum3_plus_{k}", "add_three_plus_{k}"), "a: int, b: int, c: int", "int",
             "Return a plus b plus c plus {k}.", "return a + b + c + {k}",
             lambda rng, p: tuple(rng.randint(-50, 50) for _ in range(3)), _k(1, 50)),
    Template("square-minus", 1, ("square_minus_{k}", "squared_less_{k}"), "x: int", "int",
             "Return the square of x minus {k}.", "return x * x - {k}", _x(-20, 20), _k(1, 20)),
    Template("divide-float", 1, ("over_{k}", "fraction_{k}"), "x: int", "float",
             "Return x divided by {k} as a float.", "return x / {k}", _x(-200, 200), _k(2, 16)),
    Template("length-times", 1, ("length_times_{k}", "size_times_{k}"), "s: str", "int",
             "Return the length of s multiplied by {k}.", "return len(s) * {k}", _s, _k(2, 9)),
    Template("shorter-than", 1, ("shorter_than_{k}", "has_under_{k}_chars"), "s: str", "bool",
             "Return True if s has fewer than {k} characters, else False.", "return len(s) < {k}", _s, _k(1, 8)),
    # A second batch of tier-1 families: one expression each, on strings, pairs and units. The
    # bundled model passes a third of its tier-1 tasks, and its held-out zone (half the families)
    # needs >= 100 tasks with a margin over the run-to-run spread of the zone measurement.
    Template("first-chars", 1, ("first_{k}_chars", "head_{k}", "prefix_{k}"), "s: str", "str",
             "Return the first {k} characters of s (all of s if it is shorter).", "return s[:{k}]", _s, _k(1, 6)),
    Template("last-chars", 1, ("last_{k}_chars", "tail_{k}", "suffix_{k}"), "s: str", "str",
             "Return the last {k} characters of s (all of s if it is shorter).", "return s[-{k}:]", _s, _k(1, 6)),
    Template("drop-first", 1, ("drop_first_{k}", "skip_{k}_chars", "after_{k}"), "s: str", "str",
             "Return s without its first {k} characters (an empty string if s is not longer).",
             "return s[{k}:]", _s, _k(1, 6)),
    Template("sum-divisible-by", 1, ("sum_divisible_by_{k}", "pair_sum_multiple_of_{k}"), "a: int, b: int",
             "bool", "Return True if a plus b is divisible by {k}, else False.", "return (a + b) % {k} == 0",
             _xy(0, 100), _k(2, 9)),
    Template("clamp", 1, ("clamp_{a}_{b}", "bound_{a}_to_{b}"), "x: int", "int",
             "Return x limited to the range {a} to {b}: {a} if x is below {a}, {b} if x is above {b}, else x.",
             "return min(max(x, {a}), {b})", lambda rng, p: (rng.randint(p["a"] - 15, p["b"] + 15),),
             lambda rng: (lambda a: {"a": a, "b": a + rng.randint(5, 30)})(rng.randint(0, 20))),
    Template("unit-convert", 1, ("{big}_to_{small}",), "x: int", "int",
             "Return the number of {small} in x {big}.", "return x * {factor}", _x(0, 100),
             lambda rng: dict(zip(("big", "small", "factor"), rng.choice([
                 ("hours", "minutes", 60), ("minutes", "seconds", 60), ("days", "hours", 24), ("weeks", "days", 7),
                 ("years", "months", 12), ("meters", "centimeters", 100), ("kilograms", "grams", 1000),
                 ("feet", "inches", 12), ("dozens", "items", 12), ("kilometers", "meters", 1000)]), strict=True))),
    Template("either-above", 1, ("either_above_{k}", "one_over_{k}"), "a: int, b: int", "bool",
             "Return True if a or b (or both) is greater than {k}, else False.", "return a > {k} or b > {k}",
             _xy(-20, 40), _k(0, 20)),
    Template("sum-equals", 1, ("sums_to_{k}", "adds_up_to_{k}"), "a: int, b: int", "bool",
             "Return True if a plus b equals {k}, else False.", "return a + b == {k}",
             lambda rng, p: (lambda a: (a, rng.choice([p["k"] - a, rng.randint(-20, 40)])))(rng.randint(-20, 40)),
             _k(0, 30)),
    Template("contains-char", 1, ("has_letter_{c}", "contains_{c}"), "s: str", "bool",
             "Return True if the letter '{c}' occurs in s, else False.", "return {c!r} in s", _s, _char),
    Template("repeat-char", 1, ("row_of_{c}", "repeat_{c}"), "n: int", "str",
             "Return a string made of the letter '{c}' repeated n times.", "return {c!r} * n", _x(0, 10), _char),
    Template("char-from-end", 1, ("char_{k}_from_end", "back_{k}"), "s: str", "str",
             "Return the character of s at position {k} counted from its end, where the last character is "
             "at position 1 (s has at least {k} characters).", "return s[-{k}]",
             lambda rng, p: (_word(rng, p["k"], p["k"] + 6),), _k(1, 5)),
    Template("join-two", 1, ("join_with_{name}", "link_by_{name}"), "a: str, b: str", "str",
             "Return a and b joined with '{sep}' between them.", "return a + {sep!r} + b",
             lambda rng, p: (_word(rng, 0, 6), _word(rng, 0, 6)),
             lambda rng: (lambda sep: {"sep": sep, "name": {"-": "dash", "_": "underscore", ":": "colon",
                                                           "/": "slash", " ": "space", "=": "equals"}[sep]})(
                 rng.choice("-_:/ ="))),
    Template("is-word", 1, ("is_{w}", "equals_{w}", "says_{w}"), "s: str", "bool",
             "Return True if s is exactly the text '{w}', else False.", "return s == {w!r}",
             lambda rng, p: (rng.choice([p["w"], p["w"].upper(), _word(rng, 1, 6)]),),
             lambda rng: {"w": rng.choice(["yes", "stop", "go", "hello", "done", "ok", "exit", "start", "quit"])}),
    Template("close-to", 1, ("within_{k}", "close_within_{k}"), "a: int, b: int", "bool",
             "Return True if a and b differ by at most {k}, else False.", "return abs(a - b) <= {k}",
             lambda rng, p: (lambda a: (a, a + rng.randint(-2 * p["k"], 2 * p["k"])))(rng.randint(-30, 30)),
             _k(1, 10)),
    Template("round-down", 1, ("round_down_to_{k}", "floor_to_multiple_of_{k}"), "n: int", "int",
             "Return the largest multiple of {k} that is at most the non-negative integer n.",
             "return n - n % {k}", _x(0, 500), _k(2, 12)),
    Template("average-of-two", 1, ("average_of_two", "midpoint", "mean_of_two"), "a: int, b: int", "float",
             "Return the average of a and b as a float.", "return (a + b) / 2", _xy()),
    Template("min-of-two", 1, ("smaller", "min_of_two", "lesser"), "a: int, b: int", "int",
             "Return the smaller of a and b.", "return a if a <= b else b", _xy()),
    # A third batch in the shapes the bundled model passes a third to a half of the time (an equality
    # or a remainder test, a power, a length): measured per family, 11 of the 17 families of the
    # second batch held no more than one task of the model's zone.
    Template("difference-equals", 1, ("differ_by_{k}", "gap_is_{k}"), "a: int, b: int", "bool",
             "Return True if a minus b equals {k}, else False.", "return a - b == {k}",
             lambda rng, p: (lambda b: (rng.choice([b + p["k"], rng.randint(-20, 40)]), b))(rng.randint(-20, 40)),
             _k(0, 30)),
    Template("product-equals", 1, ("product_is_{k}", "multiplies_to_{k}"), "a: int, b: int", "bool",
             "Return True if a times b equals {k}, else False.", "return a * b == {k}",
             lambda rng, p: rng.choice([(d, p["k"] // d) for d in range(1, p["k"] + 1) if p["k"] % d == 0]
                                       + [(rng.randint(1, 12), rng.randint(1, 12))]), _k(6, 48)),
    Template("remainder-of-sum", 1, ("sum_mod_{k}", "pair_remainder_{k}"), "a: int, b: int", "int",
             "Return the remainder of a plus b divided by {k} (a and b are non-negative).",
             "return (a + b) % {k}", _xy(0, 100), _k(3, 11)),
    Template("cube-plus", 1, ("cube_plus_{k}", "cubed_plus_{k}"), "x: int", "int",
             "Return the cube of x plus {k}.", "return x ** 3 + {k}", _x(-10, 10), _k(1, 20)),
    Template("scaled-square", 1, ("square_times_{k}", "scaled_square_{k}"), "x: int", "int",
             "Return {k} times the square of x.", "return {k} * x * x", _x(-15, 15), _k(2, 9)),
    Template("length-equals", 1, ("has_{k}_chars", "length_is_{k}"), "s: str", "bool",
             "Return True if s has exactly {k} characters, else False.", "return len(s) == {k}",
             lambda rng, p: (rng.choice([_word(rng, p["k"], p["k"]), _word(rng, 0, 9)]),), _k(1, 8)),
    Template("length-minus", 1, ("length_minus_{k}", "size_less_{k}"), "s: str", "int",
             "Return the length of s minus {k}.", "return len(s) - {k}", _s, _k(1, 9)),
    Template("even-after-adding", 1, ("even_plus_{k}", "is_even_after_{k}"), "x: int", "bool",
             "Return True if x plus {k} is even, else False.", "return (x + {k}) % 2 == 0", _x(), _k(1, 15)),
    Template("multiple-of-either", 1, ("multiple_of_{a}_or_{b}", "divisible_by_{a}_or_{b}"), "n: int", "bool",
             "Return True if n is divisible by {a} or by {b}, else False.", "return n % {a} == 0 or n % {b} == 0",
             _x(0, 200), lambda rng: dict(zip("ab", sorted(rng.sample(range(2, 10), 2)), strict=True))),
    Template("divides-constant", 1, ("divides_{k}", "is_divisor_of_{k}"), "n: int", "bool",
             "Return True if {k} is divisible by the positive integer n, else False.", "return {k} % n == 0",
             _x(1, 30), lambda rng: {"k": rng.choice([12, 18, 20, 24, 30, 36, 40, 48, 60, 72])}),
    Template("half-plus", 1, ("half_plus_{k}", "halved_plus_{k}"), "x: int", "float",
             "Return x divided by 2, plus {k}, as a float.", "return x / 2 + {k}", _x(-100, 100), _k(1, 30)),
    Template("sum-over", 1, ("sum_over_{k}", "pair_share_{k}"), "a: int, b: int", "float",
             "Return a plus b, divided by {k}, as a float.", "return (a + b) / {k}", _xy(), _k(2, 10)),
    Template("square-of-sum", 1, ("square_of_sum", "sum_squared", "squared_total"), "a: int, b: int", "int",
             "Return the square of a plus b: (a + b) squared.", "return (a + b) ** 2", _xy(-20, 20)),
    Template("last-digit-is", 1, ("ends_in_{k}", "last_digit_is_{k}"), "n: int", "bool",
             "Return True if the last decimal digit of the non-negative integer n is {k}, else False.",
             "return n % 10 == {k}", lambda rng, p: (rng.choice([10 * rng.randint(0, 50) + p["k"],
                                                                 rng.randint(0, 500)]),), _k(0, 9)),
    Template("divisible-by-other", 1, ("divisible_by", "is_multiple", "divides_evenly"), "a: int, b: int",
             "bool", "Return True if a is divisible by the positive integer b, else False.",
             "return a % b == 0", lambda rng, p: (rng.randint(0, 100), rng.randint(1, 12))),
    Template("remainder-of-product", 1, ("product_mod_{k}", "times_remainder_{k}"), "a: int, b: int", "int",
             "Return the remainder of a times b divided by {k} (a and b are non-negative).",
             "return a * b % {k}", _xy(0, 50), _k(3, 11)),
    # --- tier 2: one pass over a list or a string ------------------------------------------------
    Template("sum-list-times", 2, ("sum_times_{k}_list", "scaled_total_{k}"), "xs: list[int]", "int",
             "Return the sum of the numbers in xs multiplied by {k}.", "return sum(xs) * {k}", _xs(), _k(2, 9)),
    Template("sum-below", 2, ("sum_under_{k}", "total_below_{k}"), "xs: list[int]", "int",
             "Return the sum of the numbers in xs that are less than {k}.",
             "return sum(x for x in xs if x < {k})", _xs(), _k(-5, 10)),
    Template("sum-divisible", 2, ("sum_multiples_of_{k}", "divisible_total_{k}"), "xs: list[int]", "int",
             "Return the sum of the numbers in xs that are divisible by {k}.",
             "return sum(x for x in xs if x % {k} == 0)", _xs(0, 50), _k(2, 7)),
    Template("subtract-all", 2, ("lower_all_{k}", "take_{k}_from_each"), "xs: list[int]", "list[int]",
             "Return a new list with {k} subtracted from every number of xs.", "return [x - {k} for x in xs]",
             _xs(), _k(1, 20)),
    Template("max-plus", 2, ("max_plus_{k}", "largest_plus_{k}"), "xs: list[int]", "int",
             "Return the largest number in the non-empty list xs plus {k}.", "return max(xs) + {k}",
             _xs(n_lo=1), _k(1, 20)),
    Template("min-plus", 2, ("min_plus_{k}", "smallest_plus_{k}"), "xs: list[int]", "int",
             "Return the smallest number in the non-empty list xs plus {k}.", "return min(xs) + {k}",
             _xs(n_lo=1), _k(1, 20)),
    Template("first-plus", 2, ("first_plus_{k}", "head_plus_{k}"), "xs: list[int]", "int",
             "Return the first number of the non-empty list xs plus {k}.", "return xs[0] + {k}",
             _xs(n_lo=1), _k(1, 20)),
    Template("count-plus", 2, ("count_plus_{k}", "items_plus_{k}"), "xs: list[int]", "int",
             "Return the number of elements of xs plus {k}.", "return len(xs) + {k}", _xs(), _k(1, 9)),
    Template("sum-list", 2, ("total", "sum_list", "add_all"), "xs: list[int]", "int",
             "Return the sum of the numbers in xs (0 for an empty list).", "return sum(xs)", _xs()),
    Template("count-greater", 2, ("count_above_{k}", "how_many_over_{k}"), "xs: list[int]", "int",
             "Return how many numbers in xs are greater than {k}.", "return sum(1 for x in xs if x > {k})",
             _xs(), _k(-5, 10)),
    Template("keep-evens", 2, ("evens", "keep_even", "only_even"), "xs: list[int]", "list[int]",
             "Return the even numbers of xs, in their order.", "return [x for x in xs if x % 2 == 0]", _xs()),
    Template("add-to-all", 2, ("shift_all_{k}", "add_{k}_to_each"), "xs: list[int]", "list[int]",
             "Return a new list with {k} added to every number of xs.", "return [x + {k} for x in xs]",
             _xs(), _k(1, 20)),
    Template("max-list", 2, ("largest", "max_value", "biggest"), "xs: list[int]", "int",
             "Return the largest number in the non-empty list xs.", "return max(xs)", _xs(n_lo=1)),
    Template("count-char", 2, ("count_{c}", "number_of_{c}"), "s: str", "int",
             "Return how many times the letter '{c}' occurs in s.", "return s.count({c!r})", _sent, _char),
    Template("reverse-string", 2, ("reverse", "backwards", "mirror"), "s: str", "str",
             "Return s reversed.", "return s[::-1]", _s),
    Template("sum-squares", 2, ("sum_of_squares", "square_sum"), "xs: list[int]", "int",
             "Return the sum of the squares of the numbers in xs.", "return sum(x * x for x in xs)", _xs(-10, 10)),
    Template("word-count", 2, ("word_count", "count_words"), "s: str", "int",
             "Return the number of words in s (words are separated by spaces).", "return len(s.split())", _sent),
    Template("remove-char", 2, ("drop_{c}", "without_{c}"), "s: str", "str",
             "Return s with every '{c}' removed.", "return s.replace({c!r}, '')", _sent, _char),
    Template("product-list", 2, ("product", "multiply_all"), "xs: list[int]", "int",
             "Return the product of the numbers in xs (1 for an empty list).",
             "result = 1\n    for x in xs:\n        result *= x\n    return result", _xs(-5, 5, 6)),
    Template("first-word", 2, ("first_word", "head_word"), "s: str", "str",
             "Return the first word of the non-empty sentence s (words are separated by spaces).",
             "return s.split()[0]", _sent),
    Template("count-negatives", 2, ("count_negative", "negatives"), "xs: list[int]", "int",
             "Return how many numbers in xs are negative.", "return sum(1 for x in xs if x < 0)", _xs()),
    Template("double-all", 2, ("double_each", "doubled"), "xs: list[int]", "list[int]",
             "Return a new list with every number of xs doubled.", "return [2 * x for x in xs]", _xs()),
    Template("contains", 2, ("has_{k}", "contains_{k}"), "xs: list[int]", "bool",
             "Return True if the number {k} is in xs, else False.", "return {k} in xs", _xs(0, 9), _k(0, 9)),
    Template("average", 2, ("mean", "average"), "xs: list[int]", "float",
             "Return the average of the non-empty list xs as a float.", "return sum(xs) / len(xs)",
             _xs(-20, 20, 8, 1)),
    Template("sum-above", 2, ("sum_over_{k}", "total_above_{k}"), "xs: list[int]", "int",
             "Return the sum of the numbers in xs that are greater than {k}.",
             "return sum(x for x in xs if x > {k})", _xs(), _k(-5, 10)),
    Template("keep-above", 2, ("keep_over_{k}", "filter_above_{k}"), "xs: list[int]", "list[int]",
             "Return the numbers of xs that are greater than {k}, in their order.",
             "return [x for x in xs if x > {k}]", _xs(), _k(-5, 10)),
    Template("scale-all", 2, ("scale_all_{k}", "times_{k}_each"), "xs: list[int]", "list[int]",
             "Return a new list with every number of xs multiplied by {k}.", "return [x * {k} for x in xs]",
             _xs(), _k(3, 10)),
    Template("count-value", 2, ("count_{k}s", "occurrences_of_{k}"), "xs: list[int]", "int",
             "Return how many times the number {k} occurs in xs.", "return xs.count({k})", _xs(0, 5, 10), _k(0, 5)),
    Template("count-divisible", 2, ("count_multiples_of_{k}", "divisible_count_{k}"), "xs: list[int]", "int",
             "Return how many numbers in xs are divisible by {k}.", "return sum(1 for x in xs if x % {k} == 0)",
             _xs(0, 50), _k(2, 7)),
    Template("replace-char", 2, ("swap_{a}_{b}", "replace_{a}_with_{b}"), "s: str", "str",
             "Return s with every '{a}' replaced by '{b}'.", "return s.replace({a!r}, {b!r})", _sent,
             lambda rng: dict(zip("ab", rng.sample("aeioustrn", 2), strict=True))),
    Template("words-starting", 2, ("count_words_with_{c}", "words_starting_{c}"), "s: str", "int",
             "Return how many words of s start with the letter '{c}' (words are separated by spaces).",
             "return sum(1 for w in s.split() if w.startswith({c!r}))", _sent, _char),
    Template("all-above", 2, ("all_over_{k}", "every_above_{k}"), "xs: list[int]", "bool",
             "Return True if every number in xs is greater than {k} (True for an empty list).",
             "return all(x > {k} for x in xs)",
             lambda rng, p: (rng.choice([_ints(p["k"] + 1, p["k"] + 20)(rng), _ints(-10, 20)(rng)]),), _k(-5, 5)),
    Template("any-below", 2, ("any_under_{k}", "some_below_{k}"), "xs: list[int]", "bool",
             "Return True if at least one number in xs is less than {k}, else False.",
             "return any(x < {k} for x in xs)",
             lambda rng, p: (rng.choice([_ints(p["k"], p["k"] + 20)(rng), _ints(-10, 20)(rng)]),), _k(-5, 5)),
    Template("word-lengths", 2, ("word_lengths", "lengths_of_words"), "s: str", "list[int]",
             "Return the length of each word of s, in order (words are separated by spaces).",
             "return [len(w) for w in s.split()]", _sent),
    Template("keep-long-words", 2, ("words_over_{k}", "long_words_{k}"), "s: str", "list[str]",
             "Return the words of s with more than {k} letters, in order (words are separated by spaces).",
             "return [w for w in s.split() if len(w) > {k}]", _sent, _k(2, 5)),
    Template("clip-all", 2, ("clip_to_{k}", "cap_all_{k}"), "xs: list[int]", "list[int]",
             "Return a new list where every number of xs greater than {k} is replaced by {k}.",
             "return [min(x, {k}) for x in xs]", _xs(), _k(0, 10)),
    Template("min-list", 2, ("smallest_in", "min_value", "lowest"), "xs: list[int]", "int",
             "Return the smallest number in the non-empty list xs.", "return min(xs)", _xs(n_lo=1)),
    Template("join-words", 2, ("join_with_{name}", "glue_{name}"), "words: list[str]", "str",
             "Return the strings of words joined with '{sep}' between them.", "return {sep!r}.join(words)",
             lambda rng, p: ([_word(rng, 1, 5) for _ in range(rng.randint(0, 5))],),
             lambda rng: (lambda sep: {"sep": sep, "name": {"-": "dashes", ",": "commas", "+": "plus",
                                                           "/": "slashes", ", ": "comma_space"}[sep]})(
                 rng.choice(["-", ",", "+", "/", ", "]))),
    Template("upper-words", 2, ("upper_each", "shout_words"), "words: list[str]", "list[str]",
             "Return a new list with every string of words in upper case.", "return [w.upper() for w in words]",
             lambda rng, p: ([_word(rng, 1, 6) for _ in range(rng.randint(0, 5))],)),
    Template("count-in-range", 2, ("count_between_{a}_{b}", "how_many_in_{a}_{b}"), "xs: list[int]", "int",
             "Return how many numbers in xs are at least {a} and at most {b}.",
             "return sum(1 for x in xs if {a} <= x <= {b})", _xs(-10, 30),
             lambda rng: (lambda a: {"a": a, "b": a + rng.randint(3, 15)})(rng.randint(-5, 10))),
    # --- tier 3: a loop with state, or a small algorithm ------------------------------------------
    Template("count-vowels", 3, ("count_vowels", "vowel_count"), "s: str", "int",
             "Return the number of vowels (a, e, i, o, u) in the lowercase string s.",
             "return sum(1 for ch in s if ch in 'aeiou')", _sent),
    Template("palindrome", 3, ("is_palindrome", "reads_same_backwards"), "s: str", "bool",
             "Return True if s reads the same forwards and backwards.", "return s == s[::-1]",
             lambda rng, p: (rng.choice([_word(rng, 0, 6), (lambda w: w + w[::-1])(_word(rng, 1, 4))]),)),
    Template("factorial", 3, ("factorial", "fact"), "n: int", "int",
             "Return n! (the product 1 * 2 * ... * n; 0! is 1) for n >= 0.",
             "result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result", _x(0, 12)),
    Template("fizzbuzz", 3, ("fizz_buzz", "fizzbuzz_word"), "n: int", "str",
             "Return 'Fizz' if n is divisible by {a}, 'Buzz' if by {b}, 'FizzBuzz' if by both, "
             "otherwise str(n).",
             "if n % {a} == 0 and n % {b} == 0:\n        return 'FizzBuzz'\n    if n % {a} == 0:\n"
             "        return 'Fizz'\n    if n % {b} == 0:\n        return 'Buzz'\n    return str(n)", _x(1, 100),
             lambda rng: dict(zip("ab", rng.sample([2, 3, 5, 7], 2), strict=True))),
    Template("sum-digits", 3, ("digit_sum", "sum_digits"), "n: int", "int",
             "Return the sum of the decimal digits of the non-negative integer n.",
             "return sum(int(d) for d in str(n))", _x(0, 100000)),
    Template("is-prime", 3, ("is_prime", "prime"), "n: int", "bool",
             "Return True if n is a prime number, else False.",
             "if n < 2:\n        return False\n    for d in range(2, int(n ** 0.5) + 1):\n        if n % d == 0:\n"
             "            return False\n    return True", _x(0, 200)),
    Template("fibonacci", 3, ("fib", "fibonacci"), "n: int", "int",
             "Return the n-th Fibonacci number, with fib(0) = 0 and fib(1) = 1.",
             "a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a", _x(0, 30)),
    Template("reverse-words", 3, ("reverse_words", "words_backwards"), "s: str", "str",
             "Return the words of s in reverse order, joined by single spaces.",
             "return ' '.join(reversed(s.split()))", _sent),
    Template("running-sum", 3, ("running_total", "cumulative_sum"), "xs: list[int]", "list[int]",
             "Return the running sums of xs: element i is xs[0] + ... + xs[i].",
             "out, total = [], 0\n    for x in xs:\n        total += x\n        out.append(total)\n    return out",
             _xs()),
    Template("second-largest", 3, ("second_largest", "runner_up"), "xs: list[int]", "int",
             "Return the second largest distinct number in xs (xs has at least two distinct numbers).",
             "return sorted(set(xs))[-2]",
             lambda rng, p: (lambda v: (v + [max(v) + rng.randint(1, 5)],))(_ints(-20, 20, 1, 7)(rng))),
    Template("unique-sorted", 3, ("unique_sorted", "distinct_sorted"), "xs: list[int]", "list[int]",
             "Return the distinct numbers of xs in increasing order.", "return sorted(set(xs))", _xs(0, 9, 10)),
    Template("caesar", 3, ("shift_letters_{k}", "caesar_{k}"), "s: str", "str",
             "Shift every lowercase letter of s forward by {k} in the alphabet (z wraps to a); keep spaces.",
             "return ''.join(chr((ord(ch) - 97 + {k}) % 26 + 97) if ch.islower() else ch for ch in s)",
             _sent, _k(1, 5)),
    Template("longest-word", 3, ("longest_word", "longest"), "s: str", "str",
             "Return the longest word of the non-empty sentence s; the first one if several tie.",
             "return max(s.split(), key=len)", _sent),
    Template("count-long-words", 3, ("count_long_words", "long_words"), "s: str", "int",
             "Return how many words of s have more than {k} letters.",
             "return sum(1 for w in s.split() if len(w) > {k})", _sent, _k(2, 5)),
    Template("max-run", 3, ("longest_run", "max_streak"), "xs: list[int]", "int",
             "Return the length of the longest run of equal adjacent numbers in xs (0 for an empty list).",
             "best = run = 0\n    for i, x in enumerate(xs):\n        run = run + 1 if i and xs[i - 1] == x else 1\n"
             "        best = max(best, run)\n    return best", _xs(0, 2, 9)),
    Template("gcd", 3, ("gcd", "greatest_common_divisor"), "a: int, b: int", "int",
             "Return the greatest common divisor of the positive integers a and b.",
             "while b:\n        a, b = b, a % b\n    return a", _xy(1, 200)),
    Template("digits-list", 3, ("digits", "to_digits"), "n: int", "list[int]",
             "Return the decimal digits of the non-negative integer n, most significant first.",
             "return [int(d) for d in str(n)]", _x(0, 99999)),
)


def _fmt(text: str, params: dict[str, Any]) -> str:
    return text.format(**params) if params else text


@dataclass(frozen=True)
class Variant:
    template: Template
    index: int
    name: str
    params: dict[str, Any]
    examples: list[tuple[tuple, Any]]     # shown in the docstring
    cases: list[tuple[tuple, Any]]        # hidden tests (examples included)

    @property
    def task_id(self) -> str:
        return f"{SOURCE}/{self.template.family}-{self.index}"

    def signature(self) -> str:
        return f"def {self.name}({self.template.args}) -> {self.template.returns}:"

    def reference(self) -> str:
        return f"{self.signature()}\n    {_fmt(self.template.body, self.params)}\n"

    def prompt(self) -> str:
        """The signature and docstring with examples (what the instruction and the stub show)."""
        lines = [self.signature(), f'    """{_fmt(self.template.doc, self.params)}', ""]
        lines += [f"    >>> {self.name}({', '.join(map(repr, a))})\n    {r!r}" for a, r in self.examples]
        lines.append('    """')
        return "\n".join(lines) + "\n"


def _call(fn: Callable, args: tuple) -> Any:
    out = fn(*args)
    return round(out, 6) if isinstance(out, float) else out


def make_variant(template: Template, index: int, seed: int = 0, *, examples: int = 2, cases: int = 8) -> Variant:
    rng = random.Random(f"{seed}:{template.family}:{index}")
    params = template.params(rng)
    name = rng.choice(template.names).format(**params).replace("-", "minus_")
    ns: dict[str, Any] = {}
    v = Variant(template, index, name, params, [], [])
    exec(compile(v.reference(), f"<{v.task_id}>", "exec"), ns)   # our own template, never task input
    fn = ns[name]
    seen: dict[str, tuple[tuple, Any]] = {}
    for _ in range(cases * 10):
        if len(seen) >= cases:
            break
        args = template.inputs(rng, params)
        seen.setdefault(repr(args), (args, _call(fn, args)))
    all_cases = list(seen.values())
    return Variant(template, index, name, params, all_cases[:examples], all_cases)


def hidden_test_source(v: Variant) -> str:
    rows = ",\n".join(f"    ({a!r}, {r!r})" for a, r in v.cases)
    approx = v.template.returns == "float"
    check = "assert abs(got - expected) < 1e-6" if approx else "assert got == expected"
    return (f'"""Hidden tests of {v.task_id}: {v.name} on {len(v.cases)} inputs."""\n\n'
            f"import pytest\n\nfrom solution import {v.name}\n\nCASES = [\n{rows},\n]\n\n\n"
            f"@pytest.mark.parametrize(('args', 'expected'), CASES)\n"
            f"def test_{v.name}(args, expected):\n    got = {v.name}(*args)\n    {check}\n")


def instruction_for(v: Variant) -> str:
    return (f"Implement `{v.name}` in `solution.py` as its docstring describes; the tests import it from "
            f"`solution.py`.\n\n```python\n{v.prompt().rstrip()}\n```\n")


def function_task(v: Variant, dest: str | Path) -> Task:
    t = v.template
    meta = TaskMeta(
        id=v.task_id, family=f"{SOURCE}-{t.family}", project=SOURCE, source=SOURCE,
        description=f"{t.family} (tier {t.tier}): {v.name}", tier=TIERS[t.tier],
        tags=["function", f"tier-{t.tier}"], test_command="python3 -m pytest -q tests", test_timeout_s=60.0,
        answer_file="solution.py",
        origin={"template": t.family, "tier": t.tier, "variant": v.index, "params": v.params})
    stub = v.prompt() + "    raise NotImplementedError\n"
    return Task.create(dest, meta, instruction_for(v), workspace={"solution.py": stub},
                       tests={TEST_FILE: hidden_test_source(v)}, solution={"solution.py": v.prompt() + "    " +
                                                                          _fmt(t.body, v.params) + "\n"})


PER_FAMILY = 8     # variants per template in the default build (fewer where a template has fewer names)


def function_variants(*, per_family: int = PER_FAMILY, seed: int = 0,
                      families: list[str] | None = None) -> list[Variant]:
    """`per_family` distinct variants of every template (or of `families`), in template order."""
    out: list[Variant] = []
    for t in TEMPLATES:
        if families is not None and t.family not in families:
            continue
        names: set[str] = set()
        for i in range(per_family * 4):     # a name may repeat across draws: keep distinct ones
            if len(names) >= per_family:
                break
            v = make_variant(t, i, seed)
            key = f"{v.name}:{sorted(v.params.items())}"
            if key in names:
                continue
            names.add(key)
            out.append(v)
    return out


def function_tasks(dest_root: str | Path, *, per_family: int = PER_FAMILY, seed: int = 0,
                   families: list[str] | None = None) -> list[Task]:
    """`per_family` variants of every template (or of `families`), written under `dest_root`."""
    root = Path(dest_root)
    return [function_task(v, root / SOURCE / f"{v.template.family}-{v.index}")
            for v in function_variants(per_family=per_family, seed=seed, families=families)]


def build_key(*, per_family: int = PER_FAMILY, seed: int = 0) -> str:
    """What the default build of this source is made of (every variant's id, instruction and hidden
    tests): a store built under another key lacks tasks (templates were added) and gates them."""
    h = hashlib.sha256()
    for v in function_variants(per_family=per_family, seed=seed):
        for part in (v.task_id, instruction_for(v), hidden_test_source(v)):
            h.update(part.encode() + b"\0")
    return f"functions:{h.hexdigest()[:16]}"
