"""docs/measurements/ (and docs/serving.md, which quotes them) hold what bench's summaries make
of the raw runs in runs/."""

from __future__ import annotations

from pathlib import Path

from bench import compare, gpu_summary, pairs

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
