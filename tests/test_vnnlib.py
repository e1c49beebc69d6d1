"""VNN-LIB parsing: fixtures shaped like the VNN-COMP 2021 files, rounding, errors, a DNF oracle."""
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from crown_cli.errors import InputError
from crown_cli.io.vnnlib import Property, parse_vnnlib, parse_vnnlib_text

FIX = Path(__file__).resolve().parent / "fixtures" / "vnnlib"


def declare(n_in, n_out):
    return "".join(f"(declare-const X_{i} Real)\n" for i in range(n_in)) + \
        "".join(f"(declare-const Y_{j} Real)\n" for j in range(n_out))


def unit_box(n):
    return "".join(f"(assert (>= X_{i} 0))\n(assert (<= X_{i} 1))\n" for i in range(n))


# -- fixtures shaped like the real files ------------------------------------------------------

def test_acas_like_conjunction():
    p = parse_vnnlib(str(FIX / "acas_like.vnnlib"), 5, 5)
    assert (p.n_inputs, p.n_outputs, len(p.cases)) == (5, 5, 1)
    c = p.cases[0]
    assert c.lo.tolist() == [0.5, -0.5, -0.25, 0.375, -0.5]
    assert c.hi.tolist() == [0.75, 0.5, 0.25, 0.5, -0.375]
    # Y_0 <= Y_j  ->  Y_0 - Y_j <= 0
    expected = np.zeros((4, 5))
    expected[:, 0] = 1.0
    expected[np.arange(4), np.arange(1, 5)] = -1.0
    assert np.array_equal(c.A, expected)
    assert c.b.tolist() == [0.0] * 4
    assert c.lo.dtype == c.A.dtype == np.float64


def test_disjunction_of_boxes_like_prop_6():
    p = parse_vnnlib(str(FIX / "boxes_or.vnnlib"))
    assert (p.n_inputs, p.n_outputs) == (3, 3)
    assert len(p.cases) == 4  # 2 boxes x 2 output disjuncts
    box1 = ([-0.5, 0.25, 1.0], [0.5, 1.0, 2.0])
    box2 = ([-0.5, -1.0, 1.0], [0.5, -0.25, 2.0])
    out1 = ([[-1.0, 1.0, 0.0]], [0.0])  # Y_1 <= Y_0
    out2 = ([[-1.0, 0.0, 1.0], [0.0, 0.0, -1.0]], [0.0, -3.5])  # Y_2 <= Y_0, Y_2 >= 3.5
    expected = [(box1, out1), (box1, out2), (box2, out1), (box2, out2)]
    for c, ((lo, hi), (A, b)) in zip(p.cases, expected):
        assert c.lo.tolist() == lo and c.hi.tolist() == hi
        assert c.A.tolist() == A and c.b.tolist() == b
    groups = p.groups()
    assert len(groups) == 2
    for (lo, hi, outs), (blo, bhi) in zip(groups, (box1, box2)):
        assert lo.tolist() == blo and hi.tolist() == bhi
        assert [(A.tolist(), b.tolist()) for A, b in outs] == [out1, out2]


def test_mnist_like_disjunction_of_single_comparisons():
    p = parse_vnnlib(str(FIX / "mnist_like.vnnlib"), 4, 4)
    assert len(p.cases) == 3
    assert len(p.groups()) == 1
    for c, j in zip(p.cases, (0, 1, 3)):
        assert c.lo.tolist() == [0.0, 0.5, 0.75, 0.0]
        assert c.hi.tolist() == [0.25, 0.75, 1.0, 0.125]
        row = np.zeros(4)
        row[2], row[j] = 1.0, -1.0  # Y_j >= Y_2  ->  Y_2 - Y_j <= 0
        assert c.A.tolist() == [row.tolist()] and c.b.tolist() == [0.0]


def test_crlf_line_endings():
    p = parse_vnnlib(str(FIX / "crlf.vnnlib"))
    assert (p.n_inputs, p.n_outputs, len(p.cases)) == (1, 1, 1)
    assert p.cases[0].lo.tolist() == [0.0] and p.cases[0].hi.tolist() == [1.0]
    assert p.cases[0].A.tolist() == [[-1.0]] and p.cases[0].b.tolist() == [-2.0]
    text = (FIX / "crlf.vnnlib").read_bytes().decode().replace("(>= Y_0 2)", "(>= Y_0 (exp 2))")
    with pytest.raises(InputError, match=r"^crlf: line 6: unsupported operator 'exp'$"):
        parse_vnnlib_text(text, "crlf")


# -- numbers, terms, rounding ------------------------------------------------------------------

def one_input(formula_text, n_out=1):
    return parse_vnnlib_text(declare(1, n_out) + formula_text)


@pytest.mark.parametrize("text,lo,hi", [
    ("(assert (>= X_0 -0.5)) (assert (<= X_0 1.25e-1))", -0.5, 0.125),
    ("(assert (>= X_0 (- 0.5))) (assert (<= X_0 2.5E+1))", -0.5, 25.0),
    ("(assert (<= (* 2 X_0) 1)) (assert (<= (* -4 X_0) 1))", -0.25, 0.5),
    ("(assert (<= (+ X_0 1) 2)) (assert (<= (- 3 X_0) 3.5))", -0.5, 1.0),
    ("(assert (<= (- X_0) 0.25)) (assert (<= (* 0.5 (+ X_0 X_0 1)) 3))", -0.25, 2.5),
    ("(assert (= X_0 0.75))", 0.75, 0.75),
    ("(assert (< X_0 1)) (assert (> X_0 0))", 0.0, 1.0),  # strict read as non-strict
    ("(assert (<= 0 X_0 1))", 0.0, 1.0),  # chained comparison
    ("(assert (>= 1 X_0)) (assert (and true (<= 0.0 X_0)))", 0.0, 1.0),
])
def test_box_bounds_from_terms(text, lo, hi):
    p = one_input(text)
    assert p.cases[0].lo.tolist() == [lo] and p.cases[0].hi.tolist() == [hi]


def test_inexact_box_bounds_are_widened_by_one_ulp():
    p = one_input("(assert (>= X_0 0.1)) (assert (<= X_0 0.7))")
    lo, hi = p.cases[0].lo[0], p.cases[0].hi[0]
    assert lo == np.nextafter(0.1, -np.inf) and hi == np.nextafter(0.7, np.inf)
    assert Fraction(lo) < Fraction("0.1") and Fraction(hi) > Fraction("0.7")
    # the same literal as an upper and a lower bound is widened both ways (= gives both)
    p = one_input("(assert (= X_0 0.1))")
    assert p.cases[0].lo[0] < p.cases[0].hi[0]
    assert Fraction(p.cases[0].lo[0]) < Fraction("0.1") < Fraction(p.cases[0].hi[0])
    # a value that is exact only as a rational, not as a literal: 1/3
    p = one_input("(assert (>= (* 3 X_0) 1)) (assert (<= (* 3 X_0) 2))")
    assert p.cases[0].lo[0] == np.nextafter(1 / 3, -np.inf)
    assert p.cases[0].hi[0] == np.nextafter(2 / 3, np.inf)
    assert Fraction(p.cases[0].lo[0]) < Fraction(1, 3) and Fraction(p.cases[0].hi[0]) > Fraction(2, 3)
    # exact literals are not widened
    p = one_input("(assert (>= X_0 0.125)) (assert (<= X_0 0.625))")
    assert p.cases[0].lo[0] == 0.125 and p.cases[0].hi[0] == 0.625


def test_exact_sets_round_inward_to_the_largest_float_box_inside():
    """Case.exact(): each inexact box bound rounded inward to the float nearest it inside the
    real interval (the next float out lies outside), right-hand sides rounded down to the
    largest float <= the exact value; exact literals are unchanged (and the case keeps no
    copies); an interval holding no float gives lo_in > hi_in."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        a, b = sorted(rng.uniform(-3, 3, 2))
        la, lb, lc = f"{a:.17g}1", f"{b:.17g}3", f"{rng.uniform(-2, 2):.19g}"
        p = one_input(f"(assert (>= X_0 {la})) (assert (<= X_0 {lb})) "
                      f"(assert (<= (- Y_0) {lc}))", 1)
        c = p.cases[0]
        lo, hi, rhs = c.exact()
        A, B, C = Fraction(la), Fraction(lb), Fraction(lc)
        assert Fraction(lo[0]) >= A and Fraction(float(np.nextafter(lo[0], -np.inf))) < A
        assert Fraction(hi[0]) <= B and Fraction(float(np.nextafter(hi[0], np.inf))) > B
        assert Fraction(rhs[0]) <= C and Fraction(float(np.nextafter(rhs[0], np.inf))) > C
        assert c.lo[0] <= lo[0] and hi[0] <= c.hi[0]  # inside the widened box
    c = one_input("(assert (>= X_0 0.125)) (assert (<= X_0 0.625)) (assert (<= Y_0 0.5))", 1).cases[0]
    assert c.lo_in is None and c.b_in is None and c.exact()[0][0] == 0.125
    lo, hi, _ = one_input("(assert (= X_0 0.1))").cases[0].exact()
    assert lo[0] > hi[0]  # 0.1 is no float: the real set {0.1} holds none


def test_output_constants_are_rounded_to_nearest():
    p = one_input(unit_box(1) + "(assert (>= Y_0 0.1)) (assert (<= (* 3 Y_0) (+ Y_1 0.7)))", 2)
    c = p.cases[0]
    assert c.A.tolist() == [[-1.0, 0.0], [3.0, -1.0]]
    assert c.b.tolist() == [-0.1, 0.7]


def test_output_equality_gives_two_rows_and_no_outputs_gives_zero_rows():
    p = one_input(unit_box(1) + "(assert (= Y_0 Y_1))", 2)
    assert p.cases[0].A.tolist() == [[1.0, -1.0], [-1.0, 1.0]] and p.cases[0].b.tolist() == [0, 0]
    p = one_input(unit_box(1), 2)
    assert p.cases[0].A.shape == (0, 2) and p.cases[0].b.shape == (0,)


def test_empty_boxes_are_dropped():
    text = declare(1, 1) + ("(assert (or (and (>= X_0 1) (<= X_0 0.5))"
                            "            (and (>= X_0 0) (<= X_0 1))))"
                            "(assert (<= Y_0 0))")
    p = parse_vnnlib_text(text)
    assert len(p.cases) == 1 and p.cases[0].lo.tolist() == [0.0] and p.cases[0].hi.tolist() == [1.0]
    # every case empty: the property holds trivially (no case left, no error)
    p = parse_vnnlib_text(declare(1, 1) + "(assert (>= X_0 1)) (assert (<= X_0 0.5))")
    assert isinstance(p, Property) and p.cases == [] and p.groups() == []
    # a false constant atom removes its term, a true one is dropped
    p = parse_vnnlib_text(declare(1, 1) + unit_box(1) + "(assert (or (<= 2 1) (<= Y_0 (+ 1 1))))"
                          "(assert (<= 1 2))")
    assert len(p.cases) == 1 and p.cases[0].A.tolist() == [[1.0]] and p.cases[0].b.tolist() == [2.0]


# -- errors ------------------------------------------------------------------------------------

def write(tmp_path, text, name="p.vnnlib"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


ERRORS = [
    # (text, sizes, line, message part)
    (declare(2, 1) + "(assert (>= X_0 0))\n(assert (<= X_0 1))\n(assert (<= X_1 1))\n",
     (None, None), 2, "input X_1 has no lower bound"),
    (declare(1, 1) + "(assert (>= X_0 0))\n(assert (or (<= X_0 1) (<= Y_0 0)))\n",
     (None, None), 1, "input X_0 has no upper bound in case 2 of the DNF"),
    (declare(1, 1) + unit_box(1) + "(assert (<= Y_1 0))\n", (None, None), 5,
     "undeclared variable Y_1"),
    (declare(1, 1) + unit_box(1) + "(assert (<= Z 0))\n", (None, None), 5, "unknown symbol 'Z'"),
    (declare(3, 1), (2, 1), 3, "X_2 out of range: the network has 2 inputs"),
    (declare(2, 1), (3, 1), 2, "declares 2 inputs, the network has 3 (missing X_2)"),
    (declare(1, 2), (1, 3), 3, "declares 2 outputs, the network has 3 (missing Y_2)"),
    ("(declare-const X_0 Real)\n(declare-const X_2 Real)\n(declare-const Y_0 Real)\n",
     (None, None), 2, "X_1 is not declared (but X_2 is)"),
    ("(declare-const Y_0 Real)\n", (None, None), 1, "no X_i variables declared"),
    (declare(1, 1) + "(declare-const X_0 Real)\n", (None, None), 3, "X_0 declared twice"),
    (declare(1, 1) + "(declare-const X_1 Int)\n", (None, None), 3, "unsupported sort 'Int'"),
    (declare(1, 1) + "(declare-const foo Real)\n", (None, None), 3, "unsupported variable name"),
    (declare(1, 1) + "(assert (<= X_0 1)))\n", (None, None), 3,
     "unbalanced parentheses: ')' without '('"),
    (declare(1, 1) + "\n(assert (<= X_0 1)\n", (None, None), 4,
     "unbalanced parentheses: '(' never closed"),
    (declare(1, 1) + unit_box(1) + "(assert (ite (<= Y_0 0) true false))\n", (None, None), 5,
     "unsupported operator 'ite'"),
    (declare(1, 1) + unit_box(1) + "(assert (<= (exp Y_0) 1))\n", (None, None), 5,
     "unsupported operator 'exp'"),
    (declare(1, 2) + unit_box(1) + "(assert (<= (* X_0 Y_1) 1))\n", (None, None), 6,
     "non-linear product"),
    (declare(1, 1) + unit_box(1) + "(assert\n  (<= X_0 Y_0))\n", (None, None), 6,
     "mixes inputs and outputs"),
    (declare(2, 1) + unit_box(2) + "(assert (<= (+ X_0 X_1) 1))\n", (None, None), 8,
     "linear constraint over several inputs (X_0, X_1)"),
    (declare(1, 1) + "(push 1)\n", (None, None), 3, "unsupported command 'push'"),
    (declare(1, 1) + "X_0\n", (None, None), 3, "expected '(' at top level"),
    (declare(1, 1) + "(assert (<= X_0))\n", (None, None), 3, "'<=' needs at least two arguments"),
    (declare(1, 1) + "(assert (+ X_0 1))\n", (None, None), 3, "'+' used where a formula"),
    (declare(1, 1) + "(assert (<= (<= X_0 1) 1))\n", (None, None), 3, "'<=' used where a number"),
    (declare(1, 1) + "(assert (<= X_0 1) (<= X_0 2))\n", (None, None), 3,
     "assert takes exactly one formula"),
    (declare(1, 1) + "(assert (<= X_0 |1|))\n", (None, None), 3, "unsupported token"),
]


@pytest.mark.parametrize("text,sizes,line,part", ERRORS)
def test_errors_name_file_and_line(tmp_path, text, sizes, line, part):
    path = write(tmp_path, text)
    with pytest.raises(InputError) as info:
        parse_vnnlib(path, *sizes)
    msg = str(info.value)
    assert msg.startswith(f"{path}: line {line}: "), msg
    assert part in msg and "\n" not in msg


def test_dnf_cap(tmp_path):
    ors = "".join(f"(assert (or (<= Y_0 {k}) (>= Y_0 {k + 0.5})))\n" for k in range(3))
    path = write(tmp_path, declare(1, 1) + unit_box(1) + ors)
    assert len(parse_vnnlib(path, max_terms=8).cases) == 8
    with pytest.raises(InputError, match=rf"^{path}: line 7: disjunctive normal form exceeds 4 "):
        parse_vnnlib(path, max_terms=4)
    # the default cap (100000) stops 2**17 terms
    ors = "".join(f"(assert (or (<= Y_0 {k}) (>= Y_0 {k})))\n" for k in range(17))
    path = write(tmp_path, declare(1, 1) + unit_box(1) + ors, "big.vnnlib")
    with pytest.raises(InputError, match=rf"^{path}: line 21: disjunctive normal form exceeds 100000"):
        parse_vnnlib(path)


def test_missing_file_and_bad_encoding(tmp_path):
    with pytest.raises(InputError, match="spec file not found"):
        parse_vnnlib(str(tmp_path / "nope.vnnlib"))
    path = tmp_path / "bin.vnnlib"
    path.write_bytes(b"; ok\n(declare-const X_0 Real)\n\xff\xfe\n")
    with pytest.raises(InputError, match=rf"^{path}: line 3: not UTF-8 text$"):
        parse_vnnlib(str(path))


def test_large_box_parses():
    """A 784-input box like mnistfc's (its speed is measured by hand, not asserted: timed
    tests fail on a loaded machine; ~11 ms here)."""
    n = 784
    rng = np.random.default_rng(0)
    lo = rng.uniform(0, 1, n)
    lo[:100] = 0.0  # exact, like the zero pixels of the real files
    parts = [declare(n, 10), "; Input constraints:\n"]
    for i in range(n):
        parts.append(f"(assert (<= X_{i} {float(lo[i] + 0.03)!r}))\n(assert (>= X_{i} {float(lo[i])!r}))\n\n")
    parts.append("(assert (or\n" + "".join(f"    (and (>= Y_{j} Y_3))\n" for j in range(10) if j != 3)
                 + "))\n")
    text = "".join(parts)
    p = parse_vnnlib_text(text, n_inputs=n, n_outputs=10)
    assert len(p.cases) == 9 and len(p.groups()) == 1
    # the shortest repr of a float is rarely its exact value: then the bound is widened
    exact = np.array([Fraction(repr(float(v))) == Fraction(float(v)) for v in lo])
    assert np.array_equal(p.cases[0].lo, np.where(exact, lo, np.nextafter(lo, -np.inf)))
    assert 100 <= exact.sum() < n


# -- the DNF against direct evaluation of the formula -------------------------------------------

def read_sexprs(text):
    """A separate minimal S-expression reader for the oracle."""
    toks = text.replace("(", " ( ").replace(")", " ) ").split()
    stack = [[]]
    for t in toks:
        if t == "(":
            stack.append([])
        elif t == ")":
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(t)
    return stack[0]


def evaluate(e, env):
    """Exact value of a term or truth of a formula (strict comparisons read as non-strict)."""
    if isinstance(e, str):
        if e in env:
            return env[e]
        return {"true": True, "false": False}.get(e, None) if e in ("true", "false") else Fraction(e)
    op, args = e[0], [evaluate(a, env) for a in e[1:]]
    if op == "and":
        return all(args)
    if op == "or":
        return any(args)
    if op == "+":
        return sum(args, Fraction(0))
    if op == "-":
        return -args[0] if len(args) == 1 else args[0] - sum(args[1:], Fraction(0))
    if op == "*":
        out = Fraction(1)
        for a in args:
            out *= a
        return out
    pairs = list(zip(args, args[1:]))
    if op in ("<=", "<"):
        return all(a <= b for a, b in pairs)
    if op in (">=", ">"):
        return all(a >= b for a, b in pairs)
    if op == "=":
        return all(a == b for a, b in pairs)
    raise AssertionError(op)


def random_formula(rng, depth):
    def const():
        return f"{int(rng.integers(-8, 9)) / 4}"

    def x_atom():
        i = int(rng.integers(2))
        a = [f"X_{i}", f"(* {int(rng.choice([-3, -2, 2, 3]))} X_{i})", f"(- X_{i})",
             f"(+ X_{i} {const()})", f"(- {const()} X_{i})"][int(rng.integers(5))]
        op = str(rng.choice(["<=", ">=", "<", ">"]))
        return f"({op} {a} {const()})" if rng.uniform() < 0.5 else f"({op} {const()} {a})"

    def y_term():
        parts = [f"(* {int(rng.integers(-3, 4))} Y_{j})" for j in range(2) if rng.uniform() < 0.7]
        parts = parts or ["Y_0"]
        if rng.uniform() < 0.5:
            parts.append(const())
        return parts[0] if len(parts) == 1 else f"(+ {' '.join(parts)})"

    def y_atom():
        op = str(rng.choice(["<=", ">=", "<", ">"]))
        return f"({op} {y_term()} {y_term() if rng.uniform() < 0.5 else const()})"

    if depth == 0 or rng.uniform() < 0.3:
        return x_atom() if rng.uniform() < 0.4 else y_atom()
    op = "and" if rng.uniform() < 0.5 else "or"
    kids = [random_formula(rng, depth - 1) for _ in range(int(rng.integers(1, 4)))]
    return f"({op} {' '.join(kids)})"


def dnf_holds(p, x, y):
    for c in p.cases:
        if np.all(c.lo <= x) and np.all(x <= c.hi) and np.all(c.A @ y <= c.b):
            return True
    return False


def test_dnf_matches_direct_evaluation():
    outcomes = {True: 0, False: 0}
    sizes = set()
    for seed in range(60):
        rng = np.random.default_rng(seed)
        asserts = [random_formula(rng, 3) for _ in range(int(rng.integers(1, 4)))]
        # every case bounded: a global box [-2, 2] on both inputs
        text = declare(2, 2) + "".join(f"(assert (>= X_{i} -2)) (assert (<= X_{i} 2))\n"
                                       for i in range(2))
        text += "".join(f"(assert {a})\n" for a in asserts)
        p = parse_vnnlib_text(text)
        sizes.add(len(p.cases))
        tree = [f[1] for f in read_sexprs(text) if f[0] == "assert"]
        # grid points (multiples of 1/64): every float computation below is exact
        pts = rng.integers(-160, 161, size=(160, 4)) / 64.0
        # and points on the constants' grid, to exercise boundaries
        pts[:100] = rng.integers(-12, 13, size=(100, 4)) / 4.0
        for row in pts:
            x, y = row[:2], row[2:]
            env = {"X_0": Fraction(x[0]), "X_1": Fraction(x[1]),
                   "Y_0": Fraction(y[0]), "Y_1": Fraction(y[1])}
            truth = all(evaluate(f, env) for f in tree)
            assert dnf_holds(p, x, y) == truth, (seed, text, row)
            outcomes[truth] += 1
    # the formulas are not all trivial: both outcomes are common, DNFs of several sizes
    assert min(outcomes.values()) > 0.1 * sum(outcomes.values()), outcomes
    assert len(sizes) >= 4, sizes


def test_a_long_written_out_disjunction_passes_the_product_cap(tmp_path, monkeypatch):
    """A disjunction listing more terms than MAX_TERMS (VNN-COMP nn4sys' lindex_60000: 120,000
    one-input boxes) is read while its boxes stay within FLAT_CELLS numbers (at most
    FLAT_TERMS terms); past that it is refused by name, and a conjunction multiplying out
    still stops at MAX_TERMS. The caps scaled down: 8 terms, 60 cells, 50 terms."""
    from crown_cli.io import vnnlib as V

    monkeypatch.setattr(V, "MAX_TERMS", 8)
    monkeypatch.setattr(V, "FLAT_CELLS", 60)
    monkeypatch.setattr(V, "FLAT_TERMS", 50)

    def ors(n_in, k):
        return declare(n_in, 1) + "(assert (or\n" + "".join(
            f"(and (>= X_0 {j}) (<= X_0 {j}.5) (<= Y_0 {j}))\n" for j in range(k)) + "))\n"

    prop = parse_vnnlib(write(tmp_path, ors(1, 30), "a.vnnlib"), max_terms=8)  # cap 60 // 2
    assert len(prop.cases) == 30 and prop.cases[-1].lo[0] == 29 and prop.cases[-1].hi[0] == 29.5
    path = write(tmp_path, ors(1, 31), "b.vnnlib")
    with pytest.raises(InputError, match=rf"^{path}: line \d+: disjunctive normal form exceeds 30 "):
        parse_vnnlib(path, max_terms=8)
    path = write(tmp_path, ors(4, 13), "c.vnnlib")  # 5 declared: cap 12
    with pytest.raises(InputError, match="exceeds 12 terms"):
        parse_vnnlib(path, max_terms=8)
    many = "".join(f"(assert (or (<= Y_0 {k}) (>= Y_0 {k + 0.5})))\n" for k in range(4))
    path = write(tmp_path, declare(1, 1) + unit_box(1) + many, "d.vnnlib")
    with pytest.raises(InputError, match="exceeds 8 terms .a conjunction of disjunctions"):
        parse_vnnlib(path, max_terms=8)
