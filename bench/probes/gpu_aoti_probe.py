#!/usr/bin/env python3
"""Which ways of loading an AOTInductor package without its weights work on this machine's CUDA.

A small module with the UNet's ingredients (conv, group norm, linear, SDPA
attention, fp16, a dynamic batch) is compiled once per variant, and each load
runs in a child process with faulthandler on, so one crash does not hide the
others:

  variant            constants in .so   load_constants
  in_so              yes                none (the package's own)
  managed            no                 user_managed=True   (export_sdxl.py / sdxl-batch)
  copied             no                 user_managed=False
  in_so_update       yes                user_managed=True
  direct             yes                none; in_so's package unzipped by hand and its .so
                                        loaded with torch._C._aoti.AOTIModelContainerRunner*
                                        (the runner without the package loader)
  graph_mt / graph_st  in_so's package, loaded with run_single_threaded False / True, then a
                                        call captured as a CUDA graph and replayed (sdxl-batch's
                                        runner captures the UNet step)

Every package is compiled as export_sdxl.py --aoti does: linked against the
process's libstdc++.so.6 when the compiler has only a static one
(scripts/export/aoti_toolchain.py); --compiler-default leaves the compiler as it is
(on such a machine the .so then carries its own libstdc++ and crashes at load).

--diagnose prints the C++ compiler inductor chose, every compile / link command it
ran, what the package's .so needs and defines (ldd, libstdc++ symbols: a .so
with its own copy of std::locale crashes in the first std::regex), and the
libstdc++ the Python process has loaded.

Usage (GPU machine, repository root):
    python3 bench/probes/gpu_aoti_probe.py --out DIR [--device cuda] [--gdb]
        [--ld-debug] [--diagnose] [--compiler-default] [--variants in_so,managed,...]
Prints one line per variant: ok with the max difference to eager, or how it died.
--gdb runs the child under gdb, or cuda-gdb where gdb is not installed (cuda-gdb
also debugs host code), and prints the native backtrace of the crash;
--ld-debug runs it with LD_DEBUG=files, so the last shared objects opened before
the crash are printed too.

Results on the H200: bench/results/2026-11-30-defaults-h200.md (the crash) and
bench/results/2026-11-30-aoti-prefetch-h200.md (its cause and the graph variants).
"""
import argparse
import os
import shutil
import faulthandler
import json
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = {"in_so": (True, None), "managed": (False, True), "copied": (False, False), "in_so_update": (True, True),
            "direct": (True, None), "graph_mt": (True, None), "graph_st": (True, None)}
GRAPH = ("graph_mt", "graph_st")  # load in_so's package, then capture a CUDA graph of a call
COMMANDS: list = []  # (command line, cwd) of every compile / link inductor ran in this process


def build(device: str, dtype):
    import torch
    import torch.nn.functional as F

    class Block(torch.nn.Module):
        def __init__(self, c=64, heads=2):
            super().__init__()
            self.heads = heads
            self.conv = torch.nn.Conv2d(4, c, 3, padding=1)
            self.norm = torch.nn.GroupNorm(32, c)
            self.qkv = torch.nn.Linear(c, 3 * c)
            self.ctx = torch.nn.Linear(32, 2 * c)
            self.out = torch.nn.Linear(c, c)
            self.conv_out = torch.nn.Conv2d(c, 4, 3, padding=1)

        def forward(self, x, context):
            h = F.silu(self.norm(self.conv(x)))
            b, c, hh, ww = h.shape
            t = h.flatten(2).transpose(1, 2)
            q, k, v = self.qkv(t).chunk(3, dim=-1)
            ck, cv = self.ctx(context).chunk(2, dim=-1)
            k = torch.cat([k, ck], 1)
            v = torch.cat([v, cv], 1)
            split = lambda z: z.unflatten(-1, (self.heads, -1)).transpose(1, 2)  # noqa: E731
            a = F.scaled_dot_product_attention(split(q), split(k), split(v)).transpose(1, 2).flatten(2)
            t = t + self.out(a)
            return self.conv_out(t.transpose(1, 2).reshape(b, c, hh, ww)) + x

    torch.manual_seed(0)
    m = Block().to(device=device, dtype=dtype).eval()
    g = torch.Generator(device="cpu").manual_seed(1)
    inp = (torch.randn(2, 4, 16, 16, generator=g).to(device, dtype), torch.randn(2, 77, 32, generator=g).to(device, dtype))
    return m, inp


def compile_variant(name: str, out: Path, device: str) -> str:
    import torch
    import torch._inductor
    in_so, _ = VARIANTS[name]
    m, inp = build(device, torch.float16)
    rows = torch.export.Dim("rows", min=1, max=8)
    with torch.no_grad():
        ep = torch.export.export(m, inp, dynamic_shapes=({0: rows}, {0: rows}), strict=False)
    import torch._inductor.cpp_builder as cb

    if not getattr(cb.run_compile_cmd, "_probe", False):
        real = cb.run_compile_cmd

        def logged(cmd_line, cwd):
            COMMANDS.append((cmd_line, cwd))
            return real(cmd_line, cwd)

        logged._probe = True
        cb.run_compile_cmd = logged
    t0 = time.time()
    pkg = torch._inductor.aoti_compile_and_package(ep, package_path=str(out / f"{name}.pt2"),
                                                   inductor_configs={"aot_inductor.package_constants_in_so": in_so})
    print(f"  {name}: compiled in {time.time() - t0:.1f} s", flush=True)
    return pkg


def run_text(cmd: list) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return (p.stdout + p.stderr).strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"({cmd[0]}: {e})"


def package_so(pkg: str, into: Path) -> Path:
    import zipfile

    into.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(pkg) as z:
        name = next(n for n in z.namelist() if n.endswith(".so"))
        z.extract(name, into)
    return into / name


def diagnose(pkg: str, out: Path) -> None:
    import torch._inductor.cpp_builder as cb

    cxx = cb.get_cpp_compiler()
    print(f"diagnose: CXX={os.environ.get('CXX')!r}, inductor's compiler {cxx} = {shutil.which(cxx)}", flush=True)
    print("  " + run_text([cxx, "--version"]).splitlines()[0], flush=True)
    for lib in ("libstdc++.so", "libstdc++.a", "libgcc_s.so"):
        print(f"  {cxx} -print-file-name={lib}: {run_text([cxx, '-print-file-name=' + lib])}", flush=True)
    for cmd, cwd in COMMANDS:
        print(f"  command (cwd {cwd}):\n    {cmd}", flush=True)
    so = package_so(pkg, out / "diagnose")
    print(f"  {so.name}: ldd:\n" + "\n".join("    " + x for x in run_text(["ldd", str(so)]).splitlines()), flush=True)
    syms = run_text(["nm", "-C", "--defined-only", str(so)]).splitlines()
    own = [x for x in syms if "std::locale::" in x or "codecvt" in x or "std::__cxx11::collate" in x]
    print(f"  {so.name}: {len(syms)} defined symbols, {len(own)} of libstdc++'s locale machinery; e.g.", flush=True)
    print("\n".join("    " + x for x in own[:8]), flush=True)
    maps = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "libstdc++" in line}
    print(f"  this Python process has loaded: {sorted(maps) or 'no libstdc++'}", flush=True)


def child(name: str, pkg: str, device: str) -> None:
    faulthandler.enable()
    import torch
    import torch._inductor
    _, managed = VARIANTS[name]
    m, inp = build(device, torch.float16)
    if name == "direct":
        import tempfile
        import zipfile

        d = Path(tempfile.mkdtemp(prefix="aoti-direct-"))
        zipfile.ZipFile(pkg).extractall(d)
        so = next(d.rglob("*.so"))
        print(f"    {name}: {so.name}, files {sorted(f.suffix for f in so.parent.iterdir())}", flush=True)
        if device == "cuda":
            print(f"    {name}: AOTIModelContainerRunnerCuda", flush=True)
            try:
                r = torch._C._aoti.AOTIModelContainerRunnerCuda(str(so), 1, "cuda", str(so.parent))
            except TypeError:
                r = torch._C._aoti.AOTIModelContainerRunnerCuda(str(so), 1, "cuda")
        else:
            print(f"    {name}: AOTIModelContainerRunnerCpu", flush=True)
            r = torch._C._aoti.AOTIModelContainerRunnerCpu(str(so), 1)
        runner = lambda *xs: r.run(list(xs))  # noqa: E731
    elif name in GRAPH:
        single = name == "graph_st"
        print(f"    {name}: aoti_load_package(run_single_threaded={single})", flush=True)
        runner = torch._inductor.aoti_load_package(pkg, run_single_threaded=single)
    else:
        print(f"    {name}: aoti_load_package", flush=True)
        runner = torch._inductor.aoti_load_package(pkg)
    if name in GRAPH:
        static = [x.clone() for x in inp]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(side):
            runner(*static)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        print(f"    {name}: capture", flush=True)
        try:
            with torch.no_grad(), torch.cuda.graph(g):
                out = runner(*static)
        except Exception as e:  # noqa: BLE001 - the finding
            print(json.dumps({"variant": name, "capture": f"failed: {str(e).splitlines()[0][:300]}"}), flush=True)
            return
        out = out[0] if isinstance(out, (list, tuple)) else out
        g.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            want = m(*static)
        print(json.dumps({"variant": name, "capture": "ok",
                          "max_abs_diff": float((out.float() - want.float()).abs().max())}), flush=True)
        return
    if managed is not None:
        params = dict(m.named_parameters())
        params.update(dict(m.named_buffers()))
        fqns = runner.get_constant_fqns()
        print(f"    {name}: load_constants({len(fqns)} fqns, user_managed={managed})", flush=True)
        runner.load_constants({n: params[n] for n in fqns}, check_full_update=True, user_managed=managed)
    print(f"    {name}: call", flush=True)
    with torch.no_grad():
        got = runner(*inp)
        got = got[0] if isinstance(got, (list, tuple)) else got
        want = m(*inp)
    torch.cuda.synchronize() if device == "cuda" else None
    print(json.dumps({"variant": name, "max_abs_diff": float((got.float() - want.float()).abs().max())}), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--child", nargs=2, metavar=("VARIANT", "PKG"))
    ap.add_argument("--gdb", action="store_true", help="run each load under gdb or cuda-gdb: native backtrace")
    ap.add_argument("--ld-debug", action="store_true", help="run each load with LD_DEBUG=files")
    ap.add_argument("--diagnose", action="store_true", help="compiler, commands, the .so's libstdc++ (see above)")
    ap.add_argument("--compiler-default", action="store_true",
                    help="leave inductor's compiler as it is (no shared-libstdc++ link, see above)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ", ".join(VARIANTS))
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1], a.device)
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    faulthandler.enable()
    names = [v for v in a.variants.split(",") if v]
    if unknown := [v for v in names if v not in VARIANTS]:
        ap.error(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
    debugger = (shutil.which("gdb") or shutil.which("cuda-gdb")) if a.gdb else None
    if a.gdb and not debugger:
        print("--gdb: neither gdb nor cuda-gdb is on the PATH; running without", flush=True)
    if not a.compiler_default:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # the export's package
        from export.aoti_toolchain import use_shared_libstdcxx

        use_shared_libstdcxx(log=lambda m: print("  " + m, flush=True))
    diagnosed = False
    for name in names:
        try:
            # direct and the graph variants load in_so's package: compiled once
            if name in ("direct", *GRAPH) and (out / "in_so.pt2").exists():
                pkg = str(out / "in_so.pt2")
            else:
                pkg = compile_variant(name, out, a.device)
            if a.diagnose and not diagnosed:
                diagnosed = True
                diagnose(pkg, out)
        except Exception as e:  # noqa: BLE001 - report and go on with the next variant
            print(f"{name}: compile failed: {type(e).__name__}: {e}", flush=True)
            continue
        cmd = [sys.executable, __file__, "--out", str(out), "--device", a.device, "--child", name, pkg]
        if debugger:
            cmd = [debugger, "-q", "-batch", "-ex", "set pagination off", "-ex", "handle SIGPIPE nostop noprint",
                   "-ex", "run", "-ex", "bt 40", "-ex", "info registers rip", "-ex", "x/4i $pc", "--args", *cmd]
        ld_log = out / f"{name}.ld-debug"
        env = dict(os.environ, LD_DEBUG="files", LD_DEBUG_OUTPUT=str(ld_log)) if a.ld_debug else None
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        lines = (p.stdout + p.stderr).strip().splitlines()
        result = next((json.loads(x) for x in lines if x.startswith("{")), None)
        # Under a debugger the exit status is the debugger's (its "bt" fails
        # on a program that exited): the child's result line decides.
        if result and "capture" in result:
            print(f"{name}: capture {result['capture']}"
                  + (f", max|diff| vs eager {result['max_abs_diff']:.3g}" if "max_abs_diff" in result else ""), flush=True)
        elif result and (p.returncode == 0 or debugger):
            print(f"{name}: ok, max|diff| vs eager {result['max_abs_diff']:.3g}", flush=True)
        else:
            print(f"{name}: FAILED (exit {p.returncode}); last lines:", flush=True)
            print("\n".join("   " + x for x in lines[-(120 if debugger else 60):]), flush=True)
            if a.ld_debug:  # one file per process (LD_DEBUG_OUTPUT.PID): the child's is the newest
                logs = sorted(out.glob(f"{ld_log.name}.*"), key=lambda f: f.stat().st_mtime)
                if logs:
                    tail = logs[-1].read_text(errors="replace").splitlines()
                    opened = [x for x in tail if "file=" in x]
                    print(f"   last shared objects opened ({logs[-1].name}):", flush=True)
                    print("\n".join("     " + x.strip() for x in opened[-15:]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
