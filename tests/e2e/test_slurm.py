#!/usr/bin/env python3
"""Shards under a real scheduler (ctest label e2e): a single-node Slurm cluster of Debian's
slurm-wlm 22.05 (munged, slurmctld, slurmd) started in a temporary folder, with ports on the
loopback, proctrack/linuxproc and task/none (no cgroups, no systemd), runs the tiny model's batch
as a job array of 4 shards with `sdxl-batch run --shard auto` on one shared output folder.

While the array runs, a plain run of the same folder is refused (exit 4: the shards hold the
folder's lock), and one array task is requeued (`scontrol requeue`) after its first image: Slurm
stops it (SIGTERM: sdxl-batch finishes the image in flight), queues it again and it resumes.
Checked afterwards: every array task COMPLETED with exit 0, the requeued one restarted once and
its second run skipped what its first made; every image of the batch is in the folder exactly
once (one manifest line in all the shards' manifests, the file present) and byte-identical to a
single-process run of the same batch; the last shard to finish wrote one report.json of the
whole array (every shard's run, the host, the slowest run), and `sdxl-batch report` writes it again
and refuses a folder with runs of different batch files, as a shard run of another batch file
into the folder is refused (exit 2, nothing written). The exactly-once check itself must catch a folder with an
image missing and one with an image made twice (both made from a copy of the real folder).

Every daemon the test starts is stopped at the end, also when it fails. Skipped (exit 77) with
the reason when the Slurm or munge programs are not installed (scripts/setup.sh installs them).

    PYTHONPATH=tests test_slurm.py --binary B --model TINY --work DIR
"""
from __future__ import annotations

import atexit
import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import unittest
from pathlib import Path

from e2e_common import ARGS, main, read_manifest, sdxl

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo")
SHARDS = 4
TASKS = 12  # 3 images a shard (shard k: tasks k, k+4, k+8); shard 1 is requeued after its first
SETTINGS = {"steps": 6, "width": 256, "height": 256}
SLOW_STEPS = 30  # shard 1's tasks: it is still running when the test looks, however fast the machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    """munged + slurmctld + slurmd of one node, everything under `root` (config, state, logs)."""

    def __init__(self, root: Path):
        self.root, self.pids = root, []
        shutil.rmtree(root, ignore_errors=True)
        for d in ("state", "spool", "log", "run"):
            (root / d).mkdir(parents=True)
        self.conf = root / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    def start(self) -> None:
        r = self.root
        key = r / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._daemon(["munged", "--force", f"--key-file={key}", f"--socket={r / 'munge.sock'}",
                      f"--pid-file={r / 'run/munged.pid'}", f"--log-file={r / 'log/munged.log'}",
                      f"--seed-file={r / 'munge.seed'}"], r / "run/munged.pid")
        host, user = socket.gethostname().split(".")[0], getpass.getuser()
        self.conf.write_text("\n".join([
            "ClusterName=sdxltest", f"SlurmctldHost={host}(127.0.0.1)", f"SlurmUser={user}", f"SlurmdUser={user}",
            f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}",
            "AuthType=auth/munge", f"AuthInfo=socket={r / 'munge.sock'}", "CredType=cred/munge",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'run/slurmctld.pid'}", f"SlurmdPidFile={r / 'run/slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log/slurmctld.log'}", f"SlurmdLogFile={r / 'log/slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "ReturnToService=2", "MpiDefault=none",
            "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none", "MinJobAge=3600",
            f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 2} State=UNKNOWN",
            # All 4 shards at once on a 2-core machine: each runs one thread.
            "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4", ""]))
        self._daemon(["slurmctld", "-i", "-f", str(self.conf)], r / "run/slurmctld.pid")
        self._daemon(["slurmd", "-f", str(self.conf)], r / "run/slurmd.pid")
        deadline = time.time() + 60
        while time.time() < deadline:
            out = self.ctl("sinfo", "-h", "-o", "%T", check=False).stdout.strip()
            if out in ("idle", "mixed", "allocated"):
                return
            time.sleep(0.5)
        raise AssertionError(f"the Slurm node did not come up (sinfo: {out!r}); logs in {r / 'log'}")

    def _daemon(self, cmd: list[str], pid_file: Path) -> None:
        r = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60)
        if r.returncode:
            raise AssertionError(f"{cmd[0]} did not start ({r.returncode}): {r.stderr[-1500:]}")
        for _ in range(100):
            if pid_file.is_file() and pid_file.read_text().strip():
                self.pids.append(int(pid_file.read_text().strip()))
                return
            time.sleep(0.1)
        raise AssertionError(f"{cmd[0]} wrote no pid file {pid_file}")

    def ctl(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, timeout=60)
        if check and r.returncode:
            raise AssertionError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")
        return r

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` of one job or array task as {key: value} (the first record)."""
        fields = {}
        for tok in self.ctl("scontrol", "show", "job", "-o", job_id).stdout.split("\n")[0].split():
            k, _, v = tok.partition("=")
            fields[k] = v
        return fields

    def stop(self) -> None:
        """Cancels every job, stops the daemons (slurmd, slurmctld, munged), SIGKILL after 10 s."""
        if not self.pids:
            return
        self.ctl("scancel", "--full", "--user", getpass.getuser(), check=False)
        for pid in reversed(self.pids):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + 10
        for pid in reversed(self.pids):
            while time.time() < deadline and Path(f"/proc/{pid}").exists():
                time.sleep(0.1)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.pids = []


def exactly_once(out: Path, expected: set[str]) -> list[str]:
    """What is wrong with `out` as the whole batch made once: a file of `expected` with no manifest
    line or missing on disk, an image with lines in two manifests (or twice in one), a line for a
    file that was not expected. [] = every image exactly once."""
    seen: dict[str, int] = {}
    for m in sorted(out.glob("manifest*.jsonl")):
        for line in read_manifest(m.parent, m.name):
            seen[line["file"]] = seen.get(line["file"], 0) + 1
    problems = [f"{f}: no manifest line" for f in sorted(expected - set(seen))]
    problems += [f"{f}: {n} manifest lines" for f, n in sorted(seen.items()) if n > 1]
    problems += [f"{f}: not in the batch" for f in sorted(set(seen) - expected)]
    problems += [f"{f}: no file" for f in sorted(expected) if not (out / f).is_file()]
    return problems


class SlurmArray(unittest.TestCase):
    cluster: SlurmCluster

    @classmethod
    def setUpClass(cls):
        work = Path(ARGS.work)
        cls.batch = work / "night.json"
        cls.batch.write_text(json.dumps({"version": 1, "defaults": SETTINGS, "tasks": [
            dict({"id": f"p{i:02d}", "prompt": f"comic panel {i}, a lighthouse keeper", "seed": 300 + i},
                 **({"steps": SLOW_STEPS} if i % SHARDS == 1 else {})) for i in range(TASKS)]}))
        cls.cluster = SlurmCluster(work / "slurm")
        atexit.register(cls.cluster.stop)
        try:
            cls.cluster.start()
            cls.out = work / "out"
            shutil.rmtree(cls.out, ignore_errors=True)
            cls.run_array()
            cls.single = work / "single"
            shutil.rmtree(cls.single, ignore_errors=True)
            cls.single_run = sdxl("run", str(cls.batch), "--model", ARGS.model, "--out", str(cls.single),
                                  "--threads", "1", "--no-progress")
        finally:
            cls.cluster.stop()

    @classmethod
    def run_array(cls) -> None:
        """sbatch the array; requeue task 1 after its first image; wait for the array to finish."""
        c, logs = cls.cluster, cls.cluster.root / "log"
        cmd = (f"exec {ARGS.binary} run {cls.batch} --model {ARGS.model} --out {cls.out} --shard auto --threads 1 "
               "--no-progress")
        cls.array = c.ctl("sbatch", "--parsable", f"--array=0-{SHARDS - 1}", "--requeue", "--cpus-per-task=1",
                          f"--output={logs}/shard-%A_%a.out", "--wrap", cmd).stdout.strip()
        manifest = cls.out / f"manifest-shard-1-of-{SHARDS}.jsonl"
        deadline = time.time() + 240
        while time.time() < deadline and not (manifest.is_file() and manifest.read_text().strip()):
            time.sleep(0.2)
        # While the shards run, the folder is theirs: a plain run is refused (exit 4).
        cls.plain_beside = sdxl("run", str(cls.batch), "--model", ARGS.model, "--out", str(cls.out), "--threads", "1")
        cls.first_lines = len(manifest.read_text().splitlines()) if manifest.is_file() else 0
        state = c.job(f"{cls.array}_1").get("JobState")
        if state != "RUNNING" or cls.first_lines >= TASKS // SHARDS:
            raise AssertionError(f"array task 1 is {state} with {cls.first_lines} image(s) made: too late to requeue it")
        c.ctl("scontrol", "requeue", f"{cls.array}_1")
        # A requeued job waits (BeginTime, set once its processes have ended) before it is eligible
        # again; let it start now.
        task_id = c.job(f"{cls.array}_1")["JobId"]
        while time.time() < deadline:
            j = c.job(task_id)
            if j.get("JobState") == "PENDING" and j.get("Reason") == "BeginTime":
                c.ctl("scontrol", "update", f"JobId={task_id}", "StartTime=now")
            elif j.get("JobState") in ("RUNNING", "COMPLETED", "FAILED", "CANCELLED"):
                break
            time.sleep(0.2)
        while time.time() < deadline and c.ctl("squeue", "-h", "-j", cls.array, check=False).stdout.strip():
            time.sleep(0.5)
        cls.jobs = {k: c.job(f"{cls.array}_{k}") for k in range(SHARDS)}
        cls.shard1_log = next(logs.glob(f"shard-{cls.array}_1.out")).read_text(errors="replace")

    def test_every_array_task_completed_and_the_requeued_one_resumed(self):
        for k, j in self.jobs.items():
            self.assertEqual((j.get("JobState"), j.get("ExitCode")), ("COMPLETED", "0:0"), f"array task {k}: {j}")
        self.assertEqual(self.jobs[1].get("Restarts"), "1", self.jobs[1])
        self.assertGreaterEqual(self.first_lines, 1, "task 1 was requeued before its first image")
        report = json.loads((self.out / f"report-shard-1-of-{SHARDS}.json").read_text())
        # Its second run found what its first made and made only the rest.
        self.assertGreaterEqual(report["images_skipped"], self.first_lines, report)
        self.assertEqual(report["images_done"] + report["images_skipped"], report["images_total"], report)
        self.assertIn(f"{report['images_skipped']} already done (shard 1/{SHARDS})", self.shard1_log)

    def test_a_plain_run_beside_the_shards_is_refused(self):
        self.assertEqual(self.plain_beside.returncode, 4, self.plain_beside.stderr[-2000:])
        self.assertIn("are working in", self.plain_beside.stderr)

    def test_every_image_exactly_once_and_as_one_process_makes_it(self):
        self.assertEqual(self.single_run.returncode, 0, self.single_run.stderr[-2000:])
        expected = {line["file"] for line in read_manifest(self.single)}
        self.assertEqual(len(expected), TASKS)
        self.assertEqual(exactly_once(self.out, expected), [])
        differ = [f for f in sorted(expected) if (self.out / f).read_bytes() != (self.single / f).read_bytes()]
        self.assertEqual(differ, [], "shards made other PNGs than one process")

    def test_the_last_shard_wrote_one_report_of_the_whole_array(self):
        merged = json.loads((self.out / "report.json").read_text())
        self.assertEqual(merged["merged"]["reports"], SHARDS, merged["merged"])
        self.assertEqual((merged["images_total"], merged["images_done"], merged["images_failed"]), (TASKS, TASKS, 0))
        self.assertEqual(sorted(r["shard"] for r in merged["runs"]), [f"{k}/{SHARDS}" for k in range(SHARDS)])
        self.assertEqual(len(merged["hosts"]), 1, merged["hosts"])
        # Made by each shard's last run (the requeued shard's second run made only what its first had not).
        made = sum(r["images_done"] for r in merged["runs"])
        self.assertEqual(merged["hosts"][0]["images_made"], made, merged["hosts"])
        self.assertLess(made, TASKS, "the requeued shard's second run made everything again")
        self.assertEqual(len({i["file"] for i in merged["images"]}), TASKS)
        self.assertIn(merged["slowest_run"]["report"], {r["report"] for r in merged["runs"]})
        self.assertIn("<h2 id=\"runs\">Runs</h2>", (self.out / "report.html").read_text())

    def test_report_command_merges_again_and_refuses_other_batch_files(self):
        r = sdxl("report", str(self.out))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"{TASKS} of {TASKS} images done", r.stdout)
        copy = Path(ARGS.work) / "two-batches"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(self.out, copy)
        other = copy / f"report-shard-3-of-{SHARDS}.json"
        other.write_text(json.dumps(dict(json.loads(other.read_text()), batch="/elsewhere/other.json")))
        before = (copy / "report.json").read_bytes()
        r = sdxl("report", str(copy))
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("different batch files", r.stderr)
        self.assertIn("/elsewhere/other.json", r.stderr)
        self.assertEqual((copy / "report.json").read_bytes(), before, "a refused merge wrote report.json")
        empty = Path(ARGS.work) / "no-runs"
        shutil.rmtree(empty, ignore_errors=True)
        empty.mkdir()
        r = sdxl("report", str(empty))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("not the output folder of a run", r.stderr)

    def test_a_shard_of_another_batch_file_is_refused_and_writes_nothing(self):
        other = Path(ARGS.work) / "other-night.json"
        other.write_text(self.batch.read_text())
        before = sorted(p.name for p in self.out.iterdir())
        r = sdxl("run", str(other), "--model", ARGS.model, "--out", str(self.out), "--shard", "0/4", "--threads", "1")
        self.assertEqual(r.returncode, 2, r.stderr[-2000:])
        self.assertIn(f"holds runs of batch file '{self.batch}'", r.stderr)
        self.assertEqual(sorted(p.name for p in self.out.iterdir()), before)

    def test_the_check_catches_a_missing_and_a_duplicated_image(self):
        expected = {line["file"] for line in read_manifest(self.single)}
        for case in ("missing", "twice"):
            copy = Path(ARGS.work) / f"tampered-{case}"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(self.out, copy)
            m0, m2 = copy / f"manifest-shard-0-of-{SHARDS}.jsonl", copy / f"manifest-shard-2-of-{SHARDS}.jsonl"
            first = m0.read_text().splitlines()[0]
            if case == "missing":  # shard 0's first image lost: no line, no file
                m0.write_text("\n".join(m0.read_text().splitlines()[1:]) + "\n")
                (copy / json.loads(first)["file"]).unlink()
            else:  # shard 0's first image made again by shard 2
                m2.write_text(m2.read_text() + first + "\n")
            problems = exactly_once(copy, expected)
            self.assertTrue(problems, f"{case}: not caught")
            self.assertIn(json.loads(first)["file"], problems[0], problems)
            print(f"  tampered ({case}): {problems}", flush=True)


if __name__ == "__main__":
    missing = [p for p in PROGRAMS if not shutil.which(p)]
    if missing:
        print(f"SKIP: not installed: {', '.join(missing)} (Debian: slurmd slurmctld slurm-client munge; "
              "scripts/setup.sh installs them)")
        sys.exit(77)
    sys.exit(main(__doc__, "--binary", "--model", "--work"))
