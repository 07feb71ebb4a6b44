#!/usr/bin/env python3
"""The layer table of docs/architecture.md, checked against the code (docs/testing.md).

Each row names a folder and what it "may include". This script reads that column and fails on
any `#include "FOLDER/..."` of Tessera's own headers that it does not allow, naming the file and
line. What it understands of the column:
  - backticked folders (`distributed/`) and headers (`models/builtin.h`) before any **except**
    or **never**: allowed;
  - "its own folder" (a family's folder), "every family folder", "anything";
  - **except** `FOLDER/` in `FILE`: that folder, allowed in that file only;
  - **except** a family's folder: the families only through `HEADER`: no family folder, but HEADER.
A row it cannot read fails the test: the table and this script change together.

framework/ and distributed/ know no family: no file there names a family's folder (`nerf`,
`gaussians`, ...) or a model (model.name of a config in configs/) as a lowercase word, the way
code, config sections and messages name them. (Capitalized technique and dataset names, such as
NeRF-synthetic, are not families.)

It also keeps the build fast (docs/testing.md, "Build time"): no file includes <torch/torch.h>,
and no .cu file includes a <torch/...> header (nvcc parses those three times, without the
precompiled header).

Usage: layer_includes.py SOURCE_DIR
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
doc = (root / "docs/architecture.md").read_text()
section = doc.split("## Layers", 1)[1].split("\n## ", 1)[0]
families = sorted(p.name for p in (root / "models").iterdir() if p.is_dir())
top = ["distributed/", "kernels/", "framework/", "launch/"] + [f"models/{f}/" for f in families]

rules = {}  # row key -> (allowed folders, allowed files, {file name: extra folders})
for line in section.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) != 3 or not cells[0].startswith("`"):
        continue
    key = cells[0].strip("`")
    text = cells[2]
    cut = re.search(r"\*\*(except|never)\*\*", text)
    head = (text[:cut.start()] if cut else text).split("; no other")[0]
    kind, tail = (cut.group(1), text[cut.end():]) if cut else ("", "")
    folders = set(re.findall(r"`([a-z_/<>]+/)`", head))
    files = set(re.findall(r"`([\w/.]+\.h)`", head))
    extra = {}
    if "anything" in head:
        folders |= set(top)
    if "every family folder" in head:
        folders |= {f"models/{f}/" for f in families}
    own = "its own folder" in head
    m = re.match(r"\s*`([a-z_]+/)` in `([\w.]+)`", tail)
    if m:
        extra[m.group(2)] = {m.group(1)}
    elif "a family's folder: the families only through" in tail:
        folders -= {f"models/{f}/" for f in families}
        files |= set(re.findall(r"`([\w/.]+\.h)`", tail))
    elif kind == "except":
        sys.exit(f"docs/architecture.md: layer row '{key}': cannot read '{text}'")
    if not folders and not own and not files:
        sys.exit(f"docs/architecture.md: layer row '{key}': no folder it may include")
    rules[key] = (folders, files, extra, own)

expected = {"distributed/", "kernels/", "framework/", "models/<family>/", "models/builtin.{h,cpp}", "launch/"}
if set(rules) != expected:
    sys.exit(f"docs/architecture.md: the layer table has rows {sorted(rules)}, expected {sorted(expected)}")

include = re.compile(r'^\s*#\s*include\s+"([a-z_]+/[^"]+)"')
problems, checked = [], 0
torch_include = re.compile(r'^\s*#\s*include\s+<(torch/[^>]+)>')
models = set()
for config in (root / "configs").glob("*.toml"):
    m = re.search(r'^\[model\][^\[]*?^name\s*=\s*"([^"]+)"', config.read_text(), re.M | re.S)
    if m:
        models.add(m.group(1))
if not models:
    sys.exit(f"no model.name found in {root}/configs/*.toml: wrong folder?")
family_word = re.compile(r"(?<![\w-])(" + "|".join(
    re.escape(n) for n in sorted(set(families) | models, key=len, reverse=True)) + r")(?![\w-])")
for path in sorted(root.glob("**/*")):
    rel = path.relative_to(root).as_posix()
    if (path.suffix not in (".h", ".cpp", ".cu", ".cuh") or not path.is_file()
            or rel.split("/")[0].startswith(("build", "."))):
        continue
    for number, text in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if rel.split("/")[0] in ("framework", "distributed"):
            w = family_word.search(text)
            if w:
                problems.append(f"{rel}:{number}: names the family '{w.group(1)}': framework/ and "
                                "distributed/ know no family (docs/architecture.md, Layers)")
        m = torch_include.match(text)
        if m and m.group(1) == "torch/torch.h":
            problems.append(f"{rel}:{number}: includes <torch/torch.h>: include the LibTorch headers "
                            "the file uses (docs/testing.md, Build time)")
        elif m and path.suffix in (".cu", ".cuh"):
            problems.append(f"{rel}:{number}: a .cu file includes <{m.group(1)}>: only ATen's and "
                            "c10's light headers (docs/kernels.md, Light headers for nvcc)")
for path in sorted(root.glob("**/*")):
    rel = path.relative_to(root).as_posix()
    if path.suffix not in (".h", ".cpp", ".cu", ".cuh") or not path.is_file():
        continue
    parts = rel.split("/")
    if parts[0] in ("distributed", "kernels", "framework", "launch"):
        key, own_folder = parts[0] + "/", None
    elif parts[0] == "models" and len(parts) == 2:
        key, own_folder = "models/builtin.{h,cpp}", None
    elif parts[0] == "models":
        key, own_folder = "models/<family>/", f"models/{parts[1]}/"
    else:
        continue  # tests/, build trees, tools: not a layer
    folders, files, extra, own = rules[key]
    allowed = set(folders) | set(extra.get(path.name, set()))
    if own and own_folder:
        allowed.add(own_folder)
    for number, text in enumerate(path.read_text(errors="replace").splitlines(), 1):
        m = include.match(text)
        if not m:
            continue
        target = m.group(1)
        tparts = target.split("/")
        if tparts[0] not in ("distributed", "kernels", "framework", "launch", "models"):
            continue  # a library's header (torch/, nlohmann/, ...)
        checked += 1
        folder = f"models/{tparts[1]}/" if tparts[0] == "models" and len(tparts) > 2 else tparts[0] + "/"
        if folder in allowed or target in files:
            continue
        if tparts[0] == "models" and len(tparts) == 2 and key == "models/<family>/":
            problems.append(f"{rel}:{number}: includes {target}: a family never includes the registry")
            continue
        problems.append(f"{rel}:{number}: includes {target}, which '{key}' may not "
                        f"(docs/architecture.md, Layers)")

if checked < 100:
    sys.exit(f"only {checked} includes of Tessera's own headers found under {root}: wrong folder?")
for p in problems:
    print(p)
print(f"{checked} includes checked against the layer table: {len(problems)} problems")
sys.exit(1 if problems else 0)
