#!/usr/bin/python3
"""Turns the end-to-end training benchmark's results into a Markdown report and PNG plots.

Reads one JSON file per point, <trainer>_<link>_np<ranks>_<method>.json, from --results;
writes the report to --out and the plots (gnuplot, e2e_*.png) to --plots. Standard library
only; plots are skipped, with a message, where gnuplot is missing. Run from the repository root:

    bench/e2e/report.py --results bench/results/e2e --machine "..."
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

PACTRAIN = ("sparse", "ternary", "auto")
BASELINES = ("topk", "powersgd4", "powersgdM", "fp16")
METHODS = ("dense",) + PACTRAIN + BASELINES
LINKS = {"100mbit": "100 Mbit/s", "1gbit": "1 Gbit/s", "none": "unshaped"}
COLOURS = {"dense": "black", "sparse": "#d62728", "ternary": "#ff7f0e", "auto": "#8c2d04",
           "topk": "#1f77b4", "powersgd4": "#2ca02c", "powersgdM": "#17becf", "fp16": "#9467bd"}
# Methods a trainer does not have (the LibTorch loop has no strategy tuner).
NOT_RUN = {"fmnist_cnn": {"auto"}, "fortunes_lm": {"auto"}}


class Quality:
    """A trainer's quality measure, from its points' "metric": test accuracy (higher is better;
    the target is dense's final accuracy less one point) or validation bits per byte (lower is
    better; the target is dense's final value plus 3%)."""

    def __init__(self, metric):
        self.accuracy = metric != "bits_per_byte"
        self.final_key = "final_accuracy" if self.accuracy else "final_bits_per_byte"
        self.history_key = "test_accuracy" if self.accuracy else "val_bits_per_byte"
        self.column = "final acc (%)" if self.accuracy else "final bits/byte"
        self.axis = "test accuracy (%)" if self.accuracy else "validation bits per byte"

    def target(self, dense_final):
        return dense_final - 0.01 if self.accuracy else dense_final * 1.03

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


def any_point(group):
    """One point of a {method: point} group (they share a trainer)."""
    return next(iter(group.values()))


def trainer_point(points, trainer):
    """One point of a trainer."""
    return next(p for k, p in points.items() if k[0] == trainer)


def unit_of(p):
    """What throughput counts: samples, or the language model's tokens."""
    return p.get("unit", "samples")


# --- loading ------------------------------------------------------------------------------------


def load(results):
    """{(trainer, link, ranks, method): point} and the names of the files that could not be read."""
    points, bad = {}, []
    for path in sorted(glob.glob(os.path.join(results, "*.json"))):
        try:
            with open(path) as f:
                p = json.load(f)
            key = (p["trainer"], p["link"], int(p["ranks"]), p["method"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"report.py: skipping {path}: {e}", file=sys.stderr)
            bad.append(os.path.basename(path))
            continue
        points[key] = p
    return points, bad


def link_order(link):
    return (list(LINKS).index(link), link) if link in LINKS else (len(LINKS), link)


def method_order(method):
    return (METHODS.index(method), method) if method in METHODS else (len(METHODS), method)


def missing_points(points):
    """Names of the points absent from the grid: per trainer, every link and rank count it was
    run at, times every method seen in any result that the trainer has."""
    methods = {k[3] for k in points} | {"dense"}
    out = []
    for trainer in sorted({k[0] for k in points}):
        mine = [k for k in points if k[0] == trainer]
        for link in sorted({k[1] for k in mine}, key=link_order):
            for ranks in sorted({k[2] for k in mine}):
                for m in sorted(methods - NOT_RUN.get(trainer, set()), key=method_order):
                    if (trainer, link, ranks, m) not in points:
                        out.append(f"{trainer}_{link}_np{ranks}_{m}")
    return out


# --- computations -------------------------------------------------------------------------------


def throughput(p):
    """Steady samples (or tokens) per second, or None."""
    s, t = p.get("samples_per_step"), p.get("steady_step_seconds")
    return s / t if s and t else None


def time_to_target(p, target):
    """Cumulative training wall time at the end of the first epoch reaching the target, or None."""
    if target is None:
        return None
    q = quality_of(p)
    for h in sorted(p.get("history", []), key=lambda h: h.get("epoch", 0)):
        v = h.get(q.history_key)
        if v is not None and q.reached(v, target):
            return h.get("wall_seconds")
    return None


def target_of(group):
    q = quality_of(any_point(group))
    dense = group.get("dense")
    if dense is None or dense.get(q.final_key) is None:
        return None
    return q.target(dense[q.final_key])


def best_of(group, methods, target):
    """(method, time to target, reached) of the method reaching the target first; where none
    reaches it, the one with the best final quality and reached False. None if none ran."""
    present = [m for m in methods if m in group]
    reached = [(time_to_target(group[m], target), m) for m in present]
    reached = [(t, m) for t, m in reached if t is not None]
    if reached:
        t, m = min(reached)
        return m, t, True
    if not present:
        return None
    q = quality_of(any_point(group))
    best = None
    for m in present:
        v = group[m].get(q.final_key)
        if v is not None and (best is None or q.better(v, group[best][q.final_key])):
            best = m
    return best or present[0], None, False


# --- Markdown -----------------------------------------------------------------------------------


def num(v, fmt, none="—"):
    return none if v is None else format(v, fmt)


def group_table(group, target):
    """The table of one (trainer, link, ranks) group, one row per method."""
    dense_tp = throughput(group["dense"]) if "dense" in group else None
    q = quality_of(any_point(group))
    unit = unit_of(any_point(group))
    rows = [f"| method | steady {unit}/s | x dense | step ms | bytes/step (final, kB) | "
            f"{q.column} | time to target (s) | whole run (s) | mask updates (% of run) |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for m in sorted(group, key=method_order):
        p = group[m]
        tp = throughput(p)
        ratio = tp / dense_tp if tp and dense_tp else None
        step = p.get("steady_step_seconds")
        kb = p.get("final_bytes_per_step")
        rows.append(" | ".join([
            f"| {m}", num(tp, ".0f"), num(ratio, ".2f") + ("x" if ratio else ""),
            num(step and step * 1e3, ".1f"), num(kb and kb / 1e3, ".1f"),
            q.fmt(p.get(q.final_key)),
            num(time_to_target(p, target), ".1f", "not reached" if target is not None else "—"),
            num(p.get("total_seconds"), ".1f"), num(mask_update_share(p, m), ".1f")]) + " |")
    return rows


def mask_update_share(p, method):
    """Percent of the run's training time in mask updates (pactrain's methods; points that
    record it)."""
    per_step = p.get("prune_seconds_per_step")
    if method not in PACTRAIN or per_step is None or not p.get("train_seconds"):
        return None
    steps = p["steps_per_epoch"] * p["epochs"]
    return 100.0 * per_step * steps / p["train_seconds"]


def fallback_note(group, method, target):
    """Why a best method was chosen by final accuracy rather than by time to target."""
    if target is None:
        return "no dense point, so no target; best final quality"
    q = quality_of(any_point(group))
    return f"none reached the target; best final, {q.describe(group[method].get(q.final_key))}"


def summary_row(trainer, ranks, link, group, target):
    dense_tp = throughput(group["dense"]) if "dense" in group else None
    pac = best_of(group, PACTRAIN, target)
    base = best_of(group, BASELINES, target)
    pac_s = base_s = "—"
    if pac:
        tp = throughput(group[pac[0]])
        pac_s = f"{pac[0]}, " + (f"{tp / dense_tp:.2f}x dense" if tp and dense_tp else "—")
        if not pac[2]:
            pac_s += f" ({fallback_note(group, pac[0], target)})"
    if base:
        base_s = (f"{base[0]}, {base[1]:.1f} s" if base[2] else
                  f"{base[0]}, not reached ({fallback_note(group, base[0], target)})")
    ratio = f"{base[1] / pac[1]:.2f}x" if pac and base and pac[1] and base[1] else "—"
    return f"| {trainer} | {ranks} | {LINKS.get(link, link)} | {pac_s} | {base_s} | {ratio} |"


def groups(points):
    """{(trainer, ranks): {link: {method: point}}}, in report order."""
    out = {}
    for (trainer, link, ranks, method), p in points.items():
        out.setdefault((trainer, ranks), {}).setdefault(link, {})[method] = p
    return {k: dict(sorted(out[k].items(), key=lambda kv: link_order(kv[0])))
            for k in sorted(out)}


def model_section(points, results_dir):
    """The whole-step model's checks against the measured points, and its projection."""
    md = ["## Whole-step model\n",
          "`bench/e2e/step_model.py`: t = c + wire / (eta R) + K L(P), compute c from each "
          "method's unshaped point, eta fitted on dense at 100 Mbit/s and 4 ranks, L(P) from "
          "`bench/results/sync.csv`. Every row below is a prediction of a point the model was not "
          "fitted on, measured on the machine of its unshaped point.\n"]
    latency = small_collective_seconds(results_dir)
    for trainer in sorted({k[0] for k in points}):
        m = step_model(points, trainer, latency)
        checks = m.checks()
        if not checks:
            continue
        within = sum(abs(t / s - 1) <= 0.2 for _, _, _, s, t in checks)
        md.append(f"### {trainer}: measured against predicted (eta {m.eta:.2f}; "
                  f"{within} of {len(checks)} within 20%)\n")
        if m.other_machine:
            md.append(f"{m.other_machine} shaped points of {trainer} were measured on another "
                      "machine than their unshaped point, so the model cannot predict them.\n")
        md.append("| link | ranks | method | measured step ms | predicted ms | error |")
        md.append("|---|--:|---|--:|--:|--:|")
        for link, ranks, method, s, t in checks:
            md.append(f"| {LINKS.get(link, link)} | {ranks} | {method} | {s * 1e3:.1f} | "
                      f"{t * 1e3:.1f} | {(t / s - 1) * 100:+.0f}% |")
        md.append("")
        if not any(k[0] == trainer and k[2] == 2 and k[1] == "none" for k in points):
            md.append(f"No projection for {trainer}: it takes compute from the unshaped 2-rank "
                      "points (one rank per core), and none was run.\n")
            continue
        for link in ("100mbit", "1gbit"):
            unit = unit_of(trainer_point(points, trainer))
            md.append(f"### {trainer}: projected {unit}/s at {LINKS[link]} (compute of one "
                      f"rank per core)\n")
            methods = sorted({k[3] for k in points if k[0] == trainer}, key=method_order)
            md.append("| workers | " + " | ".join(methods) + " |")
            md.append("|--:|" + "--:|" * len(methods))
            cols = {x: dict(m.projection(x, link, batch_of(points, trainer))) for x in methods}
            for n in WORKERS:
                md.append(f"| {n} | " + " | ".join(num(cols[x].get(n), ".0f") for x in methods)
                          + " |")
            md.append("")
    return md


def batch_of(points, trainer):
    """Samples (or tokens) per worker per step."""
    p = trainer_point(points, trainer)
    return p["samples_per_step"] / p["ranks"]


def machines_of(group):
    """The machines that measured a link's points, in order of first appearance."""
    return list(dict.fromkeys(p["machine"] for p in group.values()))


def markdown(points, bad, pngs, out_dir, results_dir):
    counts = Counter(p["machine"] for p in points.values())
    main_machine = counts.most_common(1)[0][0]
    md = ["# End-to-end training: pactrain against dense and compression-enabled baselines\n",
          f"**Machine:** {main_machine}" +
          ("" if len(counts) == 1 else "; sections measured elsewhere name their machine") +
          "\n",
          "Generated by `bench/e2e/report.py` from `bench/results/e2e/*.json`; do not edit by "
          "hand. Steady throughput is samples (the language model: predicted bytes, tokens) per "
          "step over the step time measured from the steady epoch (`steady_from_epoch`) on; "
          "`x dense` is against the blocking ring allreduce (`dense`) at the same link and "
          "ranks. The target is dense's final accuracy less one point (the language model: "
          "dense's final validation bits per byte plus 3%); time to target is the training wall "
          "time (evaluation excluded) at the end of the first epoch reaching it. "
          "kB = 1000 bytes.\n"]
    summary = []
    for (trainer, ranks), by_link in groups(points).items():
        md.append(f"## {trainer}, {ranks} ranks\n")
        for link, group in by_link.items():
            target = target_of(group)
            tgt = (quality_of(any_point(group)).target_words(target) if target is not None
                   else "no dense point, no target")
            md.append(f"### {LINKS.get(link, link)} links ({tgt})\n")
            machines = machines_of(group)
            if machines != [main_machine]:
                md.append("Measured on " + "; ".join(machines) + ".\n")
            md.extend(group_table(group, target) + [""])
            summary.append(summary_row(trainer, ranks, link, group, target))
    md.append("## Summary\n")
    md.append("`pactrain vs best baseline` is the best baseline's time to target over pactrain's "
              "best time to target (above 1: pactrain reaches the target sooner).\n")
    md.append("| trainer | ranks | link | best pactrain (method, x dense steady) | "
              "best baseline (method, time to target) | pactrain vs best baseline |")
    md.append("|---|--:|---|---|---|--:|")
    md.extend(summary + [""])
    md.extend(model_section(points, results_dir))
    missing = missing_points(points)
    md.append("## Missing points\n")
    md.extend([f"- `{m}`" for m in missing] or ["None: every point of the grid is present."])
    md.extend([f"- `{b}` (could not be read)" for b in bad] + [""])
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


def method_line(tmp, name, method, rows):
    """A gnuplot plot clause for one method's rows (written to a data file in tmp)."""
    path = write_data(tmp, name, rows)
    return f"'{path}' using 1:2 with linespoints {style(method)} title '{method}'"


def style(method):
    """Line colour fixed per method, so that the plots agree; pactrain's lines are thicker."""
    lw = 3 if method in PACTRAIN else 2
    return f"lc rgb '{COLOURS.get(method, 'gray50')}' lw {lw} pt 7"


def header(term, png, title, xlabel, ylabel):
    return (f"set terminal {term} size 900,560 noenhanced\nset output '{png}'\n"
            f"set title '{title}'\nset xlabel '{xlabel}'\nset ylabel '{ylabel}'\n"
            "set grid\nset key outside right\n")


def plot_throughput(exe, term, tmp, plots, trainer, ranks, by_link):
    links = list(by_link)
    methods = sorted({m for g in by_link.values() for m in g}, key=method_order)
    lines = []
    for m in methods:
        rows = [(i, throughput(by_link[l][m])) for i, l in enumerate(links) if m in by_link[l]]
        rows = [r for r in rows if r[1]]
        if rows:
            lines.append(method_line(tmp, f"tp_{trainer}_{ranks}_{m}", m, rows))
    if not lines:
        return []
    png = os.path.join(plots, f"e2e_throughput_{trainer}_np{ranks}.png")
    tics = ", ".join(f"'{LINKS.get(l, l)}' {i}" for i, l in enumerate(links))
    unit = unit_of(any_point(any_point(by_link)))
    script = (header(term, png, f"{trainer}, {ranks} ranks: steady throughput", "link",
                     f"{unit}/s (steady)") +
              f"set logscale y\nset xtics ({tics})\nset xrange [-0.3:{len(links) - 0.7}]\n"
              "plot " + ", ".join(lines) + "\n")
    return [png] if run_gnuplot(exe, script, png) else []


def plot_accuracy(exe, term, tmp, plots, trainer, ranks, link, group):
    target = target_of(group)
    q = quality_of(any_point(group))
    lines, end = [], 0.0
    for m in sorted(group, key=method_order):
        hist = sorted(group[m].get("history", []), key=lambda h: h.get("epoch", 0))
        rows = [(h["wall_seconds"], q.shown(h[q.history_key])) for h in hist
                if h.get("wall_seconds") is not None and h.get(q.history_key) is not None]
        if rows:  # the run starts at wall time 0 with no accuracy measured yet
            lines.append(method_line(tmp, f"acc_{trainer}_{link}_{ranks}_{m}", m,
                                     [(0, "NaN")] + rows))
            end = max(end, rows[-1][0])
    if not lines:
        return []
    if target is not None:  # drawn from data, so that it spans the whole x range
        path = write_data(tmp, f"target_{trainer}_{link}_{ranks}",
                          [(0, q.shown(target)), (end, q.shown(target))])
        lines.append(f"'{path}' using 1:2 with lines dt 2 lw 2 lc rgb 'gray40' "
                     f"title 'target {q.describe(target)}'")
    png = os.path.join(plots, f"e2e_accuracy_{trainer}_{link}_np{ranks}.png")
    what = "accuracy" if q.accuracy else "validation bits per byte"
    title = f"{trainer}, {ranks} ranks, {LINKS.get(link, link)} links: {what} over time"
    script = (header(term, png, title, "training wall-clock seconds", q.axis) +
              f"set xrange [0:{end * 1.02}]\nplot " + ", ".join(lines) + "\n")
    return [png] if run_gnuplot(exe, script, png) else []


def plot_projection(exe, term, tmp, plots, points, trainer, link, results_dir):
    m = step_model(points, trainer, small_collective_seconds(results_dir))
    lines = []
    for x in sorted({k[3] for k in points if k[0] == trainer}, key=method_order):
        rows = m.projection(x, link, batch_of(points, trainer))
        if rows:
            lines.append(method_line(tmp, f"proj_{trainer}_{link}_{x}", x, rows))
    if not lines:
        return []
    png = os.path.join(plots, f"e2e_projection_{trainer}_{link}.png")
    unit = unit_of(trainer_point(points, trainer))
    script = (header(term, png, f"{trainer}, {LINKS[link]} links: projected throughput",
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
    acc, tp = [], []
    with tempfile.TemporaryDirectory(prefix="e2e_report_") as tmp:
        for (trainer, ranks), by_link in groups(points).items():
            for link, group in by_link.items():
                acc += plot_accuracy(exe, term, tmp, plots, trainer, ranks, link, group)
            tp += plot_throughput(exe, term, tmp, plots, trainer, ranks, by_link)
        for trainer in sorted({k[0] for k in points}):
            for link in ("100mbit", "1gbit"):
                tp += plot_projection(exe, term, tmp, plots, points, trainer, link, results_dir)
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
    for p in points.values():
        p.setdefault("machine", args.machine or "not recorded (pass --machine)")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    results_dir = os.path.dirname(os.path.abspath(args.results))  # sync.csv's
    pngs = make_plots(points, os.path.abspath(args.plots or out_dir), results_dir)
    with open(args.out, "w") as f:
        f.write(markdown(points, bad, pngs, out_dir, results_dir))
    print(f"report.py: wrote {args.out} and {len(pngs)} plots")


if __name__ == "__main__":
    main()
