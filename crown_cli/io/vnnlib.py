"""VNN-LIB property files: a linear subset, turned into input boxes and output constraints.

VNN-LIB (the property format of VNN-COMP) is SMT-LIB with real constants ``X_i`` (the network's
inputs) and ``Y_j`` (its outputs) and asserts describing a *violation*: the property is violated
(verdict ``sat``) iff some input satisfying every assert is mapped by the network to outputs
that satisfy them too; it holds (``unsat``) iff there is none.

Supported subset:

* comments ``; ...``; LF or CRLF line endings;
* ``(declare-const X_i Real)``, ``(declare-const Y_j Real)``; the X's and the Y's must each be
  numbered 0..n-1 without gaps (and match the network's sizes when they are given);
* ``(assert F)``, several meaning their conjunction; ``(check-sat)``, ``(get-model)``,
  ``(exit)``, ``(set-logic ...)``, ``(set-info ...)``, ``(set-option ...)`` are ignored;
* F built from ``and``, ``or``, ``true``, ``false`` and atoms ``(<= s t)``, ``(>= s t)``,
  ``(< s t)``, ``(> s t)`` (strict comparisons are read as non-strict: the closure of the set,
  which is what a sound ``unsat`` needs; a ``sat`` may then lie on the boundary of a strict
  inequality), ``(= s t)`` (two inequalities), chains like
  ``(<= a b c)`` (pairwise);
* linear terms: numbers (``3``, ``-0.5``, ``1.5e-3``), variables, ``(+ t ...)``, ``(- t)``,
  ``(- a b ...)``, ``(* c ... t)`` with at most one non-constant factor, all evaluated exactly
  (``fractions.Fraction``).

The formula is put in disjunctive normal form. In every term an atom over one input,
``a X_i <= c`` with a != 0, bounds that input; an atom over outputs only is a row of
``A y <= b`` (``>=`` negated); an atom over no variable is true or false. An atom mixing inputs
and outputs, or relating several inputs, is outside the subset and an :class:`InputError`.
Terms whose box is empty (some lo > hi) are dropped (they cannot be violated; if every term is
dropped the property holds trivially, and :attr:`Property.warnings` says so); a term leaving some input without a lower or upper bound
is an error.

Rounding. A box bound is the exact rational value of the atom rounded to the nearest float64,
which may lie up to half an ulp inside the real interval; when it is not exactly representable
the bound is moved outward by one ulp (``np.nextafter``) so the float box contains the real
one and ``unsat`` over it is sound. Output rows ``A``, ``b`` are rounded to nearest, not widened:
that error (half an ulp of each entry) is left to the verifier's margin.

A counterexample must lie in the real set, not the widened one: each case also keeps
``lo_in``, ``hi_in`` (each bound rounded inward: the floats inside the real interval; where
the interval holds no float, ``lo_in > hi_in`` and no float point is in the set) and ``b_in``
(each right-hand side rounded down, so ``A y <= b_in`` implies ``A y <= b`` for the exact
b; A's own rounding is not covered), which :func:`crown_cli.verification.outcome.confirm_sat`
checks a ``sat`` point against; where the interval holds no float, ``Case.pinned`` gives a
finite decimal inside it, the exact point that function confirms a counterexample at.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Dict, List, Optional, Tuple

import numpy as np

from crown_cli.errors import InputError, read_header

MAX_TERMS = 100_000  # cap on the number of DNF terms a conjunction multiplies out to
# a disjunction written out term by term (VNN-COMP nn4sys' lindex_60000: 120,000 boxes of one
# input) may have more, up to FLAT_CELLS numbers over its boxes, at most FLAT_TERMS terms
FLAT_TERMS = 1_000_000
FLAT_CELLS = 2 ** 25

_TOKEN = re.compile(r";[^\n]*|\(|\)|[^\s();]+")
_VAR = re.compile(r"([XY])_(0|[1-9][0-9]*)\Z")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\Z")
_IGNORED = {"check-sat", "get-model", "exit", "set-logic", "set-info", "set-option"}
_COMPARE = {"<=", ">=", "<", ">", "="}


@dataclass
class Case:
    """One DNF term: an x in [lo, hi] with ``A @ f(x) <= b`` (every row) is a violation."""

    lo: np.ndarray  # (n_inputs,) float64, rounded outward: contains the real box
    hi: np.ndarray
    A: np.ndarray  # (m, n_outputs) float64; m may be 0 (every x in the box violates)
    b: np.ndarray  # (m,)
    # the exact set's floats (rounded inward; None: lo, hi, b are exact): a counterexample's
    # box and right-hand sides (outcome.confirm_sat)
    lo_in: Optional[np.ndarray] = None
    hi_in: Optional[np.ndarray] = None
    b_in: Optional[np.ndarray] = None
    # the inputs whose real interval holds no float (lo_in > hi_in there), each with a point
    # of that interval written as a finite decimal (None: every input holds a float, or some
    # such interval has no finite decimal either): the exact point
    # outcome.confirm_sat confirms a counterexample at
    pinned: Optional[Dict[int, Fraction]] = None

    def exact(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lo, hi, b) of the points that are counterexamples for sure: the floats inside
        the real box, and the right-hand sides rounded down."""
        return (self.lo if self.lo_in is None else self.lo_in,
                self.hi if self.hi_in is None else self.hi_in,
                self.b if self.b_in is None else self.b_in)


@dataclass
class Property:
    """The parsed property: violated iff some case is (an empty list: it holds trivially)."""

    n_inputs: int
    n_outputs: int
    cases: List[Case] = field(default_factory=list)
    # things a user should hear about (an empty input box), one line each, naming the file
    warnings: List[str] = field(default_factory=list)

    def groups(self) -> List[Tuple[np.ndarray, np.ndarray, List[Tuple[np.ndarray, np.ndarray]]]]:
        """The cases grouped by identical input box, in order of first appearance:
        ``[(lo, hi, [(A, b), ...]), ...]``."""
        out: Dict[Tuple[bytes, bytes], Tuple] = {}
        for case in self.cases:
            key = (case.lo.tobytes(), case.hi.tobytes())
            if key not in out:
                out[key] = (case.lo, case.hi, [])
            out[key][2].append((case.A, case.b))
        return list(out.values())


def finite_decimal(v: Fraction) -> bool:
    """Whether ``v`` has a finite decimal expansion (its denominator is 2^a 5^b)."""
    d = v.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d == 1


def decimal_text(v: Fraction) -> str:
    """The exact decimal expansion of a finite decimal ``v`` (:func:`finite_decimal`)."""
    if not finite_decimal(v):
        raise ValueError(f"{v} is not a finite decimal")
    k = 0
    while (v * 10 ** k).denominator != 1:
        k += 1
    n = v.numerator * 10 ** k // v.denominator
    sign, digits = ("-" if n < 0 else ""), str(abs(n)).rjust(k + 1, "0")
    if k == 0:
        return sign + digits
    return f"{sign}{digits[:-k]}.{digits[-k:]}"


# -- S-expressions ---------------------------------------------------------------------------
# An atom is its token's text (str); a list is a _List. Positions are token indices (counting
# comments), turned into line numbers only for error messages.

class _List:
    __slots__ = ("items", "ks", "k")

    def __init__(self, items, ks, k):
        self.items = items  # str (atom) or _List
        self.ks = ks  # token index of each item
        self.k = k  # token index of the '('


class _Parser:
    def __init__(self, text: str, where: str, n_inputs, n_outputs, max_terms):
        self.text, self.where = text, where
        self.n_inputs, self.n_outputs = n_inputs, n_outputs
        self.max_terms = max_terms
        self.declared: Dict[str, int] = {}  # variable name -> token index of its declaration
        # atoms: kind 0 lower bound, 1 upper bound (var, value), 2 output row (coefs, const)
        self.kind: List[int] = []
        self.var: List[int] = []
        self.val: List[float] = []
        self.val_in: List[float] = []  # the same bounds rounded inward
        self.exact: List[Optional[Fraction]] = []  # the same bounds' exact values
        self.rows: Dict[int, Tuple[Dict[int, Fraction], Fraction]] = {}
        self._num_cache: Dict[str, Fraction] = {}
        self._bound_cache: Dict[Tuple[str, bool], Tuple[float, float]] = {}  # (outer, inner)

    # positions and errors
    def line(self, k: int) -> int:
        """Line number of token k."""
        for i, m in enumerate(_TOKEN.finditer(self.text)):
            if i == k:
                return self.text.count("\n", 0, m.start()) + 1
        return self.text.count("\n") + 1

    def error(self, k, msg):
        return InputError(f"{self.where}: line {self.line(k)}: {msg}")

    # reading
    def read(self) -> _List:
        """The top-level forms, as a _List."""
        top = cur = _List([], [], -1)
        stack: List[_List] = []
        for k, tok in enumerate(_TOKEN.findall(self.text)):
            if tok == "(":
                stack.append(cur)
                new = _List([], [], k)
                cur.items.append(new)
                cur.ks.append(k)
                cur = new
            elif tok == ")":
                if not stack:
                    raise self.error(k, "unbalanced parentheses: ')' without '('")
                cur = stack.pop()
            elif tok[0] == ";":
                continue
            else:
                if tok[0] in "|\"":
                    raise self.error(k, f"unsupported token '{tok}'")
                cur.items.append(tok)
                cur.ks.append(k)
        if stack:
            raise self.error(cur.k, "unbalanced parentheses: '(' never closed")
        for f, k in zip(top.items, top.ks):
            if isinstance(f, str):
                raise self.error(k, f"expected '(' at top level, found '{f}'")
        return top

    # terms
    def number(self, t: str) -> Optional[Fraction]:
        """The exact value of a numeral, or None if t is not one."""
        v = self._num_cache.get(t)
        if v is None:
            if not _NUMBER.match(t):
                return None
            v = self._num_cache[t] = Fraction(t)
        return v

    def variable(self, t: str, k: int) -> Tuple[str, int]:
        m = _VAR.match(t)
        if not m:
            raise self.error(k, f"unknown symbol '{t}' (expected a number, X_i or Y_j)")
        if t not in self.declared:
            raise self.error(k, f"undeclared variable {t}")
        return m.group(1), int(m.group(2))

    def head(self, node: _List) -> str:
        if not node.items or not isinstance(node.items[0], str):
            raise self.error(node.k, "expected an operator after '('")
        return node.items[0]

    def term(self, node, k) -> Tuple[Dict[Tuple[str, int], Fraction], Fraction]:
        """A linear term: ({(letter, index): coefficient}, constant), exact."""
        if isinstance(node, str):
            v = self.number(node)
            if v is not None:
                return {}, v
            return {self.variable(node, k): Fraction(1)}, Fraction(0)
        op = self.head(node)
        args = list(zip(node.items[1:], node.ks[1:]))
        if op in ("+", "-", "*") and not args:
            raise self.error(k, f"'{op}' without arguments")
        if op == "+" or op == "-":
            parts = [self.term(a, ka) for a, ka in args]
            if op == "-" and len(parts) == 1:
                coefs, const = parts[0]
                return {v: -c for v, c in coefs.items()}, -const
            coefs, const = dict(parts[0][0]), parts[0][1]
            sign = 1 if op == "+" else -1
            for cs, c0 in parts[1:]:
                for v, c in cs.items():
                    coefs[v] = coefs.get(v, 0) + sign * c
                const += sign * c0
            return coefs, const
        if op == "*":
            const, linear = Fraction(1), None
            for a, ka in args:
                cs, c0 = self.term(a, ka)
                if cs:
                    if linear is not None:
                        raise self.error(k, "non-linear product of variables is outside the "
                                            "supported subset")
                    linear = (cs, c0)
                else:
                    const *= c0
            if linear is None:
                return {}, const
            return {v: const * c for v, c in linear[0].items()}, const * linear[1]
        if op in _COMPARE or op in ("and", "or", "not"):
            raise self.error(k, f"'{op}' used where a number or variable is expected")
        raise self.error(k, f"unsupported operator '{op}'")

    # atoms
    def bound(self, value: Fraction, upward: bool, key=None) -> Tuple[float, float]:
        """(outer, inner): value rounded to float64, moved one ulp outward (up for an upper
        bound) if inexact; and the float nearest it on the inside (the largest float <= value
        for an upper bound)."""
        if key is not None:
            f = self._bound_cache.get((key, upward))
            if f is not None:
                return f
        f = float(value)
        out = inner = f
        if Fraction(f) != value:
            out = float(np.nextafter(f, np.inf if upward else -np.inf))
            if (Fraction(f) > value) == upward:  # the nearest float lies outside
                inner = float(np.nextafter(f, -np.inf if upward else np.inf))
        if key is not None:
            self._bound_cache[(key, upward)] = (out, inner)
        return out, inner

    def new_bound(self, i: int, upper: bool, value: Fraction, num=None) -> int:
        outer, inner = self.bound(value, upper, num)
        self.kind.append(1 if upper else 0)
        self.var.append(i)
        self.val.append(outer)
        self.val_in.append(inner)
        self.exact.append(value)
        return len(self.kind) - 1

    def add_atom(self, k, coefs, const) -> int:
        """The id of the atom ``sum coefs * v + const <= 0`` (some coefficient is nonzero)."""
        xs = [v for v in coefs if v[0] == "X"]
        if xs and len(xs) < len(coefs):
            raise self.error(k, "constraint mixes inputs and outputs; outside the supported "
                                "subset")
        if len(xs) > 1:
            names = ", ".join(f"X_{v[1]}" for v in sorted(xs, key=lambda v: v[1]))
            raise self.error(k, f"linear constraint over several inputs ({names}) is outside "
                                "the supported subset (only bounds on single inputs)")
        if xs:
            (v,) = xs
            a = coefs[v]
            upper = a > 0  # a X + const <= 0 is X <= -const / a, or X >= for a < 0
            return self.new_bound(v[1], upper, -const / a)
        ident = len(self.kind)
        self.kind.append(2)
        self.var.append(-1)
        self.val.append(0.0)
        self.val_in.append(0.0)
        self.exact.append(None)
        self.rows[ident] = ({v[1]: c for v, c in coefs.items()}, -const)
        return ident

    def compare(self, op, k, left, right):
        """DNF of ``left op right`` for two linear terms."""
        (lc, lk), (rc, rk) = left, right
        diff = dict(lc)
        for v, c in rc.items():
            diff[v] = diff.get(v, 0) - c
        diff = {v: c for v, c in diff.items() if c != 0}
        const = lk - rk  # left - right = diff + const
        atoms = []
        if op in ("<=", "<", "="):
            atoms.append((diff, const))
        if op in (">=", ">", "="):
            atoms.append(({v: -c for v, c in diff.items()}, -const))
        ids = []
        for coefs, c0 in atoms:
            if not coefs:
                if c0 <= 0:
                    continue  # true
                return _FALSE
            ids.append(self.add_atom(k, coefs, c0))
        return ([], [tuple(ids)]) if ids else _TRUE

    def simple_bound(self, op, a, b):
        """Fast path for ``(op X_i NUMBER)`` and ``(op NUMBER X_i)``: DNF or None."""
        if a[0] == "X":
            var, num, flip = a, b, False
        elif b[0] == "X":
            var, num, flip = b, a, True
        else:
            return None
        if var not in self.declared or not _VAR.match(var):
            return None
        value = self.number(num)
        if value is None:
            return None
        i = int(var[2:])
        upper = op in ("<=", "<")
        if flip:
            upper = not upper
        if op == "=":
            ids = (self.new_bound(i, False, value, num), self.new_bound(i, True, value, num))
        else:
            ids = (self.new_bound(i, upper, value, num),)
        return [], [ids]

    # formulas: DNF as (common atoms, terms): common AND (OR of the terms)
    def formula(self, node, k):
        if isinstance(node, str):
            if node == "true":
                return _TRUE
            if node == "false":
                return _FALSE
            raise self.error(k, f"expected a formula, found '{node}'")
        op = self.head(node)
        args, ks = node.items[1:], node.ks[1:]
        if op == "and":
            return self.conj([self.formula(a, ka) for a, ka in zip(args, ks)], k)
        if op == "or":
            return self.disj([self.formula(a, ka) for a, ka in zip(args, ks)], k)
        if op in _COMPARE:
            if len(args) < 2:
                raise self.error(k, f"'{op}' needs at least two arguments")
            if len(args) == 2 and isinstance(args[0], str) and isinstance(args[1], str):
                fast = self.simple_bound(op, args[0], args[1])
                if fast is not None:
                    return fast
            terms = [self.term(a, ka) for a, ka in zip(args, ks)]
            parts = [self.compare(op, k, terms[i], terms[i + 1]) for i in range(len(terms) - 1)]
            return parts[0] if len(parts) == 1 else self.conj(parts, k)
        if op in ("+", "-", "*"):
            raise self.error(k, f"'{op}' used where a formula is expected")
        raise self.error(k, f"unsupported operator '{op}'")

    def conj(self, dnfs, k, ks=None):
        common: List[int] = []
        terms = [()]
        for i, (c, ts) in enumerate(dnfs):
            if not ts:
                return _FALSE
            common.extend(c)
            if len(ts) == 1:
                common.extend(ts[0])
                continue
            if len(terms) > 1 and len(terms) * len(ts) > self.max_terms:  # multiplies out
                raise self.error(k if ks is None else ks[i],
                                 f"disjunctive normal form exceeds {self.max_terms} terms (a "
                                 "conjunction of disjunctions multiplies out)")
            terms = [t + u for t in terms for u in ts]
        return common, terms

    def disj(self, dnfs, k):
        if len(dnfs) == 1:
            return dnfs[0]
        terms = []
        cap = self.flat_cap()
        for c, ts in dnfs:
            c = tuple(c)
            terms.extend(c + t for t in ts)
            if len(terms) > cap:
                raise self.error(k, f"disjunctive normal form exceeds {cap} terms")
        return [], terms

    def flat_cap(self) -> int:
        """The most terms a disjunction may list: ``max_terms``, or up to :data:`FLAT_TERMS`
        where the declared inputs and outputs keep their boxes within :data:`FLAT_CELLS`
        numbers."""
        if self.max_terms != MAX_TERMS:  # a caller's own cap stands
            return self.max_terms
        width = max(1, len(self.declared))
        return max(self.max_terms, min(FLAT_TERMS, FLAT_CELLS // width))

    # commands
    def declare(self, form: _List):
        items, ks = form.items, form.ks
        if len(items) != 3 or not all(isinstance(a, str) for a in items):
            raise self.error(form.k, "expected (declare-const NAME Real)")
        name, sort = items[1], items[2]
        if sort != "Real":
            raise self.error(ks[2], f"{name}: unsupported sort '{sort}' (expected Real)")
        m = _VAR.match(name)
        if not m:
            raise self.error(ks[1], f"unsupported variable name '{name}' (expected X_i or Y_j)")
        if name in self.declared:
            raise self.error(ks[1], f"{name} declared twice")
        limit = self.n_inputs if m.group(1) == "X" else self.n_outputs
        if limit is not None and int(m.group(2)) >= limit:
            what = "inputs" if m.group(1) == "X" else "outputs"
            raise self.error(ks[1], f"{name} out of range: the network has {limit} {what}")
        self.declared[name] = ks[1]

    def sizes(self) -> Tuple[int, int]:
        out = []
        for letter, given, what in (("X", self.n_inputs, "inputs"), ("Y", self.n_outputs, "outputs")):
            idx = sorted(int(n[2:]) for n in self.declared if n[0] == letter)
            last = max((p for n, p in self.declared.items() if n[0] == letter), default=0)
            if not idx:
                raise self.error(last, f"no {letter}_i variables declared")
            n = given if given is not None else idx[-1] + 1
            if len(idx) != n:
                missing = sorted(set(range(n)) - set(idx))
                if given is not None:
                    raise self.error(last, f"declares {len(idx)} {what}, the network has {given} "
                                           f"(missing {letter}_{missing[0]})")
                raise self.error(last, f"{letter}_{missing[0]} is not declared "
                                       f"(but {letter}_{idx[-1]} is)")
            out.append(n)
        return out[0], out[1]

    def run(self) -> Property:
        dnfs, ks = [], []
        top = self.read()
        for form, k in zip(top.items, top.ks):
            cmd = self.head(form)
            if cmd == "declare-const":
                self.declare(form)
            elif cmd == "assert":
                if len(form.items) != 2:
                    raise self.error(k, "assert takes exactly one formula")
                dnfs.append(self.formula(form.items[1], form.ks[1]))
                ks.append(k)
            elif cmd in _IGNORED:
                continue
            else:
                raise self.error(k, f"unsupported command '{cmd}'")
        n_in, n_out = self.sizes()
        common, terms = self.conj(dnfs, 0, ks) if dnfs else _TRUE
        self.warnings: List[str] = []
        cases = self.cases(common, terms, n_in, n_out)
        return Property(n_in, n_out, cases, self.warnings)

    def _empty_box(self, lo, hi, every_case: bool) -> None:
        i = int(np.flatnonzero(lo > hi)[0])
        where = "the input box" if every_case else "every case's input box"
        self.warnings.append(
            f"{self.where}: {where} is empty (X_{i} has lower bound {float(lo[i]):.10g} above its "
            f"upper bound {float(hi[i]):.10g}): no input can violate the property, so it holds trivially (unsat)")

    # DNF terms -> cases
    def _apply(self, ids, lo, hi, row_ids, lo_in, hi_in):
        if not ids:
            return
        ids = np.asarray(ids, dtype=np.int64)
        kind = self._kind[ids]
        low, up = ids[kind == 0], ids[kind == 1]
        np.maximum.at(lo, self._var[low], self._val[low])
        np.minimum.at(hi, self._var[up], self._val[up])
        np.maximum.at(lo_in, self._var[low], self._val_in[low])
        np.minimum.at(hi_in, self._var[up], self._val_in[up])
        row_ids.extend(ids[kind == 2].tolist())

    def _pinned(self, id_lists, gap) -> Optional[Dict[int, Fraction]]:
        """For the inputs ``gap`` (a mask: their real interval holds no float), a point of
        each interval that is a finite decimal: its lower end, else its upper end (None when
        ``gap`` is empty or some interval has neither)."""
        if not gap.any():
            return None
        want = set(np.flatnonzero(gap).tolist())
        ends: Dict[int, List[Optional[Fraction]]] = {i: [None, None] for i in want}
        for ids in id_lists:
            for a in ids:
                i, kind = self.var[a], self.kind[a]
                if kind == 2 or i not in want:
                    continue
                e, v = ends[i], self.exact[a]
                if e[kind] is None or (v > e[kind] if kind == 0 else v < e[kind]):
                    e[kind] = v
        out = {}
        for i, (p, q) in ends.items():
            point = next((v for v in (p, q) if v is not None and finite_decimal(v)), None)
            if point is None:
                return None
            out[i] = point
        return out

    def cases(self, common, terms, n_in, n_out) -> List[Case]:
        self._kind = np.asarray(self.kind, dtype=np.int8)
        self._var = np.asarray(self.var, dtype=np.int64)
        self._val = np.asarray(self.val, dtype=np.float64)
        self._val_in = np.asarray(self.val_in, dtype=np.float64)
        lo0, hi0 = np.full(n_in, -np.inf), np.full(n_in, np.inf)
        lo0_in, hi0_in = lo0.copy(), hi0.copy()
        rows0: List[int] = []
        self._apply(common, lo0, hi0, rows0, lo0_in, hi0_in)
        if np.any(lo0 > hi0):
            self._empty_box(lo0, hi0, True)
            return []
        out = []
        dropped = None
        row_cache: Dict[int, Tuple[np.ndarray, float, float]] = {}
        for t in terms:
            lo, hi, rows = lo0.copy(), hi0.copy(), list(rows0)
            lo_in, hi_in = lo0_in.copy(), hi0_in.copy()
            self._apply(t, lo, hi, rows, lo_in, hi_in)
            if np.any(lo > hi):
                dropped = (lo, hi)
                continue  # empty box: this case cannot be violated
            for arr, side in ((lo, "lower"), (hi, "upper")):
                bad = np.flatnonzero(np.isinf(arr))
                if bad.size:
                    i = int(bad[0])
                    which = f" in case {len(out) + 1} of the DNF" if len(terms) > 1 else ""
                    raise self.error(self.declared.get(f"X_{i}", 0),
                                     f"input X_{i} has no {side} bound{which}")
            A = np.zeros((len(rows), n_out))
            b, b_in = np.zeros(len(rows)), np.zeros(len(rows))
            for r, ident in enumerate(rows):
                if ident not in row_cache:
                    coefs, rhs = self.rows[ident]
                    a = np.zeros(n_out)
                    for j, c in coefs.items():
                        a[j] = float(c)
                    # b rounded to nearest; b_in the largest float <= b (an upper bound's inner)
                    row_cache[ident] = (a, float(rhs), self.bound(rhs, True)[1])
                A[r], b[r], b_in[r] = row_cache[ident]
            exact = (np.array_equal(lo, lo_in) and np.array_equal(hi, hi_in)
                     and np.array_equal(b, b_in))
            out.append(Case(lo, hi, A, b) if exact else Case(
                lo, hi, A, b, lo_in, hi_in, b_in, self._pinned((common, t), lo_in > hi_in)))
        if not out and dropped is not None:
            self._empty_box(*dropped, every_case=False)
        return out


_TRUE = ([], [()])
_FALSE = ([], [])


def parse_vnnlib_text(text: str, where: str = "<string>", n_inputs: Optional[int] = None,
                      n_outputs: Optional[int] = None, max_terms: int = MAX_TERMS) -> Property:
    """Parse VNN-LIB text (see the module docstring); ``where`` names it in error messages.

    ``n_inputs``/``n_outputs``, when given, are the network's sizes: the declarations must
    match them exactly. Raises :class:`InputError` ``"<where>: line N: <problem>"``.
    """
    return _Parser(text, where, n_inputs, n_outputs, max_terms).run()


def parse_vnnlib(path: str, n_inputs: Optional[int] = None, n_outputs: Optional[int] = None,
                 max_terms: int = MAX_TERMS) -> Property:
    """Parse a VNN-LIB file; see :func:`parse_vnnlib_text`."""
    read_header(path, "spec")
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise InputError(f"{path}: cannot read spec file ({exc.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise InputError(f"{path}: line {line}: not UTF-8 text") from None
    return parse_vnnlib_text(text, os.fspath(path), n_inputs, n_outputs, max_terms)
