"""`tessera report RUN_DIR` (docs/training_loop.md, "Run report") checked in a real browser.

For gaussians, nerf-hash and point-diffusion (with samples): trains a few steps on 2 ranks,
writes the report, then
- the page is self-contained: no URL outside it, every image a data: URI whose PNG equals the
  run's renders/ file, and the embedded data equals metrics.jsonl, ranks.json and config.toml;
- each rank's memory by kind is the state it holds (Adam's parameters, gradients and moments);
- headless Chromium (Debian's), with every host name unresolvable, loads it without a script
  error, the page's own check finds each expected chart drawn with coloured pixels, and the
  screenshot shows them;
- a run still writing (no summary, a half-written last line) gets a report that says so;
- bad input exits 2 and writes nothing.

Usage: report_test.py BUILD_DIR SOURCE_DIR
"""
import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from checks import check, finish
from PIL import Image

build, source = sys.argv[1], os.path.abspath(sys.argv[2])
tessera = os.path.abspath(os.path.join(build, "tessera"))
chromium = shutil.which("chromium") or shutil.which("chromium-browser")


def run(args, cwd, mpi=False):
    cmd = [tessera] + args
    if mpi:
        cmd = [os.environ.get("TESSERA_MPIEXEC", "mpiexec"), "-n", "2", "--oversubscribe"] + cmd
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


def page_data(html):
    m = re.search(r'<script id="tessera-data" type="application/json">(.*?)</script>', html, re.S)
    try:
        return json.loads(m.group(1)) if m else None
    except json.JSONDecodeError:  # e.g. a "</script>" in the data ended the script early
        return None


def png_pixels(data):
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def browse(page, work, name):
    """Chromium's console self-check line (dict) and the screenshot (array) of `page`."""
    shot = os.path.join(work, name + ".png")
    cmd = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
           "--v=0", "--no-first-run", "--disable-background-networking",
           "--host-resolver-rules=MAP * ~NOTFOUND", "--user-data-dir=" + os.path.join(work, "profile"),
           "--window-size=1200,3200", "--screenshot=" + shot, "file://" + page]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    log = r.stdout + r.stderr
    check("Uncaught" not in log, f"{name}: script error in Chromium: " +
          "\n".join(l for l in log.splitlines() if "Uncaught" in l)[:800])
    m = re.search(r'"tessera-report (\{.*\})", source:', log)
    if not check(m is not None, f"{name}: the page's self-check line is missing from Chromium's log:\n{log[-2000:]}"):
        return None, None
    result = json.loads(m.group(1).replace('\\"', '"'))
    if not check(os.path.exists(shot), f"{name}: no screenshot"):
        return result, None
    return result, np.asarray(Image.open(shot).convert("RGB")).astype(np.int32)


def check_page(name, run_dir, work, expect_charts, expect_samples=0, finished=True):
    page = os.path.join(run_dir, "report.html")
    if not check(os.path.exists(page), f"{name}: no report.html"):
        return
    check(not os.path.exists(page + ".partial"), f"{name}: report.html.partial left behind")
    html = open(page, encoding="utf-8").read()
    # self-contained: nothing is fetched at view time
    for pattern in [r'(src|href)\s*=\s*"(?!data:|#)', r"<link\b", r"@import", r"url\(", r"https?://",
                    r"<iframe", r"fetch\(", r"XMLHttpRequest"]:
        check(re.search(pattern, html) is None, f"{name}: the page refers to something outside it ({pattern})")
    data = page_data(html)
    if not check(data is not None, f"{name}: no embedded data"):
        return
    lines = []
    for l in open(os.path.join(run_dir, "metrics.jsonl")):
        try:
            lines.append(json.loads(l))
        except json.JSONDecodeError:  # a record being written
            pass
    records = [l for l in lines if not l.get("summary")]
    check(data["records"] == records, f"{name}: embedded records differ from metrics.jsonl")
    check(bool(data["summary"]) == finished, f"{name}: summary present {bool(data['summary'])}, expected {finished}")
    check(data.get("config") == open(os.path.join(run_dir, "config.toml")).read(), f"{name}: config differs")
    run_names = {"gaussians": "demo_gaussians", "running": "demo_gaussians",
                 "nerf-hash": "demo_nerf", "point-diffusion": "demo_diffusion"}
    check(data.get("name") == run_names[name], f"{name}: run name {data.get('name')}")
    ranks = json.load(open(os.path.join(run_dir, "ranks.json")))
    check(data.get("ranks") == ranks, f"{name}: embedded ranks differ from ranks.json")
    check(ranks["world_size"] == 2 and [r["rank"] for r in ranks["ranks"]] == [0, 1],
          f"{name}: ranks.json lists {ranks.get('world_size')} ranks")
    check(ranks["step"] == records[-1]["step"], f"{name}: ranks.json is of step {ranks['step']}, the last record of {records[-1]['step']}")
    for r in ranks["ranks"]:
        mem = dict(r["memory"])
        check(mem.get("parameters", 0) > 0 and mem.get("gradients") == mem["parameters"] and
              mem.get("optimizer (Adam)") == 2 * mem["parameters"],
              f"{name}: rank {r['rank']} memory parts {mem}: gradients and Adam's two moments should match the parameters")
        check(r["peak_mem_bytes"] >= sum(mem.values()), f"{name}: rank {r['rank']} peak below its state")
        check(set(r["phase_s"]) == set(records[-1]["phase_s"]) and r["phase_steps"] == records[-1]["step"],
              f"{name}: rank {r['rank']} phases {sorted(r['phase_s'])} after {r['phase_steps']} steps")
    # every image is the run's own PNG
    renders = os.path.join(run_dir, "renders")
    for ev in data["evals"]:
        for v in ev["views"]:
            f = os.path.join(renders, "step-%08d-view-%03d.png" % (ev["step"], v["view"]))
            uri = v["render"]
            check(uri.startswith("data:image/png;base64,") and os.path.exists(f) and
                  np.array_equal(png_pixels(base64.b64decode(uri.split(",", 1)[1])), png_pixels(open(f, "rb").read())),
                  f"{name}: the render of view {v['view']} at step {ev['step']} is not {f}")
            t = data["targets"].get(str(v["view"]))
            check(t is not None and t.startswith("data:image/png;base64,"), f"{name}: no target for view {v['view']}")
    eval_steps = sorted({r["step"] for r in records if "eval_psnr" in r})
    check([e["step"] for e in data["evals"]] == eval_steps, f"{name}: eval steps {[e['step'] for e in data['evals']]} vs {eval_steps}")
    check(len(data["samples"]) == expect_samples, f"{name}: {len(data['samples'])} samples, expected {expect_samples}")

    if not chromium:
        return
    result, shot = browse(page, work, name)
    if result is None:
        return
    check(result["errors"] == [], f"{name}: the page reported errors {result['errors']}")
    drawn = {c["title"]: c for c in result["charts"]}
    for title in expect_charts:
        c = drawn.get(title)
        if not check(c is not None, f"{name}: chart '{title}' missing (drawn: {sorted(drawn)})"):
            continue
        check(c["points"] > 0 and c["colored"] > 100,
              f"{name}: chart '{title}' looks blank: {c['points']} points, {c['colored']} coloured pixels")
    for s in data["samples"]:
        c = drawn.get(s["name"])
        check(c is not None and c["points"] == len(s["points"]) // 6 and c["inked"] > 100,
              f"{name}: sample {s['name']} not drawn ({c})")
    if shot is not None:
        # the screenshot's top part (cards, the first charts): ink, and the series' colours
        top = shot[:1600]
        ink = (np.abs(top - 255).max(axis=2) > 30).mean()
        colour = ((top.max(axis=2) - top.min(axis=2)) > 60).mean()
        # (the page without its script: ink 0.003, colour 0; drawn: ink ~0.03, colour ~0.01)
        check(ink > 0.015 and colour > 0.005, f"{name}: the screenshot looks empty (ink {ink:.4f}, colour {colour:.4f})")
        print(f"{name}: {len(drawn)} canvases drawn, screenshot ink {ink:.3f} colour {colour:.4f}", flush=True)


with tempfile.TemporaryDirectory() as work:
    if not chromium:
        sys.exit("chromium is not installed: launch/setup installs it (Debian's chromium package)")
    run(["synth", "--out", "scene.h5", "--views", "16", "--width", "32", "--height", "32"], work)
    os.makedirs(os.path.join(work, "x<!--<script></script><b>"))
    shutil.copy(os.path.join(work, "scene.h5"), os.path.join(work, "x<!--<script></script><b>", "scene.h5"))
    run(["synth", "--preset", "shapes", "--out", "shapes.h5", "--count", "40", "--points", "256"], work)
    short = ["--set", "train.epochs=0", "--set", "train.time_budget_minutes=0", "--set", "train.log_every=3",
             "--set", "eval.max_views=2", "--set", "train.steps=12", "--set", "eval.every=6"]
    image_charts = ["loss", "PSNR of eval and train views (dB)", "eval_ssim", "seconds per step by phase (rank 0)",
                    "peak memory by kind", "seconds per step by phase"]
    for name, config, data, extra, charts in [
            ("gaussians", "demo_gaussians.toml", "scene.h5", [], image_charts + ["views_per_s"]),
            # a data path that would end the page's data script if it were not escaped
            ("nerf-hash", "demo_nerf.toml", "x<!--<script></script><b>/scene.h5", [], image_charts + ["rays_per_s", "lr"]),
            ("point-diffusion", "demo_diffusion.toml", "shapes.h5",
             ["--set", "diffusion.generative_eval=false", "--set", "diffusion.warmup_steps=1"],
             ["loss", "eval_denoise_loss", "lr", "peak memory by kind", "seconds per step by phase"])]:
        run(["train", os.path.join(source, "configs", config), "--set", f"data.path={data}",
             "--set", f"run.out_dir={name}"] + short + extra, work, mpi=True)
        samples = 0
        if name == "point-diffusion":
            samples = 3
            run(["sample", os.path.join(name, "snapshots", "step-00000012.h5"), "--count", "3",
                 "--steps", "4", "--out", os.path.join(name, "samples")], work)
        r = run(["report", name], work)
        check(re.search(r"wrote .*report\.html .*: 4 logged steps", r.stdout) is not None,
              f"{name}: report's line: {r.stdout}")
        check_page(name, os.path.join(work, name), work, charts, expect_samples=samples)

    # A run still writing: no summary yet and half a record at the end.
    shutil.copytree(os.path.join(work, "gaussians"), os.path.join(work, "running"))
    metrics = os.path.join(work, "running", "metrics.jsonl")
    lines = [json.loads(l) for l in open(metrics) if '"summary"' not in l]
    for i, rec in enumerate(lines):  # a series flat but for float rounding: its axis must not hang
        rec["flat"] = 30.000000000000004 if i % 2 else 30.0
    with open(metrics, "w") as f:
        f.writelines(json.dumps(rec) + "\n" for rec in lines)
        f.write('{"loss": 0.1, "st')
    os.remove(os.path.join(work, "running", "report.html"))
    r = run(["report", "running"], work)
    check("1 metrics.jsonl lines were not JSON" in r.stderr, f"running: no note of the partial line: {r.stderr}")
    check_page("running", os.path.join(work, "running"), work, ["loss", "flat"], finished=False)

    # A long run's records thinned: every eval record and the last kept, the others evenly.
    r = run(["report", "gaussians", "--out", "thinned.html", "--max-records", "1"], work)
    thinned = page_data(open(os.path.join(work, "thinned.html"), encoding="utf-8").read())
    logged = [json.loads(l) for l in open(os.path.join(work, "gaussians", "metrics.jsonl")) if '"summary"' not in l]
    kept = [rec["step"] for rec in thinned["records"]]
    want = [rec["step"] for i, rec in enumerate(logged) if i % len(logged) == 0 or "eval_psnr" in rec or i + 1 == len(logged)]
    check(kept == want and len(kept) < len(logged) and thinned["records_logged"] == len(logged),
          f"thinned records {kept}, expected {want} of {len(logged)}")
    check(f"4 logged steps ({len(want)} drawn)" in r.stdout, f"thinned: {r.stdout}")

    # Bad input: exit 2, nothing written.
    os.makedirs(os.path.join(work, "empty"))
    for args, what in [(["report", "missing"], "is not a folder"),
                       (["report", "empty"], "has no metrics.jsonl"),
                       (["report", "gaussians", "--out", "nowhere/r.html"], "its folder does not exist")]:
        r = subprocess.run([tessera] + args, cwd=work, capture_output=True, text=True, timeout=60)
        check(r.returncode == 2 and what in r.stderr, f"{args}: exit {r.returncode}, {r.stderr.strip()}")
    check(os.listdir(os.path.join(work, "empty")) == [], "report wrote into a folder that is not a run")
    check(not os.path.exists(os.path.join(work, "nowhere")), "report made a folder for --out")

finish("report")
