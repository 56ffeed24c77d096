"""Peer benchmark driver: recps vs PyTorch eager vs TorchRec (docs/performance.md).

Writes one synthetic Criteo TSV dataset per config (a planted signal: labels
from a hidden logistic model over the dense values and per-id weights), the
recps job for it, then runs every system on it, interleaved, for N rounds,
and prints samples/s (median/min/max over rounds), held-out AUC (one AUC
function for every system, on the same held-out file), the peak memory of the
whole job (sum over its processes of their peak RSS) and recps' ratio to the
best peer. Only training steps warmup..steps-1 are timed, for every system.

Run through bench/peers/run.sh (it makes the virtual environment).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# name: (tables, rows per table, ids per bag, global batch)
CONFIGS = {
    "S-p1": (8, 100_000, 1, 2048),
    "S-p20": (8, 100_000, 20, 2048),
    "M-p1": (26, 1_000_000, 1, 4096),
}
SYSTEMS = ["recps-W1S1", "recps-W2S2", "pytorch", "torchrec-W1", "torchrec-W2"]
TRANSPORTS = ["oneproc", "inproc", "grpc"]
DIM, NUM_DENSE, LR = 64, 13, 0.005
BOTTOM, TOP = [512, 256, 64], [512, 256, 1]


# ---------------------------------------------------------------- data

def write_dataset(path, n, tables, rows, bag, seed):
    """n Criteo TSV lines; ids uniform in [0, rows), hex; labels planted."""
    rng = np.random.default_rng(seed)
    hidden = np.random.default_rng(12345)  # the same hidden model for train and eval
    w_dense = hidden.normal(0, 0.6, NUM_DENSE)
    # Per-id weight: a fixed pseudo-random function of (table, id).
    mult = hidden.integers(1, 2**31 - 1, tables) | 1
    counts = np.floor(np.expm1(rng.exponential(1.2, (n, NUM_DENSE)))).astype(np.int64)
    dense = np.log1p(counts)
    ids = rng.integers(0, rows, (n, tables, bag), dtype=np.int64)
    h = ((ids * mult[None, :, None]) % 1_000_003) / 1_000_003.0 - 0.5  # [-0.5, 0.5)
    informative = min(tables, 6)
    logit = (dense - dense.mean(0)) @ w_dense * 0.5 + 3.0 * h[:, :informative].mean(2).sum(1)
    logit -= np.median(logit)
    labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    with open(path, "w") as f:
        chunk = 20_000
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            lines = []
            for i in range(lo, hi):
                cats = "\t".join(",".join(format(int(v), "x") for v in ids[i, t])
                                 for t in range(tables))
                lines.append(f"{labels[i]}\t" + "\t".join(map(str, counts[i])) + "\t" + cats)
            f.write("\n".join(lines) + "\n")
    return float(labels.mean())


def recps_job(path, cfg_name, train, evalp, tables, rows, batch_per_worker, steps,
              eval_batches, wire):
    lines = [f'name: "peers-{cfg_name}"']
    for t in range(tables):
        lines.append(f'tables {{ name: "t{t}" dim: {DIM} num_rows: {rows} '
                     f'optimizer {{ kind: ADAGRAD learning_rate: {LR} }} }}')
    for t in range(tables):
        lines.append(f'features {{ name: "f{t}" table: "t{t}" pooling: SUM }}')
    lines.append(f"model {{ bottom_mlp: {BOTTOM} top_mlp: {TOP} }}")
    extra = f" wire_precision: {wire}" if wire else ""
    lines.append(f"training {{ batch_size: {batch_per_worker} steps: {steps} "
                 f"dense_optimizer {{ kind: ADAGRAD learning_rate: {LR} }} "
                 f"consistency {{ mode: SYNC }} eval_interval: 0 eval_batches: {eval_batches} "
                 f"seed: 1{extra} }}")
    lines.append(f'data {{ criteo {{ train_paths: "{train}" eval_paths: "{evalp}" }} }}')
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


# ---------------------------------------------------------------- measuring

def auc(scores, labels):
    order = np.argsort(scores, kind="mergesort")
    s, y = scores[order], labels[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):  # average ranks of ties
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2.0 + 1
        i = j + 1
    pos = y > 0.5
    n_pos, n_neg = pos.sum(), (~pos).sum()
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


class TreeRss:
    """Peak RSS of a process tree: sums each process' VmHWM (last seen)."""

    def __init__(self, root_pid):
        self.root, self.peaks, self.stop = root_pid, {}, False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _children(self):
        out, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            out.append(pid)
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except OSError:
                pass
        return out

    def _loop(self):
        while not self.stop:
            for pid in self._children():
                try:
                    with open(f"/proc/{pid}/status") as f:
                        for line in f:
                            if line.startswith("VmHWM:"):
                                self.peaks[pid] = max(self.peaks.get(pid, 0),
                                                      int(line.split()[1]) * 1024)
                except OSError:
                    pass
            time.sleep(0.05)

    def finish(self):
        self.stop = True
        self.thread.join()
        return sum(self.peaks.values())


def run_tree(cmd, log_path, timeout, env=None):
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        mon = TreeRss(p.pid)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = -9
        peak = mon.finish()
    return rc, peak


def run_recps(a, cfg, d, workers, shards, steps, warm, wire="", transport=None):
    # transport: "oneproc" (every worker a thread of one process around one
    # embedded shard server: recps local --in_process --one_process),
    # "inproc" (each worker process embeds its shard server: --in_process)
    # or "grpc" (separate recps-shard processes); default --recps_transport.
    transport = transport or a.recps_transport
    tables, rows, bag, gb = CONFIGS[cfg]
    job = os.path.join(d, f"job-{workers}{wire}.textproto")
    eval_batches = max(1, a.eval_lines // gb)
    recps_job(job, cfg, os.path.join(d, "train.tsv"), os.path.join(d, "eval.tsv"),
              tables, rows, gb // workers, steps, eval_batches, wire)
    res = tempfile.mkdtemp(dir=d)
    cmd = [os.path.join(a.build_dir, "bin", "recps"), "local", f"--job={job}",
           f"--workers={workers}", f"--result_dir={res}",
           f"--work_dir={res}/work", f"--bin_dir={os.path.join(a.build_dir, 'bin')}"]
    cmd += {"oneproc": ["--in_process", "--one_process"],
            "inproc": ["--in_process"]}.get(transport, [f"--shards={shards}"])
    rc, peak = run_tree(cmd, os.path.join(res, "log.txt"), a.timeout)
    try:
        with open(os.path.join(res, "result0.json")) as f:
            r = json.load(f)
    except OSError:
        return {"error": f"rc {rc}, see {res}/log.txt"}
    secs = sum(r["step_seconds"][warm:steps])
    ev = r["evals"][-1] if r["evals"] else {}
    return {"sps": (steps - warm) * gb / secs, "auc": ev.get("auc", float("nan")),
            "peak": peak, "split": {k: 1e3 * v / steps for k, v in r["times"].items()}}


def run_torch(a, cfg, d, system, world, steps, warm):
    tables, rows, bag, gb = CONFIGS[cfg]
    spec = {"train": os.path.join(d, "train.tsv"), "eval": os.path.join(d, "eval.tsv"),
            "tables": tables, "rows": rows, "bag": bag, "dim": DIM, "num_dense": NUM_DENSE,
            "global_batch": gb, "steps": steps, "warmup": warm, "lr": LR,
            "bottom": BOTTOM, "top": TOP}
    out_dir = tempfile.mkdtemp(dir=d)
    spec_path, out = os.path.join(out_dir, "spec.json"), os.path.join(out_dir, "result.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    cmd = [sys.executable, os.path.join(HERE, "torch_dlrm.py"), f"--system={system}",
           f"--world={world}", f"--spec={spec_path}", f"--out={out}",
           f"--threads={a.torch_threads}"]
    rc, peak = run_tree(cmd, os.path.join(out_dir, "log.txt"), a.timeout)
    if rc != 0 or not os.path.exists(out):
        return {"error": f"rc {rc}, see {out_dir}/log.txt"}
    with open(out) as f:
        r = json.load(f)
    preds = [np.load(out + f".pred{k}.npy") for k in range(world)]
    p = np.concatenate([x[0] for x in preds])
    y = np.concatenate([x[1] for x in preds])
    return {"sps": r["samples"] / r["seconds"], "auc": auc(p, y), "peak": peak}


def run_system(a, cfg, d, system, steps, warm):
    # recps-...-grpc / -inproc / -oneproc: that transport whatever
    # --recps_transport says.
    for t in TRANSPORTS:
        if system.startswith("recps-") and system.endswith("-" + t):
            base = system[:-len(t) - 1]
            workers = 2 if base.startswith("recps-W2S2") else 1
            wire = base.split("-", 2)[2] if base.count("-") >= 2 else ""
            return run_recps(a, cfg, d, workers, workers, steps, warm, wire, t)
    if system == "recps-W1S1":
        return run_recps(a, cfg, d, 1, 1, steps, warm)
    if system == "recps-W2S2":
        return run_recps(a, cfg, d, 2, 2, steps, warm)
    if system.startswith("recps-W1S1-"):  # recps-W1S1-FLOAT16 etc.
        return run_recps(a, cfg, d, 1, 1, steps, warm, system.split("-", 2)[2])
    if system.startswith("recps-W2S2-"):
        return run_recps(a, cfg, d, 2, 2, steps, warm, system.split("-", 2)[2])
    if system == "pytorch":
        return run_torch(a, cfg, d, "eager", 1, steps, warm)
    if system == "torchrec-W1":
        return run_torch(a, cfg, d, "torchrec", 1, steps, warm)
    if system == "torchrec-W2":
        return run_torch(a, cfg, d, "torchrec", 2, steps, warm)
    raise ValueError(f"unknown system {system}")


# ---------------------------------------------------------------- main

def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default="S-p1,S-p20,M-p1")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help="comma list of " + ",".join(SYSTEMS) +
                   "; recps-W1S1-FLOAT16 / -BFLOAT16 (and W2S2) run recps with that "
                   "training.wire_precision; a -grpc, -inproc or -oneproc suffix "
                   "(recps-W2S2-inproc) overrides --recps_transport for that system, "
                   "to interleave them")
    p.add_argument("--recps_transport", choices=TRANSPORTS, default="oneproc",
                   help="recps' workers and shard servers: oneproc (the workers "
                   "threads of one process around one embedded shard server, recps "
                   "local --in_process --one_process; the default, fastest on one "
                   "machine, docs/performance.md), inproc (each worker process embeds "
                   "one, --in_process) or grpc (separate recps-shard processes)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=0,
                   help="training steps per run (0: 100 for S, 60 for M)")
    p.add_argument("--warmup", type=int, default=10, help="untimed first steps")
    p.add_argument("--eval_lines", type=int, default=65536, help="held-out lines")
    p.add_argument("--quick", action="store_true", help="1 round, 40 steps, 5 warmup")
    p.add_argument("--smoke", action="store_true",
                   help="tiny: S-p1 only, 1 round, 8 steps, small tables (checks the plumbing)")
    p.add_argument("--data_dir", default="", help="where datasets go (default build/peers-data)")
    p.add_argument("--build_dir", default="build")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    p.add_argument("--torch_threads", type=int, default=0,
                   help="intra-op threads per PyTorch/TorchRec process (0: CPUs / world size)")
    p.add_argument("--json", default="", help="also write every measurement here")
    a = p.parse_args()
    if a.quick:
        a.rounds, a.steps, a.warmup = 1, a.steps or 40, min(a.warmup, 5)
    if a.smoke:
        CONFIGS["S-p1"] = (8, 10_000, 1, 256)
        a.configs, a.rounds, a.steps, a.warmup, a.eval_lines = "S-p1", 1, 8, 2, 2048
    configs = a.configs.split(",")
    systems = a.systems.split(",")
    data_root = a.data_dir or os.path.join(a.build_dir, "peers-data" + ("-smoke" if a.smoke else ""))
    os.makedirs(data_root, exist_ok=True)

    steps_of = {c: a.steps or (60 if c.startswith("M") else 100) for c in configs}
    dirs = {}
    for c in configs:
        tables, rows, bag, gb = CONFIGS[c]
        d = os.path.abspath(os.path.join(data_root, c))
        os.makedirs(d, exist_ok=True)
        n_train = steps_of[c] * gb
        stamp = os.path.join(d, "stamp.json")
        want = {"tables": tables, "rows": rows, "bag": bag, "train": n_train, "eval": a.eval_lines}
        have = json.load(open(stamp)) if os.path.exists(stamp) else {}
        if have != want:
            t0 = time.time()
            pos = write_dataset(os.path.join(d, "train.tsv"), n_train, tables, rows, bag, 1)
            write_dataset(os.path.join(d, "eval.tsv"), a.eval_lines, tables, rows, bag, 2)
            for f in ("train.tsv.npz", "eval.tsv.npz"):
                if os.path.exists(os.path.join(d, f)):
                    os.remove(os.path.join(d, f))
            json.dump(want, open(stamp, "w"))
            print(f"# {c}: wrote {n_train} train + {a.eval_lines} eval lines "
                  f"({pos:.2f} positive) in {time.time() - t0:.0f} s", file=sys.stderr)
        dirs[c] = d

    results = {c: {s: [] for s in systems} for c in configs}
    for r in range(a.rounds):
        for c in configs:
            # Rotate the order each round so no system always runs first.
            order = systems[r % len(systems):] + systems[:r % len(systems)]
            for s in order:
                t0 = time.time()
                m = run_system(a, c, dirs[c], s, steps_of[c], a.warmup)
                # The machine's 1-minute load average as the run ends: on a
                # shared machine it says how much the numbers are worth.
                m["load"] = os.getloadavg()[0]
                results[c][s].append(m)
                msg = m.get("error") or (f"{m['sps']:.0f} samples/s, AUC {m['auc']:.4f}, "
                                         f"peak {m['peak'] / 2**30:.2f} GiB, "
                                         f"load {m['load']:.1f}")
                print(f"# round {r + 1} {c} {s}: {msg} ({time.time() - t0:.0f} s)",
                      file=sys.stderr, flush=True)

    print(f"\nsamples/s median (min-max) over {a.rounds} round(s); AUC on "
          f"{a.eval_lines} held-out lines; peak = sum of the job's process RSS peaks")
    print(f"machine: {os.cpu_count()} CPUs; load = 1-minute load average at the end of "
          f"each run (median)")
    print("| config | system | samples/s | min | max | AUC | peak GiB | load |")
    print("|" + "---|" * 8)
    for c in configs:
        best_peer, best_peer_name = 0.0, ""
        med = {}
        for s in systems:
            ok = [m for m in results[c][s] if "error" not in m]
            if not ok:
                print(f"| {c} | {s} | failed: {results[c][s][-1].get('error')} | | | | | |")
                continue
            sps = [m["sps"] for m in ok]
            med[s] = statistics.median(sps)
            print(f"| {c} | {s} | {med[s]:.0f} | {min(sps):.0f} | {max(sps):.0f} | "
                  f"{statistics.median(m['auc'] for m in ok):.4f} | "
                  f"{max(m['peak'] for m in ok) / 2**30:.2f} | "
                  f"{statistics.median(m['load'] for m in ok):.1f} |")
            if not s.startswith("recps") and med[s] > best_peer:
                best_peer, best_peer_name = med[s], s
        for s in systems:
            if s.startswith("recps") and s in med and best_peer > 0:
                print(f"|  | {s} / {best_peer_name} | {med[s] / best_peer:.2f}x | | | | | |")
    for c in configs:
        for s in systems:
            ok = [m for m in results[c][s] if "split" in m]
            if ok:
                sp = ok[-1]["split"]
                print(f"# {c} {s} ms/step: " + ", ".join(f"{k} {v:.1f}" for k, v in sp.items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
