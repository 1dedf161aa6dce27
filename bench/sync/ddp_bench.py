#!/usr/bin/python3
"""PyTorch DDP side by side with pactrain_sync_bench: the same gradient bytes synchronised by
torch.distributed (gloo) with DDP's plain allreduce, its fp16_compress_hook, or its PowerSGD
hook (matrix_approximation_rank 4, error feedback and warm start on).

Run one process per rank under mpirun (rank and size come from Open MPI's environment), e.g.
on the testbed:

    bench/netbed/setup.sh 4 1gbit
    bench/netbed/launch.sh /usr/bin/python3 bench/sync/ddp_bench.py --bytes 100M --hook fp16 --csv

Needs Debian's python3-torch. The gradient is a set of 2048x2048 float32 matrices (plus one
1-D remainder), so PowerSGD compresses nearly all of it. The time of one sync is the median
over --iters of a DDP backward pass minus the median of the same backward under no_sync()
(which computes the same gradients without communicating); each timed pass starts after a
barrier and counts the slowest rank. Prints one row in pactrain_sync_bench's CSV format
(method ddp_allreduce | ddp_fp16 | ddp_powersgd, allreduce column "gloo").
"""

import argparse
import datetime
import faulthandler
import os
import re
import signal
import statistics
import sys
import time

HEADER = ("method,ranks,bytes,density,median_s,min_s,max_s,bytes_sent,wire_bytes,compute_s,"
          "compute_p_s,iters,allreduce")
COLS = 2048
RANK = 4


def parse_bytes(s):
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|k|K|M|G)?", s)
    if not m:
        raise argparse.ArgumentTypeError(f"'{s}' is not a byte count")
    mult = {None: 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10,
            "Mi": 2**20, "Gi": 2**30}[m.group(2)]
    n = int(m.group(1)) * mult
    if n <= 0 or n % 4:
        raise argparse.ArgumentTypeError(f"{n} bytes is not a positive multiple of 4")
    return n


def tx_bytes(dev):
    if not dev:
        return 0
    with open(f"/sys/class/net/{dev}/statistics/tx_bytes") as f:
        return int(f.read())


def main():
    if "--csv-header" in sys.argv:
        print(HEADER)
        return 0
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bytes", type=parse_bytes, required=True)
    ap.add_argument("--hook", choices=["allreduce", "fp16", "powersgd"], required=True)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--netdev", default=os.environ.get("PACTRAIN_DDP_NETDEV", ""))
    ap.add_argument("--csv", action="store_true")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per collective")
    args = ap.parse_args()
    if args.iters < 1 or args.warmup < 0:
        ap.error("--iters must be >= 1 and --warmup >= 0")

    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints where a rank waits
    torch.set_num_threads(1)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    os.environ.setdefault("MASTER_ADDR", "10.78.0.1" if args.netdev else "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29571")
    if args.netdev:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", args.netdev)
    # A collective that cannot complete raises after this long instead of waiting forever.
    dist.init_process_group("gloo", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=args.timeout))
    # PowerSGD's hook chains callbacks that start an allreduce and wait for it on the gloo
    # worker thread that ran them. With several buckets, two failures follow: the callbacks
    # can occupy every worker thread (gloo's default is two) and leave none to run their
    # allreduces, so every rank waits forever; and with more threads, the callbacks of
    # different buckets issue their allreduces in a different order on each rank, which gloo
    # matches wrongly ("op.preamble.length <= op.nbytes"). Both were seen here at 100 MB. So
    # PowerSGD gets the whole gradient as one bucket (its compressed allreduces are small, so
    # little overlap is lost), on a group with spare threads.
    one_bucket = args.hook == "powersgd"
    if one_bucket:
        dist._DEFAULT_FIRST_BUCKET_BYTES = args.bytes + 2**20  # DDP's documented tuning knob
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = datetime.timedelta(seconds=args.timeout)
    opts._threads = 4
    opts._devices = [dist.ProcessGroupGloo.create_device(interface=args.netdev) if args.netdev
                     else dist.ProcessGroupGloo.create_default_device()]
    pg = dist.ProcessGroupGloo(dist.PrefixStore("ddp", dist.distributed_c10d._get_default_store()),
                               rank, size, opts)

    n = args.bytes // 4
    block = COLS * COLS
    shapes = [(COLS, COLS)] * (n // block)
    rest = n - len(shapes) * block
    if rest >= COLS:
        shapes.append((rest // COLS, COLS))
        rest -= (rest // COLS) * COLS
    if rest:
        shapes.append((rest,))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ps = torch.nn.ParameterList(
                [torch.nn.Parameter(torch.zeros(s)) for s in shapes])
            g = torch.Generator().manual_seed(1 + rank)
            self.cs = [torch.rand(s, generator=g) - 0.5 for s in shapes]

        def forward(self):
            return sum((p * c).sum() for p, c in zip(self.ps, self.cs))

    model = DDP(Model(), process_group=pg,
                bucket_cap_mb=(args.bytes + 2**20) / 2**20 if one_bucket else 25)
    sent = 0
    if args.hook == "fp16":
        model.register_comm_hook(pg, default_hooks.fp16_compress_hook)
        sent = 2 * n
    elif args.hook == "powersgd":
        state = psgd.PowerSGDState(process_group=pg, matrix_approximation_rank=RANK,
                                   start_powerSGD_iter=2, use_error_feedback=True,
                                   warm_start=True)
        model.register_comm_hook(state, psgd.powerSGD_hook)
        args.warmup = max(args.warmup, 3)  # compression starts at iteration 2
        for s in shapes:  # P (rows x r) and Q (cols x r) per matrix; 1-D tensors uncompressed
            sent += 4 * (RANK * (s[0] + s[1]) if len(s) == 2 else s[0])
    else:
        sent = 4 * n

    def step(sync):
        model.zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter()
        if sync:
            model().backward()
        else:
            with model.no_sync():
                model().backward()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        return dt.item()

    for _ in range(args.warmup):
        step(True)
    base = statistics.median(step(False) for _ in range(max(3, args.iters)))
    tx0 = tx_bytes(args.netdev)
    times = [step(True) for _ in range(args.iters)]
    tx = torch.tensor([(tx_bytes(args.netdev) - tx0) / args.iters], dtype=torch.float64)
    dist.all_reduce(tx)
    sync_times = [max(t - base, 0.0) for t in times]
    if rank == 0:
        med = statistics.median(sync_times)
        wire = f"{int(tx.item() / size)}" if args.netdev else ""
        if args.csv:
            print(f"ddp_{args.hook},{size},{args.bytes},1,{med:.6f},{min(sync_times):.6f},"
                  f"{max(sync_times):.6f},{sent},{wire},,0,{args.iters},gloo", flush=True)
        else:
            print(f"ddp {args.hook}: {size} ranks, {args.bytes} bytes: median {med:.6f} s per "
                  f"sync (backward {statistics.median(times):.6f} s minus no_sync backward "
                  f"{base:.6f} s); {sent} bytes sent per rank", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
