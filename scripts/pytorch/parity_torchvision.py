#!/usr/bin/env python3
"""Check that ltrain's ResNet computes what torchvision's computes, names and numbers.

1. Makes a seeded random batch (images [B,3,32,32] float32, labels [B] int64) and saves it as
   safetensors.
2. Runs ltrain's tool on it:
       ltrain_parity --arch A --stem S --device D --seed N --batch-in BATCH.safetensors --out OUT.safetensors
   which writes ltrain's initial weights under torchvision names ("weights.<name>"), its logits,
   loss and parameter gradients ("grad.<name>") for one train-mode forward/backward, TF32 off.
3. Loads "weights.*" into torchvision.models.<arch>(num_classes=10) with strict=True (the name
   check), runs the same batch the same way and compares: relative error ||a-b|| / ||b|| for the
   logits, the loss and every gradient (max over parameters, and over all gradients as one vector).

PASS (exit 0) if every error is below --tol (default 1e-4), else FAIL (exit 1) with the worst
tensors. For scale, the same step is also run in float64 and both fp32 results are compared with
it: BatchNorm's backward cancels heavily, so two correct fp32 implementations that sum in a
different order can differ by far more than 1e-4 in some gradients (torchvision fp32 vs fp64,
resnet50 imagenet stem, B=16: logits 8e-5, gradients up to 2e-2 on an H200 and on a CPU).
1e-4 holds when ltrain runs the same ATen kernels in the same order, as it should; the fp64
columns tell the two failures apart (ltrain-vs-fp64 near tv32-vs-fp64: a summation-order
difference; far above it: a bug).
Exit 2: usage; exit 3: the tool is missing or failed, or the device is unavailable.
Needs torch, torchvision and safetensors (bash scripts/python-env.sh makes .venv/ with them).
"""
import argparse
import copy
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from safetensors.torch import load_file, save_file

from torchvision_models import ARCHS, NUM_CLASSES, build_model

IMAGE_SIZE = 32
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_TOOL = os.path.join(REPO_ROOT, "build-gpu", "ltrain_parity")
SHOW_WORST = 8


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--ltrain-parity", default=DEFAULT_TOOL, metavar="PATH",
                   help="ltrain's parity tool (default: build-gpu/ltrain_parity)")
    p.add_argument("--arch", default="resnet50", choices=ARCHS)
    p.add_argument("--stem", default="imagenet", choices=("imagenet", "cifar"))
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (both sides)")
    p.add_argument("--seed", type=int, default=0, help="model seed for ltrain and batch seed here")
    p.add_argument("--batch", type=int, default=16, help="batch size")
    p.add_argument("--tol", type=float, default=1e-4, help="largest relative error that passes")
    p.add_argument("--workdir", help="keep BATCH/OUT files here (default: a temp folder, removed)")
    p.add_argument("--json", metavar="OUT", help="write the numbers here")
    p.add_argument("--no-fp64", action="store_true", help="skip the float64 reference (the scale columns)")
    args = p.parse_args(argv)
    if args.batch < 2:
        p.error("--batch must be >= 2 (train-mode BatchNorm needs more than one sample)")
    return args


# ----------------------------------------------------------------------------------------------
# safetensors files

def save_tensors(tensors, path):
    """Write a dict of tensors as safetensors, with the safetensors package."""
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, path)


def load_tensors(path):
    """Read a safetensors file into a dict of CPU tensors, with the safetensors package."""
    return load_file(path)


# ----------------------------------------------------------------------------------------------
# The two sides

def make_batch(batch, seed):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, IMAGE_SIZE, IMAGE_SIZE, generator=g)            # [B,3,32,32] f32
    labels = torch.randint(0, NUM_CLASSES, (batch,), generator=g, dtype=torch.int64)  # [B] i64
    return images, labels


def run_ltrain(args, batch_path, out_path):
    """Run ltrain_parity; exits 3 with its output when it is missing or fails."""
    tool = args.ltrain_parity
    if not (os.path.isfile(tool) and os.access(tool, os.X_OK)):
        fail_tool(f"{tool} not found or not executable: build it (scripts/gpu/host-build.sh) "
                  "or pass --ltrain-parity PATH")
    cmd = [tool, "--arch", args.arch, "--stem", args.stem, "--device", args.device,
           "--seed", str(args.seed), "--batch-in", batch_path, "--out", out_path]
    print("parity: running " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0 or not os.path.isfile(out_path):
        tail = "\n".join(proc.stdout.strip().splitlines()[-20:])
        print(tail, file=sys.stderr)
        fail_tool(f"ltrain_parity failed (exit {proc.returncode}); its output is above")


def fail_tool(message):
    print(f"parity: {message}", file=sys.stderr)
    sys.exit(3)


def load_ltrain_weights(model, out):
    """Strict load of the "weights.*" tensors; returns a list of problems (empty when fine)."""
    weights = {k[len("weights."):]: v for k, v in out.items() if k.startswith("weights.")}
    expected = model.state_dict()
    problems = [f"dtype of {k}: ltrain {weights[k].dtype}, torchvision {v.dtype}"
                for k, v in expected.items() if k in weights and weights[k].dtype != v.dtype]
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as exc:
        problems.insert(0, "load_state_dict(strict=True) failed:\n" + str(exc))
    return problems


def torchvision_step(model, images, labels):
    """One train-mode forward/backward, fp32 with TF32 off. Returns logits, loss, grads by name."""
    model.train()
    model.zero_grad(set_to_none=True)
    logits = model(images)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    return logits.detach(), loss.detach(), grads


def set_reference_flags():
    with warnings.catch_warnings():
        # torch >= 2.9 suggests the fp32_precision API; the allow_tf32 flags still work.
        warnings.simplefilter("ignore")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


# ----------------------------------------------------------------------------------------------
# Comparison

def rel_err(a, b):
    """||a-b|| / ||b|| in float64 (the absolute error when b is all zeros); inf on shape mismatch."""
    if a is None or b is None or tuple(a.shape) != tuple(b.shape):
        return float("inf")
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    den = torch.linalg.vector_norm(b).item()
    num = torch.linalg.vector_norm(a - b).item()
    return num / den if den > 0 else num


def compare(out, logits, loss, grads):
    """Returns (results dict, problems list)."""
    problems = []
    errors = {"logits": rel_err(out.get("logits"), logits), "loss": rel_err(out.get("loss"), loss)}
    grad_errors = {}
    for name, g in grads.items():
        theirs = out.get("grad." + name)
        if theirs is None:
            problems.append(f"grad.{name} missing in ltrain's output")
        if g is None:
            problems.append(f"torchvision has no gradient for {name}")
        grad_errors[name] = rel_err(theirs, g)
    for key, theirs, ours in [("logits", out.get("logits"), logits), ("loss", out.get("loss"), loss)] + \
            [("grad." + n, out.get("grad." + n), g) for n, g in grads.items()]:
        if theirs is not None and ours is not None and tuple(theirs.shape) != tuple(ours.shape):
            problems.append(f"shape of {key}: ltrain {list(theirs.shape)}, torchvision {list(ours.shape)}")
    extra = sorted(k for k in out if k.startswith("grad.") and k[len("grad."):] not in grads)
    problems += [f"{k} in ltrain's output is not a torchvision parameter" for k in extra]
    for key in ("logits", "loss"):
        if key not in out:
            problems.append(f"{key} missing in ltrain's output")

    names = [n for n, g in grads.items() if g is not None and ("grad." + n) in out]
    if names and len(names) == len(grads):
        ours = torch.cat([grads[n].detach().reshape(-1).double().cpu() for n in names])
        theirs = torch.cat([out["grad." + n].reshape(-1).double() for n in names])
        grad_global = rel_err(theirs, ours)
    else:
        grad_global = float("inf")
    worst_name = max(grad_errors, key=grad_errors.get) if grad_errors else None
    results = dict(logits_rel=errors["logits"], loss_rel=errors["loss"],
                   grad_max_rel=grad_errors[worst_name] if worst_name else float("inf"),
                   grad_max_name=worst_name, grad_global_rel=grad_global,
                   loss_ltrain=float(out["loss"].double().item()) if "loss" in out else None,
                   loss_torchvision=float(loss.double().item()),
                   per_tensor={"logits": errors["logits"], "loss": errors["loss"],
                               **{"grad." + k: v for k, v in grad_errors.items()}})
    return results, problems


CHECKS = ("logits_rel", "loss_rel", "grad_max_rel", "grad_global_rel")


def as_output(logits, loss, grads):
    """A step's results in ltrain_parity's output layout (to compare two torchvision runs)."""
    out = {"logits": logits.detach().cpu(), "loss": loss.detach().cpu()}
    out.update({"grad." + n: g.detach().cpu() for n, g in grads.items() if g is not None})
    return out


def report(results, problems, tol, scale):
    """Print the check table (with the fp64 scale columns when given); returns True on PASS."""
    print(f"parity: loss ltrain {results['loss_ltrain']}, torchvision {results['loss_torchvision']:.8f}")
    head = f"  {'check':<16} {'ltrain-vs-tv':>12}  status"
    if scale:
        head += f"  {'tv32-vs-fp64':>12}  {'ltrain-vs-fp64':>14}"
    print(head)
    for key in CHECKS:
        status = "ok" if results[key] < tol else "FAIL"
        line = f"  {key:<16} {results[key]:>12.3e}  {status:<6}"
        if scale:
            line += f"  {scale['torchvision_fp32'][key]:>12.3e}  {scale['ltrain'][key]:>14.3e}"
        if key == "grad_max_rel" and results[key] > 0:
            line += f"  ({results['grad_max_name']})"
        print(line)
    worst = sorted(results["per_tensor"].items(), key=lambda kv: -kv[1])[:SHOW_WORST]
    print(f"  worst {len(worst)} tensors:")
    for name, err in worst:
        print(f"    {err:.3e}  {name}")
    for p in problems:
        print(f"parity: problem: {p}", file=sys.stderr)
    passed = not problems and all(results[k] < tol for k in CHECKS)
    print(f"parity: {'PASS' if passed else 'FAIL'} (tolerance {tol:g})")
    return passed


def finite_or_str(value):
    """JSON-safe copy: non-finite floats become strings ("inf", "nan")."""
    if isinstance(value, dict):
        return {k: finite_or_str(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_str(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        fail_tool("--device cuda but CUDA is not available here (try --device cpu)")
    set_reference_flags()

    workdir = args.workdir or tempfile.mkdtemp(prefix="ltrain-parity-")
    os.makedirs(workdir, exist_ok=True)
    try:
        batch_path = os.path.join(workdir, "batch.safetensors")
        out_path = os.path.join(workdir, "out.safetensors")
        images, labels = make_batch(args.batch, args.seed)
        save_tensors({"images": images, "labels": labels}, batch_path)
        run_ltrain(args, batch_path, out_path)
        out = load_tensors(out_path)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    model = build_model(args.arch, args.stem)
    problems = load_ltrain_weights(model, out)
    if problems and problems[0].startswith("load_state_dict"):
        for p in problems:
            print(f"parity: problem: {p}", file=sys.stderr)
        print("parity: FAIL (weight names or shapes differ from torchvision's)")
        results = dict(names_match=False)
        passed = False
    else:
        model = model.to(device)
        model64 = None if args.no_fp64 else copy.deepcopy(model).double()
        logits, loss, grads = torchvision_step(model, images.to(device), labels.to(device))
        results, more = compare(out, logits, loss, grads)
        problems += more
        results["names_match"] = True
        scale = None
        if model64 is not None:
            ref = torchvision_step(model64, images.to(device).double(), labels.to(device))
            scale = {"torchvision_fp32": compare(as_output(logits, loss, grads), *ref)[0],
                     "ltrain": compare(out, *ref)[0]}
            results["fp64_scale"] = {k: {c: v[c] for c in CHECKS + ("grad_max_name",)} for k, v in scale.items()}
        passed = report(results, problems, args.tol, scale)

    if args.json:
        doc = dict(arch=args.arch, stem=args.stem, device=str(device), seed=args.seed, batch=args.batch,
                   tol=args.tol, torch=torch.__version__, torchvision=torchvision.__version__,
                   passed=passed, problems=problems, **results)
        with open(args.json, "w") as f:
            json.dump(finite_or_str(doc), f, indent=1)
            f.write("\n")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
