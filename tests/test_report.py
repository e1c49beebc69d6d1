"""`crown report` on small hand-made result files: numbers, layout, and bad or odd inputs."""
import csv
import json

import pytest
from click.testing import CliRunner

from crown_cli.cli import cli
from crown_cli.io.report import aggregate, read_results, render_latex, render_markdown, table

COLS = ["image", "label", "predicted", "target", "target_type", "norm", "method", "eps",
        "time_s", "evaluations", "status", "margin", "lower_bound", "search", "precision",
        "rtol", "attack_eps", "attack_time_s"]


def row(image, method, eps, time_s=1.0, status="certified", norm="inf", target="runner-up",
        attack="", **extra):
    r = {"image": image, "label": 0, "predicted": 0, "target": 1, "target_type": target,
         "norm": norm, "method": method, "eps": "" if eps is None else eps, "time_s": time_s,
         "evaluations": 5, "status": status, "margin": 1.0, "lower_bound": 0.1,
         "search": "interp", "precision": "mixed", "rtol": 0.0001, "attack_eps": attack,
         "attack_time_s": ""}
    r.update(extra)
    return r


def write_csv(path, rows, columns=COLS):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    return str(path)


def run(*args):
    return CliRunner().invoke(cli, ["report", *map(str, args)])


def cells(text):
    """Markdown table -> list of rows of cells (header first, separator dropped)."""
    out = []
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            out.append([c.strip() for c in line.strip("|").split("|")])
    return out


BASIC = [
    row(0, "fast-lin", 0.010, 1.0, attack=0.05), row(0, "crown", 0.012, 2.0, attack=0.05),
    row(1, "fast-lin", 0.020, 3.0, attack=0.04), row(1, "crown", 0.026, 4.0, attack=0.06),
    row(2, "fast-lin", None, 0.0, status="misclassified"),
    row(2, "crown", None, 0.0, status="misclassified"),
]


def test_a_cut_last_line_is_refused_naming_it(tmp_path):
    """A result file whose last row is cut (a killed run) is refused, as crown merge does (it
    was tabled with the cut row as a row of unknown settings, and a warning about them)."""
    path = write_csv(tmp_path / "r.csv", BASIC)
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-12])
    res = run(path)
    assert res.exit_code == 2
    assert f"crown: error: {path}: last line is incomplete (a killed run)" in res.stderr
    open(path, "wb").write(data)
    assert run(path).exit_code == 0


def test_averages_improvement_and_times(tmp_path):
    path = write_csv(tmp_path / "net_a.csv", BASIC)
    res = run(path)
    assert res.exit_code == 0, res.output
    header, line = cells(res.output)
    got = dict(zip(header, line))
    assert got["network"] == "net_a" and got["norm"] == "l_inf" and got["target"] == "runner-up"
    assert got["images"] == "2"
    assert got["Fast-Lin"] == "0.01500" and got["CROWN"] == "0.01900"
    assert got["CROWN vs Fast-Lin"] == "+26.7%"  # 0.019 / 0.015 - 1
    assert got["Fast-Lin s/image"] == "2.000" and got["CROWN s/image"] == "3.000"
    # per image the smallest attack distortion: image 0 0.05, image 1 0.04
    assert got["PGD attack (upper bound)"] == "0.04500"
    assert header.index("Fast-Lin") < header.index("CROWN")  # the paper's method order
    assert "net_a, l_inf, runner-up: left out 1 misclassified" in res.output


def test_rows_need_a_counting_result_from_every_method(tmp_path):
    rows = [
        row(0, "fast-lin", 0.01), row(0, "crown", 0.02),
        row(1, "fast-lin", None, status="timeout"), row(1, "crown", 0.5),
        row(2, "crown", 0.7),  # no fast-lin row at all
        row(3, "fast-lin", 0.0, status="not-certified"), row(3, "crown", 0.04),
        row(4, "fast-lin", 1e4, status="capped"), row(4, "crown", 1e4, status="capped"),
    ]
    rep = aggregate(read_results(write_csv(tmp_path / "n.csv", rows)))
    (g,) = rep.groups
    assert g.images == [0, 3, 4]
    assert dict(g.excluded) == {"timeout": 1, "missing": 1}
    by = {c.method: c for c in g.columns}
    assert by["fast-lin"].mean_eps == pytest.approx((0.01 + 0.0 + 1e4) / 3)
    assert by["crown"].mean_eps == pytest.approx((0.02 + 0.04 + 1e4) / 3)
    _, _, notes = table(rep)
    assert notes == ["n, l_inf, runner-up: left out 1 missing, 1 timeout; capped at --max-eps "
                     "(eps is that cap): fast-lin 1, crown 1"]


def test_exact_rows_count_when_solved(tmp_path):
    # `--method exact` writes status optimal (solved) or timeout (no eps)
    rows = [row(0, "crown", 0.02), row(0, "exact", 0.03, status="optimal"),
            row(1, "crown", 0.01), row(1, "exact", None, status="timeout")]
    rep = aggregate(read_results(write_csv(tmp_path / "n.csv", rows)))
    (g,) = rep.groups
    assert g.images == [0] and dict(g.excluded) == {"timeout": 1}
    assert {c.method: c.mean_eps for c in g.columns} == {"crown": 0.02, "exact": 0.03}


def test_groups_by_network_norm_and_target_in_paper_order(tmp_path):
    a = write_csv(tmp_path / "a.csv", [row(0, "crown", 0.1, norm="inf"),
                                       row(0, "crown", 0.5, norm="1"),
                                       row(0, "crown", 0.3, norm="2", target="least"),
                                       row(0, "crown", 0.2, norm="2", target="runner-up")])
    b = write_csv(tmp_path / "b.csv", [row(0, "fast-lin", 0.9)])
    res = run(b, a)
    rows = cells(res.output)[1:]
    assert [r[:3] for r in rows] == [["b", "l_inf", "runner-up"], ["a", "l_1", "runner-up"],
                                     ["a", "l_2", "runner-up"], ["a", "l_2", "least"],
                                     ["a", "l_inf", "runner-up"]]
    # a method absent from a group shows '-'; no improvement column without both methods
    assert rows[0][4:6] == ["0.90000", "-"] and rows[1][4:6] == ["-", "0.50000"]
    assert not any("vs Fast-Lin" in h for h in cells(res.output)[0])


def test_mixed_settings_become_separate_columns_with_a_warning(tmp_path):
    rows = [row(0, "crown", 0.010), row(1, "crown", 0.020),
            row(0, "crown", 0.011, rtol=0.001), row(1, "crown", 0.021, rtol=0.001),
            row(0, "fast-lin", 0.005), row(1, "fast-lin", 0.010)]
    res = run(write_csv(tmp_path / "m.csv", rows))
    assert res.exit_code == 0
    header, line = cells(res.output)
    got = dict(zip(header, line))
    assert got["CROWN (rtol=0.0001)"] == "0.01500" and got["CROWN (rtol=0.001)"] == "0.01600"
    assert got["CROWN (rtol=0.0001) vs Fast-Lin"] == "+100.0%"
    assert got["CROWN (rtol=0.001) vs Fast-Lin"] == "+113.3%"
    assert ("crown: warning: m, l_inf, runner-up: crown rows with different rtol; shown as "
            "separate columns") in res.output


def test_alpha_settings_from_the_sidecars_become_separate_columns(tmp_path):
    """alpha-crown rows carry no optimiser settings; each file's sidecar options do: rows
    run with different --alpha-iters are not averaged together (unset: ``default``)."""
    def sidecar(path, iters):
        opts = {"--model": "m/net.h5", "--alpha-iters": iters, "--alpha-lr": None}
        with open(str(path) + ".json", "w") as fh:
            json.dump({"model": {"path": "m/net.h5"}, "options": opts}, fh)
    a = write_csv(tmp_path / "a.csv", [row(0, "alpha-crown", 0.030),
                                       row(1, "alpha-crown", 0.040),
                                       row(0, "crown", 0.02), row(1, "crown", 0.02)])
    b = write_csv(tmp_path / "b.csv", [row(0, "alpha-crown", 0.032),
                                       row(1, "alpha-crown", 0.044)])
    sidecar(a, None)
    sidecar(b, 100)
    res = run(a, b)
    assert res.exit_code == 0, res.output
    header, line = cells(res.output)
    got = dict(zip(header, line))
    assert got["network"] == "net"
    assert got["alpha-CROWN (alpha_iters=default)"] == "0.03500"
    assert got["alpha-CROWN (alpha_iters=100)"] == "0.03800"
    assert "alpha-crown rows with different alpha_iters; shown as separate columns" in \
        res.output
    assert "repeated" not in res.output
    # the same settings in both files: one column, the second file's rows repeat the first's
    sidecar(b, None)
    res = run(a, b)
    got = dict(zip(*cells(res.output)))
    assert got["alpha-CROWN"] == "0.03500"
    assert "2 repeated alpha-crown rows" in res.output


def test_repeated_rows_keep_the_first(tmp_path):
    rows = [row(0, "crown", 0.010), row(0, "crown", 0.5)]
    res = run(write_csv(tmp_path / "d.csv", rows))
    assert cells(res.output)[1][4] == "0.01000"
    assert "1 repeated crown rows for the same image; kept the first of each" in res.output


def test_certified_eps_above_attack_is_flagged(tmp_path):
    rows = [row(0, "crown", 0.02, attack=0.01), row(1, "crown", 0.02, attack=0.03),
            row(2, "crown", 0.02)]
    res = run(write_csv(tmp_path / "s.csv", rows))
    assert ("crown: warning: s, l_inf, runner-up: image 0: crown certified eps 0.02 exceeds "
            "attack distortion 0.01") in res.output
    assert "image 1" not in res.output
    assert "attack average over 2 of 3 images" in res.output


def test_latex_output(tmp_path):
    path = write_csv(tmp_path / "mnist_3x1024.csv", BASIC)
    out = tmp_path / "t.tex"
    res = run(path, "--format", "latex", "-o", out)
    assert res.exit_code == 0 and res.output == ""
    tex = out.read_text()
    lines = tex.splitlines()
    assert lines[0] == r"\begin{tabular}{lllrrrrrrr}" and lines[1] == r"\toprule"
    assert lines[4] == (r"mnist\_3x1024 & $\ell_\infty$ & runner-up & 2 & 0.01500 & 0.01900 & "
                        r"0.04500 & +26.7\% & 2.000 & 3.000 \\")
    assert r"\bottomrule" in lines and r"\end{tabular}" in lines
    assert "% mnist_3x1024, l_inf, runner-up: left out 1 misclassified" in lines


def test_markdown_and_latex_agree_on_the_numbers(tmp_path):
    rep = aggregate(read_results(write_csv(tmp_path / "x.csv", BASIC)))
    md = render_markdown(rep)
    tex = render_latex(rep)
    for number in ("0.01500", "0.01900", "0.04500", "2.000", "3.000"):
        assert number in md and number in tex


def test_network_name_from_model_column_and_sidecar(tmp_path):
    with_col = write_csv(tmp_path / "one.csv", [row(0, "crown", 0.1, model="models/big_net.h5")],
                         COLS + ["model"])
    side = write_csv(tmp_path / "two.csv", [row(0, "crown", 0.2)])
    (tmp_path / "two.csv.json").write_text(json.dumps({"model": "/x/mnist_2x20.h5"}))
    plain = write_csv(tmp_path / "three.csv", [row(0, "crown", 0.3)])
    part = write_csv(tmp_path / "three.l2.csv", [row(0, "fast-lin", 0.1)])  # same network
    res = run(with_col, side, plain, part)
    assert [r[0] for r in cells(res.output)[1:]] == ["big_net", "mnist_2x20", "three"]
    assert cells(res.output)[3][4:6] == ["0.10000", "0.30000"]


def test_network_name_falls_through_to_the_stem_sidecar(tmp_path):
    """<file>.json without a model (unreadable or model-less) does not hide <stem>.json's."""
    path = write_csv(tmp_path / "four.csv", [row(0, "crown", 0.1)])
    (tmp_path / "four.csv.json").write_text(json.dumps({"options": {}}))
    (tmp_path / "four.json").write_text(json.dumps({"model": {"path": "/m/net_b.h5"}}))
    assert read_results(path)[0]["network"] == "net_b"
    (tmp_path / "four.csv.json").write_text("{not json")
    assert read_results(path)[0]["network"] == "net_b"


def test_jsonl_input(tmp_path):
    path = tmp_path / "j.jsonl"
    lines = [dict(row(0, "crown", 0.25), eps=0.25, attack_eps=None),
             dict(row(1, "crown", 0.75), eps=0.75, attack_eps=None)]
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    res = run(path)
    assert res.exit_code == 0, res.output
    assert cells(res.output)[1][:5] == ["j", "l_inf", "runner-up", "2", "0.50000"]


def test_missing_column_is_a_one_line_error(tmp_path):
    path = write_csv(tmp_path / "bad.csv", [row(0, "crown", 0.1)],
                     [c for c in COLS if c != "status"])
    res = run(path)
    assert res.exit_code == 2
    assert res.output == f"crown: error: {path}: missing column 'status'\n"


def test_empty_and_header_only_files(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    res = run(empty)
    assert res.exit_code == 2
    assert res.output == f"crown: error: {empty}: empty result file (no header line)\n"
    header_only = write_csv(tmp_path / "h.csv", [])
    other = write_csv(tmp_path / "o.csv", [row(0, "crown", 0.1)])
    res = run(header_only, other)
    assert res.exit_code == 0
    assert f"crown: warning: {header_only}: no rows" in res.output
    assert len(cells(res.output)) == 2


def test_bad_number_and_missing_file(tmp_path):
    path = write_csv(tmp_path / "n.csv", [row(3, "crown", "abc")])
    res = run(path)
    assert res.exit_code == 2
    assert res.output == f"crown: error: {path}: bad eps value 'abc' (image 3)\n"
    res = run(tmp_path / "nope.csv")
    assert res.output == f"crown: error: {tmp_path / 'nope.csv'}: result file not found\n"


def test_plot_writes_a_png(tmp_path):
    path = write_csv(tmp_path / "p.csv", BASIC + [row(0, "crown", 0.3, norm="2", attack=0.9)])
    png = tmp_path / "fig.png"
    res = run(path, "--plot", png, "-o", tmp_path / "t.md")
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_plot_with_nothing_to_plot(tmp_path):
    path = write_csv(tmp_path / "p.csv", [row(0, "crown", None, status="misclassified")])
    res = run(path, "--plot", tmp_path / "fig.png")
    assert res.exit_code == 2
    assert res.output.endswith("crown: error: --plot: no counted rows to plot\n")


def test_plot_without_matplotlib_is_a_clear_error(tmp_path, monkeypatch):
    import sys

    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    res = run(write_csv(tmp_path / "p.csv", BASIC), "--plot", tmp_path / "fig.png")
    assert res.exit_code == 2
    assert res.output == "crown: error: --plot: needs matplotlib (pip install 'crown-cli[plot]')\n"
    assert not (tmp_path / "fig.png").exists()
