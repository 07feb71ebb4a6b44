"""RUN_DIR/tensorboard read back with TensorBoard's own reader (its EventAccumulator, which checks
every record's CRC-32C) against the run's metrics.jsonl and renders/ (docs/training_loop.md,
"TensorBoard"). For each family: every number of every metrics.jsonl record is a scalar of the
same name at the same step with the same float32 value, and nothing else is; the resolved
config is the text `config`. Image families: each eval render is an image eval/view_III whose
left half is the render's PNG pixel for pixel and whose right half is the target (the halves'
PSNR is the eval PSNR of metrics.jsonl). A resumed run: what the first process logged after the
snapshot it resumed from is dropped (restart marker), as metrics.jsonl drops it. And
run.tensorboard = false writes no folder.

Usage: tensorboard_test.py BUILD_DIR SOURCE_DIR
"""
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from checks import check, finish
from PIL import Image
from tensorboard.backend.event_processing import event_accumulator

build, source = sys.argv[1], os.path.abspath(sys.argv[2])
tessera = os.path.abspath(os.path.join(build, "tessera"))


def run(args, cwd):
    r = subprocess.run([tessera] + args, cwd=cwd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"tessera {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


def records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip() and '"summary"' not in line]


def expected_scalars(recs):
    """{tag: [(step, float32 value)]} as the event file should hold them."""
    out = {}

    def add(obj, prefix, step):
        for key, value in obj.items():
            tag = prefix + key
            if isinstance(value, dict):
                add(value, tag + "/", step)
            elif isinstance(value, bool):
                out.setdefault(tag, []).append((step, 1.0 if value else 0.0))
            elif isinstance(value, (int, float)):
                out.setdefault(tag, []).append((step, float(np.float32(value))))

    for r in recs:
        add({k: v for k, v in r.items() if k != "step"}, "", r["step"])
    return out


def load(run_dir):
    acc = event_accumulator.EventAccumulator(
        os.path.join(run_dir, "tensorboard"),
        size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def check_scalars(name, run_dir, acc):
    want = expected_scalars(records(run_dir))
    tags = set(acc.Tags()["scalars"])
    check(tags == set(want), f"{name}: scalar tags {sorted(tags ^ set(want))} differ from metrics.jsonl")
    for tag in sorted(set(want) & tags):
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        check(got == want[tag], f"{name}: scalar {tag}: {got} != metrics.jsonl {want[tag]}")
    return want


def check_config(name, run_dir, acc):
    texts = acc.Tensors("config") if "config" in acc.Tags()["tensors"] else []
    if not check(len(texts) >= 1, f"{name}: no text 'config'"):
        return
    text = texts[-1].tensor_proto.string_val[0].decode()
    check(text.startswith("```toml\n") and "[run]" in text and f'out_dir = "{run_dir}"' in text,
          f"{name}: the config text is not the resolved TOML of the run: {text[:200]!r}")


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) / 255 - b.astype(np.float64) / 255) ** 2)
    return 10 * np.log10(1.0 / mse)


def check_images(name, run_dir, acc):
    recs = {r["step"]: r for r in records(run_dir)}
    renders = sorted(f for f in os.listdir(os.path.join(run_dir, "renders")) if f.startswith("step-"))
    want = {}  # (tag, step) -> render file
    for f in renders:
        _, step, _, view = f[:-4].split("-")
        want[(f"eval/view_{view}", int(step))] = f
    got = {}
    for tag in acc.Tags()["images"]:
        for e in acc.Images(tag):
            check((tag, e.step) not in got, f"{name}: image {tag} twice at step {e.step}")
            got[(tag, e.step)] = e
    check(set(got) == set(want), f"{name}: images {sorted(got)} != renders/ {sorted(want)}")
    per_step = {}
    for key in sorted(set(got) & set(want)):
        e = got[key]
        pair = np.asarray(Image.open(io.BytesIO(e.encoded_image_string)).convert("RGB"))
        render = np.asarray(Image.open(os.path.join(run_dir, "renders", want[key])).convert("RGB"))
        h, w = render.shape[:2]
        if not check((e.height, e.width) == (h, 2 * w) and pair.shape[:2] == (h, 2 * w),
                     f"{name}: {key} is {e.width}x{e.height}, not the render {w}x{h} twice"):
            continue
        check(np.array_equal(pair[:, :w], render), f"{name}: {key}: left half is not the render")
        per_step.setdefault(key[1], []).append(psnr(pair[:, :w], pair[:, w:]))
    for step, values in per_step.items():
        # 8-bit rounding of render and target moves the PSNR by far less than 0.1 dB.
        check(abs(np.mean(values) - recs[step]["eval_psnr"]) < 0.1,
              f"{name}: step {step}: PSNR of the image halves {np.mean(values):.3f} != eval_psnr "
              f"{recs[step]['eval_psnr']:.3f}: the right half is not the target")
    return len(got)


short = ["--set", "train.epochs=0", "--set", "train.time_budget_minutes=0",
         "--set", "train.log_every=2", "--set", "eval.max_views=2"]
work = tempfile.mkdtemp(prefix="tessera-tensorboard.")
try:
    run(["synth", "--out", "scene.h5", "--views", "16", "--width", "32", "--height", "32"], work)
    run(["synth", "--preset", "shapes", "--out", "shapes.h5", "--count", "40", "--points", "256"], work)
    cases = [("gaussians", "demo_gaussians.toml", "scene.h5", 6, 3),
             ("nerf-hash", "demo_nerf.toml", "scene.h5", 4, 2),
             ("point-diffusion", "demo_diffusion.toml", "shapes.h5", 4, 2)]
    for name, config, data, steps, every in cases:
        out = name
        run(["train", os.path.join(source, "configs", config), "--set", f"data.path={data}",
             "--set", f"run.out_dir={out}", "--set", f"train.steps={steps}",
             "--set", f"eval.every={every}", "--set", "diffusion.generative_eval=false"
             if name == "point-diffusion" else "run.seed=0",
             "--set", "diffusion.warmup_steps=1" if name == "point-diffusion" else "run.seed=0"]
            + short, work)
        run_dir = os.path.join(work, out)
        files = os.listdir(os.path.join(run_dir, "tensorboard"))
        check(len(files) == 1 and files[0].startswith("events.out.tfevents."),
              f"{name}: tensorboard/ holds {files}")
        acc = load(run_dir)
        want = check_scalars(name, run_dir, acc)
        check("loss" in want and "eval_" + ("denoise_loss" if name == "point-diffusion" else "psnr")
              in want, f"{name}: metrics.jsonl lacks loss or the eval metric: {sorted(want)}")
        check_config(name, out, acc)
        if name != "point-diffusion":
            check(check_images(name, run_dir, acc) == 4, f"{name}: not 2 views x 2 evals of images")

    # Resume: train 6 steps with snapshots at 3 and 6, drop the one at 6, resume from 3. The
    # first file holds steps 4-6 of the first process; the reader must drop them.
    base = ["train", os.path.join(source, "configs", "demo_gaussians.toml"),
            "--set", "data.path=scene.h5", "--set", "run.out_dir=resumed", "--set", "train.steps=6",
            "--set", "eval.every=3", "--set", "snapshot.every=3", "--set", "snapshot.keep=0",
            "--set", "train.log_every=1"] + short[:-4] + ["--set", "eval.max_views=2"]
    run(base, work)
    os.remove(os.path.join(work, "resumed", "snapshots", "step-00000006.h5"))
    run(base + ["--resume", "auto"], work)
    run_dir = os.path.join(work, "resumed")
    check(len(os.listdir(os.path.join(run_dir, "tensorboard"))) == 2, "resume: not two event files")
    acc = load(run_dir)
    want = check_scalars("resumed", run_dir, acc)
    check([s for s, _ in want["loss"]] == [1, 2, 3, 4, 5, 6], f"resume: loss steps {want['loss']}")
    check(check_images("resumed", run_dir, acc) == 4, "resume: not 2 views x 2 evals of images")

    run(["train", os.path.join(source, "configs", "demo_gaussians.toml"), "--set", "data.path=scene.h5",
         "--set", "run.out_dir=off", "--set", "train.steps=2", "--set", "run.tensorboard=false"] + short,
        work)
    check(not os.path.exists(os.path.join(work, "off", "tensorboard")),
          "run.tensorboard = false still wrote tensorboard/")
finally:
    shutil.rmtree(work, ignore_errors=True)

finish("tensorboard files")
