#!/usr/bin/python3
"""Turns the end-to-end training benchmark's results into a Markdown report and PNG plots.

Reads every JSON point in --results (run.sh names them
<trainer>_<link>_np<ranks>_<method>_s<seed>.json; the report reads the trainer, link, ranks,
method and seed from the point, not from its name); writes the report to --out and the plots
(gnuplot, e2e_*.png) to --plots. Standard library only; plots are skipped, with a message,
where gnuplot is missing. Run from the repository root:

    bench/e2e/report.py --results bench/results/e2e --machine "..."

A cell is a (trainer, link, ranks); each method in it has one point per seed. Points written
before seeds and evaluations were recorded count as seed 1, with their per-epoch history as
their evaluations.
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter

from step_model import WORKERS, small_collective_seconds, step_model

# pactrain's methods; a label "<sparse|ternary|auto>_..." is pactrain's too. Every other label,
# dense included, is a baseline.
PACTRAIN = ("sparse", "ternary", "ternary_restart", "auto")
PACTRAIN_BASES = ("sparse", "ternary", "auto")
BASELINES = ("dgc999", "dgc99", "topk", "powersgd1", "powersgd2", "powersgd4", "powersgd8",
             "powersgdM", "powersgd4_start", "fp16")
METHODS = ("dense",) + PACTRAIN + BASELINES
LINKS = {"100mbit": "100 Mbit/s", "1gbit": "1 Gbit/s", "none": "unshaped"}
# Fixed per method, so that the plots agree: pactrain reds and oranges, DGC blues, PowerSGD
# greens and teals, fp16 purple, dense black. Other labels: PACTRAIN_OTHER or BASELINE_OTHER.
COLOURS = {"dense": "black",
           "sparse": "#d62728", "ternary": "#ff7f0e", "ternary_restart": "#a50f15",
           "auto": "#8c2d04",
           "dgc999": "#08519c", "dgc99": "#6baed6", "topk": "#1f77b4",
           "powersgd1": "#74c476", "powersgd2": "#31a354", "powersgd4": "#006d2c",
           "powersgd8": "#00441b", "powersgdM": "#17becf", "powersgd4_start": "#2a9d8f",
           "fp16": "#9467bd"}
PACTRAIN_OTHER, BASELINE_OTHER = "#fc9272", "gray50"
# Methods a trainer does not have, as run.sh's has_method: the LibTorch loop has no strategy tuner
# (auto), and the language model's recipe never restarts its learning rate.
NOT_RUN = {"fmnist_cnn": {"auto"}, "fortunes_lm": {"auto", "ternary_restart"}}


def is_pactrain(method):
    return method in PACTRAIN or any(method.startswith(b + "_") for b in PACTRAIN_BASES)


class Quality:
    """A trainer's quality measure, from its points' "metric": test accuracy (higher is better;
    targets: dense's mean final accuracy less 0.5, 1 or 1.5 points, 1 the headline) or
    validation bits per byte (lower is better; dense's mean final value plus 2%, 3% or 5%, 3%
    the headline)."""

    def __init__(self, metric):
        self.accuracy = metric != "bits_per_byte"
        self.final_key = "final_accuracy" if self.accuracy else "final_bits_per_byte"
        self.history_key = "test_accuracy" if self.accuracy else "val_bits_per_byte"
        self.column = "final acc (%)" if self.accuracy else "final bits/byte"
        self.axis = "test accuracy (%)" if self.accuracy else "validation bits per byte"
        self.offsets = (0.5, 1.0, 1.5) if self.accuracy else (2.0, 3.0, 5.0)
        self.headline = 1.0 if self.accuracy else 3.0

    def target(self, dense_final, offset=None):
        offset = self.headline if offset is None else offset
        return dense_final - offset / 100 if self.accuracy else dense_final * (1 + offset / 100)

    def offset_words(self, offset):
        return (f"dense - {offset:g} point{'s' if offset != 1 else ''}" if self.accuracy
                else f"dense + {offset:g}%")

    def reached(self, value, target):
        return value >= target if self.accuracy else value <= target

    def better(self, a, b):
        """Whether final value a is better than b."""
        return a > b if self.accuracy else a < b

    def shown(self, value):
        """A value as the tables and plots show it (accuracy in percent)."""
        return None if value is None else value * 100 if self.accuracy else value

    def fmt(self, value):
        return num(self.shown(value), ".1f" if self.accuracy else ".3f")

    def describe(self, value):
        """A value in words."""
        return f"{self.fmt(value)}%" if self.accuracy else f"{self.fmt(value)} bits/byte"

    def target_words(self, target):
        return (f"target accuracy {self.describe(target)}" if self.accuracy else
                f"target {self.describe(target)}")


def quality_of(p):
    """The Quality of a point's trainer."""
    return Quality(p.get("metric", "accuracy"))


def unit_of(p):
    """What throughput counts: samples, or the language model's tokens."""
    return p.get("unit", "samples")


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def num(v, fmt, none="—"):
    return none if v is None else format(v, fmt)


# --- loading ------------------------------------------------------------------------------------


def evals_of(p):
    """[(wall seconds, quality, epoch)] of a point's evaluations in training order: its
    "evals", else its per-epoch "history" (epoch: fractional, rounded to 1e-3; None where the
    evaluation does not say)."""
    q = quality_of(p)
    spe = p.get("steps_per_epoch")
    for key in ("evals", "history"):
        rows = []
        for e in p.get(key) or []:
            if isinstance(e, dict) and e.get("wall_seconds") is not None and \
                    e.get(q.history_key) is not None:
                epoch = e.get("epoch")
                if epoch is None and e.get("step") is not None and spe:
                    epoch = e["step"] / spe
                epoch = None if epoch is None else round(float(epoch), 3)
                rows.append((float(e["wall_seconds"]), float(e[q.history_key]), epoch))
        if rows:
            return sorted(rows, key=lambda r: r[0])
    return []


def load(results):
    """The points ([point], each with "_file", "seed" and "_evals" set) and [(file, why)] of
    those left out: unreadable, or a second point of the same run."""
    points, bad, seen = [], [], {}
    for path in sorted(glob.glob(os.path.join(results, "*.json"))):
        name = os.path.basename(path)
        try:
            with open(path) as f:
                p = json.load(f)
            p["ranks"] = int(p["ranks"])
            p["seed"] = int(p.get("seed", 1))
            if not all(isinstance(p[k], str) for k in ("trainer", "link", "method")):
                raise TypeError("trainer, link and method must be strings")
            p["_file"] = name
            p["_evals"] = evals_of(p)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            print(f"report.py: skipping {path}: {e}", file=sys.stderr)
            bad.append((name, "could not be read"))
            continue
        run = run_key(p)
        if run in seen:
            print(f"report.py: skipping {path}: the same run as {seen[run]}", file=sys.stderr)
            bad.append((name, f"left out: the same run as `{seen[run]}`"))
            continue
        seen[run] = name
        points.append(p)
    return points, bad


def run_key(p):
    return p["trainer"], p["link"], p["ranks"], p["method"], p["seed"]


def canonical_name(p):
    return "{}_{}_np{}_{}_s{}.json".format(*run_key(p))


def link_order(link):
    return (list(LINKS).index(link), link) if link in LINKS else (len(LINKS), link)


def method_order(method):
    if method in METHODS:
        return (METHODS.index(method), method)
    return (len(METHODS) + (0 if is_pactrain(method) else 1), method)


# --- cells and their statistics -----------------------------------------------------------------


class Runs:
    """One method's points in a cell, one per seed."""

    def __init__(self, method, points):
        self.method = method
        self.points = sorted(points, key=lambda p: p["seed"])
        self.seeds = [p["seed"] for p in self.points]
        self.n = len(self.points)

    def mean(self, f):
        return mean(f(p) for p in self.points)

    def values(self, f):
        return [v for v in (f(p) for p in self.points) if v is not None]

    def times(self, target):
        """Each seed's time to the target (None where it does not reach it)."""
        return [time_to_target(p, target) for p in self.points]

    def sources(self):
        """The point files, as the method and its seeds where run.sh named them."""
        if all(p["_file"] == canonical_name(p) for p in self.points):
            return f"{self.method} {seed_list(self.seeds)}"
        return ", ".join(f"`{p['_file']}`" for p in self.points)


def seed_list(seeds):
    """s1-3, s1,3 or s2."""
    seeds = sorted(seeds)
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"s{seeds[0]}-{seeds[-1]}"
    return "s" + ",".join(str(s) for s in seeds)


class Cell:
    """A (trainer, link, ranks) and its methods' runs."""

    def __init__(self, trainer, link, ranks, points):
        self.trainer, self.link, self.ranks = trainer, link, ranks
        by_method = {}
        for p in points:
            by_method.setdefault(p["method"], []).append(p)
        self.runs = {m: Runs(m, by_method[m]) for m in sorted(by_method, key=method_order)}
        self.seeds = sorted({p["seed"] for p in points})
        self.q = quality_of(points[0])
        self.unit = unit_of(points[0])
        dense = self.runs.get("dense")
        self.dense_final = dense.mean(lambda p: p.get(self.q.final_key)) if dense else None
        self.dense_tp = dense.mean(throughput) if dense else None

    def target(self, offset=None):
        return None if self.dense_final is None else self.q.target(self.dense_final, offset)

    def name(self):
        return f"{self.trainer}, {self.ranks} ranks, {LINKS.get(self.link, self.link)}"


def cells_of(points):
    """{(trainer, ranks): {link: Cell}}, in report order."""
    by_key = {}
    for p in points:
        by_key.setdefault((p["trainer"], p["ranks"], p["link"]), []).append(p)
    out = {}
    for (trainer, ranks, link) in sorted(by_key, key=lambda k: (k[0], k[1], link_order(k[2]))):
        out.setdefault((trainer, ranks), {})[link] = Cell(trainer, link, ranks,
                                                           by_key[(trainer, ranks, link)])
    return out


def throughput(p):
    """Steady samples (or tokens) per second, or None."""
    s, t = p.get("samples_per_step"), p.get("steady_step_seconds")
    return s / t if s and t else None


def time_to_target(p, target):
    """Training wall time (evaluation excluded) at the first evaluation reaching the target,
    without interpolation; None if none does."""
    if target is None:
        return None
    q = quality_of(p)
    return next((w for w, v, _ in p["_evals"] if q.reached(v, target)), None)


def mask_update_share(p):
    """Percent of the run's training time in mask updates (pactrain's methods; points that
    record it)."""
    per_step = p.get("prune_seconds_per_step")
    if not is_pactrain(p["method"]) or per_step is None or not p.get("train_seconds"):
        return None
    return 100.0 * per_step * p["steps_per_epoch"] * p["epochs"] / p["train_seconds"]


class Best:
    """The method with the lowest mean time to target among those every seed of which
    reaches it."""

    def __init__(self, runs, times):
        self.method, self.runs, self.times = runs.method, runs, times
        self.mean, self.lo, self.hi = mean(times), min(times), max(times)

    def words(self):
        spread = f" ({self.lo:.1f}-{self.hi:.1f})" if self.runs.n > 1 else ""
        return f"{self.method}, {self.mean:.1f} s{spread}, {self.runs.n} seed" + \
            ("s" if self.runs.n > 1 else "")


def best_of(cell, pactrain, target):
    """The Best of pactrain's methods (pactrain True) or of the baselines, or None where none
    is eligible."""
    best = None
    for m, runs in cell.runs.items():
        if is_pactrain(m) != pactrain:
            continue
        times = runs.times(target)
        if times and all(t is not None for t in times):
            b = Best(runs, times)
            if best is None or b.mean < best.mean:
                best = b
    return best


def closest(cell, pactrain, target):
    """Words on the method with the best mean final quality, where none is eligible."""
    q, best = cell.q, None
    for m, runs in cell.runs.items():
        if is_pactrain(m) != pactrain:
            continue
        v = runs.mean(lambda p: p.get(q.final_key))
        if v is not None and (best is None or q.better(v, best[1])):
            best = (m, v)
    if best is None:
        return "none run"
    times = cell.runs[best[0]].times(target)
    got = sum(t is not None for t in times)
    return (f"none with every seed reaching (closest: {best[0]}, mean final "
            f"{q.describe(best[1])}, {got}/{len(times)} seeds reach)")


def race(cell, target):
    """(best pactrain, best baseline, verdict, ratio baseline/pactrain or None)."""
    if target is None:
        return None, None, "no target (no dense point)", None
    pac, base = best_of(cell, True, target), best_of(cell, False, target)
    ratio = base.mean / pac.mean if pac and base and pac.mean > 0 else None
    if pac and base:
        overlap = pac.lo <= base.hi and base.lo <= pac.hi
        verdict = ("first" if pac.mean < base.mean else "behind") + \
            (", within the spread" if overlap else "")
    elif pac:
        verdict = "first (no baseline reaches in every seed)"
    elif base:
        verdict = "behind (no pactrain method reaches in every seed)"
    else:
        verdict = "neither reaches"
    if len(cell.seeds) <= 1 or any(b and b.runs.n <= 1 for b in (pac, base)):
        verdict = "one seed: " + verdict
    return pac, base, verdict, ratio


def sources(cell, *bests):
    """Which point files a summary row comes from: dense's (the target) and the winners'."""
    out = []
    if "dense" in cell.runs:
        out.append(cell.runs["dense"].sources() + " (target)")
    out += [b.runs.sources() for b in bests if b and b.method != "dense"]
    return "; ".join(out)


# --- Markdown -----------------------------------------------------------------------------------


def spread_words(values, fmt):
    """'mean (min-max)' of values formatted with fmt (a function); the mean alone for one."""
    if not values:
        return "—"
    m = fmt(mean(values))
    return m if len(values) == 1 else f"{m} ({fmt(min(values))}-{fmt(max(values))})"


def target_cell(runs, target):
    """The time-to-target column: mean (min-max) over the seeds; where not every seed reaches,
    'k/n reached' with the mean and range of those that do."""
    if target is None:
        return "—"
    times = runs.times(target)
    got = [t for t in times if t is not None]
    if not got:
        return "not reached"
    words = spread_words(got, lambda v: f"{v:.1f}")
    return words if len(got) == len(times) else f"{len(got)}/{len(times)} reached: {words}"


def cell_table(cell, target):
    """The table of one cell, one row per method (means over its seeds)."""
    q = cell.q
    rows = [f"| method | seeds | steady {cell.unit}/s | x dense | step ms | bytes/step "
            f"(final, kB) | {q.column} | time to target (s) | whole run (s) | "
            "mask updates (% of run) |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for m, runs in cell.runs.items():
        tp = runs.mean(throughput)
        ratio = tp / cell.dense_tp if tp and cell.dense_tp else None
        step = runs.mean(lambda p: p.get("steady_step_seconds"))
        kb = runs.mean(lambda p: p.get("final_bytes_per_step"))
        finals = runs.values(lambda p: p.get(q.final_key))
        rows.append(" | ".join([
            f"| {m}", f"{runs.n} ({seed_list(runs.seeds)})", num(tp, ".0f"),
            num(ratio, ".2f") + ("x" if ratio else ""), num(step and step * 1e3, ".1f"),
            num(kb and kb / 1e3, ".1f"), spread_words(finals, q.fmt), target_cell(runs, target),
            num(runs.mean(lambda p: p.get("total_seconds")), ".1f"),
            num(runs.mean(mask_update_share), ".1f")]) + " |")
    return rows


def best_words(best, cell, pactrain, target):
    return best.words() if best else closest(cell, pactrain, target)


def summary_row(cell, target, offset=None):
    """A summary row; offset given: with a target column (the sweep)."""
    pac, base, verdict, ratio = race(cell, target)
    tgt = []
    if offset is not None:
        tgt = [cell.q.offset_words(offset) + ("" if target is None else
                                              f": {cell.q.describe(target)}")]
    return "| " + " | ".join(
        [cell.trainer, str(cell.ranks), LINKS.get(cell.link, cell.link), str(len(cell.seeds))] +
        tgt + [best_words(pac, cell, True, target) if target is not None else "—",
               best_words(base, cell, False, target) if target is not None else "—",
               num(ratio, ".2f") + ("x" if ratio else ""), verdict,
               sources(cell, pac, base) or "—"]) + " |"


def model_section(cells, results_dir):
    """The whole-step model's checks against the measured points, and its projection."""
    runs = {(c.trainer, c.link, c.ranks, m): r.points
            for by_link in cells.values() for c in by_link.values() for m, r in c.runs.items()}
    source = ("`bench/results/netbed.csv` (the 4000-byte `MPI_Iallreduce`)"
              if os.path.exists(os.path.join(results_dir, "netbed.csv")) else
              "`bench/results/sync.csv` (the 4 kB dense allreduce)")
    md = ["## Whole-step model\n",
          "`bench/e2e/step_model.py`: t = c + (wire - burst) / (eta R) + K L(P), compute c from "
          "each method's unshaped point, eta fitted on dense at 100 Mbit/s and 4 ranks, burst "
          "the testbed's token bucket (about 1 ms of bytes, at least 16 KiB), "
          f"L(P) from {source}; the ternary methods' "
          "payloads scale with their lane width, bit_width(2P). Step times are means over "
          "seeds. Every row below is a prediction of a (link, ranks, method) the model was not "
          "fitted on, measured on the machine of its unshaped point.\n"]
    latency = small_collective_seconds(results_dir)
    trainers = sorted({k[0] for k in runs})
    for trainer in trainers:
        m = step_model(runs, trainer, latency)
        checks = m.checks()
        if checks:
            def within(rows):
                return sum(abs(t / s - 1) <= 0.2 for _, _, _, s, t, _ in rows)
            per_ranks = "".join(
                f", {within(mine)} of {len(mine)} at {ranks} ranks"
                for ranks in (2, 4) for mine in [[c for c in checks if c[1] == ranks]] if mine)
            seeded = [c for c in checks if c[5][0] < c[5][1]]
            inside = sum(lo <= t <= hi for _, _, _, _, t, (lo, hi) in seeded)
            md.append(f"### {trainer}: measured against predicted (eta {m.eta:.2f}; "
                      f"{within(checks)} of {len(checks)} within 20%{per_ranks})\n")
            if seeded:
                spread = max(max(hi / s - 1, 1 - lo / s) for _, _, _, s, _, (lo, hi) in seeded)
                md.append(f"The seeds of one (link, ranks, method) differ from their mean step "
                          f"by up to {spread * 100:.0f}% (4 ranks share 2 cores with the "
                          f"testbed's packet work); {inside} of {len(seeded)} predictions with "
                          "several seeds fall inside their seeds' range.\n")
            if m.other_machine:
                md.append(f"{m.other_machine} shaped (link, ranks, method) of {trainer} were "
                          "measured on another machine than their unshaped point, so the model "
                          "cannot predict them.\n")
            md.append("| link | ranks | method | measured step ms (mean) | seeds' range ms | "
                      "predicted ms | error |")
            md.append("|---|--:|---|--:|--:|--:|--:|")
            for link, ranks, method, s, t, (lo, hi) in checks:
                md.append(f"| {LINKS.get(link, link)} | {ranks} | {method} | {s * 1e3:.1f} | "
                          f"{lo * 1e3:.1f}-{hi * 1e3:.1f} | {t * 1e3:.1f} | "
                          f"{(t / s - 1) * 100:+.0f}% |")
            md.append("")
        if not any(k[0] == trainer and k[2] == 2 and k[1] == "none" for k in runs):
            md.append(f"No projection for {trainer}: it takes compute from the unshaped 2-rank "
                      "points (one rank per core), and none was run.\n")
            continue
        methods = sorted({k[3] for k in runs if k[0] == trainer}, key=method_order)
        batch = batch_of(runs, trainer)
        unit = unit_of(next(p[0] for k, p in runs.items() if k[0] == trainer))
        for link in ("100mbit", "1gbit"):
            md.append(f"### {trainer}: projected {unit}/s at {LINKS[link]} (compute of one "
                      f"rank per core)\n")
            md.append("| workers | " + " | ".join(methods) + " |")
            md.append("|--:|" + "--:|" * len(methods))
            cols = {x: dict(m.projection(x, link, batch)) for x in methods}
            for n in WORKERS:
                md.append(f"| {n} | " + " | ".join(num(cols[x].get(n), ".0f") for x in methods)
                          + " |")
            md.append("")
    return md


def batch_of(runs, trainer):
    """Samples (or tokens) per worker per step."""
    p = next(p[0] for k, p in runs.items() if k[0] == trainer)
    return p["samples_per_step"] / p["ranks"]


def missing_points(points, cells):
    """Names of the points absent from the grid: per trainer, every link and rank count it was
    run at, times every method seen in any point that the trainer has, times every seed its
    cell was run with (seed 1 for a cell with no point)."""
    methods = {p["method"] for p in points} | {"dense"}
    have = {run_key(p) for p in points}
    out = []
    for trainer in sorted({p["trainer"] for p in points}):
        mine = [p for p in points if p["trainer"] == trainer]
        for link in sorted({p["link"] for p in mine}, key=link_order):
            for ranks in sorted({p["ranks"] for p in mine}):
                cell = cells.get((trainer, ranks), {}).get(link)
                seeds = cell.seeds if cell else [1]
                for m in sorted(methods - NOT_RUN.get(trainer, set()), key=method_order):
                    for s in seeds:
                        if (trainer, link, ranks, m, s) not in have:
                            out.append(f"{trainer}_{link}_np{ranks}_{m}_s{s}")
    return out


def seed_lines(cells):
    """Which cells have how many seeds, most first; the cells of one seed, where others have
    more, as "every other cell"."""
    by_n = {}
    for (trainer, ranks), by_link in cells.items():
        for link, c in by_link.items():
            by_n.setdefault(len(c.seeds), []).append(c.name())
    out = []
    for n, names in sorted(by_n.items(), reverse=True):
        if n == 1 and out:
            out.append("Every other cell has one seed.")
        else:
            out.append(f"{n} seed{'s' if n != 1 else ''}: " + "; ".join(names) + ".")
    return out


def header(points, cells):
    counts = Counter(p["machine"] for p in points)
    main_machine = counts.most_common(1)[0][0]
    evals = Counter(p.get("evals_per_epoch") for p in points if p.get("evals"))
    old = sum(1 for p in points if not p.get("evals"))
    def points_word(k):
        return f"{k} point{'s' if k != 1 else ''}"
    every = "; ".join(f"{n} times per epoch ({points_word(k)})" if len(evals) + bool(old) > 1
                      else f"{n} times per epoch" for n, k in sorted(evals.items(), key=str))
    if old:
        every += ("; " if every else "") + (f"once per epoch, at its end ({points_word(old)} "
                                            "written before evaluations were recorded, whose "
                                            "per-epoch history stands for them)")
    rewind = sorted({p["method"] for p in points if p.get("lr_rewind")}, key=method_order)
    md = ["# End-to-end training: pactrain against dense and compression-enabled baselines\n",
          f"**Machine:** {main_machine}" +
          ("" if len(counts) == 1 else "; sections measured elsewhere name their machine") +
          "\n",
          "Generated by `bench/e2e/report.py` from `bench/results/e2e/*.json`; do not edit by "
          "hand. kB = 1000 bytes.\n",
          allreduce_line(points),
          f"**Evaluations:** quality is evaluated {every}. Every time below is training wall "
          "time with evaluation excluded.\n",
          "**Seeds:** " + " ".join(seed_lines(cells)) + " A method's row gives the mean over "
          "its seeds and, for final quality and time to target, the range (min-max).\n",
          "**Methods:** pactrain's are " + ", ".join(f"`{m}`" for m in PACTRAIN) +
          " (and labels starting with one of `sparse_`, `ternary_`, `auto_`); every other, "
          "`dense` included, is a baseline." +
          (" Runs with `lr_rewind` 1 (the learning rate restarts after the last mask update): "
           + ", ".join(f"`{m}`" for m in rewind) + "; every other run follows one cosine "
           "schedule." if rewind else "") + "\n",
          "Steady throughput is samples (the language model: predicted bytes, tokens) per step "
          "over the step time measured from the steady epoch (`steady_from_epoch`) on; `x "
          "dense` is the mean over seeds against dense's mean at the same link and ranks.\n",
          "**Target:** from dense's mean final quality over its seeds: its accuracy less one "
          "point (the language model: its validation bits per byte plus 3%); the target sweep "
          "also takes 0.5 and 1.5 points (2% and 5%). A seed's time to target is the training "
          "wall time at its first evaluation reaching the target, without interpolation. Where "
          "not every seed reaches it, the table says `k/n reached` and the mean and range are "
          "over the k seeds that do.\n",
          "**Verdicts:** a method is eligible where every one of its seeds reaches the target; "
          "the best pactrain method and the best baseline (dense included) are the eligible "
          "ones with the lowest mean time. pactrain is `first` where its best mean is below the "
          "best baseline's, else `behind`; `within the spread` where the two methods' seed "
          "ranges overlap. The ratio is the best baseline's mean over the best pactrain "
          "method's (above 1: pactrain reaches the target sooner). `one seed` marks cells, or "
          "winners, with a single seed: no verdict there stands on more than one run. "
          "`points` names the files a row comes from: `<method> s<seeds>` for "
          "`<trainer>_<link>_np<ranks>_<method>_s<seed>.json`, else the file names.\n"]
    return main_machine, md


def allreduce_line(points):
    """What the points record of the MPI library's allreduce algorithms (the earliest points of
    the faithful testbed do not; its launch.sh forces them)."""
    seen = Counter(p["allreduce_algorithms"] for p in points if p.get("allreduce_algorithms"))
    if not seen:
        return ("**Allreduce algorithms:** not recorded by these points; `bench/netbed/launch.sh` "
                "forces the ring (recursive doubling for the blocking call on 2 ranks).\n")
    rest = " (the rest do not record it)" if sum(seen.values()) < len(points) else ""
    return "**Allreduce algorithms:** " + "; ".join(
        f"{line} ({k} point{'s' if k != 1 else ''})" for line, k in seen.most_common()) + \
        rest + ".\n"


def markdown(points, bad, pngs, out_dir, results_dir):
    cells = cells_of(points)
    main_machine, md = header(points, cells)
    summary, sweep = [], []
    for (trainer, ranks), by_link in cells.items():
        md.append(f"## {trainer}, {ranks} ranks\n")
        for link, cell in by_link.items():
            target = cell.target()
            tgt = (cell.q.target_words(target) + f", {cell.q.offset_words(cell.q.headline)} "
                   f"over {cell.runs['dense'].n} dense seed" +
                   ("s" if cell.runs["dense"].n > 1 else "")
                   if target is not None else "no dense point, no target")
            md.append(f"### {LINKS.get(link, link)} links ({tgt})\n")
            machines = list(dict.fromkeys(p["machine"] for r in cell.runs.values()
                                          for p in r.points))
            if machines != [main_machine]:
                md.append("Measured on " + "; ".join(machines) + ".\n")
            md.extend(cell_table(cell, target) + [""])
            summary.append(summary_row(cell, target))
            sweep += [summary_row(cell, cell.target(off), off) for off in cell.q.offsets]
    cols = ("best pactrain (method, mean s (range), seeds) | best baseline (method, mean s "
            "(range), seeds) | baseline / pactrain | verdict | points |")
    md.append("## Summary (headline target)\n")
    md.append("| trainer | ranks | link | seeds | " + cols)
    md.append("|---|--:|---|--:|---|---|--:|---|---|")
    md.extend(summary + [""])
    md.append("## Target sweep\n")
    md.append("The same race at three targets (accuracy: dense's mean less 0.5, 1 and 1.5 "
              "points; bits per byte: dense's mean plus 2%, 3% and 5%).\n")
    md.append("| trainer | ranks | link | seeds | target | " + cols)
    md.append("|---|--:|---|--:|---|---|---|--:|---|---|")
    md.extend(sweep + [""])
    md.extend(model_section(cells, results_dir))
    missing = missing_points(points, cells)
    md.append("## Missing points\n")
    md.extend([f"- `{m}`" for m in missing] or ["None: every point of the grid is present."])
    md.extend([f"- `{b}` ({why})" for b, why in bad] + [""])
    if pngs:
        md.append("## Plots\n")
        md.extend(f"![{os.path.basename(p)}]({os.path.relpath(p, out_dir)})\n" for p in pngs)
    return "\n".join(md)


# --- plots --------------------------------------------------------------------------------------


def gnuplot_terminal():
    """'pngcairo' or 'png', whichever this gnuplot has, or None where gnuplot is missing."""
    exe = shutil.which("gnuplot") or ("/usr/bin/gnuplot" if os.path.exists("/usr/bin/gnuplot")
                                      else None)
    if exe is None:
        return None, None
    for term in ("pngcairo", "png"):
        r = subprocess.run([exe, "-e", f"set terminal {term}"], capture_output=True)
        if r.returncode == 0:
            return exe, term
    return None, None


def run_gnuplot(exe, script, png):
    r = subprocess.run([exe], input=script, text=True, capture_output=True)
    if r.returncode != 0 or not os.path.exists(png):
        print(f"report.py: gnuplot failed for {png}: {r.stderr.strip()}", file=sys.stderr)
        return False
    return True


def write_data(tmp, name, rows):
    path = os.path.join(tmp, name + ".dat")
    with open(path, "w") as f:
        f.writelines(" ".join(str(v) for v in row) + "\n" for row in rows)
    return path


def method_line(tmp, name, method, rows, title=None):
    """A gnuplot plot clause for one method's rows (written to a data file in tmp)."""
    path = write_data(tmp, name, rows)
    return f"'{path}' using 1:2 with linespoints {style(method)} title '{title or method}'"


def colour(method):
    return COLOURS.get(method, PACTRAIN_OTHER if is_pactrain(method) else BASELINE_OTHER)


def style(method):
    """Line colour fixed per method, so that the plots agree; pactrain's lines are thicker,
    and the PowerSGD run with a dense start dashed."""
    lw = 3 if is_pactrain(method) else 2
    dt = " dt 2" if method.endswith("_start") else ""
    return f"lc rgb '{colour(method)}' lw {lw}{dt} pt 7 ps 0.6"


def plot_header(term, png, title, xlabel, ylabel):
    return (f"set terminal {term} size 1100,640 noenhanced\nset output '{png}'\n"
            f"set title '{title}'\nset xlabel '{xlabel}'\nset ylabel '{ylabel}'\n"
            "set grid\nset key outside right\n")


def plot_throughput(exe, term, tmp, plots, trainer, ranks, by_link):
    links = list(by_link)
    methods = sorted({m for c in by_link.values() for m in c.runs}, key=method_order)
    lines = []
    for m in methods:
        rows = [(i, by_link[l].runs[m].mean(throughput)) for i, l in enumerate(links)
                if m in by_link[l].runs]
        rows = [r for r in rows if r[1]]
        if rows:
            lines.append(method_line(tmp, f"tp_{trainer}_{ranks}_{m}", m, rows))
    if not lines:
        return []
    png = os.path.join(plots, f"e2e_throughput_{trainer}_np{ranks}.png")
    tics = ", ".join(f"'{LINKS.get(l, l)}' {i}" for i, l in enumerate(links))
    unit = next(iter(by_link.values())).unit
    script = (plot_header(term, png, f"{trainer}, {ranks} ranks: steady throughput (mean over "
                          "seeds)", "link", f"{unit}/s (steady)") +
              f"set logscale y\nset xtics ({tics})\nset xrange [-0.3:{len(links) - 0.7}]\n"
              "plot " + ", ".join(lines) + "\n")
    return [png] if run_gnuplot(exe, script, png) else []


def mean_curve(runs):
    """[(mean wall seconds, mean quality)] at each evaluation the seeds share (they evaluate at
    the same steps): by epoch where every evaluation names one (a point with its per-epoch
    history only then shares the epoch ends), else by index."""
    curves = [p["_evals"] for p in runs.points if p["_evals"]]
    if not curves:
        return []
    if all(e[2] is not None for c in curves for e in c):
        shared = set.intersection(*({e[2] for e in c} for c in curves))
        curves = [[e for e in c if e[2] in shared] for c in curves]
    n = min(len(c) for c in curves)
    return [(mean(c[i][0] for c in curves), mean(c[i][1] for c in curves)) for i in range(n)]


def plot_accuracy(exe, term, tmp, plots, cell):
    target, q = cell.target(), cell.q
    tag = f"{cell.trainer}_{cell.link}_np{cell.ranks}"
    lines, end = [], 0.0
    counts = {r.n for r in cell.runs.values()}
    for m, runs in cell.runs.items():
        rows = [(w, q.shown(v)) for w, v in mean_curve(runs)]
        if rows:  # the run starts at wall time 0 with no accuracy measured yet
            title = m if len(counts) == 1 else f"{m} ({runs.n} seed{'s' if runs.n > 1 else ''})"
            lines.append(method_line(tmp, f"acc_{tag}_{m}", m, [(0, "NaN")] + rows, title))
            end = max(end, rows[-1][0])
    if not lines:
        return []
    if target is not None:  # drawn from data, so that it spans the whole x range
        path = write_data(tmp, f"target_{tag}", [(0, q.shown(target)), (end, q.shown(target))])
        lines.append(f"'{path}' using 1:2 with lines dt 2 lw 2 lc rgb 'gray40' "
                     f"title 'target {q.describe(target)}'")
    png = os.path.join(plots, f"e2e_accuracy_{tag}.png")
    what = "accuracy" if q.accuracy else "validation bits per byte"
    seeds = ("" if counts != {1} and len(counts) > 1 else
             ", one seed" if counts == {1} else f", mean of {counts.pop()} seeds")
    title = f"{cell.name()}: {what}{seeds}"
    script = (plot_header(term, png, title, "training wall-clock seconds (evaluation excluded)",
                          q.axis) +
              f"set xrange [0:{end * 1.02}]\nplot " + ", ".join(lines) + "\n")
    return [png] if run_gnuplot(exe, script, png) else []


def plot_projection(exe, term, tmp, plots, runs, trainer, link, results_dir):
    m = step_model(runs, trainer, small_collective_seconds(results_dir))
    lines = []
    for x in sorted({k[3] for k in runs if k[0] == trainer}, key=method_order):
        rows = m.projection(x, link, batch_of(runs, trainer))
        if rows:
            lines.append(method_line(tmp, f"proj_{trainer}_{link}_{x}", x, rows))
    if not lines:
        return []
    png = os.path.join(plots, f"e2e_projection_{trainer}_{link}.png")
    unit = unit_of(next(p[0] for k, p in runs.items() if k[0] == trainer))
    script = (plot_header(term, png, f"{trainer}, {LINKS[link]} links: projected throughput",
                          "workers", f"{unit}/s (model)") +
              "set logscale xy\nset xtics (8, 32, 128, 512, 1024)\nplot " + ", ".join(lines) +
              "\n")
    return [png] if run_gnuplot(exe, script, png) else []


def make_plots(points, plots, results_dir):
    """The PNGs made: accuracy plots first (the ones readers look at first), then throughput."""
    exe, term = gnuplot_terminal()
    if exe is None:
        print("report.py: gnuplot (with png or pngcairo) not found; skipping plots",
              file=sys.stderr)
        return []
    os.makedirs(plots, exist_ok=True)
    cells = cells_of(points)
    runs = {(c.trainer, c.link, c.ranks, m): r.points
            for by_link in cells.values() for c in by_link.values() for m, r in c.runs.items()}
    acc, tp = [], []
    with tempfile.TemporaryDirectory(prefix="e2e_report_") as tmp:
        for (trainer, ranks), by_link in cells.items():
            for cell in by_link.values():
                acc += plot_accuracy(exe, term, tmp, plots, cell)
            tp += plot_throughput(exe, term, tmp, plots, trainer, ranks, by_link)
        for trainer in sorted({p["trainer"] for p in points}):
            for link in ("100mbit", "1gbit"):
                tp += plot_projection(exe, term, tmp, plots, runs, trainer, link, results_dir)
    return acc + tp


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default="bench/results/e2e")
    ap.add_argument("--machine", default="",
                    help="one line naming the machine of the points that do not name theirs")
    ap.add_argument("--out", default="bench/results/e2e.md")
    ap.add_argument("--plots", default=None, help="directory of the PNGs (default: --out's)")
    args = ap.parse_args()
    points, bad = load(args.results)
    if not points:
        sys.exit(f"report.py: no readable results in {args.results}")
    for p in points:
        p.setdefault("machine", args.machine or "not recorded (pass --machine)")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    results_dir = os.path.dirname(os.path.abspath(args.results))  # netbed.csv's and sync.csv's
    pngs = make_plots(points, os.path.abspath(args.plots or out_dir), results_dir)
    with open(args.out, "w") as f:
        f.write(markdown(points, bad, pngs, out_dir, results_dir))
    print(f"report.py: wrote {args.out} and {len(pngs)} plots")


if __name__ == "__main__":
    main()
