"""A whole-step cost model for bench/e2e: a training step of method m on P workers over links
of rate R takes

    t = c_m(P) + max(0, wire_m(P) - burst) / (eta R) + K_m L(P)

c_m(P): the step's compute and local work, from the unshaped point (its measured step, less the
        model's communication at the testbed's unshaped rate, R_NONE);
wire_m: bytes each worker sends per step: 2 (P - 1) / P B for a ring allreduce of B bytes
        (dense, fp16, PowerSGD, pactrain's payloads), (P - 1) B for Top-k's allgather;
K_m:    collectives per step, as the point records it (collectives_per_step; pactrain's ternary
        runs: one per tensor, two with a separate scale round); points written before it was
        recorded fall back to COLLECTIVES;
L(P):   one small collective's time on P workers (bench/results/sync.csv's 4 kB allreduce);
eta:    the link's efficiency, fitted on one point (dense, 4 ranks, 100 Mbit/s);
burst:  what the testbed's token bucket lets pass at once: up to its depth (10 ms of bytes at
        the rate, at least 256 KiB; bench/netbed/setup.sh), refilled during the compute. At
        100 Mbit/s that is half of a 90%-sparse step's bytes; real links have no such bucket,
        so the projection leaves it out.

Every other shaped point is then a prediction, compared with its measurement where the same
machine measured it and its unshaped point. For 8 to 1024 workers the model takes c_m from
the 2-rank points (one rank per core, as one machine per worker would run) and
L(P) = 2 (P - 1) alpha, with alpha a ring round at 2 ranks.
Used by report.py; standard library only.
"""

import csv
import os

R_NONE = 4.7e9  # bits/s: veth + TCP per host on the testbed, unshaped (bench/netbed/README.md)
LINK_RATE = {"100mbit": 100e6, "500mbit": 500e6, "1gbit": 1e9, "2gbit": 2e9, "none": R_NONE}
# The MLP's counts, for points without collectives_per_step; others: 1.
COLLECTIVES = {"ternary": 6, "auto": 6, "powersgd4": 2, "powersgdM": 2}
WORKERS = (8, 16, 32, 64, 128, 256, 512, 1024)


def wire_bytes(method, ranks, payload):
    """Bytes each worker sends per step for a payload of `payload` bytes per worker."""
    if method == "topk":
        return (ranks - 1) * payload
    return 2.0 * (ranks - 1) / ranks * payload


def burst_bytes(rate, compute):
    """Bytes the testbed's tbf bucket (depth max(rate x 10 ms, 256 KiB)) holds after
    `compute` seconds without traffic."""
    if rate >= R_NONE:
        return 0.0
    depth = max(rate / 8 / 100, 262144)
    return min(depth, compute * rate / 8)


def small_collective_seconds(results_dir):
    """{ranks: seconds} of the 4 kB dense allreduce in sync.csv (median over link rates)."""
    path = os.path.join(results_dir, "sync.csv")
    by_ranks = {}
    if os.path.exists(path):
        with open(path) as f:
            for row in csv.DictReader(f):
                if row["strategy"] == "dense" and int(row["bytes"]) <= 4096:
                    by_ranks.setdefault(int(row["ranks"]), []).append(float(row["median_s"]))
    return {r: sorted(v)[len(v) // 2] for r, v in by_ranks.items()}


class step_model:
    def __init__(self, points, trainer, latency):
        """points: {(trainer, link, ranks, method): point}; latency: small_collective_seconds."""
        self.points = {k: p for k, p in points.items() if k[0] == trainer}
        self.latency = latency
        self.eta = 1.0
        dense = self.points.get((trainer, "100mbit", 4, "dense"))
        c = self.compute(4, "dense")
        if dense and c is not None and \
                dense.get("machine") == self.unshaped(4, "dense").get("machine"):
            comm = dense["steady_step_seconds"] - c - self.lat(4, "dense")
            wire = wire_bytes("dense", 4, self.payload("dense")) - burst_bytes(100e6, c)
            if comm > 0:
                self.eta = wire * 8 / (100e6 * comm)
        self.trainer = trainer

    def payload(self, method):
        for (_, _, _, m), p in self.points.items():
            if m == method and p.get("final_bytes_per_step"):
                return p["final_bytes_per_step"]
        return None

    def lat(self, ranks, method):
        if ranks in self.latency:
            one = self.latency[ranks]
        elif 2 in self.latency:
            alpha = self.latency[2] / 2  # a ring allreduce on 2 ranks takes 2 rounds
            one = 2 * (ranks - 1) * alpha
        else:
            one = 0.0
        return self.collectives(method) * one

    def collectives(self, method):
        for (_, _, _, m), p in self.points.items():
            if m == method and p.get("collectives_per_step"):
                return p["collectives_per_step"]
        return COLLECTIVES.get(method, 1)

    def unshaped(self, ranks, method):
        return next((p for k, p in self.points.items()
                     if k[1] == "none" and k[2] == ranks and k[3] == method), None)

    def compute(self, ranks, method):
        p = self.unshaped(ranks, method)
        if p is None or not p.get("steady_step_seconds"):
            return None
        w = wire_bytes(method, ranks, p["final_bytes_per_step"])
        return max(0.0, p["steady_step_seconds"] - w * 8 / R_NONE - self.lat(ranks, method))

    def predict(self, ranks, method, rate, compute_ranks=None, testbed=True):
        """Seconds per step; testbed: with the testbed's token bucket (see burst)."""
        c = self.compute(compute_ranks or ranks, method)
        b = self.payload(method)
        if c is None or b is None:
            return None
        wire = wire_bytes(method, ranks, b) - (burst_bytes(rate, c) if testbed else 0.0)
        return c + max(0.0, wire) * 8 / (self.eta * rate) + self.lat(ranks, method)

    def checks(self):
        """(link, ranks, method, measured, predicted) of every shaped point but the fitted one
        and those measured on another machine than their unshaped point (another compute)."""
        out = []
        self.other_machine = 0  # points left out: measured elsewhere than their unshaped point
        for (_, link, ranks, method), p in sorted(self.points.items()):
            if link == "none" or (link, ranks, method) == ("100mbit", 4, "dense"):
                continue
            basis = self.unshaped(ranks, method)
            if basis is not None and basis.get("machine") != p.get("machine"):
                self.other_machine += 1
                continue
            t = self.predict(ranks, method, LINK_RATE.get(link, 0) or R_NONE)
            if t is not None and p.get("steady_step_seconds"):
                out.append((link, ranks, method, p["steady_step_seconds"], t))
        return out

    def projection(self, method, link, samples_per_worker):
        """[(workers, samples/s)] for WORKERS, compute from the 2-rank points."""
        rows = []
        for n in WORKERS:
            t = self.predict(n, method, LINK_RATE[link], compute_ranks=2, testbed=False)
            if t:
                rows.append((n, n * samples_per_worker / t))
        return rows
