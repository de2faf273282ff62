"""Preprocessing throughput: whole `recipeforge preprocess` processes and the in-process pipeline.

The workload is the one users compare with Axolotl's `preprocess`: synthetic alpaca rows of 20-400 words,
sequence_len 512 with packing, ChatML. For each `--num-proc` it spawns `python -m recipeforge preprocess`
on a generated recipe with an empty cache folder `--runs` times and reports the fastest whole-process
wall time (imports, reading, rendering, tokenizing, masking, packing, writing the cache) with tokens/s;
then it times `prepare_lm_data` in this process (no cache) and reports packing and padding figures.

Tokenizers (all offline): ``tiny:llama`` (the built-in 1,024-token BPE, trained on the very words the rows
are made of: about one token per word, a small vocabulary), ``bpe32k`` (a 32,000-token byte-level BPE
trained once on the documentation found on this machine, kept under ~/.cache/recipeforge-bench: a real
model's vocabulary size and per-token cost), or a local tokenizer directory.

    python bench/preprocess.py                                  # 20k rows, tiny:llama and bpe32k
    python bench/preprocess.py --tokenizer bpe32k --num-proc 1 2 auto --runs 5
    python bench/preprocess.py --scaling 20000 200000 1000000     # cost per row and peak RSS as rows grow
    python bench/preprocess.py --scaling 20000 200000 --streamed  # the same rows as a stream too

Whole-process figures come with the process's CPU time (user + system, forked workers included; the least of the
runs): on a shared machine other processes stretch wall times far more than CPU times, so compare those there.

`--scaling` runs one whole `recipeforge preprocess` per row count (num_proc 1, the first tokenizer, a cold
cache) and prints wall and CPU time, time per row, the process's peak resident memory (its own rusage) and its
peak anonymous resident memory (RssAnon: without the pages of memory-mapped files, which the kernel can
drop), so a cost that grows faster than the rows, or memory that grows with them, shows.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORDS = ("the a cow dog cat duck sheep says moo woof meow quack what does is of and to in on with one two three "
         "four five six seven eight nine ten answer question count add plus equals color red blue green apple "
         "banana cherry grape lemon fruit water sun moon tree house car road city world day night").split()
BPE_DIR = Path.home() / ".cache" / "recipeforge-bench" / "bpe32k"


def synthetic_rows(n: int, seed: int = 0) -> list[dict]:
    """Alpaca rows of 20-400 words: a short instruction, sometimes an input, the rest the output."""
    rng = random.Random(seed)

    def text(k: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(k)).capitalize() + "."

    rows = []
    for _ in range(n):
        total = rng.randint(20, 400)
        instruction = rng.randint(4, min(40, total // 2))
        given = rng.randint(0, total // 4) if rng.random() < 0.4 else 0
        rows.append({"instruction": text(instruction), "input": text(given) if given else "",
                     "output": text(max(1, total - instruction - given))})
    return rows


def bpe32k() -> Path:
    """A 32k-token byte-level BPE (GPT/Llama-3 style) trained once on the documentation found on this machine."""
    if (BPE_DIR / "tokenizer.json").is_file():
        return BPE_DIR
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    def corpus(limit: int = 40 << 20):
        import sysconfig

        seen = 0
        for base in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]):
            for path in sorted(Path(base).rglob("*")):
                if path.suffix not in (".md", ".txt", ".rst") or not path.is_file():  # prose: docs, READMEs
                    continue
                try:
                    text = path.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                yield text
                seen += len(text)
                if seen > limit:
                    return

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=32_000, special_tokens=specials,
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                          show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|pad|>",
                                   bos_token="<|endoftext|>", additional_special_tokens=["<|im_start|>"])
    BPE_DIR.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=BPE_DIR.parent))
    fast.save_pretrained(str(tmp))
    os.replace(tmp, BPE_DIR)
    return BPE_DIR


def write_workload(folder: Path, rows: int, sequence_len: int, tokenizer: str, num_proc, *,
                   streaming: bool = False) -> Path:
    """The data file and the recipe `recipeforge preprocess` runs on (`streaming`: read as a stream)."""
    data = folder / "alpaca.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows(rows)))
    tok = str(bpe32k()) if tokenizer == "bpe32k" else tokenizer
    recipe = folder / f"bench-{num_proc}.yaml"
    recipe.write_text(
        "stage: sft\n"
        f"model: {{name_or_path: 'tiny:llama', tokenizer: '{tok}'}}\n"
        f"data: {{datasets: [{{path: {data}, format: alpaca}}], sequence_len: {sequence_len}, "
        f"packing: true, chat_template: chatml, num_proc: {num_proc}, streaming: {str(streaming).lower()}}}\n"
        "train: {max_steps: 1, global_batch_size: 8}\n")
    return recipe


def whole_process(recipe: Path, runs: int, tree: Path = ROOT) -> tuple[float, dict, float]:
    """Fastest wall time of `python -m recipeforge preprocess` (the recipeforge of `tree`) with a cold cache, its
    statistics, and the least CPU time (user + system, its forked workers included) of the runs: on a shared
    machine other processes stretch the wall time, much less the CPU time."""
    import resource

    best, stats, cpu = float("inf"), {}, float("inf")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as cache:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "recipeforge", "preprocess", str(recipe),
                                  f"data.cache_dir={cache}"], capture_output=True, text=True, env=env,
                                 cwd=tree)  # `-m` puts the working directory first on sys.path
            seconds = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if out.returncode != 0:
            raise SystemExit(out.stderr[-2000:])
        cpu = min(cpu, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if seconds < best:
            best, stats = seconds, json.loads(out.stdout[out.stdout.index("{"):])
    return best, stats, cpu


def scaled_rows(n: int, pool: int = 20_000) -> list[dict]:
    """`n` distinct rows: the synthetic pool repeated, each copy's output ending in its own number (the
    pipeline drops duplicate rows), so generating a million rows costs seconds, not minutes."""
    base = synthetic_rows(min(n, pool))
    return [{**r, "output": f"{r['output']} {i // len(base)}"} if i >= len(base) else r
            for i, r in ((i, base[i % len(base)]) for i in range(n))]


def peak_rss_run(cmd: list[str], env: dict, cwd: Path) -> tuple[float, int, str, int, int, float]:
    """Run `cmd`; its wall seconds, exit code, stdout, peak resident memory in KiB (this child's own
    rusage, from wait4, not the maximum over every child so far), peak anonymous resident memory in
    KiB (RssAnon, sampled from /proc every 50 ms: the memory the process holds, without the pages of
    memory-mapped files, which the kernel can drop; 0 where /proc has no such line) and its CPU seconds
    (user + system, from the same rusage)."""
    import threading

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=cwd)
    peak_anon = [0]

    def sample() -> None:
        status = Path(f"/proc/{proc.pid}/status")
        while proc.returncode is None:
            try:
                line = next((x for x in status.read_text().splitlines() if x.startswith("RssAnon:")), "")
            except OSError:
                return
            if line:
                peak_anon[0] = max(peak_anon[0], int(line.split()[1]))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    sampler.join()
    return (time.perf_counter() - t0, proc.returncode, out, usage.ru_maxrss, peak_anon[0],
            usage.ru_utime + usage.ru_stime)


def scaling(counts: list[int], tokenizer: str, sequence_len: int, tree: Path, *, streamed: bool = False) -> list[dict]:
    """One cold whole-process preprocess per row count (`streamed`: one pass over the same rows as a stream,
    `data.streaming`, in a process of its own, see `stream_pass`): seconds, microseconds per row, peak RSS."""
    table = []
    env = {**os.environ, "PYTHONPATH": str(tree)}
    for n in counts:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            with open(folder / "alpaca.jsonl", "w") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in scaled_rows(n))
            recipe = write_workload(folder, n, sequence_len, tokenizer, 1, streaming=streamed)
            cmd = ([sys.executable, str(Path(__file__).resolve()), "--stream-pass", str(recipe)] if streamed else
                   [sys.executable, "-m", "recipeforge", "preprocess", str(recipe), f"data.cache_dir={folder / 'cache'}"])
            seconds, code, out, rss_kib, anon_kib, cpu = peak_rss_run(cmd, env, tree)
            if code != 0:
                raise SystemExit(f"{'the streamed pass over' if streamed else 'preprocess of'} {n} rows failed "
                                 f"(exit {code})")
            stats = json.loads(out[out.index("{"):])
        pipeline = stats["seconds"] if streamed else stats["preprocess_seconds"]
        table.append({"rows": n, "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1),
                      "us_per_row": round(seconds / n * 1e6, 1), "pipeline_us_per_row": round(pipeline / n * 1e6, 1),
                      "tokens": stats["tokens" if streamed else "train_tokens"], "peak_rss_mib": round(rss_kib / 1024),
                      "peak_anon_rss_mib": round(anon_kib / 1024)})
    return table


def stream_pass(recipe: Path) -> dict:
    """Read one whole pass of a streamed recipe's training stream as training would (one process, every
    window tokenized and packed, the next one made in a thread): rows, sequences, tokens and seconds."""
    from recipeforge.components.tokenizer import load_tokenizer, set_chat_template
    from recipeforge.config import load_recipe
    from recipeforge.stages.streamed_data import training_stream

    loaded = load_recipe(recipe)
    m = loaded.recipe.model
    tok = load_tokenizer(m.tokenizer or m.name_or_path, vocab_size=1024)
    set_chat_template(tok, "chatml", required=True)

    class Context:
        base_dir = recipe.parent

        @staticmethod
        def locate(path):
            return None

    t0 = time.perf_counter()
    stream = training_stream(loaded.recipe, tok, Context, rank=0, world=1)
    sequences = tokens = 0
    for seq in stream:
        if stream.position.passes > 0:
            break
        sequences += 1
        tokens += len(seq["input_ids"])
    return {"rows": stream.position.rows, "sequences": sequences, "tokens": tokens,
            "seconds": time.perf_counter() - t0}


def in_process(recipe: Path, runs: int, micro_batch: int) -> dict:
    """`prepare_lm_data` timed in this process (no cache; fastest of `runs`), with packing figures."""
    from recipeforge.components.collate import LMCollator
    from recipeforge.components.lm_data import prepare_lm_data
    from recipeforge.components.tokenizer import load_tokenizer, set_chat_template
    from recipeforge.config import load_recipe

    loaded = load_recipe(recipe)
    m = loaded.recipe.model
    tok = load_tokenizer(m.tokenizer or m.name_or_path, vocab_size=1024)
    set_chat_template(tok, "chatml", required=True)
    best, lm = float("inf"), None
    for _ in range(runs):
        t0 = time.perf_counter()
        lm = prepare_lm_data(loaded.recipe, tok, base_dir=recipe.parent, use_cache=False)
        best = min(best, time.perf_counter() - t0)
    collate = LMCollator(tok.pad_token_id, packed=True)
    rows = lm.train
    for start in range(0, len(rows), micro_batch):
        collate([rows[j] for j in range(start, min(start + micro_batch, len(rows)))])
    return {"seconds": best, "stats": lm.stats, "padding": collate.counter.take()["padding_share"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--sequence-len", type=int, default=512)
    ap.add_argument("--tokenizer", nargs="+", default=["tiny:llama", "bpe32k"],
                    help="tiny:llama, bpe32k or a local tokenizer directory (several: one report each)")
    ap.add_argument("--num-proc", nargs="+", default=["1", "2"], help="data.num_proc values to time (or auto)")
    ap.add_argument("--runs", type=int, default=3, help="runs per figure; the fastest is reported")
    ap.add_argument("--micro-batch", type=int, default=8, help="rows per batch when measuring padding")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--tree", type=Path, default=ROOT,
                    help="source tree the spawned processes run (e.g. a git worktree of an older commit, to compare)")
    ap.add_argument("--no-in-process", action="store_true", help="whole-process figures only")
    ap.add_argument("--scaling", type=int, nargs="+", metavar="ROWS",
                    help="time per row and peak RSS of one preprocess per row count (see the module docstring)")
    ap.add_argument("--streamed", action="store_true",
                    help="with --scaling: also one pass over the same rows as a stream (data.streaming)")
    ap.add_argument("--stream-pass", type=Path, metavar="RECIPE", help=argparse.SUPPRESS)  # --streamed's child
    args = ap.parse_args(argv)
    if args.stream_pass:
        print(json.dumps(stream_pass(args.stream_pass)))
        return 0
    if args.scaling:
        tables = {"cached": scaling(args.scaling, args.tokenizer[0], args.sequence_len, args.tree)}
        if args.streamed:
            tables["streamed"] = scaling(args.scaling, args.tokenizer[0], args.sequence_len, args.tree, streamed=True)
        if args.json:
            print(json.dumps(tables, indent=2))
            return 0
        for name, table in tables.items():
            print(f"{name}: " + ("`recipeforge preprocess`, cold cache" if name == "cached"
                                 else "one pass over the stream, tokenized and packed a window at a time"))
            print(f"{'rows':>9} {'wall s':>8} {'CPU s':>7} {'us/row':>8} {'pipeline us/row':>16} {'tokens':>13} "
                  f"{'peak RSS MiB':>13} {'anon RSS MiB':>13}")
            for r in table:
                print(f"{r['rows']:>9,} {r['seconds']:>8.1f} {r['cpu_seconds']:>7.1f} {r['us_per_row']:>8.1f} "
                      f"{r['pipeline_us_per_row']:>16.1f} {r['tokens']:>13,} {r['peak_rss_mib']:>13,} "
                      f"{r['peak_anon_rss_mib']:>13,}")
        return 0

    report = []
    with tempfile.TemporaryDirectory() as tmp:
        for tokenizer in args.tokenizer:
            folder = Path(tmp) / tokenizer.replace("/", "_").replace(":", "_")
            folder.mkdir()
            entry = {"tokenizer": tokenizer, "rows": args.rows, "sequence_len": args.sequence_len, "whole": {}}
            for num_proc in args.num_proc:
                seconds, stats, cpu = whole_process(write_workload(folder, args.rows, args.sequence_len, tokenizer,
                                                                   num_proc), args.runs, args.tree)
                entry["whole"][num_proc] = {"seconds": round(seconds, 2), "cpu_seconds": round(cpu, 2),
                                            "tokens": stats["train_tokens"],
                                            "tokens_per_second": round(stats["train_tokens"] / seconds)}
            report.append(entry)
            if args.no_in_process:
                continue
            inner = in_process(write_workload(folder, args.rows, args.sequence_len, tokenizer, args.num_proc[-1]),
                               args.runs, args.micro_batch)
            entry["in_process"] = {"num_proc": args.num_proc[-1], "seconds": round(inner["seconds"], 2),
                                   "tokens_per_second": round(inner["stats"]["train_tokens"] / inner["seconds"]),
                                   "packed_sequences": inner["stats"]["packed_sequences"],
                                   "packing_efficiency": inner["stats"]["packing_efficiency"],
                                   "padding_share": round(inner["padding"], 4)}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for e in report:
        tokens = next(iter(e["whole"].values()))["tokens"]
        print(f"{e['tokenizer']}: {e['rows']} alpaca rows, sequence_len {e['sequence_len']}, packed, "
              f"{tokens:,} tokens (fastest of {args.runs})")
        for num_proc, w in e["whole"].items():
            print(f"  whole process, num_proc {num_proc:<4}  {w['seconds']:6.2f} s  "
                  f"{w['tokens_per_second']:>10,} tokens/s  CPU {w['cpu_seconds']:6.2f} s  "
                  f"(python -m recipeforge preprocess, cold cache)")
        i = e.get("in_process")
        if i is None:
            continue
        print(f"  in process,    num_proc {i['num_proc']:<4}  {i['seconds']:6.2f} s  "
              f"{i['tokens_per_second']:>10,} tokens/s  (read + render + tokenize + mask + pack)")
        print(f"  packing: {i['packed_sequences']} sequences, efficiency {i['packing_efficiency']:.2%}, "
              f"padding share {i['padding_share']:.2%} (batches of {args.micro_batch})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
