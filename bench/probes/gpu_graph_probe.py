#!/usr/bin/env python3
"""Whether an exported UNet (unet.ts) can be captured as a CUDA graph, and what a replay saves.
    python3 bench/probes/gpu_graph_probe.py MODEL_DIR      (GPU machine)
Loads unet.ts two ways -- map_location="cuda" (constants land on the GPU) and
on the CPU then .to("cuda") (tensor constants stay on the CPU) -- and for the
second: checks the outputs agree, looks for host-synchronising ops with
torch.cuda.set_sync_debug_mode("error") (a traced `inner_dim // heads` on a
GPU constant becomes a .item() per attention layer, which forbids capture),
captures one call as a CUDA graph, checks a replay equals a plain call on new
inputs, and times plain calls vs replays (ms per CFG step, 1024x1024)."""
import json
import sys
import time

import torch

torch._C._set_graph_executor_optimize(False)
m = sys.argv[1]
cfg = json.load(open(f"{m}/model.json"))
t0 = time.time(); ref = torch.jit.load(f"{m}/unet.ts", map_location="cuda"); print(f"load to cuda: {time.time()-t0:.1f} s")
t0 = time.time(); unet = torch.jit.load(f"{m}/unet.ts", map_location="cpu"); unet.to("cuda"); torch.cuda.synchronize()
print(f"load to cpu, then .to(cuda): {time.time()-t0:.1f} s")
dt = torch.float16
x = torch.randn(2, 4, 128, 128, device="cuda", dtype=dt)
t = torch.full((2,), 999.0, device="cuda")
ctx = torch.randn(2, 77, cfg["unet"]["context_dim"], device="cuda", dtype=dt)
pooled = torch.randn(2, cfg["unet"]["pooled_dim"], device="cuda", dtype=dt)
tids = torch.tensor([[1024, 1024, 0, 0, 1024, 1024]] * 2, device="cuda", dtype=dt)
with torch.inference_mode():
    a = ref(x, t, ctx, pooled, tids); b = unet(x, t, ctx, pooled, tids)
    print("cpu-loaded vs cuda-loaded: max diff", (a - b).abs().max().item(), "equal", torch.equal(a, b))
    for name, mod in (("cuda-loaded", ref), ("cpu-loaded", unet)):
        torch.cuda.set_sync_debug_mode("error")
        try:
            mod(x, t, ctx, pooled, tids); print(f"{name}: no synchronising op")
        except Exception as e:
            print(f"{name}: synchronising op: ...{str(e)[-200:]}")
        torch.cuda.set_sync_debug_mode(0)
    g = torch.cuda.CUDAGraph(); s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        unet(x, t, ctx, pooled, tids)
    torch.cuda.current_stream().wait_stream(s)
    try:
        with torch.cuda.graph(g):
            out = unet(x, t, ctx, pooled, tids)
    except Exception as e:
        print("capture failed:", str(e)[:300]); sys.exit(1)
    x.copy_(torch.randn_like(x)); g.replay(); r = unet(x, t, ctx, pooled, tids); torch.cuda.synchronize()
    print("capture ok; replay vs plain on new inputs: max diff", (out - r).abs().max().item(), "equal", torch.equal(out, r))
    for name, fn in (("plain", lambda: unet(x, t, ctx, pooled, tids)), ("graph", g.replay)):
        for _ in range(3):
            fn()
        torch.cuda.synchronize(); t0 = time.time()
        for _ in range(20):
            fn()
        torch.cuda.synchronize(); print(f"{name}: {(time.time()-t0)/20*1000:.1f} ms per CFG step (batch 2 = 1 image)")
