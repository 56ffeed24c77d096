"""Peer benchmark driver: recps vs PyTorch eager vs TorchRec (docs/performance.md).

Writes one synthetic Criteo TSV dataset per shape (a planted signal: labels
from a hidden logistic model over the dense values and per-id weights), the
recps job for it, then runs every system on it, interleaved, for N rounds,
and prints samples/s (median/min/max over rounds), held-out AUC (one AUC
function for every system, on the same held-out file), the peak memory of the
whole job (sum over its processes of their peak RSS), recps' ratio to the
best peer and recps' per-phase step split. Only training steps
warmup..steps-1 are timed, for every system.

Run through bench/peers/run.sh (it makes the virtual environment); the data
writer's checks: python3 bench/peers/peers.py --self_test (numpy only).
"""

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclasses.dataclass(frozen=True)
class Shape:
    """One shape of the panel: the data and the model every system trains.

    The embedding dim is one per shape, not per table group: recps' job
    validation and TorchRec's DLRM both require every table's dim to equal
    the bottom MLP's last width (the dot interaction multiplies them).
    """
    groups: tuple          # ((tables, rows), ...): `tables` tables of `rows` rows
    batch: int             # global batch
    dim: int = 64
    bag: tuple = (1, 1)    # ids per bag, uniform in [lo, hi] (lo == hi: fixed)
    zipf: float = 0.0      # 0: uniform ids; s > 0: Zipf(s) ranks, scattered
    dynamic: bool = False  # recps tables without num_rows; ids spread over 63 bits
    steps: int = 100       # default training steps per run
    eval_cap: int = 0      # at most this many held-out lines (0: --eval_lines)

    @property
    def rows(self):
        """Rows per table, the groups interleaved round robin so that the six
        informative tables (the first six) span the sizes."""
        left = [list(g) for g in self.groups]
        out = []
        while any(n for n, _ in left):
            for g in left:
                if g[0]:
                    g[0] -= 1
                    out.append(g[1])
        return out

    @property
    def bottom(self):
        return BOTTOM[:-1] + [self.dim]


NUM_DENSE, LR = 13, 0.005
BOTTOM, TOP = [512, 256, 64], [512, 256, 1]
SHAPES = {
    # The first three shapes; their data is byte for byte what the writer
    # made before the panel (checked by --self_test).
    "S-p1": Shape(((8, 100_000),), 2048),
    "S-p20": Shape(((8, 100_000),), 2048, bag=(20, 20)),
    "M-p1": Shape(((26, 1_000_000),), 4096, steps=60),
    # Variable bags (mean 50.5 ids), tables of three sizes; a small batch keeps
    # the ids per step (~670k) near S-p20's and the held-out file small.
    "U-var": Shape(((8, 1_000), (12, 100_000), (6, 1_000_000)), 512, bag=(1, 100),
                   eval_cap=16384),
    "Z-p20": Shape(((8, 100_000),), 2048, bag=(20, 20), zipf=1.05),
    "Z-var-dyn": Shape(((10, 10_000), (10, 100_000), (6, 1_000_000)), 4096, dim=32,
                       bag=(1, 15), zipf=1.05, dynamic=True, steps=60),
    # One dim for all 100 tables (see Shape); 16 as in wide production models.
    # 101 features make the top MLP's input 5066 wide: ~1.4 s a step for the
    # dense part alone on 2 vCPUs, hence 60 steps.
    "Wide-100": Shape(((40, 1_000), (30, 10_000), (20, 50_000), (10, 200_000)), 4096,
                      dim=16, zipf=1.05, steps=60),
    "Narrow-16": Shape(((26, 100_000),), 16384, dim=16, steps=60),
    "Wide-256": Shape(((8, 100_000),), 1024, dim=256, bag=(4, 4)),
}
SYSTEMS = ["recps-W1S1", "recps-W2S2", "recps-W2S2-grpc", "pytorch", "torchrec-W1",
           "torchrec-W2"]
# The recps forms the goal names: one process at W1 and W2, the service
# form (separate recps-shard processes) at W2.
FORMS = {"W1": "recps-W1S1", "W2": "recps-W2S2", "service": "recps-W2S2-grpc"}
TRANSPORTS = ["oneproc", "inproc", "grpc"]
HIDDEN_SEED = 12345  # the hidden model and the id scatter: one for train and eval


def smoke_shape(s):
    """The shape at a size that checks the plumbing in seconds."""
    return dataclasses.replace(s, groups=tuple((n, min(r, 10_000)) for n, r in s.groups),
                               batch=min(s.batch, 256))


# ---------------------------------------------------------------- data

def scatter_perm(table, rows):
    """Where Zipf rank r of `table` lands: a fixed random permutation of
    [0, rows), so hot ids are spread over the table as in real data (not
    packed at ids 0, 1, 2, ..., which would flatter cache locality)."""
    return np.random.default_rng([HIDDEN_SEED, table]).permutation(rows)


def spread63(x):
    """A dynamic table's id: splitmix64's finaliser (a bijection of 64-bit
    words) of x, top bit dropped, so ids are arbitrary non-negative int64."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return ((z ^ (z >> np.uint64(31))) >> np.uint64(1)).astype(np.int64)


def make_samples(shape, n, seed):
    """n samples of the shape: labels [n], counts [n, NUM_DENSE] (the raw
    dense integers), lengths [n, tables] (ids per bag) and ids (every id in
    file order: line, then table, then position in the bag)."""
    rng = np.random.default_rng(seed)
    hidden = np.random.default_rng(HIDDEN_SEED)
    w_dense = hidden.normal(0, 0.6, NUM_DENSE)
    rows = np.asarray(shape.rows, np.int64)
    tables = len(rows)
    # Per-id weight: a fixed pseudo-random function of (table, id).
    mult = hidden.integers(1, 2**31 - 1, tables) | 1
    counts = np.floor(np.expm1(rng.exponential(1.2, (n, NUM_DENSE)))).astype(np.int64)
    dense = np.log1p(counts)
    lo, hi = shape.bag
    fixed = lo == hi
    lengths = (np.full((n, tables), lo, np.int64) if fixed
               else rng.integers(lo, hi + 1, (n, tables), dtype=np.int64))
    table = np.repeat(np.tile(np.arange(tables, dtype=np.int16), n), lengths.ravel())
    if not shape.zipf:
        # Draws the same stream as rng.integers(0, rows, (n, tables, bag)).
        ids = rng.integers(0, rows[table], dtype=np.int64)
    else:
        u = rng.random(len(table))
        ids = np.empty(len(table), np.int64)
        order = np.argsort(table, kind="stable")
        ends = np.cumsum(np.bincount(table, minlength=tables))
        cdfs = {}
        for t in range(tables):
            r = int(rows[t])
            if r not in cdfs:  # Zipf over ranks 1..r, inverted by bisection
                c = np.cumsum(np.arange(1, r + 1, dtype=np.float64) ** -shape.zipf)
                cdfs[r] = c / c[-1]
            at = order[(ends[t - 1] if t else 0):ends[t]]  # table t's ids
            rank = np.minimum(np.searchsorted(cdfs[r], u[at], side="right"), r - 1)
            ids[at] = scatter_perm(t, r)[rank]
    h = ((ids * mult[table]) % 1_000_003) / 1_000_003.0 - 0.5  # [-0.5, 0.5)
    informative = min(tables, 6)
    if fixed:  # the same arithmetic as before variable bags, bit for bit
        pooled = h.reshape(n, tables, lo).mean(2)
    else:
        starts = np.cumsum(lengths.ravel()) - lengths.ravel()
        pooled = (np.add.reduceat(h, starts) / lengths.ravel()).reshape(n, tables)
    logit = (dense - dense.mean(0)) @ w_dense * 0.5 + 3.0 * pooled[:, :informative].sum(1)
    logit -= np.median(logit)
    labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    if shape.dynamic:
        ids = spread63(ids)  # the label above stays a function of the id
    return labels, counts, lengths, ids


_DIGITS = np.frombuffer(b"0123456789abcdef", np.uint8)


def tsv_bytes(labels, counts, lengths, ids):
    """The Criteo TSV text of these samples: label and counts in decimal,
    then per table its bag's ids in lower-case hex joined by ','. Vectorised:
    every number becomes a token followed by its separator."""
    n, tables = lengths.shape
    head = NUM_DENSE + 1
    per_line = head + lengths.sum(1)
    line_start = np.cumsum(per_line) - per_line
    total = int(per_line.sum())
    vals = np.empty(total, np.uint64)
    sep = np.full(total, ord(","), np.uint8)
    is_dec = np.zeros(total, bool)
    dec = (line_start[:, None] + np.arange(head)).ravel()
    is_dec[dec] = True
    vals[dec] = np.column_stack([labels, counts]).ravel()
    sep[dec] = ord("\t")
    hexes = np.flatnonzero(~is_dec)  # the ids' places, in file order
    vals[hexes] = ids
    sep[hexes[np.cumsum(lengths.ravel()) - 1]] = ord("\t")  # a bag's last id
    sep[line_start + per_line - 1] = ord("\n")
    digits = np.ones(total, np.int64)
    for where, base in ((dec, 10), (hexes, 16)):
        x = vals[where] // base
        while x.any():
            digits[where] += x > 0
            x //= base
    width = digits + 1
    start = np.cumsum(width) - width
    out = np.empty(int(width.sum()), np.uint8)
    out[start + digits] = sep
    for where, base in ((dec, 10), (hexes, 16)):
        x, last, d = vals[where], start[where] + digits[where] - 1, digits[where]
        for k in range(int(d.max(initial=0))):
            m = d > k
            out[last[m] - k] = _DIGITS[(x[m] % base).astype(np.intp)]
            x = x // base
    return out.tobytes()


def write_dataset(path, shape, n, seed):
    """n Criteo TSV lines of the shape; returns the fraction of positives."""
    labels, counts, lengths, ids = make_samples(shape, n, seed)
    ends = np.cumsum(lengths.sum(1))
    per_chunk = max(1, 2_000_000 // (NUM_DENSE + 1 + int(ends[-1]) // n))  # ~2M tokens
    with open(path, "wb") as f:
        for lo in range(0, n, per_chunk):
            hi = min(n, lo + per_chunk)
            first = int(ends[lo - 1]) if lo else 0
            f.write(tsv_bytes(labels[lo:hi], counts[lo:hi], lengths[lo:hi],
                              ids[first:int(ends[hi - 1])]))
    return float(labels.mean())


def recps_job(path, cfg_name, shape, train, evalp, batch_per_worker, steps,
              eval_batches, wire):
    lines = [f'name: "peers-{cfg_name}"']
    for t, rows in enumerate(shape.rows):
        size = "" if shape.dynamic else f" num_rows: {rows}"
        lines.append(f'tables {{ name: "t{t}" dim: {shape.dim}{size} '
                     f'optimizer {{ kind: ADAGRAD learning_rate: {LR} }} }}')
    for t in range(len(shape.rows)):
        lines.append(f'features {{ name: "f{t}" table: "t{t}" pooling: SUM }}')
    lines.append(f"model {{ bottom_mlp: {shape.bottom} top_mlp: {TOP} }}")
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
        # A session of its own, so that a run past the timeout (or ^C) ends
        # with all of its processes (shard servers, workers, torchrec's ranks).
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
        mon = TreeRss(p.pid)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = -9
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:  # nothing left
                pass
            p.wait()
        peak = mon.finish()
    return rc, peak


def run_recps(a, cfg, d, workers, shards, steps, warm, wire="", transport=None):
    # transport: "oneproc" (every worker a thread of one process around one
    # embedded shard server: recps local --in_process --one_process),
    # "inproc" (each worker process embeds its shard server: --in_process)
    # or "grpc" (separate recps-shard processes); default --recps_transport.
    transport = transport or a.recps_transport
    shape = a.shapes[cfg]
    gb = shape.batch
    job = os.path.join(d, f"job-{workers}{wire}.textproto")
    eval_batches = max(1, a.eval_of[cfg] // gb)
    recps_job(job, cfg, shape, os.path.join(d, "train.tsv"), os.path.join(d, "eval.tsv"),
              gb // workers, steps, eval_batches, wire)
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
    shape = a.shapes[cfg]
    spec = {"train": os.path.join(d, "train.tsv"), "eval": os.path.join(d, "eval.tsv"),
            "rows": shape.rows, "dim": shape.dim, "dynamic": shape.dynamic,
            "num_dense": NUM_DENSE, "global_batch": shape.batch, "steps": steps,
            "warmup": warm, "lr": LR, "bottom": shape.bottom, "top": TOP}
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


# ---------------------------------------------------------------- report

def cpu_model():
    name, n, avx512 = "unknown CPU", os.cpu_count(), False
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and name == "unknown CPU":
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    avx512 = avx512 or " avx512f" in line
    except OSError:
        pass
    return f"{name}, {n} logical CPUs{', AVX-512' if avx512 else ''}"


def describe(name, s):
    groups = " + ".join(f"{n} x {r:,}" for n, r in s.groups)
    bag = s.bag[0] if s.bag[0] == s.bag[1] else f"{s.bag[0]}..{s.bag[1]}"
    ids = f"Zipf({s.zipf}) scattered" if s.zipf else "uniform"
    kind = "dynamic" if s.dynamic else "fixed"
    return f"| {name} | {groups} | {s.dim} | {ids} | {bag} | {s.batch} | {kind} |"


def report(a, configs, systems, results):
    """The result tables (Markdown), as lines."""
    out = [f"cpu: {cpu_model()}",
           f"samples/s median (min-max) over {a.rounds} round(s); AUC on the held-out "
           f"file; peak = sum of the job's process RSS peaks; load = 1-minute load "
           f"average at the end of each run (median)", "",
           "| shape | tables x rows | dim | ids | ids per bag | global batch | recps tables |",
           "|" + "---|" * 7]
    out += [describe(c, a.shapes[c]) for c in configs]
    out += ["", "| shape | system | samples/s | min | max | AUC | peak GiB | load |",
            "|" + "---|" * 8]
    med, aucs = {}, {}
    for c in configs:
        for s in systems:
            ok = [m for m in results[c][s] if "error" not in m]
            if not ok:
                out.append(f"| {c} | {s} | failed: {results[c][s][-1].get('error')} "
                           f"| | | | | |")
                continue
            sps = [m["sps"] for m in ok]
            med[c, s] = statistics.median(sps)
            aucs[c, s] = statistics.median(m["auc"] for m in ok)
            out.append(f"| {c} | {s} | {med[c, s]:.0f} | {min(sps):.0f} | {max(sps):.0f} | "
                       f"{aucs[c, s]:.4f} | {max(m['peak'] for m in ok) / 2**30:.2f} | "
                       f"{statistics.median(m['load'] for m in ok):.1f} |")
    # The goal: recps >= 1.5x the best peer at W1 and W2 (one process),
    # >= 1.0x in the service form at W2; AUC within 0.005 of every peer.
    out += ["", "| shape | best peer | samples/s | W1 | W2 | service | max AUC gap | goal |",
            "|" + "---|" * 8]
    for c in configs:
        peers = [s for s in systems if not s.startswith("recps") and (c, s) in med]
        if not peers:
            continue
        best = max(peers, key=lambda s: med[c, s])
        ratio = {f: med[c, s] / med[c, best] for f, s in FORMS.items() if (c, s) in med}
        gaps = [abs(aucs[c, r] - aucs[c, p]) for r in systems if r.startswith("recps")
                and (c, r) in aucs for p in peers]
        gap = max(gaps) if gaps else None
        goal = "-"  # unless every form ran
        if len(ratio) == len(FORMS):
            met = (ratio["W1"] >= 1.5 and ratio["W2"] >= 1.5 and ratio["service"] >= 1.0
                   and gap is not None and gap <= 0.005)
            goal = "met" if met else "not met"
        cells = [f"{ratio[f]:.2f}x" if f in ratio else "-" for f in FORMS]
        out.append(f"| {c} | {best} | {med[c, best]:.0f} | " + " | ".join(cells) +
                   f" | {'-' if gap is None else f'{gap:.4f}'} | {goal} |")
    # recps' step split: ms per step (rank 0), median over the rounds.
    keys = []
    for c in configs:
        for s in systems:
            for m in results[c][s]:
                keys += [k for k in m.get("split", {}) if k not in keys]
    if keys:
        out += ["", "recps' step split, ms per step (rank 0; median over rounds):", "",
                "| shape | system | " + " | ".join(keys) + " |", "|" + "---|" * (2 + len(keys))]
        for c in configs:
            for s in systems:
                ok = [m["split"] for m in results[c][s] if "split" in m]
                if ok:
                    out.append(f"| {c} | {s} | " + " | ".join(
                        f"{statistics.median(sp.get(k, 0.0) for sp in ok):.1f}"
                        for k in keys) + " |")
    return out


# ---------------------------------------------------------------- self test

# sha256 (first 16 hex digits) of 3000 lines of each first shape, seeds 1 and 2,
# as the writer made them before the panel: their data must not change.
LEGACY_DIGESTS = {("S-p1", 1): "cc01082207824429", ("S-p1", 2): "d6acc324004bc10a",
                  ("S-p20", 1): "b0805bf1e31887f0", ("S-p20", 2): "2a3349011a5df09d",
                  ("M-p1", 1): "ce7999f2eb86f2bb", ("M-p1", 2): "803b7928cf56de41"}


def self_test():
    """Checks the data writer (numpy only): the first shapes' data as
    before, ids in range, bag lengths in bounds, Zipf hot ids scattered, the
    same seed the same file, and torch_dlrm's reader reads back what was
    written."""
    sys.path.insert(0, HERE)
    from torch_dlrm import Samples, parse_tsv  # numpy only at import
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)
        print(f"{'ok  ' if ok else 'FAIL'} {what}")

    d = tempfile.mkdtemp(prefix="peers-self-test-")
    for (name, seed), want in LEGACY_DIGESTS.items():
        p = os.path.join(d, f"{name}-{seed}.tsv")
        write_dataset(p, SHAPES[name], 3000, seed)
        got = hashlib.sha256(open(p, "rb").read()).hexdigest()[:16]
        check(got == want, f"{name} seed {seed}: the same data as before ({got})")
    n = 2000
    for name, s in SHAPES.items():
        p, q = os.path.join(d, f"{name}.tsv"), os.path.join(d, f"{name}-again.tsv")
        pos = write_dataset(p, s, n, 1)
        write_dataset(q, s, n, 1)
        check(open(p, "rb").read() == open(q, "rb").read(), f"{name}: same seed, same file")
        check(0.3 < pos < 0.7, f"{name}: {pos:.2f} positive")
        labels, dense, lengths, ids = parse_tsv(p, NUM_DENSE, len(s.rows))
        want = make_samples(s, n, 1)
        check(np.array_equal(labels, want[0]) and
              np.array_equal(dense, np.log1p(want[1]).astype(np.float32)) and
              np.array_equal(lengths, want[2]) and np.array_equal(ids, want[3]),
              f"{name}: torch_dlrm's reader reads what was written")
        # A torchrec rank's batch (odd lines, lines 3..7 of those): per table
        # the bags of its lines, as a loop over the file's lines finds them.
        tables = len(s.rows)
        off = np.concatenate([[0], np.cumsum(lengths)])
        bags = [[ids[off[line * tables + t]:off[line * tables + t + 1]] for t in range(tables)]
                for line in range(7, 17, 2)]
        _, _, got, got_len = Samples(labels, dense, lengths, ids).lines(
            np.arange(1, n, 2)).batch(3, 8)
        check(np.array_equal(got, np.concatenate([b[t] for t in range(tables) for b in bags]))
              and np.array_equal(got_len, lengths[7:17:2].T),
              f"{name}: a rank's batch holds its lines' bags, grouped by table")
        spec = {"train": p, "rows": s.rows, "num_dense": NUM_DENSE, "dynamic": s.dynamic}
        loaded = Samples.load(spec, "train")
        table = np.repeat(np.tile(np.arange(tables), n), lengths.ravel())
        check(bool((loaded.ids < np.asarray(s.rows)[table]).all()) and
              (s.dynamic or np.array_equal(loaded.ids, ids)),
              f"{name}: the torch peers' ids fit their tables"
              + (" (id mod rows)" if s.dynamic else ""))
        lo, hi = s.bag
        check(lengths.min() >= lo and lengths.max() <= hi and
              (lo == hi or lengths.min() < lengths.max()), f"{name}: bags of {lo}..{hi} ids")
        rows = np.asarray(s.rows)
        limit = np.int64(2**63 - 1) if s.dynamic else rows[table]
        check(bool(ids.min() >= 0) and bool((ids < limit).all()),
              f"{name}: ids in [0, {'2^63' if s.dynamic else 'rows'})")
        if s.zipf:
            hot, share = [], []  # per table: its most frequent id, that id's share
            for t in range(len(rows)):
                vals, cnt = np.unique(ids[table == t], return_counts=True)
                hot.append(int(vals[cnt.argmax()]))
                share.append(cnt.max() / cnt.sum())
            low = sum(i < 10 for i in hot)
            check(low <= len(rows) // 10, f"{name}: the hottest id is below 10 in {low} of "
                  f"{len(rows)} tables (scattered)")
            check(min(share) > 0.02, f"{name}: the hottest id takes {min(share):.1%} to "
                  f"{max(share):.1%} of a table's ids (skewed)")
        job = os.path.join(d, f"{name}.textproto")
        recps_job(job, name, s, p, p, s.batch, 10, 1, "")
        text = open(job).read()
        check(("num_rows" in text) != s.dynamic and
              f"bottom_mlp: {BOTTOM[:-1] + [s.dim]}" in text,
              f"{name}: the job's tables ({'dynamic' if s.dynamic else 'fixed'}) and "
              f"bottom MLP (ends with {s.dim})")
    shutil.rmtree(d)
    print(f"{len(failures)} failed" if failures else "self test passed")
    return 1 if failures else 0


# ---------------------------------------------------------------- main

def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default=None,
                   help="comma list of shapes (" + ",".join(SHAPES) + ") or 'panel' for "
                   "all of them; default S-p1,S-p20,M-p1 (--smoke: panel)")
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
                   help="training steps per run (0: the shape's, 100 or 60)")
    p.add_argument("--warmup", type=int, default=10, help="untimed first steps")
    p.add_argument("--eval_lines", type=int, default=65536,
                   help="held-out lines (U-var: at most 16384)")
    p.add_argument("--quick", action="store_true", help="1 round, 40 steps, 5 warmup")
    p.add_argument("--smoke", action="store_true",
                   help="tiny: 1 round, 8 steps, tables of at most 10k rows, batches of at "
                   "most 256 (checks the plumbing)")
    p.add_argument("--self_test", action="store_true",
                   help="check the data writer and exit (numpy only)")
    p.add_argument("--data_dir", default="", help="where datasets go (default build/peers-data)")
    p.add_argument("--build_dir", default="build")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    p.add_argument("--torch_threads", type=int, default=0,
                   help="intra-op threads per PyTorch/TorchRec process (0: CPUs / world size)")
    p.add_argument("--json", default="", help="also write every measurement here")
    p.add_argument("--markdown", default="", help="also write the result tables here")
    a = p.parse_args()
    if a.self_test:
        sys.exit(self_test())
    if a.quick:
        a.rounds, a.steps, a.warmup = 1, a.steps or 40, min(a.warmup, 5)
    a.configs = a.configs or ("panel" if a.smoke else "S-p1,S-p20,M-p1")
    if a.smoke:
        a.rounds, a.steps, a.warmup, a.eval_lines = 1, 8, 2, 2048
    configs = [c for name in a.configs.split(",")
               for c in (SHAPES if name == "panel" else [name])]
    for c in configs:
        if c not in SHAPES:
            p.error(f"unknown shape {c}; known: {', '.join(SHAPES)}, panel")
    a.shapes = {c: smoke_shape(s) if a.smoke else s for c, s in SHAPES.items()}
    a.eval_of = {c: min(a.eval_lines, s.eval_cap or a.eval_lines) for c, s in a.shapes.items()}
    systems = a.systems.split(",")
    data_root = a.data_dir or os.path.join(a.build_dir, "peers-data" + ("-smoke" if a.smoke else ""))
    os.makedirs(data_root, exist_ok=True)

    steps_of = {c: a.steps or a.shapes[c].steps for c in configs}
    dirs = {}
    for c in configs:
        shape = a.shapes[c]
        d = os.path.abspath(os.path.join(data_root, c))
        os.makedirs(d, exist_ok=True)
        n_train, n_eval = steps_of[c] * shape.batch, a.eval_of[c]
        stamp = os.path.join(d, "stamp.json")
        want = {"shape": dataclasses.asdict(shape), "train": n_train, "eval": n_eval}
        want = json.loads(json.dumps(want))  # tuples as lists, as read back
        have = json.load(open(stamp)) if os.path.exists(stamp) else {}
        if have != want:
            t0 = time.time()
            pos = write_dataset(os.path.join(d, "train.tsv"), shape, n_train, 1)
            write_dataset(os.path.join(d, "eval.tsv"), shape, n_eval, 2)
            for f in os.listdir(d):  # the torch peers' parsed copies
                if f.endswith(".npz"):
                    os.remove(os.path.join(d, f))
            json.dump(want, open(stamp, "w"))
            mb = sum(os.path.getsize(os.path.join(d, f)) for f in ("train.tsv", "eval.tsv"))
            print(f"# {c}: wrote {n_train} train + {n_eval} eval lines ({pos:.2f} positive, "
                  f"{mb / 2**20:.0f} MiB) in {time.time() - t0:.0f} s", file=sys.stderr)
        dirs[c] = d

    print(f"# cpu: {cpu_model()}", file=sys.stderr)
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

    lines = report(a, configs, systems, results)
    print("\n" + "\n".join(lines))
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
