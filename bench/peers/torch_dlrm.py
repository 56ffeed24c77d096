"""The DLRM of the peer benchmark in PyTorch eager and in TorchRec.

  python torch_dlrm.py --system=eager|torchrec --world=1|2 --spec=SPEC.json --out=RESULT.json

SPEC.json (written by peers.py): train/eval TSV paths, tables, rows, dim, bag
length, global batch, steps, warmup steps, learning rate. The TSV is parsed
and every batch built before the timed window (as recps' prefetch thread
prepares its batches off the step); the timed window is training steps
warmup..steps-1. Predictions on the held-out file are written next to the
result so the caller computes one AUC for every system.
"""

import argparse
import json
import os
import time

import numpy as np


def parse_tsv(path, num_dense, num_cat, bag):
    """label [N], dense [N, num_dense] (log1p of max(x, 0)), ids [N, num_cat, bag]."""
    cache = path + ".npz"
    if os.path.exists(cache) and os.path.getmtime(cache) >= os.path.getmtime(path):
        z = np.load(cache)
        return z["labels"], z["dense"], z["ids"]
    labels, dense, ids = [], [], []
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            labels.append(int(fields[0]))
            dense.append([float(x) if x else 0.0 for x in fields[1:1 + num_dense]])
            row = []
            for c in fields[1 + num_dense:1 + num_dense + num_cat]:
                vals = [int(v, 16) for v in c.split(",")] if c else []
                if len(vals) != bag:
                    raise ValueError(f"{path}: a bag of {len(vals)} ids, expected {bag}")
                row.append(vals)
            ids.append(row)
    labels = np.asarray(labels, np.float32)
    dense = np.log1p(np.maximum(np.asarray(dense, np.float64), 0.0)).astype(np.float32)
    ids = np.asarray(ids, np.int64).reshape(len(labels), num_cat, bag)
    np.savez(cache, labels=labels, dense=dense, ids=ids)
    return labels, dense, ids


def build_mlp(torch, sizes, in_features, relu_last):
    layers = []
    for i, width in enumerate(sizes):
        layers.append(torch.nn.Linear(in_features, width))
        if relu_last or i + 1 < len(sizes):
            layers.append(torch.nn.ReLU())
        in_features = width
    return torch.nn.Sequential(*layers)


def run_eager(spec, args):
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    F, D, rows, bag = spec["tables"], spec["dim"], spec["rows"], spec["bag"]

    class EagerDLRM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.ModuleList(
                torch.nn.EmbeddingBag(rows, D, mode="sum", sparse=True) for _ in range(F))
            for e in self.emb:  # recps' default init
                torch.nn.init.uniform_(e.weight, -D ** -0.5, D ** -0.5)
            self.bottom = build_mlp(torch, spec["bottom"], spec["num_dense"], True)
            n = F + 1
            self.top = build_mlp(torch, spec["top"], D + n * (n - 1) // 2, False)
            li, lj = torch.tril_indices(n, n, -1)
            self.register_buffer("li", li)
            self.register_buffer("lj", lj)

        def forward(self, dense, ids):  # ids: [B, F, bag]
            x = self.bottom(dense)
            e = torch.stack([self.emb[f](ids[:, f, :]) for f in range(F)], 1)
            t = torch.cat([x.unsqueeze(1), e], 1)
            z = torch.bmm(t, t.transpose(1, 2))
            return self.top(torch.cat([x, z[:, self.li, self.lj]], 1)).squeeze(1)

    model = EagerDLRM()
    lr = spec["lr"]
    opt_sparse = torch.optim.Adagrad(model.emb.parameters(), lr=lr, eps=1e-8)
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("emb.")]
    opt_dense = torch.optim.Adagrad(dense_params, lr=lr, eps=1e-8)
    loss_fn = torch.nn.BCEWithLogitsLoss()

    labels, dense, ids = parse_tsv(spec["train"], spec["num_dense"], F, bag)
    B, steps, warm = spec["global_batch"], spec["steps"], spec["warmup"]
    batches = []
    for s in range(steps):
        lo = (s * B) % (len(labels) - B + 1)
        batches.append((torch.from_numpy(dense[lo:lo + B]), torch.from_numpy(ids[lo:lo + B]),
                        torch.from_numpy(labels[lo:lo + B])))
    start = None
    for s, (xd, xi, y) in enumerate(batches):
        if s == warm:
            start = time.perf_counter()
        opt_sparse.zero_grad()
        opt_dense.zero_grad()
        loss = loss_fn(model(xd, xi), y)
        loss.backward()
        opt_sparse.step()
        opt_dense.step()
    elapsed = time.perf_counter() - start
    el, ed, ei = parse_tsv(spec["eval"], spec["num_dense"], F, bag)
    preds = []
    with torch.no_grad():
        for lo in range(0, len(el), B):
            preds.append(torch.sigmoid(model(torch.from_numpy(ed[lo:lo + B]),
                                             torch.from_numpy(ei[lo:lo + B]))).numpy())
    np.save(args.out + ".pred0.npy", np.stack([np.concatenate(preds), el]))
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
    F, D, rows, bag = spec["tables"], spec["dim"], spec["rows"], spec["bag"]
    lim = D ** -0.5
    tables = [EmbeddingBagConfig(name=f"t{f}", embedding_dim=D, num_embeddings=rows,
                                 feature_names=[f"f{f}"],
                                 init_fn=lambda w: torch.nn.init.uniform_(w, -lim, lim))
              for f in range(F)]
    device = torch.device("cpu")
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    model = DLRMTrain(DLRM(embedding_bag_collection=ebc, dense_in_features=spec["num_dense"],
                           dense_arch_layer_sizes=spec["bottom"],
                           over_arch_layer_sizes=spec["top"], dense_device=device))
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

    def batch_of(dense, ids, labels, lo, hi):
        n = hi - lo
        vals = torch.from_numpy(np.ascontiguousarray(ids[lo:hi].transpose(1, 0, 2)).reshape(-1))
        lengths = torch.full((F * n,), bag, dtype=torch.int32)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=[f"f{f}" for f in range(F)],
                                                  values=vals, lengths=lengths)
        return Batch(dense_features=torch.from_numpy(dense[lo:hi]), sparse_features=kjt,
                     labels=torch.from_numpy(labels[lo:hi]))

    labels, dense, ids = parse_tsv(spec["train"], spec["num_dense"], F, bag)
    # The rank's lines, as recps' reader takes them: line % world == rank.
    labels, dense, ids = labels[rank::world], dense[rank::world], ids[rank::world]
    B = spec["global_batch"] // world
    steps, warm = spec["steps"], spec["warmup"]
    batches = []
    for s in range(steps):
        lo = (s * B) % (len(labels) - B + 1)
        batches.append(batch_of(dense, ids, labels, lo, lo + B))
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
    el, ed, ei = parse_tsv(spec["eval"], spec["num_dense"], F, bag)
    el, ed, ei = el[rank::world], ed[rank::world], ei[rank::world]
    model.eval()
    preds = []
    # Every rank runs the same number of (sharded) forward passes.
    n_eval = (len(el) // B) * B
    with torch.no_grad():
        for lo in range(0, n_eval, B):
            _, (_, logits, _) = model(batch_of(ed, ei, el, lo, lo + B))
            preds.append(torch.sigmoid(logits).numpy())
    np.save(args.out + f".pred{rank}.npy", np.stack([np.concatenate(preds), el[:n_eval]]))
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
