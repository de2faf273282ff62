"""What the GPU cases have measured, and what the next lease of a GPU should run first.

    python bench/gpu/ledger.py next --gpu H100-80GB            # suite cases, in the order to run them
    python bench/gpu/ledger.py next --gpu H100-80GB --kind throughput
    python bench/gpu/ledger.py record OUT/gpu-*.json           # add a lease's results (suite or throughput)
    python bench/gpu/ledger.py show

bench/gpu/ledger.json keeps, per case and GPU, the last measurement: its status, date, the commit it
was recorded at, its main figures, and `deps`: a short sha256 of every file the case depends on (the
repository's modules its training process imported, read from `python -X importtime`; the bench
scripts; the model's config.json). `next` orders the cases a lease should run: first those never
measured on that GPU, then those measured but failed, then those whose files changed since (oldest
first), and last those measured on the code as it is. A GPU is named as the planner's accelerator
table names it (H100-80GB, H200-141GB); `next --gpu auto` asks this machine's GPU.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LEDGER = Path(__file__).with_name("ledger.json")
KINDS = ("suite", "throughput")


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def module_files(module_names: list[str]) -> list[Path]:
    """The repository files of `module_names` (recipeforge's, and first-party plugins' under plugins/*/src)."""
    roots = [REPO] + sorted(p for p in (REPO / "plugins").glob("*/src") if p.is_dir())
    files = []
    for name in sorted(set(module_names)):
        rel = Path(*name.split("."))
        for root in roots:
            for candidate in (root / rel / "__init__.py", root / rel.with_suffix(".py")):
                if candidate.is_file():
                    files.append(candidate)
                    break
            else:
                continue
            break
    return files


def imported_modules(stderr: str, prefixes: tuple[str, ...] = ("recipeforge",)) -> list[str]:
    """Module names of `python -X importtime` output (``import time: self | cumulative | name``) that
    start with one of `prefixes` (``recipeforge`` also matches ``recipeforge_liger``)."""
    names = []
    for line in stderr.splitlines():
        _, marker, rest = line.partition("import time:")  # a worker's line may carry a launcher's prefix
        if marker and rest.count("|") == 2:
            name = rest.rsplit("|", 1)[1].strip()
            if name.startswith(prefixes):
                names.append(name)
    return names


def deps_of(stderr: str, extra: list[Path]) -> dict[str, str]:
    """{repo-relative path: short sha256} of the files a case ran: the modules its run imported and `extra`."""
    files = module_files(imported_modules(stderr)) + [p for p in extra if p.is_file()]
    return {str(p.relative_to(REPO)): file_hash(p) for p in sorted(set(files))}


def changed(deps: dict[str, str]) -> list[str]:
    """The files of `deps` whose content differs now (or that are gone)."""
    out = []
    for rel, digest in deps.items():
        path = REPO / rel
        if not path.is_file() or file_hash(path) != digest:
            out.append(rel)
    return out


def load(path: Path = LEDGER) -> dict:
    if not path.is_file():
        return {"entries": []}
    return json.loads(path.read_text())


def save(ledger: dict, path: Path = LEDGER) -> None:
    ledger["entries"].sort(key=lambda e: (e["kind"], e["case"], e["gpu"]))
    path.write_text(json.dumps(ledger, indent=2, sort_keys=True) + "\n")


FIGURES = ("plan_gb", "measured_reserved_gb", "plan_error", "tokens_per_s", "mfu", "trl_tokens_per_s", "ratio",
           "init_s", "first_step_s", "loss_first", "loss_last")


def record(ledger: dict, result: dict, *, commit: str | None, gpu: str | None = None) -> int:
    """Add the cases of one results file (bench/gpu/suite.py or throughput.py output) to `ledger`, under
    `gpu` (default: the accelerator the results name); cases not run (skipped) are left out. Returns
    how many were recorded."""
    kind = "throughput" if "sequence_len" in result and "flop_convention" not in result else "suite"
    gpu = gpu or result.get("accelerator") or result.get("gpu")
    n = 0
    for row in result.get("cases", []):
        if row.get("status") == "skipped" or "case" not in row or row["case"] == "pytest -m gpu":
            continue
        entry = {"kind": kind, "case": row["case"], "gpu": gpu, "date": result.get("date"), "commit": commit,
                 "status": row.get("status"), "figures": {k: row[k] for k in FIGURES if row.get(k) is not None},
                 "deps": row.get("deps") or {}}
        ledger["entries"] = [e for e in ledger["entries"]
                             if (e["kind"], e["case"], e["gpu"]) != (kind, row["case"], gpu)] + [entry]
        n += 1
    return n


def case_names(kind: str) -> list[str]:
    """The cases of bench/gpu/suite.py or throughput.py, in their own order."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    module = __import__("suite" if kind == "suite" else "throughput")
    return [c.name for c in module.CASES]


def next_cases(ledger: dict, gpu: str, kind: str = "suite") -> list[tuple[str, str]]:
    """(case, why) for every case of `kind`, in the order a lease on `gpu` should run them."""
    entries = {e["case"]: e for e in ledger["entries"] if e["kind"] == kind and e["gpu"] == gpu}
    elsewhere = {e["case"]: e["gpu"] for e in ledger["entries"] if e["kind"] == kind and e.get("status") == "ok"}
    ranked = []
    for order, name in enumerate(case_names(kind)):
        entry = entries.get(name)
        if entry is None and name in elsewhere:  # what another GPU measured is known in kind, if not in figures
            ranked.append(((0, "1", order), name, f"never measured on this GPU (measured on {elsewhere[name]})"))
        elif entry is None:
            ranked.append(((0, "", order), name, "never measured on any GPU"))
        elif entry.get("status") != "ok":
            ranked.append(((1, entry.get("date") or "", order), name, f"last run: {entry.get('status')}"))
        elif not entry.get("deps"):
            ranked.append(((2, entry.get("date") or "", order), name, "measured before files were recorded"))
        elif changed(entry["deps"]):
            files = changed(entry["deps"])
            ranked.append(((2, entry.get("date") or "", order), name,
                           f"{len(files)} file(s) changed since {entry.get('date')}: {', '.join(files[:3])}"))
        else:
            ranked.append(((3, entry.get("date") or "", order), name, f"measured on this code ({entry.get('date')})"))
    return [(name, why) for _, name, why in sorted(ranked)]


def this_gpu() -> str:
    """The accelerator name of this machine's GPU as the planner's table gives it."""
    from recipeforge.plan.hardware import probe_local_hardware

    acc = probe_local_hardware().accelerator
    if acc is None:
        raise SystemExit("no GPU on this machine: give --gpu NAME (e.g. H100-80GB)")
    return acc.name


def git_commit() -> str | None:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    return proc.stdout.strip() or None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    nxt = sub.add_parser("next", help="the cases in the order the next lease runs them")
    nxt.add_argument("--gpu", required=True, help="accelerator name (H100-80GB, H200-141GB) or auto")
    nxt.add_argument("--kind", choices=KINDS, default="suite")
    nxt.add_argument("--names", action="store_true", help="names only, one line (for a shell command line)")
    rec = sub.add_parser("record", help="add results files to the ledger")
    rec.add_argument("results", nargs="+", type=Path)
    rec.add_argument("--commit", help="the commit the results were measured at (default: HEAD)")
    rec.add_argument("--gpu", help="the GPU to record them under (default: the one the results name)")
    sub.add_parser("show", help="the ledger, a line per entry")
    ap.add_argument("--ledger", type=Path, default=LEDGER)
    args = ap.parse_args(argv)
    ledger = load(args.ledger)
    if args.command == "next":
        gpu = this_gpu() if args.gpu == "auto" else args.gpu
        order = next_cases(ledger, gpu, args.kind)
        if args.names:
            print(" ".join(name for name, _ in order))
        else:
            for name, why in order:
                print(f"{name:24s} {why}")
    elif args.command == "record":
        commit = args.commit or git_commit()
        for path in args.results:
            n = record(ledger, json.loads(path.read_text()), commit=commit, gpu=args.gpu)
            print(f"{path}: {n} case(s) recorded")
        save(ledger, args.ledger)
    else:
        for e in ledger["entries"]:
            print(f"{e['kind']:10s} {e['case']:24s} {e['gpu']:12s} {e.get('date')} {e.get('status')} "
                  f"{json.dumps(e.get('figures', {}))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
