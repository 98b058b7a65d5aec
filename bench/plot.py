#!/usr/bin/python3
"""Turns qkv_bench's JSON into docs/img/*.svg and a Markdown table.

    build/bench/qkv_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
        --benchmark_out=bench.json --benchmark_out_format=json
    /usr/bin/python3 bench/plot.py bench.json            # writes docs/img/attention_d64.svg, _d128.svg, ...
    /usr/bin/python3 bench/plot.py bench.json --out docs/img/zen3   # the same, into another folder
    /usr/bin/python3 bench/plot.py bench.json --table    # prints the table of docs/performance.md
    /usr/bin/python3 bench/plot.py bench.json --table16  # the table of 2-byte inputs against float

Needs matplotlib (Debian: python3-matplotlib) for the plots only. Medians of
the repetitions are used.
"""
import json
import os
import re
import sys

IMPLS = ["qkv_fused", "qkv_fused_2threads", "qkv_kernel", "qkv_naive", "onednn", "openblas", "eigen"]
LABELS = {
    "qkv_fused": "qkv fused",
    "qkv_fused_2threads": "qkv fused, 2 threads",
    "qkv_kernel": "qkv kernel, called directly",
    "qkv_naive": "qkv naive",
    "onednn": "oneDNN (matmul, softmax, matmul)",
    "openblas": "OpenBLAS sgemm + softmax",
    "eigen": "Eigen 3.4",
}
# 2-byte inputs (bench/qkv_bench.cpp's *_bf16 and *_f16 rows), against float.
IMPLS16 = ["qkv_fused", "qkv_fused_bf16", "qkv_fused_f16", "onednn", "onednn_bf16"]
LABELS.update({
    "qkv_fused_bf16": "qkv fused, bf16",
    "qkv_fused_f16": "qkv fused, f16",
    "onednn_bf16": "oneDNN, bf16",
})
NAME = re.compile(r"^(\w+)/n=(\d+)/m=(\d+)/d=(\d+)/causal=(\d)")


def load(path):
    with open(path) as f:
        data = json.load(f)
    rows = {}
    probe = None
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        if b["name"].startswith("fma_probe"):
            probe = {"gflops": b["GFLOP/s"] / 1e9, "label": b.get("label", "")}
            continue
        m = NAME.match(b["name"])
        if not m:
            continue
        impl, n, mm, d, causal = m.group(1), *map(int, m.groups()[1:])
        rows[(impl, n, mm, d, causal)] = {
            "ms": b["real_time"] if b["time_unit"] == "ms" else b["real_time"] / 1e6,
            "gflops": b["GFLOP/s"] / 1e9,
            "label": b.get("label", ""),
        }
    return data.get("context", {}), rows, probe


def table(rows, probe):
    configs = sorted({k[1:] for k in rows}, key=lambda c: (c[2], c[3], c[0] == 1, c[0], c[1]))
    impls = [i for i in IMPLS if any(k[0] == i for k in rows)]
    # Same-run ratios: qkv fused against the FMA probe and against each peer
    # (the peer's time over qkv's: above 1, qkv is faster).
    peers = [i for i in ("onednn", "openblas", "eigen") if i in impls]
    extra = (["fused, % of probe"] if probe else []) + [f"{LABELS[p].split(' ')[0]} time / fused" for p in peers]
    out = ["| n | m | d | causal | " + " | ".join([LABELS[i] for i in impls] + extra) + " |",
           "|---|---|---|---|" + "---|" * (len(impls) + len(extra))]
    for n, m, d, causal in configs:
        cells = []
        for i in impls:
            r = rows.get((i, n, m, d, causal))
            cells.append(f"{r['ms']:.3g} ms, {r['gflops']:.0f}" if r else "")
        fused = rows.get(("qkv_fused", n, m, d, causal))
        if probe:
            cells.append(f"{100 * fused['gflops'] / probe['gflops']:.0f}%" if fused else "")
        for p in peers:
            r = rows.get((p, n, m, d, causal))
            cells.append(f"{r['ms'] / fused['ms']:.2f}×" if r and fused else "")
        out.append(f"| {n} | {m} | {d} | {'yes' if causal else 'no'} | " + " | ".join(cells) + " |")
    if probe:
        out.append(f"\nFMA probe ({probe['label']}): {probe['gflops']:.0f} GFLOP/s")
    return "\n".join(out)


def table16(rows):
    configs = sorted({k[1:] for k in rows if k[0] == "qkv_fused_bf16"}, key=lambda c: (c[2], c[3], c[0]))
    impls = [i for i in IMPLS16 if any(k[0] == i for k in rows)]
    # GFLOP/s over float fused's (above 1: faster), and oneDNN bf16's time over qkv bf16's.
    out = ["| n | m | d | causal | " + " | ".join(LABELS[i] for i in impls) +
           " | bf16 / float | f16 / float | oneDNN bf16 time / qkv bf16 |",
           "|---|---|---|---|" + "---|" * (len(impls) + 3)]
    for n, m, d, causal in configs:
        get = lambda i: rows.get((i, n, m, d, causal))
        cells = [f"{get(i)['ms']:.3g} ms, {get(i)['gflops']:.0f}" if get(i) else "" for i in impls]
        f, b, h, ob = get("qkv_fused"), get("qkv_fused_bf16"), get("qkv_fused_f16"), get("onednn_bf16")
        cells.append(f"{f['ms'] / b['ms']:.2f}×" if f and b else "")
        cells.append(f"{f['ms'] / h['ms']:.2f}×" if f and h else "")
        cells.append(f"{ob['ms'] / b['ms']:.2f}×" if ob and b else "")
        out.append(f"| {n} | {m} | {d} | {'yes' if causal else 'no'} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def plots(rows, outdir):
    import matplotlib
    matplotlib.use("svg")
    matplotlib.rcParams["svg.hashsalt"] = "qkv"  # reproducible files
    import matplotlib.pyplot as plt

    os.makedirs(outdir, exist_ok=True)
    for impls, stem in ((IMPLS, "attention"), (IMPLS16, "attention16")):
        if stem == "attention16" and not any(k[0] == "qkv_fused_bf16" for k in rows):
            continue
        plot_set(plt, rows, outdir, impls, stem)


def plot_set(plt, rows, outdir, impls, stem):
    for d in sorted({k[3] for k in rows}):
        fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
        for ax, causal in zip(axes, (0, 1)):
            for impl in impls:
                pts = sorted((k[1], v["gflops"]) for k, v in rows.items()
                             if k[0] == impl and k[3] == d and k[4] == causal and k[1] == k[2])
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=LABELS[impl])
            ax.set_xscale("log", base=2)
            ax.set_xlabel("sequence length T (n = m = T)")
            ax.set_title(f"d = {d}, {'causal' if causal else 'no mask'}")
            ax.grid(True, alpha=0.3)
        axes[0].set_ylabel("GFLOP/s (4·d per visible pair), one thread")
        axes[1].legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(outdir, f"{stem}_d{d}.svg")
        fig.savefig(path, metadata={"Date": None})
        plt.close(fig)
        print("wrote", path)


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    context, rows, probe = load(sys.argv[1])
    if "--table" in sys.argv:
        print(table(rows, probe))
    elif "--table16" in sys.argv:
        print(table16(rows))
    else:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        out = os.path.join(root, "docs", "img")
        if "--out" in sys.argv:
            at = sys.argv.index("--out")
            if at + 1 >= len(sys.argv):
                print("plot.py: --out needs a folder", file=sys.stderr)
                return 2
            out = sys.argv[at + 1]
        plots(rows, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
