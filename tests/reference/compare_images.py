"""Compare two images (and optionally two latents .npy files).

    PYTHONPATH=tests python -m reference.compare_images A.png B.png [--latents-a X.npy --latents-b Y.npy]
        [--min-psnr 40] [--json]

Prints PSNR (dB over uint8 RGB; inf when identical) and the max abs pixel
difference, plus the max abs latents difference when both latents are given.
Exit 0 when PSNR >= --min-psnr, 1 otherwise (or when shapes differ), 2 on bad
arguments. numpy + pillow only.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np
from PIL import Image


def load_rgb(path: str) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.uint8)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0.0 else 10.0 * math.log10(255.0**2 / mse)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--latents-a")
    ap.add_argument("--latents-b")
    ap.add_argument("--min-psnr", type=float, default=40.0)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    a = ap.parse_args()
    if bool(a.latents_a) != bool(a.latents_b):
        ap.error("--latents-a and --latents-b go together")

    res: dict = {"a": a.a, "b": a.b, "min_psnr": a.min_psnr}
    ok = True
    msgs = []
    try:
        ia, ib = load_rgb(a.a), load_rgb(a.b)
    except OSError as e:
        print(f"error: cannot read image: {e}", file=sys.stderr)
        return 2
    res["size_a"], res["size_b"] = [ia.shape[1], ia.shape[0]], [ib.shape[1], ib.shape[0]]
    if ia.shape != ib.shape:
        ok = False
        res["psnr"] = None
        res["max_abs_diff"] = None
        msgs.append(f"image sizes differ: {res['size_a']} vs {res['size_b']}")
    else:
        p = psnr(ia, ib)
        res["psnr"] = p
        res["max_abs_diff"] = int(np.abs(ia.astype(np.int16) - ib.astype(np.int16)).max())
        if not p >= a.min_psnr:
            ok = False
            msgs.append(f"PSNR {p:.2f} dB < {a.min_psnr:g} dB")

    if a.latents_a:
        try:
            la = np.load(a.latents_a).astype(np.float64)
            lb = np.load(a.latents_b).astype(np.float64)
        except (OSError, ValueError) as e:
            print(f"error: cannot read latents: {e}", file=sys.stderr)
            return 2
        if la.shape != lb.shape:
            ok = False
            res["latents_max_abs_diff"] = None
            msgs.append(f"latents shapes differ: {list(la.shape)} vs {list(lb.shape)}")
        else:
            res["latents_max_abs_diff"] = float(np.abs(la - lb).max()) if la.size else 0.0
            res["latents_abs_max"] = float(np.abs(lb).max()) if lb.size else 0.0

    res["ok"] = ok
    res["message"] = "; ".join(msgs) if msgs else "ok"
    if a.json:
        out = dict(res)
        if out.get("psnr") == math.inf:
            out["psnr"] = "inf"  # JSON has no infinity
        print(json.dumps(out))
    else:
        if res["psnr"] is not None:
            ps = "inf" if res["psnr"] == math.inf else f"{res['psnr']:.3f}"
            print(f"psnr_db {ps}")
            print(f"max_abs_diff {res['max_abs_diff']}")
        if "latents_max_abs_diff" in res and res["latents_max_abs_diff"] is not None:
            print(f"latents_max_abs_diff {res['latents_max_abs_diff']:.6g}")
        print("ok" if ok else f"FAIL: {res['message']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
