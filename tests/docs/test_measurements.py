"""docs/measurements/ (and docs/serving.md, which quotes them) hold what bench's summaries make
of the raw runs in runs/."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench import compare, cuda_graphs, gpu_summary, pairs

ROOT = Path(__file__).resolve().parents[2]


def test_the_tracing_off_figures_are_the_committed_pairs() -> None:
    """docs/measurements/tracing-off-2026-11-27.md quotes what bench.pairs makes of its runs."""
    folder = ROOT / "runs/tracing-off-2026-11-27"
    page = (ROOT / "docs/measurements/tracing-off-2026-11-27.md").read_text()
    one, two = folder / "sitting-1.txt", folder / "sitting-2.txt"
    for files, a, b in [((one,), "head", "notrace"), ((two,), "head", "notrace"),
                        ((one, two), "head", "notrace"), ((two,), "head", "aa")]:  # fmt: skip
        median, low, high = pairs.difference(pairs.runs(*files), a, b)
        assert f"{median:.2f} µs [{low:.2f}, {high:.2f}]" in page


def test_the_sitting_of_2026_11_28_quotes_its_runs() -> None:
    """docs/measurements/sitting-2026-11-28.md quotes what bench.compare makes of its runs:
    each checkout by its own bench, and both by one harness (ab/)."""
    folder = ROOT / "runs/sitting-2026-11-28"
    page = (ROOT / "docs/measurements/sitting-2026-11-28.md").read_text()
    assert compare.table(folder) in page
    assert compare.table(folder / "ab") in page
    assert compare.table(folder, folder / "ab") in page


def test_the_gpu_runs_of_2026_11_28_quote_their_files() -> None:
    """docs/measurements/gpu-2026-11-28.md quotes what bench.gpu_summary makes of its runs on
    the H200."""
    folder = ROOT / "runs/gpu-2026-11-28"
    page = (ROOT / "docs/measurements/gpu-2026-11-28.md").read_text()
    sittings = {"5886f9a (runs 1-3)": (1, 2, 3), "43b2b15 (runs 4-5)": (4, 5)}
    assert gpu_summary.onnxruntime_table(folder) in page
    assert gpu_summary.served_table(folder, sittings) in page
    assert gpu_summary.served(4, folder)["digits-mlp", "cuda-graphs", 1] == 147.36


def test_the_gpu_figures_quoted_are_the_runs() -> None:
    """docs/serving.md and its measurements page quote the H200 runs' per-run ratios as
    bench.gpu_summary reads them."""
    folder = ROOT / "runs/gpu-2026-11-28"
    runs = [gpu_summary.served(run, folder) for run in range(1, 6)]

    def span(model: str, mode: str, c: int, digits: int = 2) -> str:
        ratios = [run[model, mode, c] / run[model, "cuda", c] for run in runs]
        return f"{min(ratios):.{digits}f}-{max(ratios):.{digits}f}"

    graphs = span("digits-mlp", "cuda-graphs", 1)
    wide = [span("fashion-mlp-wide", "cpu", c, digits=1) for c in (1, 64)]  # CPU / CUDA
    assert (graphs, wide) == ("0.36-0.62", ["5.2-9.7", "3.1-4.8"])
    for page in (ROOT / "docs/serving.md", ROOT / "docs/measurements/gpu-2026-11-28.md"):
        text = " ".join(page.read_text().split())
        assert f"{graphs} of the plain" in text, page
        assert f"{wide[0]} times faster" in text, page


TIMES = "\u00d7"  # the multiplication sign serving.md's ratios carry


def _tables(text: str) -> list[list[str]]:
    """The Markdown table rows of ``text`` below their headers, as their cells."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("|")]  # fmt: skip
    return [
        r
        for i, r in enumerate(rows)
        if r[0] != "---" and (i + 1 == len(rows) or rows[i + 1][0] != "---")
    ]


def test_the_invariance_figures_quoted_are_the_runs() -> None:
    """docs/measurements/invariance-2026-11-28.md and docs/serving.md quote what
    ``bench.invariance`` printed: the sweeps summed per model, the cost tables as printed."""
    folder = ROOT / "runs/invariance-2026-11-28"
    page = (ROOT / "docs/measurements/invariance-2026-11-28.md").read_text()
    serving = " ".join((ROOT / "docs/serving.md").read_text().split())
    lines = _tables((folder / "sweep.txt").read_text())
    for model in sorted({r[0] for r in lines}):
        own = [r for r in lines if r[0] == model]
        compared, differ = sum(int(r[4]) for r in own), sum(int(r[5]) for r in own)
        worst = max(int(r[6]) for r in own)
        assert f"| {model} | {len(own)} | {compared:,} | {differ} | {worst} |" in page
    odd = _tables((folder / "odd-widths.txt").read_text())
    assert len(odd) == 36 and {(r[4], r[5], r[6]) for r in odd} == {("32896", "0", "0")}
    cost = (folder / "cost.txt").read_text()
    served = re.findall(r"\n(digits-[a-z-]+), 64 clients.*?\n\n((?:\|.*\n)+)", cost)
    assert [head for head, _ in served] == ["digits-mlp", "digits-autoencoder"]
    for head, table in served:
        rates = {r[0]: r[1:] for r in _tables(table)}
        rate, rows, pad = int(rates["off"][0]), rates["rows"][1], rates["pad"][1]
        assert f"| {head} | {rate:,} | {rows} | {pad} |" in page
        assert f"{rate:,} | {rows} {TIMES} | {pad} {TIMES}" in serving
    runs = [r for r in _tables(cost) if r[0].isdigit()]
    assert [r[0] for r in runs] == ["1", "8", "64", "256"]
    for size, off, rows, pad in runs:
        assert f"| {size} | {off} | {rows} | {pad} |" in page
        if size != "8":
            shown = f"{float(pad):.1f}" if size == "1" else pad
            assert f"{float(off):,.1f} | {rows} {TIMES} | {shown} {TIMES}" in serving, size


def test_the_second_gpu_lease_quotes_its_judgement() -> None:
    """docs/measurements/gpu-2026-11-28.md's table of the accurate graphs on CUDA is what
    ``bench.cuda_graphs --judge`` made of each run's differences."""
    folder = ROOT / "runs/gpu-2026-11-28-b"
    page = " ".join((ROOT / "docs/measurements/gpu-2026-11-28.md").read_text().split())
    before = json.loads((folder / "cuda-graphs-judged.json").read_text())
    after = cuda_graphs.judge(folder / "after/cuda-graphs.npz")
    assert {k for k, v in before.items() if v["differ"]} == {"relu'", "elu'"}
    assert not any(v["differ"] for v in after.values()) and len(after) == 14
    elu = before["elu'"]
    assert f"| elu' | {elu['differ']:,} ({elu['cuda_above_one']:,} above 1 ULP) |" in page
    assert f"{elu['cuda_worst_ulp']:.3f} ULP at {elu['cuda_worst_x']:.2f}" in page
    relu = before["relu'"]
    assert f"| relu' | {relu['differ']:,} " in page
