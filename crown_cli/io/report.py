"""Aggregate result rows into the paper's table layout (markdown or LaTeX) and plot them.

Rows are grouped by (network, norm, target type), one table row per group; every method
(with its settings, see below) gets a column of average certified eps, an improvement over
Fast-Lin and an average time per image, and the attack's average distortion is shown beside
them when the rows have one.

Counting rules (also in docs/cli.md, crown report):

* A row counts if its status is ``certified``, ``capped`` (certified at ``--max-eps``; its eps
  is a valid lower bound), ``not-certified`` (counts as eps 0, the bound it proved) or
  ``optimal`` (``--method exact`` solved: eps is the minimum distortion).
* A group averages over the images that have a counting row for every method column of the
  group, so all columns of a table row average the same images. Images left out are counted
  by the reason (the status of the first non-counting row, e.g. ``misclassified``,
  ``timeout``, ``error``, or ``missing`` when a method has no row) in the notes.
* Rows of one method whose settings (``search``, ``precision``, ``rtol``; for alpha-crown
  also ``--alpha-iters`` and ``--alpha-lr``, read from the file's provenance sidecar, unset
  meaning ``default``) differ within a group become separate columns, labelled with the
  differing settings; a warning says so.
  A repeated (method, settings, image) row keeps the first one read, with a warning.
* The attack column averages, over the group's images, the smallest ``attack_eps`` any row
  of the image carries (each is a verified upper bound); images without one are left out of
  that average and counted in the notes. A certified eps above an image's attack distortion
  is reported as a warning: it would mean an unsound certificate.

Pure functions over lists of row dicts; only :func:`read_results` opens files and only
:func:`plot_report` needs matplotlib.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from crown_cli.errors import InputError
from crown_cli.io.results import check_last_line

REQUIRED_COLUMNS = ("image", "target_type", "norm", "method", "eps", "time_s", "status")
SETTING_COLUMNS = ("search", "precision", "rtol", "alpha_iters", "alpha_lr")
# settings of alpha-crown rows taken from the file's sidecar options (not row columns)
SIDECAR_SETTINGS = (("alpha_iters", "--alpha-iters"), ("alpha_lr", "--alpha-lr"))
# optimal: a solved `--method exact` row (eps is the minimum distortion)
COUNTED_STATUSES = ("certified", "capped", "not-certified", "optimal")
METHOD_ORDER = ("fast-lin", "fast-lip", "op-norm", "lp", "lp-full", "crown-paper", "crown",
                "crown-quad",
                "alpha-crown", "exact")
METHOD_NAMES = {"fast-lin": "Fast-Lin", "fast-lip": "Fast-Lip", "op-norm": "Op-norm",
                "lp": "LP", "lp-full": "LP-Full", "crown": "CROWN", "crown-paper": "CROWN (paper lines)",
                "crown-quad": "CROWN-Quad",
                "alpha-crown": "alpha-CROWN",
                "exact": "Exact"}
NORM_ORDER = ("1", "2", "inf")  # the paper's tables list l_1, l_2, l_inf
TARGET_ORDER = ("runner-up", "random", "least", "untargeted")
BASELINE = "fast-lin"
# methods whose gain over CROWN gets a column of its own (when a crown column is in the group)
OVER_CROWN = ("alpha-crown",)


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------


def network_name(path: str, sidecars: Optional[List[Dict[str, object]]] = None) -> str:
    """The network a result file is about: its provenance sidecar's model, else its name.

    A ``model`` column, when present, overrides this per row (see :func:`read_results`).
    The sidecar is ``<path>.json`` (or ``<stem>.json``) with a ``model`` entry holding the
    model path (a string, or an object with a ``path``); the network is that file's stem.
    Without one it is the result file's name up to its first dot, so ``mnist_2x20.l2.csv``
    and ``mnist_2x20.csv`` both report on ``mnist_2x20``. ``sidecars``: :func:`_sidecars`
    of ``path``, when the caller has read them already.
    """
    for meta in _sidecars(path) if sidecars is None else sidecars:
        model = meta.get("model")
        if isinstance(model, dict):
            model = model.get("path")
        if isinstance(model, str) and model:
            return _stem(model)
    return os.path.basename(path).split(".", 1)[0] or _stem(path)


def _sidecars(path: str) -> List[Dict[str, object]]:
    """The readable provenance sidecars of a result file, in the order they are consulted:
    ``<path>.json``, then ``<stem>.json`` (each only if it exists and holds a JSON object)."""
    found = []
    stem = os.path.splitext(path)[0]
    for side in (path + ".json", stem + ".json"):
        if side == path or not os.path.isfile(side):
            continue
        try:
            with open(side, encoding="utf-8") as fh:
                meta = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict):
            found.append(meta)
    return found


def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def result_format(path: str) -> str:
    """'csv' or 'jsonl': what the provenance sidecar ``<path>.json`` says the file is, else what
    its first non-blank character says ('{': JSON Lines), whatever the file is called."""
    side = path + ".json"
    if os.path.isfile(side):
        try:
            with open(side, encoding="utf-8") as fh:
                fmt = json.load(fh).get("format")
            if fmt in ("csv", "jsonl"):
                return fmt
        except (OSError, ValueError, AttributeError):
            pass
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096).lstrip()
    except OSError as exc:
        raise InputError(f"{path}: cannot read result file ({exc.strerror})") from None
    return "jsonl" if head.startswith(b"{") else "csv"


def read_results(path: str) -> List[Dict[str, str]]:
    """Rows of a result file (CSV or JSON Lines, see :func:`result_format`) as dicts of strings.

    Each row gets a ``network`` entry. Raises InputError for a missing or empty file, one whose
    last line is cut (a killed run), for a ``crown verify`` result file and for a missing
    required column (naming the file and the column).
    """
    if not os.path.isfile(path):
        raise InputError(f"{path}: result file not found")
    fmt = result_format(path)
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        fh.seek(max(0, fh.tell() - 1))
        check_last_line(path, fh.read(1))
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            if fmt == "jsonl":
                rows = [_json_row(path, n, line) for n, line in enumerate(fh, 1) if line.strip()]
                header = list(rows[0]) if rows else []
            else:
                reader = csv.DictReader(fh)
                header = reader.fieldnames or []
                rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(f"{path}: cannot read result file ({exc})") from None
    if not header:
        raise InputError(f"{path}: empty result file (no header line)")
    if "verdict" in header and "vnnlib" in header:
        raise InputError(f"{path}: is a crown verify result file (one verdict per instance); "
                         "crown report tables the rows of crown certify")
    for col in REQUIRED_COLUMNS:
        if col not in header:
            raise InputError(f"{path}: missing column '{col}'")
    sidecars = _sidecars(path)
    default = network_name(path, sidecars)
    # alpha-CROWN's optimiser settings are not row columns; the sidecar's options hold them
    opts = next((m["options"] for m in sidecars if isinstance(m.get("options"), dict)), {})
    alpha = {col: opts[flag] for col, flag in SIDECAR_SETTINGS if flag in opts}
    for row in rows:
        model = row.get("model") or ""
        row["network"] = _stem(model) if model else default
        row["_file"] = path
        if row.get("method") == "alpha-crown":
            for col, value in alpha.items():
                if col not in row:
                    row[col] = "default" if value is None else str(value)
    return rows


def _json_row(path, n, line) -> Dict[str, str]:
    try:
        obj = json.loads(line)
    except ValueError:
        raise InputError(f"{path}: line {n}: not valid JSON") from None
    if not isinstance(obj, dict):
        raise InputError(f"{path}: line {n}: expected a JSON object")
    return {k: "" if v is None else (repr(v) if isinstance(v, float) else str(v))
            for k, v in obj.items()}


def _number(row, col) -> Optional[float]:
    text = (row.get(col) or "").strip()
    if text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{row.get('_file', 'results')}: bad {col} value '{text}' "
                         f"(image {row.get('image')})") from None
    return value if math.isfinite(value) else None


# ---------------------------------------------------------------------------------------------
# aggregation
# ---------------------------------------------------------------------------------------------


@dataclass
class Column:
    """One method (with settings) within a group: per-image eps and time."""

    method: str
    label: str  # method name, plus the settings that tell it apart from its siblings
    eps: Dict[int, float] = field(default_factory=dict)
    time: Dict[int, float] = field(default_factory=dict)
    status: Dict[int, str] = field(default_factory=dict)
    mean_eps: Optional[float] = None
    mean_time: Optional[float] = None
    improvement: Optional[float] = None  # % over Fast-Lin
    over_crown: Optional[float] = None  # % over CROWN (OVER_CROWN methods)
    capped: int = 0


@dataclass
class Group:
    network: str
    norm: str
    target_type: str
    columns: List[Column]
    images: List[int]  # images every column counts, ascending
    excluded: Counter  # reason -> images left out
    attack: Dict[int, float]  # image -> smallest attack distortion
    attack_mean: Optional[float] = None
    attack_images: int = 0


@dataclass
class Report:
    groups: List[Group]
    warnings: List[str]

    def labels(self) -> List[str]:
        """All column labels, in the paper's method order, then alphabetically."""
        seen = {}
        for g in self.groups:
            for c in g.columns:
                seen.setdefault(c.label, c.method)
        return sorted(seen, key=lambda lab: (_method_rank(seen[lab]), lab))

    def has_attack(self) -> bool:
        return any(g.attack for g in self.groups)


def _method_rank(method: str) -> Tuple[int, str]:
    return (METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER), method)


def _order(value: str, order: Sequence[str]) -> Tuple[int, str]:
    return (order.index(value) if value in order else len(order), value)


def aggregate(rows: Sequence[Dict[str, str]]) -> Report:
    """Group rows by (network, norm, target type) and average each method column."""
    warnings: List[str] = []
    networks: List[str] = []
    buckets: Dict[tuple, List[Dict[str, str]]] = {}
    for row in rows:
        net = row.get("network") or "results"
        if net not in networks:
            networks.append(net)
        key = (net, row["norm"], row["target_type"])
        buckets.setdefault(key, []).append(row)
    keys = sorted(buckets, key=lambda k: (networks.index(k[0]), _order(k[1], NORM_ORDER),
                                          _order(k[2], TARGET_ORDER)))
    groups = [_group(key, buckets[key], warnings) for key in keys]
    return Report(groups, warnings)


def _group(key, rows, warnings) -> Group:
    net, norm, ttype = key
    where = f"{net}, {norm_text(norm)}, {ttype}"
    # method -> settings tuple -> rows
    variants: Dict[str, Dict[tuple, list]] = {}
    for row in rows:
        settings = tuple((c, row.get(c) or "") for c in SETTING_COLUMNS if c in row)
        variants.setdefault(row["method"], {}).setdefault(settings, []).append(row)
    columns: List[Column] = []
    for method in sorted(variants, key=_method_rank):
        by_settings = variants[method]
        differing = [c for c in SETTING_COLUMNS
                     if len({dict(s).get(c) for s in by_settings}) > 1]
        if differing:
            warnings.append(f"{where}: {method} rows with different {', '.join(differing)}; "
                            "shown as separate columns")
        for settings, vrows in by_settings.items():
            label = method
            if differing:
                label += " (" + ", ".join(f"{c}={dict(settings).get(c) or '?'}"
                                          for c in differing) + ")"
            columns.append(_column(method, label, vrows, where, warnings))
    all_images = sorted({int(r["image"]) for r in rows})
    images, excluded = [], Counter()
    for i in all_images:
        reason = None
        for col in columns:
            st = col.status.get(i)
            if st is None:
                reason = reason or "missing"
            elif st not in COUNTED_STATUSES or i not in col.eps:
                reason = st if reason in (None, "missing") else reason
        if reason is None:
            images.append(i)
        else:
            excluded[reason] += 1
    attack: Dict[int, float] = {}
    for row in rows:
        a = _number(row, "attack_eps") if "attack_eps" in row else None
        if a is not None:
            i = int(row["image"])
            attack[i] = min(a, attack.get(i, math.inf))
    for col in columns:
        if images:
            col.mean_eps = sum(col.eps[i] for i in images) / len(images)
            col.mean_time = sum(col.time[i] for i in images) / len(images)
        col.capped = sum(col.status[i] == "capped" for i in images)
        for i in images:
            if i in attack and col.eps[i] > attack[i]:
                warnings.append(f"{where}: image {i}: {col.label} certified eps {col.eps[i]!r} "
                                f"exceeds attack distortion {attack[i]!r}")
    baselines = [c for c in columns if c.method == BASELINE]
    if len(baselines) == 1 and baselines[0].mean_eps:
        base = baselines[0].mean_eps
        for col in columns:
            if col is not baselines[0] and col.mean_eps is not None:
                col.improvement = 100.0 * (col.mean_eps / base - 1.0)
    crowns = [c for c in columns if c.method == "crown"]
    if len(crowns) == 1 and crowns[0].mean_eps:
        for col in columns:
            if col.method in OVER_CROWN and col.mean_eps is not None:
                col.over_crown = 100.0 * (col.mean_eps / crowns[0].mean_eps - 1.0)
    with_attack = [i for i in images if i in attack]
    group = Group(net, norm, ttype, columns, images, excluded, attack)
    if with_attack:
        group.attack_mean = sum(attack[i] for i in with_attack) / len(with_attack)
        group.attack_images = len(with_attack)
    return group


def _column(method, label, rows, where, warnings) -> Column:
    col = Column(method, label)
    dup = 0
    for row in rows:
        i = int(row["image"])
        if i in col.status:
            dup += 1
            continue
        col.status[i] = row["status"]
        eps, t = _number(row, "eps"), _number(row, "time_s")
        if row["status"] in COUNTED_STATUSES and eps is not None:
            col.eps[i] = eps
            col.time[i] = t if t is not None else 0.0
    if dup:
        warnings.append(f"{where}: {dup} repeated {label} rows for the same image; "
                        "kept the first of each")
    return col


# ---------------------------------------------------------------------------------------------
# rendering
# ---------------------------------------------------------------------------------------------


def norm_text(norm: str) -> str:
    return {"inf": "l_inf", "2": "l_2", "1": "l_1"}.get(norm, norm)


def _label_name(label: str, method: str) -> str:
    return METHOD_NAMES.get(method, method) + label[len(method):]


def table(report: Report, raw: bool = False) -> Tuple[List[str], List[List[str]], List[str]]:
    """(header, rows of cells, notes) of the report; cells are plain text, or with ``raw`` the
    numbers themselves (eps and seconds unrounded, improvements in %, None for '-')."""
    labels = report.labels()
    methods = {c.label: c.method for g in report.groups for c in g.columns}
    names = {lab: _label_name(lab, methods[lab]) for lab in labels}
    improved = [lab for lab in labels if methods[lab] != BASELINE and any(
        c.label == lab and c.improvement is not None for g in report.groups for c in g.columns)]
    header = ["network", "norm", "target", "images"] + [names[lab] for lab in labels]
    if report.has_attack():
        header.append("PGD attack (upper bound)")
    header += [f"{names[lab]} vs Fast-Lin" for lab in improved]
    over = [lab for lab in labels if any(c.label == lab and c.over_crown is not None
                                         for g in report.groups for c in g.columns)]
    header += [f"{names[lab]} vs CROWN" for lab in over]
    header += [f"{names[lab]} s/image" for lab in labels]
    body, notes = [], []
    for g in report.groups:
        cols = {c.label: c for c in g.columns}
        def cell(lab, attr, fmt):
            value = getattr(cols[lab], attr) if lab in cols else None
            return value if raw else "-" if value is None else fmt(value)

        cells = [g.network, norm_text(g.norm), g.target_type,
                 len(g.images) if raw else str(len(g.images))]
        cells += [cell(lab, "mean_eps", _fmt_eps) for lab in labels]
        if report.has_attack():
            cells.append(g.attack_mean if raw else _fmt_eps(g.attack_mean))
        cells += [cell(lab, "improvement", lambda v: f"{v:+.1f}%") for lab in improved]
        cells += [cell(lab, "over_crown", lambda v: f"{v:+.2f}%") for lab in over]
        cells += [cell(lab, "mean_time", lambda v: f"{v:.3f}") for lab in labels]
        body.append(cells)
        note = _group_note(g)
        if note:
            notes.append(f"{g.network}, {norm_text(g.norm)}, {g.target_type}: {note}")
    return header, body, notes


def _group_note(g: Group) -> str:
    parts = []
    if g.excluded:
        parts.append("left out " + ", ".join(f"{n} {reason}" for reason, n in
                                             sorted(g.excluded.items())))
    capped = [f"{c.label} {c.capped}" for c in g.columns if c.capped]
    if capped:
        parts.append("capped at --max-eps (eps is that cap): " + ", ".join(capped))
    if g.attack and g.attack_images < len(g.images):
        parts.append(f"attack average over {g.attack_images} of {len(g.images)} images "
                     "(no adversarial example found or no attack for the rest)")
    return "; ".join(parts)


def _fmt_eps(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.5f}" if value >= 0.001 else f"{value:.3e}"


RULES = ("Averages over the images every method of the row has a result for (certified, "
         "capped, exact's optimal, or not-certified counted as eps 0); misclassified images "
         "are skipped. "
         "Times are seconds per image (certification only).")


def column_key(name: str) -> str:
    """A table column's name for --columns: lower case, runs of other characters as '-'
    ('CROWN s/image' -> 'crown-s-image', 'alpha-CROWN vs CROWN' -> 'alpha-crown-vs-crown')."""
    import re

    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def select_columns(header: List[str], body: List[list], columns: Optional[Sequence[str]]):
    """(header, body) with only ``columns`` (names as in the header, or :func:`column_key`s),
    in that order; InputError naming an unknown one and listing the choices."""
    if not columns:
        return header, body
    keys = [column_key(h) for h in header]
    picks = []
    for name in columns:
        k = column_key(name)
        if k not in keys:
            raise InputError(f"--columns: no column '{name}' in this report (columns: "
                             f"{', '.join(keys)})")
        picks.append(keys.index(k))
    return [header[i] for i in picks], [[row[i] for i in picks] for row in body]


def render_markdown(report: Report, columns: Optional[Sequence[str]] = None) -> str:
    header, body, notes = table(report)
    header, body = select_columns(header, body, columns)
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if h in ("network", "norm", "target") else "---:"
                            for h in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    lines += ["", RULES]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


_LATEX_ESCAPES = {"\\": r"\textbackslash{}", "_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#",
                  "$": r"\$", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                  "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_ESCAPES.get(ch, ch) for ch in text)


def render_latex(report: Report, columns: Optional[Sequence[str]] = None) -> str:
    """A booktabs tabular (needs \\usepackage{booktabs}) with the notes as a comment below."""
    header, body, notes = table(report)
    header, body = select_columns(header, body, columns)
    norms = {"l_inf": r"$\ell_\infty$", "l_2": r"$\ell_2$", "l_1": r"$\ell_1$"}
    lines = [r"\begin{tabular}{lll" + "r" * (len(header) - 3) + "}", r"\toprule",
             " & ".join(latex_escape(h) for h in header) + r" \\", r"\midrule"]
    for row in body:
        cells = [latex_escape(c) if header[k] != "norm" else norms.get(c, latex_escape(c))
                 for k, c in enumerate(row)]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    lines += ["% " + RULES] + [f"% {n}" for n in notes]
    return "\n".join(lines) + "\n"


def render_csv(report: Report, columns: Optional[Sequence[str]] = None) -> str:
    """The table as CSV: a header line, then one line per table row with the numbers unrounded
    (floats as repr, improvements in %, empty for '-'). No notes: they go to the warnings."""
    header, body, _ = table(report, raw=True)
    header, body = select_columns(header, body, columns)
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(header)
    for row in body:
        out.writerow(["" if v is None else repr(v) if isinstance(v, float) else v for v in row])
    return buf.getvalue()


def render_json(report: Report, columns: Optional[Sequence[str]] = None) -> str:
    """The table as one JSON object: ``rows`` (one object per table row, keys the column names,
    numbers unrounded, null for '-'), ``notes`` and the counting ``rules``."""
    header, body, notes = table(report, raw=True)
    header, body = select_columns(header, body, columns)
    doc = {"rows": [dict(zip(header, row)) for row in body], "notes": notes, "rules": RULES}
    return json.dumps(doc, indent=2) + "\n"


RENDERERS = {"markdown": render_markdown, "latex": render_latex, "csv": render_csv,
             "json": render_json}

# the table format an --output name implies
TABLE_EXTENSIONS = {".md": "markdown", ".markdown": "markdown", ".tex": "latex", ".csv": "csv",
                    ".json": "json"}


def table_format(output: str, fmt: Optional[str]) -> str:
    """The format of ``crown report``'s table: ``fmt`` (--format) when given, else from the
    --output name's extension (.md, .tex, .csv, .json; anything else and stdout: markdown).
    InputError for a --format that contradicts the extension, and for a .jsonl name (a
    result-file format; a report is one table)."""
    ext = os.path.splitext(output)[1].lower() if output != "-" else ""
    if ext == ".jsonl":
        raise InputError(f"{output}: crown report writes one table (markdown, latex, csv or "
                         "json), not JSON Lines; name the file *.json for --format json")
    implied = TABLE_EXTENSIONS.get(ext)
    if fmt is None:
        return implied or "markdown"
    if implied is not None and implied != fmt:
        raise InputError(f"{output}: --format {fmt} but the name ends in {ext}; drop --format "
                         f"or give the file an extension of {fmt}")
    return fmt


def plot_report(report: Report, path: str) -> None:
    """Certified eps per image for every method beside the attack's distortion, one panel per
    group, saved as an image (format from the extension, e.g. PNG)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise InputError("--plot: needs matplotlib (pip install 'crown-cli[plot]')") from None
    groups = [g for g in report.groups if g.images]
    if not groups:
        raise InputError("--plot: no counted rows to plot")
    ncols = min(3, len(groups))
    nrows = -(-len(groups) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.0 * ncols, 3.6 * nrows), squeeze=False)
    for ax, g in zip(axes.flat, groups):
        for col in g.columns:
            ax.plot(g.images, [col.eps[i] for i in g.images], marker="o", markersize=3,
                    linewidth=1, label=_label_name(col.label, col.method))
        if g.attack:
            xs = [i for i in g.images if i in g.attack]
            ax.plot(xs, [g.attack[i] for i in xs], "k--x", markersize=4, linewidth=0.8,
                    label="PGD attack (upper bound)")
        ax.set_title(f"{g.network}, {norm_text(g.norm)}, {g.target_type}", fontsize=9)
        ax.set_xlabel("image index")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # images are whole numbers
        ax.set_ylabel("eps")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot write plot ({exc})") from None
    finally:
        plt.close(fig)
