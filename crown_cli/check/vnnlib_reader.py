"""VNN-LIB properties (the subset of docs/cli.md) as exact cases: an input box and rows A y <= b.

An atom is ``(coefficients {("X"|"Y", i): Fraction}, constant)``, meaning ``sum + constant <= 0``;
a formula is in disjunctive normal form: a list of terms, each a tuple of atom indices.
"""
import re
from fractions import Fraction

from .network import Reject

_TOKEN = re.compile(r";[^\n]*|\(|\)|[^\s();]+")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\Z")
_VAR = re.compile(r"([XY])_(0|[1-9]\d*)\Z")
MAX_TERMS = 100_000


def _read(text):
    stack, cur = [], []
    for tok in _TOKEN.findall(text):
        if tok == "(":
            stack.append(cur)
            cur = []
        elif tok == ")":
            if not stack:
                raise Reject("unbalanced ')'")
            done, cur = cur, stack.pop()
            cur.append(done)
        elif tok[0] != ";":
            cur.append(tok)
    if stack:
        raise Reject("unbalanced '('")
    return cur


class _Parser:
    def __init__(self):
        self.declared, self.atoms = set(), []

    def term(self, t):
        """A linear term: ({variable: coefficient}, constant)."""
        if isinstance(t, str):
            if _NUMBER.match(t):
                return {}, Fraction(t)
            if t not in self.declared:
                raise Reject(f"unknown symbol {t}")
            m = _VAR.match(t)
            return {(m.group(1), int(m.group(2))): Fraction(1)}, Fraction(0)
        if not t or not isinstance(t[0], str) or t[0] not in ("+", "-", "*") or len(t) < 2:
            raise Reject(f"unsupported term {t!r:.60}")
        parts = [self.term(a) for a in t[1:]]
        if t[0] == "*":
            linear = [p for p in parts if p[0]]
            if len(linear) > 1:
                raise Reject("a product of variables is not linear")
            k = Fraction(1)
            for p in parts:
                k *= p[1] if not p[0] else 1
            cs, c0 = linear[0] if linear else ({}, Fraction(1))
            return {v: k * c for v, c in cs.items()}, k * c0
        if t[0] == "-" and len(parts) == 1:
            return {v: -c for v, c in parts[0][0].items()}, -parts[0][1]
        cs, c0 = dict(parts[0][0]), parts[0][1]
        sign = 1 if t[0] == "+" else -1
        for ps, p0 in parts[1:]:
            for v, c in ps.items():
                cs[v] = cs.get(v, 0) + sign * c
            c0 += sign * p0
        return cs, c0

    def atom(self, left, right):
        """DNF of ``left <= right``."""
        cs = dict(left[0])
        for v, c in right[0].items():
            cs[v] = cs.get(v, 0) - c
        cs = {v: c for v, c in cs.items() if c != 0}
        if not cs:
            return [()] if left[1] <= right[1] else []
        self.atoms.append((cs, left[1] - right[1]))
        return [(len(self.atoms) - 1,)]

    def formula(self, f):
        if f in ("true", "false"):
            return [()] if f == "true" else []
        if isinstance(f, str) or not f or not isinstance(f[0], str):
            raise Reject(f"unsupported formula {f!r:.60}")
        op, args = f[0], f[1:]
        if op in ("and", "or"):
            parts = [self.formula(a) for a in args]
            return _and(parts) if op == "and" else _or(parts)
        if op not in ("<=", ">=", "<", ">", "=") or len(args) < 2:
            raise Reject(f"unsupported formula ({op} ...)")
        terms = [self.term(a) for a in args]  # strict read as non-strict: the closure
        parts = []
        for a, b in zip(terms, terms[1:]):
            if op in ("<=", "<", "="):
                parts.append(self.atom(a, b))
            if op in (">=", ">", "="):
                parts.append(self.atom(b, a))
        return _and(parts)


def _and(parts):
    out = [()]
    for p in parts:
        out = [t + u for t in out for u in p]
        if len(out) > MAX_TERMS:
            raise Reject(f"the disjunctive normal form exceeds {MAX_TERMS} terms")
    return out


def _or(parts):
    return [t for p in parts for t in p]


def read_vnnlib(text, n_in, n_out):
    """The property's cases with a nonempty box: [(lo, hi, rows)], lo/hi lists of Fractions,
    rows a list of (coefficients tuple over Y, b), each row meaning ``a . y <= b``."""
    p = _Parser()
    asserts = []
    for form in _read(text):
        if isinstance(form, str) or not form or not isinstance(form[0], str):
            raise Reject(f"unexpected top-level {form!r:.60}")
        if form[0] == "declare-const":
            if len(form) != 3 or form[2] != "Real" or not _VAR.match(str(form[1])):
                raise Reject(f"unsupported declaration {form!r:.60}")
            p.declared.add(form[1])
        elif form[0] == "assert" and len(form) == 2:
            asserts.append(form[1])
        elif form[0] not in ("check-sat", "get-model", "exit", "set-logic", "set-info",
                             "set-option"):
            raise Reject(f"unsupported command {form[0]}")
    for letter, n in (("X", n_in), ("Y", n_out)):
        names = {d for d in p.declared if d[0] == letter}
        if names != {f"{letter}_{i}" for i in range(n)}:
            raise Reject(f"declares {len(names)} {letter} variables, the network has {n} "
                         f"({'inputs' if letter == 'X' else 'outputs'})")
    cases = []
    for term in _and([p.formula(f) for f in asserts]):
        lo, hi, rows = [None] * n_in, [None] * n_in, []
        for a in term:
            cs, c0 = p.atoms[a]
            xs = [v for v in cs if v[0] == "X"]
            if xs and (len(xs) > 1 or len(cs) > 1):
                raise Reject("a constraint over several inputs, or inputs and outputs together")
            if xs:
                (v, c), = cs.items()
                x = -c0 / c  # c X + c0 <= 0: X <= x if c > 0, X >= x if c < 0
                side = hi if c > 0 else lo
                if side[v[1]] is None or (x < side[v[1]] if c > 0 else x > side[v[1]]):
                    side[v[1]] = x
            else:
                rows.append((tuple(cs.get(("Y", j), Fraction(0)) for j in range(n_out)), -c0))
        if None in lo or None in hi:
            raise Reject("an input without a lower or an upper bound")
        if all(a <= b for a, b in zip(lo, hi)):
            cases.append((lo, hi, rows))
    return cases
