#!/usr/bin/python3
"""Turns qkv_bench's JSON into docs/img/*.svg and a Markdown table, and the
tour's CSV files (examples/tour.cpp, --csv DIR) into PNG pictures.

    build/bench/qkv_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
        --benchmark_out=bench.json --benchmark_out_format=json
    /usr/bin/python3 bench/plot.py bench.json            # writes docs/img/attention_d64.svg, _d128.svg, ...
    /usr/bin/python3 bench/plot.py bench.json --out docs/img/zen3   # the same, into another folder
    /usr/bin/python3 bench/plot.py bench.json --table    # prints the table of docs/performance.md
    /usr/bin/python3 bench/plot.py bench.json --table16  # the table of 2-byte inputs against float

    build/examples/tour --csv tour-csv
    /usr/bin/python3 bench/plot.py --tour tour-csv --out docs/img/tour   # weights.png, gradient.png, timing.png

Needs matplotlib (Debian: python3-matplotlib) for the plots only. Medians of
the repetitions are used. Without --out, the tour's pictures go next to its
CSV files.
"""
import csv
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


# The look both kinds of plots share: points marked on their lines, sizes on
# a log2 axis, a light grid.
def line(ax, x, y, label, **style):
    return ax.plot(x, y, marker="o", label=label, **style)


def log2_axis(ax, label, ticks=None):
    """A log2 x axis; with ticks, those values are marked, written plainly (256, 512, ...)."""
    ax.set_xscale("log", base=2)
    ax.set_xlabel(label)
    ax.grid(True, alpha=0.3)
    if ticks is not None:
        from matplotlib.ticker import FixedLocator, NullLocator
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([f"{t:g}" for t in ticks])


def log_y(ax, label, subs=(1.0, 2.0, 5.0)):
    """A log y axis labelled plainly (0.1, 0.2, 0.5, 1, ...): subs picks the marks within each decade."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel(label)


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
                    line(ax, [p[0] for p in pts], [p[1] for p in pts], LABELS[impl])
            log2_axis(ax, "sequence length T (n = m = T)")
            ax.set_title(f"d = {d}, {'causal' if causal else 'no mask'}")
        axes[0].set_ylabel("GFLOP/s (4·d per visible pair), one thread")
        axes[1].legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(outdir, f"{stem}_d{d}.svg")
        fig.savefig(path, metadata={"Date": None})
        plt.close(fig)
        print("wrote", path)


# The tour's pictures, from the CSV files tour --csv DIR writes.
def read_csv(folder, name):
    with open(os.path.join(folder, name), newline="") as f:
        return list(csv.DictReader(f))


def machine(folder):
    """What the tour ran on, from its machine.csv: cpu, arch, threads, compiler, build ({} without the file)."""
    try:
        return {r["key"]: r["value"] for r in read_csv(folder, "machine.csv")}
    except FileNotFoundError:
        return {}


def machine_caption(m):
    if not m:
        return "machine not recorded (no machine.csv)"
    return (f"measured on {m.get('cpu', 'unknown CPU')}  ·  qkv kernels: {m.get('arch', '?')}  ·  "
            f"{m.get('threads', '?')} threads  ·  {m.get('compiler', '?')}, {m.get('build', '?')}")


def save(plt, fig, caption, path):
    # Below the axes; bbox_inches="tight" widens the picture to take it in.
    fig.text(0.01, -0.01, caption, ha="left", va="top", fontsize=8, color="0.3")
    fig.savefig(path, dpi=100, bbox_inches="tight", pad_inches=0.15, metadata={"Software": None},
                pil_kwargs={"optimize": True})
    plt.close(fig)
    print("wrote", path)


def tour_weights(plt, folder, outdir, caption):
    from matplotlib.colors import LogNorm
    rows = read_csv(folder, "weights.csv")
    dk, keys = int(rows[0]["d_k"]), int(rows[0]["keys"])
    n = 1 + max(int(r["query"]) for r in rows)
    m = 1 + max(int(r["key"]) for r in rows)
    grids = {}
    for r in rows:
        grid = grids.setdefault(r["scale"], [[0.0] * m for _ in range(n)])
        grid[int(r["query"])][int(r["key"])] = float(r["weight"])
    norm = LogNorm(vmin=1e-8, vmax=1)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.9), layout="constrained")
    titles = {"raw": "softmax(Q Kᵀ), unscaled", "scaled": f"softmax(Q Kᵀ / √{dk}), scaled"}
    for ax, scale in zip(axes, ("raw", "scaled")):
        image = ax.imshow(grids[scale], norm=norm, cmap="viridis", interpolation="nearest")
        ax.set_title(titles[scale])
        ax.set_xlabel(f"key j (first {m} of {keys})")
        ax.set_ylabel("query i")
    bar = fig.colorbar(image, ax=axes, extend="min", shrink=0.9, pad=0.02)
    bar.set_label("weight softmax(S)ᵢⱼ (log scale; below 1e-8 drawn as 1e-8)")
    bar.ax.axhline(1 / keys, color="white", linewidth=2)
    bar.ax.text(-0.15, 1 / keys, f"1/{keys}", ha="right", va="center", fontsize=8,
                transform=bar.ax.get_yaxis_transform())
    fig.suptitle(f"Attention weights, d_k = {dk}, coordinates N(0, 1): {n} queries against {m} of {keys} keys\n"
                 f"unscaled, a row's weights span many orders of magnitude; scaled, they stay near 1/{keys}",
                 fontsize=11)
    save(plt, fig, caption, os.path.join(outdir, "weights.png"))


def tour_gradient(plt, folder, outdir, caption):
    rows = read_csv(folder, "gradient.csv")
    dks = [int(r["d_k"]) for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2), layout="constrained")
    for key, label, colour in (("scaled", "scaled, S = Q Kᵀ / √d_k", "C0"), ("raw", "unscaled, S = Q Kᵀ", "C3")):
        line(ax, dks, [float(r[f"median_mass_{key}"]) for r in rows], label, color=colour)
        for r, x in zip(rows, dks):
            share = float(r[f"share_below_1e-6_{key}"])
            if share > 0:
                ax.annotate(f"below 1e-6\nin {100 * share:.0f} % of rows", (x, float(r[f"median_mass_{key}"])),
                            textcoords="offset points", xytext=(-12, 0), ha="right", va="center", fontsize=8,
                            color=colour)
    log2_axis(ax, "d_k (coordinates N(0, 1))", ticks=dks)
    log_y(ax, r"median over rows of $\Sigma_{j\ \neq\ \mathrm{winner}}\ |dS_{ij}|$")
    ax.set_title(f"Gradient reaching the keys that lost a row ({rows[0]['rows']} queries and keys)")
    ax.legend()
    save(plt, fig, caption, os.path.join(outdir, "gradient.png"))


def tour_timing(plt, folder, outdir, caption, threads):
    rows = read_csv(folder, "timing.csv")
    ts = [int(r["T"]) for r in rows]
    col = lambda name: [float(r[name]) for r in rows]
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(14, 4.2), layout="constrained")
    line(left, ts, col("fused_ms"), "fused, 1 thread", color="C0")
    line(left, ts, col("naive_ms"), "naive, 1 thread", color="C3")
    line(left, ts, col("fused_all_threads_ms"), f"fused, {threads} threads", color="C0", linestyle="--",
         markerfacecolor="white")
    log_y(left, "ms (best of 5 up to T = 1024, then of 3)")
    left.set_title("time")
    left.legend()
    line(middle, ts, [nv / f for f, nv in zip(col("fused_ms"), col("naive_ms"))], "naive's time over fused's",
         color="C2")
    middle.axhline(1, color="0.5", linewidth=1)
    middle.set_ylim(bottom=0)
    middle.set_ylabel("×, one thread each")
    middle.set_title("naive's time over fused's")
    line(right, ts, col("fused_mib"), "fused", color="C0")
    line(right, ts, col("naive_mib"), "naive", color="C3")
    log_y(right, "MiB allocated beyond inputs and output")
    right.set_title("memory (qkv::cost)")
    right.legend()
    for ax in (left, middle, right):
        log2_axis(ax, "sequence length T (n = m = T)", ticks=ts)
    fig.suptitle(f"softmax(Q Kᵀ / √{rows[0]['d']}) V, d = {rows[0]['d']}, float: fused against naive", fontsize=11)
    save(plt, fig, caption, os.path.join(outdir, "timing.png"))


def tour(folder, outdir):
    import matplotlib
    matplotlib.use("agg")
    import matplotlib.pyplot as plt

    os.makedirs(outdir, exist_ok=True)
    m = machine(folder)
    caption = machine_caption(m)
    tour_weights(plt, folder, outdir, caption)
    tour_gradient(plt, folder, outdir, caption)
    tour_timing(plt, folder, outdir, caption, m.get("threads", "all"))


def option(name):
    """The value after --name on the command line, None without one; exits when it lacks its value."""
    if name not in sys.argv:
        return None
    at = sys.argv.index(name)
    if at + 1 >= len(sys.argv):
        print(f"plot.py: {name} needs a folder", file=sys.stderr)
        sys.exit(2)
    return sys.argv[at + 1]


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    if sys.argv[1] == "--tour":
        folder = option("--tour")
        tour(folder, option("--out") or folder)
        return 0
    context, rows, probe = load(sys.argv[1])
    if "--table" in sys.argv:
        print(table(rows, probe))
    elif "--table16" in sys.argv:
        print(table16(rows))
    else:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        plots(rows, option("--out") or os.path.join(root, "docs", "img"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
