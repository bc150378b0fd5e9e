"""Templates of the generated code problems: small stdin/stdout tasks, each parametrised by the seed.

A template is ``template(rng) -> (statement, reference program, input generator)``. The statement fixes the
input and output formats; its parameters (divisors, words, bases, orders, moduli...) come from ``rng``, so one
template yields many distinct statements, which ``splits.draw`` assigns to train or eval by content hash. The
reference programs read with ``input()`` and write with ``print()`` only (``code_data.run_trusted`` runs them
in-process to make the hidden tests; the sandbox runs the same text as the scripted coder's answer).

Departure from the paper: the paper trains on CodeContests / APPS; these toy problems stand in for them on a
machine without the data (the ``jsonl`` dataset reads the real ones).
"""

from __future__ import annotations

import random
from typing import Callable

Template = Callable[[random.Random], tuple[str, str, Callable[[random.Random], str]]]
WORDS = ["Fizz", "Buzz", "Foo", "Bar", "Ping", "Pong", "Zip", "Zap", "Tick", "Tock"]
YES_NO = [("YES", "NO"), ("Yes", "No"), ("TRUE", "FALSE"), ("1", "0"), ("OK", "FAIL")]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
TEXT_WORDS = ["apple", "Banana", "cat", "dog", "Echo", "level", "noon", "tree", "sun", "moon", "Radar", "a", "Zebra"]


def _prog(body: str, **consts: object) -> str:
    head = "".join(f"{k} = {v!r}\n" for k, v in consts.items())
    return head + body.strip("\n") + "\n"


def _ints(r: random.Random, n: int, lo: int = -50, hi: int = 50) -> str:
    return " ".join(str(r.randint(lo, hi)) for _ in range(n))


def _list_input(lo: int = -50, hi: int = 50, min_n: int = 1, max_n: int = 8) -> Callable[[random.Random], str]:
    def gen(r: random.Random) -> str:
        n = r.randint(min_n, max_n)
        return f"{n}\n{_ints(r, n, lo, hi)}\n"
    return gen


def _sentence(r: random.Random, lo: int = 1, hi: int = 7) -> str:
    return " ".join(r.choice(TEXT_WORDS) for _ in range(r.randint(lo, hi)))


def _line(r: random.Random) -> str:
    return _sentence(r) + "\n"


LIST_IN = "The first line holds an integer n (1 <= n <= 8); the second line holds n integers."


def filter_aggregate(rng: random.Random):
    kind = rng.choice(["div", "gt", "odd", "even"])
    k = rng.randint(2, 9) if kind == "div" else rng.randint(-9, 9)
    cond = {"div": f"divisible by {k}", "gt": f"greater than {k}", "odd": "odd", "even": "even"}[kind]
    test = {"div": "x % K == 0", "gt": "x > K", "odd": "x % 2 != 0", "even": "x % 2 == 0"}[kind]
    agg = rng.choice(["sum", "count", "max"])
    what = {"sum": "the sum of the integers that are", "count": "how many of the integers are",
            "max": "the largest of the integers that are"}[agg]
    tail = " (print NONE if there is none)" if agg == "max" else ""
    body = f"""n = int(input())
xs = [x for x in map(int, input().split()) if {test}]
""" + {"sum": "print(sum(xs))", "count": "print(len(xs))", "max": "print(max(xs) if xs else 'NONE')"}[agg]
    return f"{LIST_IN} Print {what} {cond}{tail}.", _prog(body, K=k), _list_input()


def order_statistic(rng: random.Random):
    k = rng.randint(1, 3)
    side = rng.choice(["smallest", "largest"])
    ordinal = {1: "", 2: "second ", 3: "third "}[k]
    body = "n = int(input())\nxs = sorted(map(int, input().split()), reverse=REV)\nprint(xs[K - 1])"
    return (f"The first line holds an integer n ({k} <= n <= 8); the second line holds n integers. Print the "
            f"{ordinal}{side} of them (counting repeated values separately).",
            _prog(body, K=k, REV=side == "largest"), _list_input(min_n=k))


def reverse_text(rng: random.Random):
    mode = rng.choice(["chars", "words", "each"])
    case = rng.choice(["as it is", "in upper case", "in lower case", "with the case of every letter swapped"])
    what = {"chars": "the line reversed character by character", "words": "its words in reverse order",
            "each": "every word reversed, words kept in their order"}[mode]
    expr = {"chars": "s[::-1]", "words": "' '.join(s.split()[::-1])", "each": "' '.join(w[::-1] for w in s.split())"}
    fix = {"as it is": "", "in upper case": ".upper()", "in lower case": ".lower()",
           "with the case of every letter swapped": ".swapcase()"}[case]
    return (f"The input is one line of words (letters only) separated by single spaces. Print {what}, {case}.",
            _prog(f"s = input()\nprint(({expr[mode]}){fix})"), _line)


def count_letters(rng: random.Random):
    kind = rng.choice(["letter", "vowels", "upper"])
    c = rng.choice(LETTERS)
    what = {"letter": f"how many times the letter '{c}' occurs, ignoring case", "vowels":
            "how many vowels (a, e, i, o, u, either case) it contains", "upper": "how many upper-case letters it has"}
    test = {"letter": "ch.lower() == C", "vowels": "ch.lower() in 'aeiou'", "upper": "ch.isupper()"}[kind]
    return (f"The input is one line of words separated by spaces. Print {what[kind]}.",
            _prog(f"s = input()\nprint(sum(1 for ch in s if {test}))", C=c), _line)


def fizzbuzz(rng: random.Random):
    a, b = rng.sample(range(2, 8), 2)
    wa, wb = rng.sample(WORDS, 2)
    body = """n = int(input())
for i in range(1, n + 1):
    s = (WA if i % A == 0 else '') + (WB if i % B == 0 else '')
    print(s or i)"""
    return (f"The input is an integer n (1 <= n <= 30). For i = 1..n print one line: '{wa}{wb}' if i is divisible "
            f"by both {a} and {b}, '{wa}' if only by {a}, '{wb}' if only by {b}, else i itself.",
            _prog(body, A=a, B=b, WA=wa, WB=wb), lambda r: f"{r.randint(1, 30)}\n")


def gcd_lcm(rng: random.Random):
    op = rng.choice(["greatest common divisor", "least common multiple"])
    fn = "math.gcd" if op.startswith("greatest") else "math.lcm"
    return (f"{LIST_IN.replace('integers.', 'positive integers (at most 60).')} Print their {op}.",
            _prog(f"import math\nn = int(input())\nprint({fn}(*map(int, input().split())))"),
            _list_input(1, 60))


def primes(rng: random.Random):
    yes, no = rng.choice(YES_NO)
    body = """def is_prime(m):
    return m > 1 and all(m % d for d in range(2, int(m ** 0.5) + 1))
q = int(input())
for _ in range(q):
    print(Y if is_prime(int(input())) else N)"""
    return (f"The first line holds q (1 <= q <= 6); each of the next q lines holds an integer m (0 <= m <= 10000). "
            f"For each m print {yes} if m is prime, else {no}, one answer per line.",
            _prog(body, Y=yes, N=no),
            lambda r: (lambda q: f"{q}\n" + "".join(f"{r.randint(0, 10000 if r.random() < .5 else 30)}\n"
                                                    for _ in range(q)))(r.randint(1, 6)))


def sort_numbers(rng: random.Random):
    desc, lines, unique = rng.random() < 0.5, rng.random() < 0.5, rng.random() < 0.5
    body = "n = int(input())\nxs = list(map(int, input().split()))\nxs = sorted(set(xs) if UNIQUE else xs, " \
           "reverse=DESC)\nprint(*xs, sep=SEP)"
    return (f"{LIST_IN} Print {'the distinct values' if unique else 'them'} in "
            f"{'descending' if desc else 'ascending'} order, {'one per line' if lines else 'separated by spaces'}.",
            _prog(body, DESC=desc, UNIQUE=unique, SEP="\n" if lines else " "), _list_input(-9, 9))


def prefix_scan(rng: random.Random):
    kind = rng.choice(["sums", "maxima", "minima"])
    m = rng.choice([0, 7, 10, 97, 1000])
    op = {"sums": "acc + x", "maxima": "max(acc, x)", "minima": "min(acc, x)"}[kind]
    mod = f" Print every value modulo {m} (a result in 0..{m - 1})." if m and kind == "sums" else ""
    body = f"""n = int(input())
out = []
for i, x in enumerate(map(int, input().split())):
    acc = x if i == 0 else {op}
    out.append(acc % M if M else acc)
print(*out)"""
    return (f"{LIST_IN} Print the n running {kind} (the i-th value covers the first i integers), separated by "
            f"spaces.{mod}", _prog(body, M=m if kind == "sums" else 0), _list_input())


def word_stats(rng: random.Random):
    kind = rng.choice(["count", "distinct", "longest", "frequent"])
    fold = rng.random() < 0.5
    what = {"count": "the number of words", "distinct": "the number of distinct words",
            "longest": "the longest word (the first one if several are longest)",
            "frequent": "the most frequent word (the alphabetically smallest if tied)"}[kind]
    expr = {"count": "len(ws)", "distinct": "len(set(ws))", "longest": "max(ws, key=len)",
            "frequent": "min(set(ws), key=lambda w: (-ws.count(w), w))"}[kind]
    case = " Treat upper and lower case as equal and print words in lower case." if fold else ""
    return (f"The input is one line of words separated by spaces. Print {what}.{case}",
            _prog(f"ws = input().split()\nif FOLD:\n    ws = [w.lower() for w in ws]\nprint({expr})", FOLD=fold),
            _line)


def digits(rng: random.Random):
    b = rng.randint(2, 10)
    kind = rng.choice(["sum", "count", "root"])
    what = {"sum": "the sum of its digits", "count": "the number of its digits",
            "root": "its digital root (repeat summing the digits until one digit is left; print that digit "
                    "in base 10)"}[kind]
    body = """def ds(n):
    s, c = 0, 0
    while True:
        s, c, n = s + n % B, c + 1, n // B
        if n == 0:
            return s, c
n = int(input())
s, c = ds(n)
if KIND == 'count':
    print(c)
elif KIND == 'sum':
    print(s)
else:
    while n >= B:
        n = ds(n)[0]
    print(n)"""
    return (f"The input is an integer n (0 <= n <= 10^9). Write n in base {b} and print {what}.",
            _prog(body, B=b, KIND=kind), lambda r: f"{r.randint(0, 10 ** r.randint(1, 9))}\n")


def palindrome(rng: random.Random):
    yes, no = rng.choice(YES_NO)
    loose = rng.random() < 0.5
    rule = "ignoring case and spaces" if loose else "exactly (case and spaces count)"
    body = "s = input()\nif LOOSE:\n    s = s.replace(' ', '').lower()\nprint(Y if s == s[::-1] else N)"
    return (f"The input is one line of letters and spaces. Print {yes} if it reads the same backwards, {rule}, "
            f"else {no}.", _prog(body, Y=yes, N=no, LOOSE=loose),
            lambda r: (lambda s: s + s[::-1] if r.random() < 0.4 else s)(_sentence(r, 1, 3)) + "\n")


def matrix(rng: random.Random):
    kind = rng.choice(["row sums", "column sums", "transpose"])
    out = {"row sums": "the r row sums on one line", "column sums": "the c column sums on one line",
           "transpose": "the transposed matrix: c lines of r integers"}[kind]
    body = """r, c = map(int, input().split())
a = [list(map(int, input().split())) for _ in range(r)]
if KIND == 'row sums':
    print(*[sum(row) for row in a])
elif KIND == 'column sums':
    print(*[sum(col) for col in zip(*a)])
else:
    for col in zip(*a):
        print(*col)"""
    return (f"The first line holds r and c (1 <= r, c <= 4); then r lines of c integers follow. Print {out}, "
            "separated by spaces.", _prog(body, KIND=kind),
            lambda r: (lambda n, m: f"{n} {m}\n" + "".join(_ints(r, m, -9, 9) + "\n" for _ in range(n)))(
                r.randint(1, 4), r.randint(1, 4)))


def mean(rng: random.Random):
    kind = rng.choice(["mean", "mean of the squares", "mean absolute value"])
    f = {"mean": "x", "mean of the squares": "x * x", "mean absolute value": "abs(x)"}[kind]
    body = f"n = int(input())\nxs = [{f} for x in map(int, input().split())]\nprint(sum(xs) / n)"
    return (f"{LIST_IN} Print the {kind} of them (any answer within 1e-6 absolute or relative error is accepted).",
            _prog(body), _list_input())


def caesar(rng: random.Random):
    k = rng.randint(1, 25)
    direction = rng.choice(["forward", "backward"])
    body = "s = input()\nprint(''.join(chr((ord(ch) - 97 + SHIFT) % 26 + 97) if ch.islower() else ch for ch in s))"
    return (f"The input is one line of lower-case letters and spaces. Shift every letter {k} places {direction} in "
            "the alphabet (wrapping around from z to a and back); keep spaces. Print the result.",
            _prog(body, SHIFT=k if direction == "forward" else -k),
            lambda r: " ".join("".join(r.choice(LETTERS) for _ in range(r.randint(1, 6)))
                               for _ in range(r.randint(1, 4))) + "\n")


def sequence(rng: random.Random):
    a0, a1 = rng.randint(0, 3), rng.randint(1, 3)
    m = rng.choice([10, 97, 1000, 1_000_000_007])
    body = "n = int(input())\na, b = A0, A1\nfor _ in range(n):\n    a, b = b, (a + b) % M\nprint(a % M)"
    return (f"A sequence has f(0) = {a0}, f(1) = {a1} and f(i) = f(i-1) + f(i-2). The input is an integer n "
            f"(0 <= n <= 1000). Print f(n) modulo {m}.", _prog(body, A0=a0, A1=a1, M=m),
            lambda r: f"{r.randint(0, 1000 if r.random() < 0.5 else 12)}\n")


def base_convert(rng: random.Random):
    b = rng.randint(2, 9)
    to_base = rng.random() < 0.5
    if to_base:
        body = "n = int(input())\nd = ''\nwhile True:\n    d, n = str(n % B) + d, n // B\n    if n == 0:\n" \
               "        break\nprint(d)"
        return (f"The input is an integer n (0 <= n <= 10^6). Print n written in base {b}.", _prog(body, B=b),
                lambda r: f"{r.randint(0, 10 ** r.randint(1, 6))}\n")
    return (f"The input is a non-negative integer written in base {b} (at most 8 digits). Print its value in "
            "base 10.", _prog("print(int(input(), B))", B=b),
            lambda r: "".join(str(r.randrange(b)) for _ in range(r.randint(1, 8))) + "\n")


def pair_count(rng: random.Random):
    k = rng.randint(2, 9)
    op = rng.choice(["sum", "difference"])
    test = "(xs[i] + xs[j]) % K == 0" if op == "sum" else "(xs[i] - xs[j]) % K == 0"
    body = f"n = int(input())\nxs = list(map(int, input().split()))\nprint(sum(1 for i in range(n) " \
           f"for j in range(i + 1, n) if {test}))"
    return (f"{LIST_IN} Print how many pairs of positions i < j have a {op} of values divisible by {k}.",
            _prog(body, K=k), _list_input(-20, 20))


TEMPLATES: list[Template] = [filter_aggregate, order_statistic, reverse_text, count_letters, fizzbuzz, gcd_lcm,
                             primes, sort_numbers, prefix_scan, word_stats, digits, palindrome, matrix, mean,
                             caesar, sequence, base_convert, pair_count]
BY_NAME: dict[str, Template] = {t.__name__: t for t in TEMPLATES}  # a generated problem's ``family`` names its template
