"""The DLRM of the peer benchmark in PyTorch eager and in TorchRec.

  python torch_dlrm.py --system=eager|torchrec --world=1|2 --spec=SPEC.json --out=RESULT.json

SPEC.json (written by peers.py): train/eval TSV paths, rows per table, dim,
whether recps' tables are dynamic, MLP widths, global batch, steps, warmup
steps, learning rate. Bags may hold any number of ids (offsets / jagged
lengths). The TSV is parsed and every batch built before the timed window (as
recps' prefetch thread prepares its batches off the step); the timed window
is training steps warmup..steps-1. Predictions on the held-out file are
written next to the result so the caller computes one AUC for every system.
"""

import argparse
import itertools
import json
import os
import time

import numpy as np


def parse_tsv(path, num_dense, num_cat):
    """labels [N], dense [N, num_dense] (log1p of max(x, 0)), lengths
    [N, num_cat] (ids per bag) and ids (every id in file order: line, table,
    place in the bag). Cached next to the file (numpy only: peers.py's self
    test reads with it)."""
    cache = path + ".bags.npz"
    if os.path.exists(cache) and os.path.getmtime(cache) >= os.path.getmtime(path):
        z = np.load(cache)
        return z["labels"], z["dense"], z["lengths"], z["ids"]
    labels, dense, lengths, chunks, tokens = [], [], [], [], []

    def flush():  # hex tokens to int64, a chunk at a time to bound memory
        chunks.append(np.fromiter(map(int, tokens, itertools.repeat(16)), np.int64,
                                  len(tokens)))
        tokens.clear()

    with open(path) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 1 + num_dense + num_cat:
                raise ValueError(f"{path}: a line of {len(fields)} fields, expected "
                                 f"{1 + num_dense + num_cat}")
            labels.append(int(fields[0]))
            dense.append([float(x) if x else 0.0 for x in fields[1:1 + num_dense]])
            for c in fields[1 + num_dense:]:
                bag = c.split(",") if c else []
                lengths.append(len(bag))
                tokens.extend(bag)
            if len(tokens) > 1 << 20:
                flush()
    flush()
    labels = np.asarray(labels, np.float32)
    dense = np.log1p(np.maximum(np.asarray(dense, np.float64), 0.0)).astype(np.float32)
    lengths = np.asarray(lengths, np.int64).reshape(len(labels), num_cat)
    ids = np.concatenate(chunks)
    tmp = f"{cache}.{os.getpid()}.tmp"  # torchrec's ranks may parse at once
    with open(tmp, "wb") as f:
        np.savez(f, labels=labels, dense=dense, lengths=lengths, ids=ids)
    os.replace(tmp, cache)
    return labels, dense, lengths, ids


class Samples:
    """Parsed lines: labels, dense, lengths [N, F] and the ids in file order."""

    def __init__(self, labels, dense, lengths, ids):
        self.labels, self.dense, self.lengths, self.ids = labels, dense, lengths, ids
        self.ends = np.cumsum(lengths.sum(1))  # past each line's last id

    @classmethod
    def load(cls, spec, which):
        rows = np.asarray(spec["rows"], np.int64)
        labels, dense, lengths, ids = parse_tsv(spec[which], spec["num_dense"], len(rows))
        if spec["dynamic"]:
            # recps' dynamic tables take any int64 id; the torch tables have
            # fixed rows, so here, as the data is loaded, each id is hashed
            # into its table as id mod rows (colliding ids share a row, as
            # in any hashed fixed-size table). Not timed.
            table = np.repeat(np.tile(np.arange(len(rows)), len(labels)), lengths.ravel())
            ids = ids % rows[table]
        return cls(labels, dense, lengths, ids)

    def __len__(self):
        return len(self.labels)

    def lines(self, idx):
        """The samples of lines idx."""
        n = self.lengths[idx].sum(1)
        start = self.ends[idx] - n
        take = np.repeat(start - (np.cumsum(n) - n), n) + np.arange(n.sum())
        return Samples(self.labels[idx], self.dense[idx], self.lengths[idx], self.ids[take])

    def batch(self, lo, hi):
        """Lines lo..hi-1 as dense, labels, ids grouped by table (each
        table's bags in line order) and lengths [F, hi - lo]."""
        ids = self.ids[(self.ends[lo - 1] if lo else 0):self.ends[hi - 1]]
        lengths = self.lengths[lo:hi]
        table = np.repeat(np.tile(np.arange(lengths.shape[1]), hi - lo), lengths.ravel())
        ids = ids[np.argsort(table, kind="stable")]
        return self.dense[lo:hi], self.labels[lo:hi], ids, np.ascontiguousarray(lengths.T)


def build_mlp(torch, sizes, in_features, relu_last):
    layers = []
    for i, width in enumerate(sizes):
        layers.append(torch.nn.Linear(in_features, width))
        if relu_last or i + 1 < len(sizes):
            layers.append(torch.nn.ReLU())
        in_features = width
    return torch.nn.Sequential(*layers)


def dlrm_init_(torch, module):
    """recps' MLP init, which is the reference DLRM's (dlrm_s_pytorch.py):
    weights N(0, sqrt(2 / (fan_in + fan_out))), biases N(0, sqrt(1 / fan_out)).
    PyTorch's nn.Linear default (uniform +-1/sqrt(fan_in)) starts with logits
    about 3x smaller; on U-var (sum bags of up to 100 rows) that alone moved
    the held-out AUC by 0.013 after 40 steps, so every system starts alike."""
    for m in module.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, 0.0, (2.0 / (m.in_features + m.out_features)) ** 0.5)
            torch.nn.init.normal_(m.bias, 0.0, (1.0 / m.out_features) ** 0.5)


def run_eager(spec, args):
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    rows, D = spec["rows"], spec["dim"]
    F = len(rows)

    class EagerDLRM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.ModuleList(
                torch.nn.EmbeddingBag(r, D, mode="sum", sparse=True) for r in rows)
            for e in self.emb:  # recps' default init
                torch.nn.init.uniform_(e.weight, -D ** -0.5, D ** -0.5)
            self.bottom = build_mlp(torch, spec["bottom"], spec["num_dense"], True)
            n = F + 1
            self.top = build_mlp(torch, spec["top"], D + n * (n - 1) // 2, False)
            dlrm_init_(torch, self.bottom)
            dlrm_init_(torch, self.top)
            li, lj = torch.tril_indices(n, n, -1)
            self.register_buffer("li", li)
            self.register_buffer("lj", lj)

        def forward(self, dense, bags):  # bags: per table (ids, offsets)
            x = self.bottom(dense)
            e = torch.stack([self.emb[f](*bags[f]) for f in range(F)], 1)
            t = torch.cat([x.unsqueeze(1), e], 1)
            z = torch.bmm(t, t.transpose(1, 2))
            return self.top(torch.cat([x, z[:, self.li, self.lj]], 1)).squeeze(1)

    def batch_of(samples, lo, hi):
        dense, labels, ids, lengths = samples.batch(lo, hi)
        per_table = np.split(ids, np.cumsum(lengths.sum(1))[:-1])
        bags = [(torch.from_numpy(v), torch.from_numpy(np.cumsum(n) - n))
                for v, n in zip(per_table, lengths)]
        return torch.from_numpy(dense), bags, torch.from_numpy(labels)

    model = EagerDLRM()
    lr = spec["lr"]
    opt_sparse = torch.optim.Adagrad(model.emb.parameters(), lr=lr, eps=1e-8)
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("emb.")]
    opt_dense = torch.optim.Adagrad(dense_params, lr=lr, eps=1e-8)
    loss_fn = torch.nn.BCEWithLogitsLoss()

    train = Samples.load(spec, "train")
    B, steps, warm = spec["global_batch"], spec["steps"], spec["warmup"]
    batches = []
    for s in range(steps):
        lo = (s * B) % (len(train) - B + 1)
        batches.append(batch_of(train, lo, lo + B))
    del train
    start = None
    for s, (xd, bags, y) in enumerate(batches):
        if s == warm:
            start = time.perf_counter()
        opt_sparse.zero_grad()
        opt_dense.zero_grad()
        loss = loss_fn(model(xd, bags), y)
        loss.backward()
        opt_sparse.step()
        opt_dense.step()
    elapsed = time.perf_counter() - start
    del batches
    ev = Samples.load(spec, "eval")
    preds = []
    with torch.no_grad():
        for lo in range(0, len(ev), B):
            xd, bags, _ = batch_of(ev, lo, min(len(ev), lo + B))
            preds.append(torch.sigmoid(model(xd, bags)).numpy())
    np.save(args.out + ".pred0.npy", np.stack([np.concatenate(preds), ev.labels]))
    return {"seconds": elapsed, "samples": (steps - warm) * B, "last_loss": float(loss)}


def torchrec_worker(rank, world, spec, args, port):
    import torch
    import torch.distributed as dist
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.datasets.utils import Batch
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.model_parallel import get_default_sharders
    from torchrec.models.dlrm import DLRM, DLRMTrain
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    from torch.distributed.optim import _apply_optimizer_in_backward as apply_in_backward

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1)
    rows, D = spec["rows"], spec["dim"]
    F = len(rows)
    lim = D ** -0.5
    tables = [EmbeddingBagConfig(name=f"t{f}", embedding_dim=D, num_embeddings=r,
                                 feature_names=[f"f{f}"],
                                 init_fn=lambda w: torch.nn.init.uniform_(w, -lim, lim))
              for f, r in enumerate(rows)]
    device = torch.device("cpu")
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    model = DLRMTrain(DLRM(embedding_bag_collection=ebc, dense_in_features=spec["num_dense"],
                           dense_arch_layer_sizes=spec["bottom"],
                           over_arch_layer_sizes=spec["top"], dense_device=device))
    dlrm_init_(torch, model.model.dense_arch)
    dlrm_init_(torch, model.model.over_arch)
    lr = spec["lr"]
    apply_in_backward(torch.optim.Adagrad, model.model.sparse_arch.parameters(),
                      {"lr": lr, "eps": 1e-8})
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device="cpu",
                                                         local_world_size=world))
    sharders = get_default_sharders()
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    model = DistributedModelParallel(module=model, device=device, plan=plan, sharders=sharders)
    dense_opt = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        lambda params: torch.optim.Adagrad(params, lr=lr, eps=1e-8))
    opt = CombinedOptimizer([model.fused_optimizer, dense_opt])

    def batch_of(samples, lo, hi):
        dense, labels, ids, lengths = samples.batch(lo, hi)
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=[f"f{f}" for f in range(F)], values=torch.from_numpy(ids),
            lengths=torch.from_numpy(lengths.ravel().astype(np.int32)))
        return Batch(dense_features=torch.from_numpy(dense), sparse_features=kjt,
                     labels=torch.from_numpy(labels))

    # The rank's lines, as recps' reader takes them: line % world == rank.
    train = Samples.load(spec, "train")
    train = train.lines(np.arange(rank, len(train), world))
    B = spec["global_batch"] // world
    steps, warm = spec["steps"], spec["warmup"]
    batches = []
    for s in range(steps):
        lo = (s * B) % (len(train) - B + 1)
        batches.append(batch_of(train, lo, lo + B))
    del train
    model.train()
    start = None
    for s, batch in enumerate(batches):
        if s == warm:
            dist.barrier()
            start = time.perf_counter()
        opt.zero_grad()
        loss, _ = model(batch)
        loss.backward()
        opt.step()
    dist.barrier()
    elapsed = time.perf_counter() - start
    del batches
    ev = Samples.load(spec, "eval")
    ev = ev.lines(np.arange(rank, len(ev), world))
    model.eval()
    preds = []
    # Every rank runs the same number of (sharded) forward passes.
    n_eval = (len(ev) // B) * B
    with torch.no_grad():
        for lo in range(0, n_eval, B):
            _, (_, logits, _) = model(batch_of(ev, lo, lo + B))
            preds.append(torch.sigmoid(logits).numpy())
    np.save(args.out + f".pred{rank}.npy", np.stack([np.concatenate(preds), ev.labels[:n_eval]]))
    if rank == 0:
        with open(args.out + ".tmp", "w") as f:
            json.dump({"seconds": elapsed, "samples": (steps - warm) * spec["global_batch"],
                       "last_loss": float(loss)}, f)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--system", choices=["eager", "torchrec"], required=True)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--spec", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: cores / world)")
    p.add_argument("--port", type=int, default=29511)
    args = p.parse_args()
    with open(args.spec) as f:
        spec = json.load(f)
    if args.threads <= 0:
        args.threads = max(1, (os.cpu_count() or 1) // args.world)
    if args.system == "eager":
        result = run_eager(spec, args)
    elif args.world == 1:
        torchrec_worker(0, 1, spec, args, args.port)
        with open(args.out + ".tmp") as f:
            result = json.load(f)
    else:
        import torch.multiprocessing as mp
        mp.start_processes(torchrec_worker, args=(args.world, spec, args, args.port),
                           nprocs=args.world, start_method="fork")
        with open(args.out + ".tmp") as f:
            result = json.load(f)
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
