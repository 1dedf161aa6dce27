"""A whole-step cost model for bench/e2e: a training step of method m on P workers over links
of rate R takes

    t = c_m(P) + max(0, wire_m(P) - burst) / (eta R) + K_m L(P)

c_m(P): the step's compute and local work, from the unshaped point (its measured step, less the
        model's communication at the testbed's unshaped rate, R_NONE);
wire_m: bytes each worker sends per step: 2 (P - 1) / P B for a ring allreduce of B bytes
        (dense, fp16, PowerSGD, pactrain's payloads), (P - 1) B for DGC's allgather (dgc999,
        dgc99, and the older label topk);
B:      the payload per worker (final_bytes_per_step). Dense, fp16 and PowerSGD payloads do
        not depend on P. pactrain's ternary codec (ternary, ternary_restart, auto) sums values
        in {-1, 0, 1} over P workers in integer lanes of bit_width(2P) bits (P = 2: 3 bits,
        4: 4, 8: 5, 1024: 12), so its payload measured on P0 ranks scales by
        bit_width(2P) / bit_width(2 P0); its scales (one float per 1024 kept entries, about
        1/1024 of the kept entries' bytes as floats) are scaled with it, which is negligible;
K_m:    collectives per step, as the point records it (collectives_per_step; pactrain's ternary
        runs: one per tensor, two with a separate scale round); points written before it was
        recorded fall back to COLLECTIVES;
L(P):   one small collective's time on P workers: the median 4000-byte MPI_Iallreduce of
        bench/results/netbed.csv (bench/netbed/probe.sh; its fastest rate, the least
        serialisation in it), else bench/results/sync.csv's 4 kB dense allreduce;
eta:    the link's efficiency, fitted on one point (dense, 4 ranks, 100 Mbit/s);
burst:  what the testbed's token bucket lets pass at once after a compute gap: up to its
        depth, tbf_bucket_bytes(R) (bench/netbed/setup.sh). Real links have no such bucket, so the
        projection leaves it out.

Points may come with several seeds: the model takes, per (link, ranks, method), the mean over
seeds of steady_step_seconds. Every other shaped point is then a prediction, compared with its
measurement where the same machine measured it and its unshaped point. For 8 to 1024 workers
the model takes c_m from the 2-rank points (one rank per core, as one machine per worker would
run) and L(P) = 2 (P - 1) alpha, with alpha a ring round at 2 ranks.
Used by report.py; standard library only.
"""

import csv
import os

R_NONE = 4.7e9  # bits/s: veth + TCP per host on the testbed, unshaped (bench/netbed/README.md)
LINK_RATE = {"100mbit": 100e6, "500mbit": 500e6, "1gbit": 1e9, "2gbit": 2e9, "none": R_NONE}
# The testbed's tbf bucket: about 1 ms of bytes at the rate, at least 16 KiB, with TSO, GSO and
# GRO off, so that every byte is shaped (bench/netbed/setup.sh; before, max(10 ms of bytes,
# 256 KiB) let a small payload cross unshaped after each compute gap).
TBF_BUCKET_MIN_BYTES = 16 * 1024


def tbf_bucket_bytes(rate):
    """The testbed's bucket at `rate` bits/s, as bench/netbed/setup.sh sets it."""
    return max(TBF_BUCKET_MIN_BYTES, int(rate) // 8 // 1000)
# The MLP's counts, for points without collectives_per_step; others: 1.
COLLECTIVES = {"ternary": 6, "ternary_restart": 6, "auto": 6}
WORKERS = (8, 16, 32, 64, 128, 256, 512, 1024)
# pactrain's methods whose payload is ternary lanes (labels "<one of these>_..." too).
TERNARY = ("ternary", "auto")


def is_allgather(method):
    """DGC's labels (and the older topk): every rank's (index, value) pairs by an allgather."""
    return method == "topk" or method.startswith("dgc")


def is_ternary(method):
    return any(method == t or method.startswith(t + "_") for t in TERNARY)


def lane_bits(ranks):
    """Bits of a ternary lane summing P workers' values in {-1, 0, 1}: bit_width(2P)."""
    return (2 * ranks).bit_length()


def wire_bytes(method, ranks, payload):
    """Bytes each worker sends per step for a payload of `payload` bytes per worker."""
    if is_allgather(method):
        return (ranks - 1) * payload
    return 2.0 * (ranks - 1) / ranks * payload


def burst_bytes(rate, compute):
    """Bytes the testbed's tbf bucket (tbf_bucket_bytes deep) holds after `compute` seconds
    without traffic."""
    if rate >= R_NONE:
        return 0.0
    return min(tbf_bucket_bytes(rate), compute * rate / 8)


def _median(v):
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def small_collective_seconds(results_dir):
    """{ranks: seconds} of one small collective: netbed.csv's 4000-byte MPI_Iallreduce at the
    fastest rate it has (rows of the faithful bucket where there are others), else sync.csv's 4 kB
    dense allreduce (median over link rates)."""
    path = os.path.join(results_dir, "netbed.csv")
    if os.path.exists(path):
        rows = []
        try:
            with open(path) as f:
                for r in csv.DictReader(f):
                    if r.get("call") == "iallreduce" and int(r["bytes"]) <= 4096:
                        rows.append(r)
        except (OSError, ValueError, KeyError):
            rows = []
        def faithful(r):
            return r.get("bucket") == str(tbf_bucket_bytes(LINK_RATE.get(r.get("rate"), 0)))
        if any(faithful(r) for r in rows):
            rows = [r for r in rows if faithful(r)]
        by_ranks = {}
        for r in rows:
            rate = LINK_RATE.get(r.get("rate"), 0)
            by_ranks.setdefault(int(r["ranks"]), {}).setdefault(rate, []).append(
                float(r["median_ms"]) / 1e3)
        if by_ranks:
            return {n: _median(v[max(v)]) for n, v in by_ranks.items()}
    path = os.path.join(results_dir, "sync.csv")
    by_ranks = {}
    if os.path.exists(path):
        with open(path) as f:
            for row in csv.DictReader(f):
                if row["strategy"] == "dense" and int(row["bytes"]) <= 4096:
                    by_ranks.setdefault(int(row["ranks"]), []).append(float(row["median_s"]))
    return {r: sorted(v)[len(v) // 2] for r, v in by_ranks.items()}


def mean_point(seeds):
    """One point standing for a method's seeds: the first's keys, with steady_step_seconds the
    mean over the seeds that record it and steady_step_range their (min, max). A lone point (a
    dict) is returned as it is."""
    if isinstance(seeds, dict):
        return seeds
    p = dict(seeds[0])
    steps = [s["steady_step_seconds"] for s in seeds if s.get("steady_step_seconds")]
    p["steady_step_seconds"] = sum(steps) / len(steps) if steps else None
    p["steady_step_range"] = (min(steps), max(steps)) if steps else None
    return p


class step_model:
    def __init__(self, points, trainer, latency):
        """points: {(trainer, link, ranks, method): point or [points of its seeds]};
        latency: small_collective_seconds."""
        self.points = {k: mean_point(p) for k, p in points.items() if k[0] == trainer}
        self.latency = latency
        self.eta = 1.0
        self.other_machine = 0
        dense = self.points.get((trainer, "100mbit", 4, "dense"))
        c = self.compute(4, "dense")
        if dense and c is not None and dense.get("steady_step_seconds") and \
                dense.get("machine") == self.unshaped(4, "dense").get("machine"):
            comm = dense["steady_step_seconds"] - c - self.lat(4, "dense")
            wire = wire_bytes("dense", 4, self.payload("dense", 4)) - burst_bytes(100e6, c)
            if comm > 0 and wire > 0:
                self.eta = wire * 8 / (100e6 * comm)
        self.trainer = trainer

    def payload(self, method, ranks):
        """Bytes per worker per step at `ranks` workers: measured at that rank count where
        there is a point, else from the point with the most ranks, ternary lanes rescaled."""
        found = [(k[2] != ranks, -k[2], k[1], p) for k, p in self.points.items()
                 if k[3] == method and p.get("final_bytes_per_step")]
        if not found:
            return None
        _, neg_ranks, _, p = min(found, key=lambda f: f[:3])
        b = p["final_bytes_per_step"]
        if is_ternary(method):
            b *= lane_bits(ranks) / lane_bits(-neg_ranks)
        return b

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
        if method.startswith("powersgd"):
            return 2
        return COLLECTIVES.get(method, 1)

    def unshaped(self, ranks, method):
        return next((p for k, p in self.points.items()
                     if k[1] == "none" and k[2] == ranks and k[3] == method), None)

    def compute(self, ranks, method):
        p = self.unshaped(ranks, method)
        if p is None or not p.get("steady_step_seconds") or not p.get("final_bytes_per_step"):
            return None
        w = wire_bytes(method, ranks, p["final_bytes_per_step"])
        return max(0.0, p["steady_step_seconds"] - w * 8 / R_NONE - self.lat(ranks, method))

    def predict(self, ranks, method, rate, compute_ranks=None, testbed=True):
        """Seconds per step; testbed: with the testbed's token bucket (see burst)."""
        c = self.compute(compute_ranks or ranks, method)
        b = self.payload(method, ranks)
        if c is None or b is None:
            return None
        wire = wire_bytes(method, ranks, b) - (burst_bytes(rate, c) if testbed else 0.0)
        return c + max(0.0, wire) * 8 / (self.eta * rate) + self.lat(ranks, method)

    def checks(self):
        """(link, ranks, method, measured, predicted, (lo, hi)) of every shaped (link, ranks,
        method) but the fitted one and those measured on another machine than their unshaped
        point (another compute); measured is the mean over seeds, (lo, hi) their range."""
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
                s = p["steady_step_seconds"]
                out.append((link, ranks, method, s, t, p.get("steady_step_range") or (s, s)))
        return out

    def projection(self, method, link, samples_per_worker):
        """[(workers, samples/s)] for WORKERS, compute from the 2-rank points."""
        rows = []
        for n in WORKERS:
            t = self.predict(n, method, LINK_RATE[link], compute_ranks=2, testbed=False)
            if t:
                rows.append((n, n * samples_per_worker / t))
        return rows
