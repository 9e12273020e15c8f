"""What `plan` prints: fits 100 columns, collapsed layers, readable names, units, true notes."""

from __future__ import annotations

import re

import pytest

from shardplan.cli.main import main
from shardplan.cli.render import cut_kind, fmt_bytes, fmt_params, fmt_seconds


def test_gpt2_xl_on_4x8_fits_84_lines_of_100_columns(capsys):
    # capsys is not a terminal: the CLI lays tables out for 100 columns
    assert main(["plan", "gpt2-xl", "--mesh", "4x8", "--batch", "8", "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) <= 84, "\n".join(lines)  # 48 layers in the space of at most three
    assert max(len(line) for line in lines) <= 100
    text = "\n".join(lines)
    # identical layers print once (the first and the last may differ: they read the embeddings
    # and feed the head; D-Rec's plan cuts their attention output otherwise since 4c71bb2)
    assert re.search(r"h\.[01]–4[67] ×4[5-8]", text), text
    # one summary line per mesh axis, with its link (row-major: 8 GPUs per node, issue 27)
    assert "node axis (4, inter-node 25 GB/s):" in text
    assert "gpu axis (8, intra-node 300 GB/s):" in text and "batch" in text
    assert " ms" in text and " GB" in text  # units, not 1.38e-05 or 1.44e+03 GB


def test_ops_all_expands_and_top_ranks(capsys):
    args = ["plan", "gpt2-small", "--small", "--mesh", "2x2", "-q"]
    assert main([*args, "--ops", "all"]) == 0
    out = capsys.readouterr().out
    assert "h.1.mlp.act" in out and "×2" not in out
    assert main([*args, "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "the 3 costliest of 66 ops" in out


def test_readable_cut_names_come_from_the_signature():
    from shardplan import zoo

    g = zoo.build("gpt2-small", small=True)
    fc = g.op("h.0.mlp.fc.linear")
    assert [cut_kind(g, fc, d) for d in ("b", "n", "k")] == ["batch", "column", "row"]
    scores = g.op("h.0.attn.scores")
    kinds = {d.name: cut_kind(g, scores, d.name) for d in scores.signature.loop_dims}
    assert kinds["b0"] == "batch" and kinds["b1"] == "heads"
    assert cut_kind(g, fc, None) == "none"


def test_units():
    assert fmt_seconds(1.38e-05) == "13.8 µs"
    assert fmt_seconds(0.063) == "63 ms"
    assert fmt_seconds(2.5) == "2.5 s"
    assert fmt_seconds(-1.5e-5) == "-15 µs"


def test_times_under_a_microsecond_print_in_us_and_float_noise_as_zero():
    assert fmt_seconds(0) == "0"
    assert fmt_seconds(1.51e-7) == "0.15 µs"
    assert fmt_seconds(1.58e-8) == "0.02 µs"
    assert fmt_seconds(7.56e-9) == "<0.01 µs"
    assert fmt_seconds(2.33e-11) == "<0.01 µs"  # 4 bytes all-reduced: real, negligible
    assert fmt_seconds(3e-19) == "0"  # under a femtosecond
    # against a 5.72 ms total, 5.72e-15 s is rounding of sums (<= 1e-12 x the total)
    assert fmt_seconds(5.72e-15, scale=5.72e-3) == "0"
    assert fmt_seconds(5.72e-15) == "<0.01 µs"
    assert fmt_seconds(1e-11, scale=5.72e-3) == "<0.01 µs"


def test_plan_summary_prints_no_nanoseconds(capsys):
    # gpt2-small on 8: the loss's all-reduce of 4 bytes costs ~2e-11 s (printed "0.0233 ns" once)
    assert main(["plan", "gpt2-small", "--mesh", "8", "-q"]) == 0
    out = capsys.readouterr().out
    assert " ns" not in out
    assert "intra-op fwd <0.01 µs, bwd 0," in out
    assert fmt_bytes(1.44e12) == "1.44 TB"
    assert fmt_bytes(512) == "512 B"
    assert fmt_params(175e9) == "175 B"
    assert fmt_params(124e6) == "124 M"


def test_unused_axis_note_says_nothing_divides(capsys):
    assert main(["plan", "gpt2-small", "--mesh", "7", "--ops", "none", "-q"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "no dim of any op divides by 7" in out
    assert "costs more time than it saves" not in out


def test_non_dividing_batch_warns(capsys):
    args = ["plan", "mlp", "--small", "--batch", "6", "--mesh", "8", "--method", "data-parallel"]
    assert main([*args, "--ops", "none", "-q"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "batch 6 (x) does not divide over 8 devices" in text
    assert "data parallelism can use at most 2 of them" in text
    assert "4 of the 8 ways of mesh axis 'dev' left unused" in text
    assert "the data-parallel plan splits only the dims its recipe names" in text
    assert "costs more time than it saves" not in text


def test_install_hints_keep_their_extra(monkeypatch, tmp_path, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    png = tmp_path / "p.png"
    assert main(["plan", "mlp", "--small", "--mesh", "2", "--plot", str(png), "-q"]) == 8
    assert "pip install 'shardplan[plot]'" in " ".join(capsys.readouterr().err.split())


def test_plan_plot_writes_a_png_and_an_svg(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png, svg = tmp_path / "plan.png", tmp_path / "plan.svg"
    args = ["plan", "gpt2-small", "--small", "--mesh", "2x2", "-q"]
    assert main([*args, "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([*args, "--plot", str(svg)]) == 0
    assert b"<svg" in svg.read_bytes()[:1000]
    assert main([*args, "--plot", str(tmp_path / "plan.bmp")]) == 2
