# Renders the raw results of launch/bench-report (JSON lines, Google Benchmark JSON, metadata)
# into docs/performance.md with ratio tables and PNG plots (matplotlib). Run by launch/bench-report.
import argparse
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MIB = 1024.0 * 1024.0


def read_env(path):
    out = {}
    if os.path.exists(path):
        for line in open(path):
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                out[k] = v
    return out


def read_jsonl(path):
    rows = []
    if os.path.exists(path):
        for line in open(path):
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return rows


def read_commands(path):
    cmds = []
    if os.path.exists(path):
        for line in open(path):
            parts = line.rstrip("\n").split("\t", 4)
            if len(parts) == 5:
                label, out, secs, rc, cmd = parts
                cmds.append({"label": label, "out": out, "seconds": secs, "rc": rc, "cmd": cmd})
    return cmds


def fmt(x, digits=3):
    if x is None:
        return "—"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def ratio(x, base):
    if x is None or not base:
        return "—"
    return f"{x / base:.2f}×"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def status_note(cmds, label):
    for c in cmds:
        if c["label"] == label and c["rc"] not in ("0",):
            return f"\n\n**{label} did not complete** (status {c['rc']}); see its log in the raw folder."
    return ""


def human_bytes(b):
    for unit, scale in (("MiB", MIB), ("KiB", 1024.0)):
        if b >= scale:
            return f"{b / scale:g} {unit}"
    return f"{b} B"


def section_allreduce(raw, cmds, plots, doc_dir):
    out = ["## Allreduce: Communicator vs raw MPI",
           "",
           "`tessera bench allreduce --device cpu` under `mpirun -np N`: Tessera's `Communicator::allreduce` "
           "(float32 sum) against a raw `MPI_Allreduce` on the same buffer in the same run, each the median "
           "of interleaved runs on the slowest rank. Ratio = Tessera time / raw time (1.00× = no overhead).",
           ""]
    series = {}
    rows = []
    for np_ in (2, 4):
        for r in read_jsonl(os.path.join(raw, f"allreduce-np{np_}.jsonl")):
            t, b = r.get("tessera_s"), r.get("raw_s")
            rows.append([r.get("ranks"), human_bytes(r["bytes"]), fmt(t * 1e3), fmt(b * 1e3),
                         ratio(t, b), fmt(r.get("busbw_gbs"))])
            series.setdefault(r.get("ranks"), []).append((r["bytes"], t / b if b else None))
    if not rows:
        out.append("No results." + status_note(cmds, "allreduce-np2") + status_note(cmds, "allreduce-np4"))
        return "\n".join(out)
    out.append(table(["ranks", "message", "Tessera (ms)", "raw MPI (ms)", "ratio vs raw",
                      "bus bandwidth (GB/s)"], rows))
    out[-1] += status_note(cmds, "allreduce-np2") + status_note(cmds, "allreduce-np4")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for n, pts in sorted(series.items()):
        pts = [p for p in pts if p[1] is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{n} ranks")
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("Tessera time / raw MPI time")
    ax.set_title("Allreduce overhead vs raw MPI")
    ax.legend()
    fig.tight_layout()
    path = os.path.join(plots, "allreduce_ratio.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    out += ["", f"![allreduce ratio]({os.path.relpath(path, doc_dir)})"]
    return "\n".join(out)


def section_nerf(raw, cmds, plots, doc_dir, meta):
    out = ["## NeRF training (`tessera bench nerf`)", ""]
    tput = {}
    for np_ in (1, 2, 4):
        for r in read_jsonl(os.path.join(raw, f"nerf-np{np_}.jsonl")):
            # The float path (a --deterministic bench adds run.deterministic's lines beside it).
            if r.get("case") == "throughput" and not r.get("deterministic", False):
                tput.setdefault(r["model"], {})[r["ranks"]] = r["rays_per_s"]
    cpus = int(meta.get("cpus", "0") or 0)
    out += ["### Throughput and scaling over ranks",
            "",
            "Global rays/s over the timed optimizer steps through the `RayTrainer` (ray sharding, gradient "
            "sync), for the same global batch at 1, 2 and 4 ranks. Speed-up = rays/s / rays/s at 1 rank "
            "(same run); efficiency = speed-up / ranks."
            + (f" This machine has {cpus} CPUs, so 4 ranks are oversubscribed and each rank gets a "
               "share of the cores: scaling here measures overhead, not added hardware." if cpus and cpus < 4 else ""),
            ""]
    rows = []
    for model, by_n in sorted(tput.items()):
        base = by_n.get(1)
        for n in sorted(by_n):
            sp = by_n[n] / base if base else None
            rows.append([model, n, fmt(by_n[n]), ratio(by_n[n], base), f"{sp / n:.2f}" if sp else "—"])
    if rows:
        out.append(table(["model", "ranks", "rays/s", "speed-up vs 1 rank", "efficiency"], rows))
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for model, by_n in sorted(tput.items()):
            ns = sorted(by_n)
            ax.plot(ns, [by_n[n] for n in ns], marker="o", label=model)
            if 1 in by_n:
                ax.plot(ns, [by_n[1] * n for n in ns], ls=":", color=ax.lines[-1].get_color(), lw=0.8)
        ax.set_xticks([1, 2, 4])
        ax.set_xlabel("ranks (dotted: linear scaling from 1 rank)")
        ax.set_ylabel("global rays/s")
        ax.set_title("NeRF training throughput over ranks")
        ax.legend()
        fig.tight_layout()
        path = os.path.join(plots, "nerf_scaling.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out += ["", f"![scaling]({os.path.relpath(path, doc_dir)})"]
    else:
        out.append("No results.")
    out[-1] += "".join(status_note(cmds, f"nerf-np{n}") for n in (1, 2, 4))

    fixed = read_jsonl(os.path.join(raw, "nerf-np1.jsonl"))
    ckpt = [r for r in fixed if r.get("case") == "checkpoint"]
    out += ["", "### Activation checkpointing policies",
            "",
            "One forward + backward of a fixed `nerf-mlp` batch on one rank with each policy: `none`, "
            "`segments` (`every = 1`: every segment but the last), `all` (every segment, the last "
            "included) and `budget` (the planner's choice for a budget midway between the predicted "
            "peaks of `segments` and `none`), interleaved step by step. Peak = bytes allocated above the "
            "step's start (the counting CPU allocator; the caching allocator on CUDA). Recompute = the "
            "checkpoints' second forwards inside backward, as a share of the step. Ratios against "
            "`none` in the same run (time: the median of the ratios within a round).",
            ""]
    if ckpt:
        base = next((r for r in ckpt if r["policy"] == "none"), None)
        rows = []
        for r in ckpt:
            share = r.get("recompute_share")
            rows.append([r["policy"], r["checkpointed"], r["rays"], fmt(r["peak_bytes"] / MIB),
                         ratio(r["peak_bytes"], base and base["peak_bytes"]), fmt(r["step_s"]),
                         f'{r["vs_none"]:.2f}×' if "vs_none" in r
                         else ratio(r["step_s"], base and base["step_s"]),
                         "–" if share is None else f"{100 * share:.0f}%"])
        out.append(table(["policy", "segments checkpointed", "rays", "peak (MiB)", "memory vs none",
                          "step (s)", "time vs none", "recompute share"], rows))
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for r in ckpt:
            ax.scatter(r["step_s"], r["peak_bytes"] / MIB, s=40)
            ax.annotate(r["policy"], (r["step_s"], r["peak_bytes"] / MIB), textcoords="offset points",
                        xytext=(6, 4))
        ax.set_xlabel("step time (s)")
        ax.set_ylabel("peak memory (MiB)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"Checkpoint policies, nerf-mlp, {ckpt[0]['rays']} rays")
        fig.tight_layout()
        path = os.path.join(plots, "checkpoint_memory_time.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out += ["", f"![checkpointing]({os.path.relpath(path, doc_dir)})"]
    else:
        out.append("No results.")

    acc = [r for r in fixed if r.get("case") == "accumulate"]
    out += ["", "### Gradient accumulation",
            "",
            "The same fixed batch split into K micro-batches (forward + backward each, one gradient): peak "
            "memory should fall as 1/K, time stays about the same. Ratios against K = 1 in the same run.",
            ""]
    if acc:
        base = next((r for r in acc if r["k"] == 1), None)
        rows = [[r["k"], r["rays"], fmt(r["peak_bytes"] / MIB), ratio(r["peak_bytes"], base and base["peak_bytes"]),
                 fmt(r["step_s"]),
                 f'{r["vs_k1"]:.2f}×' if "vs_k1" in r else ratio(r["step_s"], base and base["step_s"])]
                for r in acc]
        out.append(table(["K", "rays", "peak (MiB)", "memory vs K=1", "step (s)", "time vs K=1"], rows))
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ks = [r["k"] for r in acc]
        ax.plot(ks, [r["peak_bytes"] / MIB for r in acc], marker="o", label="measured")
        if base:
            ax.plot(ks, [base["peak_bytes"] / MIB / k for k in ks], ls=":", color="gray", label="1/K")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks)
        ax.set_xticklabels([str(k) for k in ks])
        ax.set_xlabel("micro-batches K")
        ax.set_ylabel("peak memory (MiB)")
        ax.set_title(f"Accumulation, nerf-mlp, {acc[0]['rays']} rays")
        ax.legend()
        fig.tight_layout()
        path = os.path.join(plots, "accumulation_memory.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out += ["", f"![accumulation]({os.path.relpath(path, doc_dir)})"]
    else:
        out.append("No results.")
    return "\n".join(out)


def kernel_times_ms(path):
    """{benchmark name: real time in ms} of a Google Benchmark JSON file (means of repetitions)."""
    data = json.load(open(path))
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
    times = {}
    for b in data.get("benchmarks", []):
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "mean":
            continue
        name = re.sub(r"/real_time$", "", b.get("run_name", b["name"]))
        times[name] = b["real_time"] * scale[b.get("time_unit", "ns")]
    return times


def section_kernels(raw, cmds):
    out = ["## Kernels vs plain LibTorch (`build/tests/bench_<op>`, CPU)",
           "",
           "Google Benchmark pairs `Op…` / `Reference…` with the same arguments: the op in `kernels/` "
           "against the plain-LibTorch way of writing it, in the same process. Speed-up = reference time / "
           "op time (above 1× = the op is faster). Real time; the mean of the repetitions in the full run. "
           "An op benchmark with no reference twin shows —.",
           ""]
    rows = []
    for c in cmds:
        if not c["label"].startswith("kernel-"):
            continue
        op = c["label"][len("kernel-"):]
        path = os.path.join(raw, c["out"])
        if c["rc"] != "0" or not os.path.exists(path):
            rows.append([op, "—", "—", "—", f"not run ({c['rc']})"])
            continue
        try:
            times = kernel_times_ms(path)
        except json.JSONDecodeError:
            rows.append([op, "—", "—", "—", "unreadable output"])
            continue
        for name, t_ms in times.items():
            if not name.startswith("Op"):
                continue
            ref_ms = times.get("Reference" + name[2:])
            rows.append([op, f"`{name}`", fmt(t_ms), fmt(ref_ms),
                         f"{ref_ms / t_ms:.2f}×" if ref_ms else "—"])
    if rows:
        out.append(table(["op", "benchmark", "op (ms)", "reference (ms)", "speed-up"], rows))
    else:
        out.append("No results.")
    return "\n".join(out)


def bench_rows(raw, cmds, prefix, bench):
    """The commands whose label starts with `prefix` and the JSON lines of `bench` they printed."""
    labels = [c for c in cmds if c["label"].startswith(prefix)]
    rows = []
    for c in labels:
        rows += [r for r in read_jsonl(os.path.join(raw, c["out"])) if r.get("bench") == bench]
    return labels, rows


def section_snapshot(raw, cmds):
    out = ["## Snapshots: write, read and the seal (`tessera bench snapshot`)", ""]
    labels, rows = bench_rows(raw, cmds, "snapshot", "snapshot")
    if not labels:
        out.append("Not run (left out with `--only`).")
        return "\n".join(out)
    out += ["A sharded 3DGS-shaped state (59 floats per Gaussian plus two Adam moments) written as "
            "one snapshot and read back, each rank its own rows: parallel HDF5 (every rank writes "
            "its hyperslab) vs gathered to rank 0, medians of the slowest rank. Both times include "
            "the seal (docs/formats.md, \"The seal\"): written after the close, checked before "
            "HDF5 opens the file. Seal check = rank 0 checking the whole file's seal; plain read = "
            "rank 0 reading the same file without hashing, in the same run (both from the page "
            "cache): the ratio is the checksum's cost over the I/O.", ""]
    if not rows:
        out.append("No results." + "".join(status_note(cmds, c["label"]) for c in labels))
        return "\n".join(out)
    gathered = {r["ranks"]: r for r in rows if r["mode"] == "gathered"}
    trs = []
    for r in rows:
        base = gathered.get(r["ranks"], r)
        trs.append([f"{r['count']:,}", r["ranks"], r["mode"], fmt(r["bytes"] / MIB), fmt(r["write_s"]),
                    ratio(r["write_s"], base["write_s"]), fmt(r["read_s"]), fmt(r["validate_s"]),
                    fmt(r.get("seal_s", 0)), fmt(r.get("plain_read_s", 0)),
                    f"{r.get('seal_vs_plain_read', 0):.2f}×"])
    out.append(table(["Gaussians", "ranks", "mode", "file (MiB)", "write (s)", "write vs gathered",
                      "read (s)", "validate (s)", "seal check (s)", "plain read (s)",
                      "seal check vs plain read"], trs))
    out[-1] += "".join(status_note(cmds, c["label"]) for c in labels)
    return "\n".join(out)


def section_gaussians(raw, cmds, plots, doc_dir, meta):
    out = ["## Gaussian splatting: memory and time per rank (`tessera bench gaussians`)", ""]
    labels, rows = bench_rows(raw, cmds, "gaussians", "gaussians")
    if not labels:
        out.append("Not run (left out with `--only`).")
        return "\n".join(out)
    if any(c["rc"] == "absent" for c in labels):
        out.append("Skipped: this build has no `tessera bench gaussians`.")
        return "\n".join(out)
    cpus = int(meta.get("cpus", "0") or 0)
    out += ["The sharded 3DGS trainer at a fixed count of Gaussians (random in the scene bounds, no "
            "densification, so the count stays exact), the same scene and views at 1, 2 and 4 ranks "
            "(`mpirun -np N`). Step = median over the timed steps of the slowest rank's wall time. "
            "Peak = the largest per-rank peak of the counting CPU allocator from the trainer's "
            "construction on (the rank's slice of the initial set and the neighbour search over all "
            "means, then its shard's parameters, Adam state, gradients and activations); steady = "
            "the same over the training steps only. Both fall as 1/N. Ratios against 1 rank at the "
            "same count in the same run."
            + (f" This machine has {cpus} CPUs, so 4 ranks are oversubscribed: step times measure "
               "overhead, not added hardware." if cpus and cpus < 4 else ""),
            ""]
    if not rows:
        out.append("No results." + "".join(status_note(cmds, c["label"]) for c in labels))
        return "\n".join(out)
    by_count = {}
    for r in rows:
        by_count.setdefault(r["count"], {})[r["ranks"]] = r
    trs = []
    for count in sorted(by_count):
        base = by_count[count].get(1)
        for n in sorted(by_count[count]):
            r = by_count[count][n]
            steady = r.get("steady_peak_bytes_per_rank")
            trs.append([f"{count:,}", n, f"{r.get('max_gaussians_per_rank', count // n):,}",
                        fmt(r["step_s"]), ratio(r["step_s"], base and base["step_s"]),
                        fmt(r["gaussians_per_s"]),
                        fmt(r["peak_bytes_per_rank"] / MIB),
                        ratio(r["peak_bytes_per_rank"], base and base["peak_bytes_per_rank"]),
                        fmt(steady / MIB) if steady else "—",
                        ratio(steady, base and base.get("steady_peak_bytes_per_rank")),
                        fmt(r.get("init_s"))])
    out.append(table(["Gaussians", "ranks", "per rank (max)", "step (s)", "time vs 1 rank",
                      "Gaussians/s", "peak/rank (MiB)", "peak vs 1 rank", "steady/rank (MiB)",
                      "steady vs 1 rank", "init (s)"], trs))
    out[-1] += "".join(status_note(cmds, c["label"]) for c in labels)
    settings = rows[0]
    out += ["", f"Scene {settings.get('size', '?')}×{settings.get('size', '?')}, "
            f"{settings.get('views_per_step', '?')} view(s) per step, SH degree {settings.get('sh_degree', '?')}, "
            f"{settings.get('steps', '?')} timed step(s), {settings.get('device', 'cpu')}."]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    per_rank = lambda r: r.get("max_gaussians_per_rank", r["count"] // r["ranks"])  # noqa: E731
    for key, label, marker, offset in (("peak_bytes_per_rank", "peak (with construction)", "o", (6, -10)),
                                       ("steady_peak_bytes_per_rank", "steady (training steps)", "s", (6, 3))):
        pts = sorted((per_rank(r), r[key] / MIB, r["ranks"], r["count"]) for r in rows if r.get(key))
        if not pts:
            continue
        line = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, ls="", label=label)[0]
        for x, y, n, count in pts:
            ax.annotate(f"{n} rank{'s' if n > 1 else ''}, {count:,}", (x, y), textcoords="offset points",
                        xytext=offset, fontsize=6.5, color=line.get_color())
    steady_pts = [(per_rank(r), r["steady_peak_bytes_per_rank"]) for r in rows if r.get("steady_peak_bytes_per_rank")]
    if steady_pts:
        per_gaussian = sorted(b / x for x, b in steady_pts)[len(steady_pts) // 2]
        xs = [min(x for x, _ in steady_pts), max(x for x, _ in steady_pts)]
        ax.plot(xs, [x * per_gaussian / MIB for x in xs], ls=":", color="gray", lw=0.8,
                label=f"{per_gaussian:,.0f} bytes × Gaussians per rank")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("Gaussians per rank (largest shard)")
    ax.set_ylabel("peak memory per rank (MiB)")
    ax.set_title("3DGS: Gaussians per rank vs peak memory per rank")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(plots, "gaussians_memory.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    out += ["", f"![Gaussians per rank vs memory]({os.path.relpath(path, doc_dir)})"]
    return "\n".join(out)


def section_gstep(raw, cmds):
    out = ["## Where a 3DGS step's time goes (`tessera bench gaussians`, phases)", ""]
    labels, rows = bench_rows(raw, cmds, "gstep", "gaussians")
    if not labels:
        out.append("Not run (left out with `--only`).")
        return "\n".join(out)
    out += ["The sharded 3DGS trainer at the sizes users train: random Gaussians in the bounds of a "
            "30-view synthetic scene, one view per step, SH degree 3, no densification. Step = median "
            "over the timed steps of the slowest rank's wall time; the phases are rank 0's median "
            "seconds per phase (`phases_s`, the trainer's `PhaseTimer`): project and sh (per view, on "
            "the owners), exchange (the tile split, the all-to-all of projected rows and the image "
            "allreduce, both ways), bin and rasterize (on the tile owners), loss (L1 + SSIM, forward "
            "and backward), rasterize_bwd, project_bwd (SH and projection backward), optimizer (Adam), "
            "densify (the global count here). Ratios against 1 rank at the same count and size.", ""]
    if not rows:
        out.append("No results." + "".join(status_note(cmds, c["label"]) for c in labels))
        return "\n".join(out)
    base = {(r["count"], r["size"]): r for r in rows if r["ranks"] == 1}
    phases = []
    for r in rows:
        for p in r.get("phases_s", {}):
            if p not in phases:
                phases.append(p)
    trs = []
    for r in rows:
        b = base.get((r["count"], r["size"]))
        ph = r.get("phases_s", {})
        trs.append([f"{r['count']:,}", f"{r['size']}×{r['size']}", r["ranks"], fmt(r["step_s"]),
                    ratio(r["step_s"], b and b["step_s"])]
                   + [fmt(1e3 * ph[p]) if p in ph else "—" for p in phases])
    out.append(table(["Gaussians", "image", "ranks", "step (s)", "time vs 1 rank"]
                     + [f"{p} (ms)" for p in phases], trs))
    out[-1] += "".join(status_note(cmds, c["label"]) for c in labels)
    return "\n".join(out)


def section_threads(raw, cmds):
    out = ["## CPU threads: Tessera's loops on 1 vs 2 threads", ""]
    labels = [c for c in cmds if c["label"].startswith("threads-")]
    out += ["Tessera's CPU loops run on torch's intra-op pool (ATen `parallel_for`; the GCC build "
            "compiles Tessera with `-fopenmp`). Each kernel op on 1 and 2 threads "
            "(`OMP_NUM_THREADS`), and end to end one process on one core (`taskset -c 0`: a "
            "process's threads are the cores of its affinity mask) vs on both, in this run. Under "
            "`mpirun`, which binds a rank to one core, a rank has one thread; ranks bound to several "
            "cores get more (docs/clusters.md). Speed-up = 1-thread time / 2-thread time.", ""]
    rows = []
    ops = []
    for c in labels:
        m = re.match(r"threads-kernel-(.+)-t([12])$", c["label"])
        if m and m.group(1) not in ops:
            ops.append(m.group(1))
    for op in ops:
        times = {}
        for t in ("1", "2"):
            path = os.path.join(raw, f"threads-kernel-{op}-t{t}.json")
            try:
                times[t] = kernel_times_ms(path)
            except (OSError, json.JSONDecodeError):
                times[t] = {}
        for name, t1 in times["1"].items():
            t2 = times["2"].get(name)
            rows.append([op, f"`{name}`", fmt(t1), fmt(t2), f"{t1 / t2:.2f}×" if t2 else "—"])
    if rows:
        out.append(table(["op", "benchmark", "1 thread (ms)", "2 threads (ms)", "speed-up"], rows))
    end = []
    g = {t: bench_rows(raw, cmds, f"threads-gaussians-t{t}", "gaussians")[1] for t in ("1", "2")}
    if g["1"] and g["2"]:
        a, b = g["1"][0], g["2"][0]
        end.append([f"3DGS step, {a['count']:,} Gaussians at {a['size']}×{a['size']} (s)",
                    fmt(a["step_s"]), fmt(b["step_s"]), f"{a['step_s'] / b['step_s']:.2f}×"])
    n = {t: bench_rows(raw, cmds, f"threads-nerf-t{t}", "nerf")[1] for t in ("1", "2")}
    for a in n["1"]:
        b = next((r for r in n["2"] if r.get("model") == a.get("model") and r.get("case") == a.get("case")), None)
        if b and a.get("rays_per_s"):
            end.append([f"{a.get('model')} training rays/s", fmt(a["rays_per_s"]), fmt(b["rays_per_s"]),
                        f"{b['rays_per_s'] / a['rays_per_s']:.2f}×"])
    if end:
        out += ["", table(["end to end", "1 thread", "2 threads", "speed-up"], end)]
    if not rows and not end:
        out.append("No results." + "".join(status_note(cmds, c["label"]) for c in labels))
    return "\n".join(out)


def section_scale(raw, cmds):
    out = ["## 10 M Gaussians on 4 ranks (`tessera bench gaussians`, a training run)", ""]
    labels, rows = bench_rows(raw, cmds, "scale-", "gaussians")
    if not labels:
        out.append("Not run (left out with `--only`).")
        return "\n".join(out)
    out += ["Random Gaussians in the bounds of a 16-view 128×128 synthetic scene (`tessera synth "
            "--preset objects`), SH degree 3, one view per step, no densification. Peak = the "
            "largest rank's allocator peak from the trainer's construction on; bytes per Gaussian = "
            "every rank's peak summed, over the count (`peak_bytes_per_gaussian`); all-to-all = the "
            "projected rows and their gradients a step sends between ranks, summed over ranks. Ratios "
            "against the 1-rank run at the same count, in the same run.", ""]
    if not rows:
        out.append("No results." + "".join(status_note(cmds, c["label"]) for c in labels))
        return "\n".join(out)
    base = {r["count"]: r for r in rows if r["ranks"] == 1}
    trs = []
    for r in sorted(rows, key=lambda r: (r["count"], r["ranks"])):
        b = base.get(r["count"])
        trs.append([f"{r['count']:,}", r["ranks"], f"{r.get('max_gaussians_per_rank', 0):,}",
                    fmt(r["step_s"]), fmt(r["gaussians_per_s"]),
                    fmt(r["peak_bytes_per_rank"] / MIB),
                    ratio(r["peak_bytes_per_rank"], b and b["peak_bytes_per_rank"]),
                    f"{r.get('peak_bytes_per_gaussian', 0):,.0f}",
                    fmt(r.get("all_to_all_bytes_per_step", 0) / MIB),
                    fmt(r.get("init_s")),
                    fmt(r["export_s"]) if r.get("export_s") else "—"])
    out.append(table(["Gaussians", "ranks", "per rank (max)", "step (s)", "Gaussians/s",
                      "peak/rank (MiB)", "peak vs 1 rank", "bytes per Gaussian",
                      "all-to-all per step (MiB)", "init (s)", "PLY export (s)"], trs))
    out[-1] += "".join(status_note(cmds, c["label"]) for c in labels)
    # The training run from the exported PLY.
    train_dir = os.path.join(raw, "scale-train")
    records = read_jsonl(os.path.join(train_dir, "metrics.jsonl"))
    steps = [r for r in records if "step" in r and "loss" in r and "all_to_all_bytes" in r]
    ranks_path = os.path.join(train_dir, "ranks.json")
    out += ["", "**Training from the 10M-Gaussian PLY** (`tessera train configs/demo_gaussians.toml` "
            "on 4 ranks, `gaussians.init_ply` = the set the 4-rank bench exported, 4 steps; the "
            "command is in the table at the end):", ""]
    if not steps or not os.path.exists(ranks_path):
        out.append("No results." + status_note(cmds, "scale-train-np4"))
        return "\n".join(out)
    ranks = json.load(open(ranks_path)).get("ranks", [])
    one = base.get(10000000)
    peaks = [r.get("peak_mem_bytes", 0) for r in ranks]
    trs = [[r.get("rank"), fmt(r.get("peak_mem_bytes", 0) / MIB),
            ratio(r.get("peak_mem_bytes", 0), one and one["peak_bytes_per_rank"])] for r in ranks]
    out.append(table(["rank", "peak (MiB)", "vs the bench's 1 rank holding all 10M"], trs))
    last = steps[-1]
    rate = [r["steps_per_s"] for r in steps if r.get("steps_per_s")]
    out += ["", f"Gaussians {last.get('gaussians', 0):,}; {len(steps)} steps logged; step time "
            f"{fmt(1 / (sorted(rate)[len(rate) // 2])) if rate else '?'} s (median); rank 0 sent "
            f"{fmt(sorted(r['all_to_all_bytes'] for r in steps)[len(steps) // 2] / MIB)} MiB by "
            f"all-to-all per step (median); the ranks' peaks sum to {sum(peaks) / MIB:,.0f} MiB, "
            f"{sum(peaks) / max(1, last.get('gaussians', 1)):,.0f} bytes per Gaussian "
            "(the process peaks: start-up and reading the PLY slice included)."]
    return "\n".join(out)


def section_plan(raw, cmds):
    out = ["## Capacity plan (`tessera plan`) against the measurements, and projections", ""]
    labels = [c for c in cmds if c["label"].startswith("plan-")]
    plans = {}
    for c in labels:
        for r in read_jsonl(os.path.join(raw, c["out"])):
            if r.get("plan") == "gaussians":
                plans[c["label"][len("plan-"):]] = r
    if not plans:
        out.append("No results." + "".join(status_note(cmds, c["label"]) for c in labels))
        return "\n".join(out)
    out += ["`tessera plan configs/demo_gaussians.toml --gaussians G --ranks N --image-size S` "
            "for each 3DGS bench run of this report (the same count, ranks and size; no cached "
            "targets), against what the bench measured: the per-rank peak and the all-to-all bytes "
            "per step. The plan's costs are measured constants (docs/gaussians.md, \"Capacity "
            "plan\"); its exchange model assumes every Gaussian in view (`--visible 1`) touching "
            "1.5 ranks' tiles (`--ranks-touched`).", ""]
    trs = []
    for key in sorted(k for k in plans if not k.startswith("projection-")):
        p = plans[key]
        measured = [r for r in read_jsonl(os.path.join(raw, key + ".jsonl")) if r.get("bench") == "gaussians"]
        if not measured:
            continue
        m = measured[0]
        err = p["peak_bytes_per_rank"] / m["peak_bytes_per_rank"] - 1
        a2a_m, a2a_p = m.get("all_to_all_bytes_per_step", 0), p["all_to_all_bytes_per_step"]
        trs.append([key, f"{p['count']:,}", p["ranks"], f"{p['size']}×{p['height']}",
                    fmt(m["peak_bytes_per_rank"] / MIB), fmt(p["peak_bytes_per_rank"] / MIB),
                    f"{100 * err:+.1f}%", p.get("peak_at", "?"),
                    fmt(a2a_m / MIB), fmt(a2a_p / MIB),
                    f"{100 * (a2a_p / a2a_m - 1):+.1f}%" if a2a_m else "—"])
    out.append(table(["run", "Gaussians", "ranks", "image", "peak/rank measured (MiB)",
                      "planned (MiB)", "error", "peak at", "all-to-all measured (MiB)",
                      "planned (MiB)", "error"], trs))
    proj = [plans[k] for k in sorted(plans, key=lambda k: (plans[k]["count"], plans[k]["ranks"]))
            if k.startswith("projection-")]
    if proj:
        link = 50e9  # bytes/s per GPU: 400 Gb/s InfiniBand NDR, one NIC per GPU
        out += ["", "**Projections** for 1920×1080 training views (one per step), 300 train views "
                "cached on every rank (7.5 GB), on H200s (141 GB, 90% of it for the allocator's "
                "peak), every Gaussian in view (`--visible 1`: an object-centric capture; a large "
                "scene's view sees a fraction, and its exchange shrinks with it). Exchange time = "
                "all-to-all bytes per rank over 50 GB/s (one 400 Gb/s NIC per GPU), a lower bound "
                "that ignores latency and overlap. For scale: Grendel-GS trains 40 M Gaussians on "
                "16 GPUs, RetinaGS 1 B on 64.", ""]
        trs = []
        for p in proj:
            a2a_rank = p["all_to_all_bytes_per_step"] / p["ranks"]
            trs.append([f"{p['count']:,}", p["ranks"], f"{p['max_gaussians_per_rank']:,}",
                        f"{p['peak_bytes_per_rank'] / 1e9:,.1f}", "yes" if p["fits"] else "**no**",
                        f"{p['max_count']:,}" if p.get("max_count") else "—",
                        f"{a2a_rank / 1e9:,.2f}", f"{1e3 * a2a_rank / link:,.0f}"])
        out.append(table(["Gaussians", "H200s", "per rank", "peak/rank (GB)", "fits 141 GB",
                          "largest that fits", "all-to-all per rank and step (GB)",
                          "exchange time (ms)"], trs))
    return "\n".join(out)


def section_diffusion(raw, cmds, plots, doc_dir):
    out = ["## Point diffusion: checkpoint policies (`tessera bench diffusion`)", ""]
    labels, rows = bench_rows(raw, cmds, "diffusion", "diffusion")
    if not labels:
        out.append("Not run (left out with `--only`).")
        return "\n".join(out)
    if any(c["rc"] == "absent" for c in labels):
        out.append("Skipped: this build has no `tessera bench diffusion`.")
        return "\n".join(out)
    out += ["One training step of the point-diffusion family as a run takes it "
            "(`TrainingRun::train_step`: forward, DDPM loss, backward, gradient allreduce, Adam) on "
            "synthetic shapes under each `checkpoint.policy`, on one rank; one model, the policies "
            "interleaved step by step. Peak = the counting CPU allocator's (or the CUDA caching allocator's) "
            "peak during a step: parameters, Adam state, gradients and activations; step = that "
            "peak above what was allocated before the step; stored = what the forward keeps for "
            "backward (a dry forward). Time = median of the timed steps. Ratios against policy "
            "`none` in the same run.", ""]
    if not rows:
        out.append("No results." + "".join(status_note(cmds, c["label"]) for c in labels))
        return "\n".join(out)
    base = next((r for r in rows if r["policy"] == "none"), rows[0])
    trs = [[r["policy"], r.get("recomputed_blocks", "—"), fmt(r["step_s"]), ratio(r["step_s"], base["step_s"]),
            fmt(r["peak_bytes"] / MIB), ratio(r["peak_bytes"], base["peak_bytes"]),
            fmt(r["step_bytes"] / MIB), ratio(r["step_bytes"], base["step_bytes"]),
            fmt(r["stored_bytes"] / MIB), ratio(r["stored_bytes"], base["stored_bytes"])] for r in rows]
    out.append(table(["policy", "blocks recomputed", "step (s)", "time vs none", "peak (MiB)",
                      "peak vs none", "step (MiB)", "step vs none", "stored (MiB)", "stored vs none"], trs))
    out[-1] += "".join(status_note(cmds, c["label"]) for c in labels)
    out += ["", f"{base['tokens']} tokens, width {base['width']}, {base['depth']} blocks, "
            f"{base.get('heads', '?')} heads, batch {base['batch']}, {base.get('precision', 'fp32')}, "
            f"{base.get('parameters', 0):,} parameters, {base.get('steps', '?')} timed step(s) per "
            f"policy, {base.get('device', 'cpu')}."]
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        x, y = r["step_s"] / base["step_s"], r["peak_bytes"] / base["peak_bytes"]
        ax.plot([x], [y], marker="o", ls="")
        ax.annotate(r["policy"], (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set_xlabel("step time vs none")
    ax.set_ylabel("peak memory vs none")
    ax.set_title("point-diffusion: memory vs time per checkpoint policy")
    ax.grid(True, lw=0.3)
    fig.tight_layout()
    path = os.path.join(plots, "diffusion_checkpoint.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    out += ["", f"![memory vs time per policy]({os.path.relpath(path, doc_dir)})"]
    return "\n".join(out)


GPU_SECTION = """## GPU check

The figures above are CPU figures. `launch/gpu-check` runs the CUDA tests and GPU benchmarks on the
lent GPU machine (one H200; torch 2.11 + CUDA 13.0, nvcc and CMake preinstalled, no network, no
Debian packages of ours) from a bundle built here, so that its minutes go to running, not
compiling (each `.cu` takes minutes), all within 7 minutes:

```bash
launch/gpu-check-prepare                          # here, with network: build + pack .gpu-bundle/
launch/gpu-check .gpu-bundle /tmp/gc --dry-run    # here: every step up to the first that needs a GPU
# on the GPU machine, with the device tool, from the repository root:
#   run(command="launch/gpu-check .gpu-bundle $OUT", carry=[".gpu-bundle"], timeout_s=560)
```

- `gpu-check-prepare` makes `.gpu-bundle/` (git-ignored; about 40 MiB, checked to stay under the
  device tool's 64 MiB with the working tree): `debs/`, the `apt-get download` of OpenMPI, HDF5
  (OpenMPI flavour), TOML++, spdlog, fmt, stb and the libraries they load, with the headers and
  tools a build there would need (`--list` prints them); `bin/`, `tessera` and every test binary
  with CUDA or NCCL cases, built here for sm_90 against the pinned torch, stripped, with a RUNPATH
  to the unpacked .debs and the GPU machine's torch wheel (`/opt/torch/.venv/...`: torch, NCCL and
  the CUDA runtime of the wheel); `tests.tsv`, each binary's CUDA filter and the number of cases it
  lists here; `manifest.txt`, commit, torch, CUDA architectures and checksums.
- `gpu-check BUNDLE OUT_DIR` runs these steps, each under `timeout`, within `--budget` (420 s):
  `env`; `bundle` (whole, and built against this machine's torch: otherwise it compiles there
  instead, the second mode, also `--build`); `unpack` (`dpkg -x` into `/tmp/tessera-gpu-prefix`,
  OpenMPI relocated with `OPAL_PREFIX`, a library the machine already has used in place of the
  Debian 12 copy); `libs` (`ldd` of every binary finds everything); `cases` (every binary lists
  the cases `tests.tsv` recorded); `tests` (each binary's CUDA cases under `mpiexec -n 1` with
  `TESSERA_REQUIRE_CUDA=1`, so a case that would skip fails; every case recorded must run, none
  skip or fail; the NCCL, gradient-sync and trainer cases also on every GPU where there are
  several); `bench-nerf` (`tessera bench nerf` throughput in fp32, bf16, fp16);
  `bench-checkpoint` (checkpoint policies and accumulation: step time and caching-allocator
  peak); `bench-gaussians-1m`, `bench-gaussians-10m` (`tessera bench gaussians --device cuda`);
  `bench-diffusion` (fp32, bf16); `train` (the three demos of `launch/demo` on CUDA, one rank:
  synth, then `tessera train` of each `configs/demo_*.toml`, with each run's time and final eval
  record); `repeat` (nerf-hash's and gaussians' first 50 demo steps twice each on the bitwise
  path: `metrics.jsonl` without timings, and gaussians' PLY, must be the same bits); `sanitizer`
  (compute-sanitizer memcheck, then racecheck, over the kernels' CUDA cases,
  while at least 60 s are left; `--sanitizer-tools` picks others). Each bench step runs even when
  an earlier one failed. `--only tests,train,...` runs a subset after `cases`, for a second call
  within a short device lease.
- `OUT_DIR` gets at most the 8 files the device tool brings back: `summary.md`, `summary.json`,
  `tests-cuda.txt`, `bench-nerf-cuda.jsonl`, `bench-gaussians-cuda.jsonl`,
  `bench-diffusion-cuda.jsonl`, `train-cuda.txt` and `details.tar.gz` (every step's log, each binary's JUnit XML).
  Exit 0 when every step passed, 1 when one failed, 2 on bad arguments or an incomplete bundle.
- `--dry-run` does `env`, `bundle`, `unpack` (into a temporary prefix), `libs` and `cases` here,
  then stops before `tests`. `launch/bench-report --gpu-results OUT_DIR` puts a GPU run's summary
  into this document.
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--raw", required=True, help="raw folder of launch/bench-report")
    ap.add_argument("--out", required=True, help="the Markdown report")
    ap.add_argument("--plots", required=True, help="folder of the PNG plots")
    ap.add_argument("--gpu-results", default="", help="OUT_DIR of a launch/gpu-check run")
    a = ap.parse_args()
    os.makedirs(a.plots, exist_ok=True)
    doc_dir = os.path.dirname(os.path.abspath(a.out))
    meta = read_env(os.path.join(a.raw, "meta.env"))
    cmds = read_commands(os.path.join(a.raw, "commands.tsv"))
    version = open(os.path.join(a.raw, "version.txt")).read().strip() if os.path.exists(
        os.path.join(a.raw, "version.txt")) else "unknown"
    quick = meta.get("quick") == "1"

    doc = ["# Performance", "",
           "Generated by `launch/bench-report" + (" --quick" if quick else "") + "`; rerun it to refresh "
           "this file and the plots in `docs/performance/`. Every ratio compares two figures measured in "
           "the same run on the same machine, so ratios are more trustworthy than absolute times.", ""]
    if quick:
        doc += ["> **Quick variant** (`--quick`): fewer repeats and smaller sizes (a 32×32 scene, 512-ray "
                "training steps, 256-ray fixed batches, one timed repeat, 16 MiB largest allreduce, 0.05 s "
                "per kernel benchmark; Gaussians on a 64×64 scene, 2 timed steps (the 4M and 10M runs of the scale section are the same in both variants); the 3DGS step phases at full size with 2 timed steps; one timed snapshot write and read per mode). Good for spotting regressions, noisy as absolute numbers. Run "
                "`launch/bench-report` without `--quick` for the full variant.", ""]
    load = f"{meta.get('load_start', '?')} at the start, {meta.get('load_end', '?')} at the end"
    doc += ["## Machine and build", "",
            table(["", ""], [
                ["date (UTC)", meta.get("date", "?")],
                ["CPU", f"{meta.get('cpu', '?')}, {meta.get('cpus', '?')} CPUs ({meta.get('cores', '?')} cores)"],
                ["memory", f"{meta.get('memory_gib', '?')} GiB"],
                ["load average (1, 5, 15 min)", load],
                ["git commit", meta.get("commit", "?") + (" with uncommitted changes" if meta.get("dirty") == "1" else "")],
                ["build", f"`{meta.get('build_dir', 'build')}`"],
                ["suite wall time", f"{meta.get('seconds', '?')} s"],
            ]), "",
            "`tessera --version`:", "", "```", version, "```", ""]
    try:
        load1 = float(meta.get("load_start", "0").split()[0])
    except ValueError:
        load1 = 0.0
    cpus = int(meta.get("cpus", "1") or 1)
    if load1 > 0.5 * cpus:
        doc += [f"> **Noisy run:** the load average was {load1:g} on {cpus} CPUs when it started (other "
                "processes, e.g. builds, shared the cores), so absolute times are inflated and vary; the "
                "same-run ratios are less affected but not immune.", ""]
    sections = {c["label"].split("-")[0] for c in cmds}
    if "allreduce" in sections:
        doc += [section_allreduce(a.raw, cmds, a.plots, doc_dir), ""]
    if "nerf" in sections:
        doc += [section_nerf(a.raw, cmds, a.plots, doc_dir, meta), ""]
    if "kernel" in sections:
        doc += [section_kernels(a.raw, cmds), ""]
    if "threads" in sections:
        doc += [section_threads(a.raw, cmds), ""]
        # The build before Tessera's loops were threaded cannot be rerun from this tree: its
        # figures, measured by hand when the change landed, are included as they are.
        before = os.path.join(doc_dir, "performance", "cpu_threads.md")
        if os.path.exists(before):
            doc += [open(before).read().strip(), ""]
    if "gaussians" in sections:
        doc += [section_gaussians(a.raw, cmds, a.plots, doc_dir, meta), ""]
    if "gstep" in sections:
        doc += [section_gstep(a.raw, cmds), ""]
    if "diffusion" in sections:
        doc += [section_diffusion(a.raw, cmds, a.plots, doc_dir), ""]
    if "snapshot" in sections:
        doc += [section_snapshot(a.raw, cmds), ""]
    if "scale" in sections:
        doc += [section_scale(a.raw, cmds), ""]
    if "plan" in sections:
        doc += [section_plan(a.raw, cmds), ""]
    doc += ["## Commands", "",
            "Run from the repository root, in this order (`mpirun` flags from `launch/common.sh`); seconds "
            "are wall time.", "",
            table(["benchmark", "seconds", "status", "command"],
                  [[c["label"], c["seconds"], "ok" if c["rc"] == "0" else c["rc"], f"`{c['cmd']}`"] for c in cmds]),
            ""]
    # The price of run.deterministic is measured by hand (training runs with and without it):
    # docs/performance/determinism.md, included as it is.
    price = os.path.join(doc_dir, "performance", "determinism.md")
    if os.path.exists(price):
        doc += [open(price).read().strip(), ""]
    # Training quality on real captures is measured by hand (minutes of training per run, not a
    # benchmark): its figures live in docs/performance/real_captures.md and are included as they are.
    captures = os.path.join(doc_dir, "performance", "real_captures.md")
    if os.path.exists(captures):
        doc += [open(captures).read().strip(), ""]
    doc.append(GPU_SECTION)
    # Figures of the GPU machine, lent now and then for minutes: measured by launch/gpu-check runs
    # and written up by hand in docs/performance/gpu.md, included as they are.
    gpu = os.path.join(doc_dir, "performance", "gpu.md")
    if os.path.exists(gpu):
        doc += [open(gpu).read().strip(), ""]
    if a.gpu_results:
        summary = os.path.join(a.gpu_results, "summary.md")
        text = open(summary).read()
        text = re.sub(r"^#", "###", text, flags=re.M)
        doc += ["### Latest GPU check results", "", text.strip(), ""]
    with open(a.out, "w") as f:
        f.write("\n".join(doc).rstrip() + "\n")
    print(f"wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
