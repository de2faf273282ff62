#!/usr/bin/env bash
# Every GPU check in one command, inside a fixed allowance of seconds, for a GPU machine lent for minutes:
# `pytest -m gpu` beside the suite (bench/gpu/suite.py), then the throughput comparison with TRL
# (bench/gpu/throughput.py) with what time is left. Results land in OUT before the allowance ends.
#
#   bash bench/gpu/lease.sh OUT SECONDS [--cases C ...] [--throughput C ...] [--pytest TEST ...]
#
# Packages the machine lacks travel as wheels in .whl/ (see ../shared/gpu/wheels.sh); DeepSpeed ships as an
# sdist, built in the background while the first cases run (its cases come late in the suite's order).
# Without --cases / --throughput, the cases run in the order bench/gpu/ledger.py gives for this GPU: never
# measured first, then failed, then changed since measured (LEASE_GPU names the GPU on a machine without one).
# OUT receives, each rewritten as soon as a case finishes (a lease cut short keeps what ran): gpu-DATE.json/.md
# (suite), gpu-throughput-DATE.json; at the end pytest-gpu.txt, lease.log and logs.tar.gz (each run's stderr,
# plan and metrics; no weights). Afterwards: python bench/gpu/ledger.py record OUT/gpu-*.json.
#
# Sizing (bench/results/gpu-2026-11-26-H200.json, gpu-2026-11-28-H100.json): a machine's start took from
# 30 s to over 5 minutes of the lease; setup takes 20-30 s; a case reaches its first step 30-45 s after
# its launch (an 8B's random init is made on the GPU in about a second) and takes 60-110 s in all, the 8B
# LoRA/QLoRA ones with 20 s to write their random base. Order the cases by what is least known, give one
# call everything the lease has left, and pass BENCH_COMMIT (the copy sent may carry other history).
# A case that has not ended in 8 minutes hangs: it is stopped with its processes and recorded as failed (exit
# 124, bench/gpu/common.py CASE_TIMEOUT_S), and the suite goes on.
# LEASE_SMOKE=1 rehearses the whole lease on a CPU (tests/rehearsal): the same scripts and cases at the
# scripts' --smoke sizes (common.py: tiny shapes, sequence 256, SMOKE_ROWS rows, two micro batches a step),
# 5 steps a case instead of 8.
set -u
out=$(realpath -m "${1:?OUT}"); total=${2:?SECONDS}; shift 2
cases=(); tput=(); tests=(-m gpu); tput_given=0
while [ $# -gt 0 ]; do
  case $1 in
    --cases) shift; while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do cases+=("$1"); shift; done ;;
    --pytest) shift; tests=(); while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do tests+=("$1"); shift; done ;;
    --throughput) shift; tput=(); tput_given=1; while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do tput+=("$1"); shift; done ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
start=$(date +%s)
left() { echo $(( total - ($(date +%s) - start) )); }
work=/tmp/gpu-lease
mkdir -p "$out" "$work"
exec > >(tee "$out/lease.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:/tmp/site-ds:$PWD HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
if ls .whl/deepspeed-*.tar.gz >/dev/null 2>&1; then
  (DS_BUILD_OPS=0 python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site-ds \
     .whl/deepspeed-*.tar.gz > "$work/deepspeed-install.txt" 2>&1; echo "deepspeed install: exit $?") &
fi
# The plugins in this repository (kernels.liger comes from one), found through their entry points.
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site plugins/recipeforge-liger \
  > "$work/plugins-install.txt" 2>&1 || echo "[lease] plugin install failed: $(tail -3 "$work/plugins-install.txt")"
[ -z "${LEASE_SMOKE:-}" ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, accelerate, peft, trl, datasets, pydantic, omegaconf; print('torch', torch.__version__, 'cuda', torch.version.cuda)" || exit 1
gpu=${LEASE_GPU:-auto}
if [ ${#cases[@]} -eq 0 ]; then
  read -r -a cases <<< "$(python3 bench/gpu/ledger.py next --gpu "$gpu" --names)" || exit 1
  python3 bench/gpu/ledger.py next --gpu "$gpu"
fi
if [ $tput_given -eq 0 ]; then  # `--throughput` with no names: no throughput comparison
  read -r -a tput <<< "$(python3 bench/gpu/ledger.py next --gpu "$gpu" --kind throughput --names)" || exit 1
fi
echo "[lease] setup done at $(( $(date +%s) - start ))s; suite order: ${cases[*]}; throughput: ${tput[*]}"

# pytest -m gpu (or the tests named, in the order named) trains tiny models only: beside the suite it costs the suite's timings little.
# SIGINT at the allowance: pytest then still prints the failures it has seen.
(timeout -s INT $(( total * 6 / 10 )) python3 -m pytest "${tests[@]}" -q -p no:cacheprovider -o addopts="--import-mode=importlib" \
   -rA --tb=short --timeout 200 > "$out/pytest-gpu.txt" 2>&1; echo "[lease] pytest -m gpu: exit $? at $(( $(date +%s) - start ))s") &
pytest_pid=$!

smoke=(); steps=8
# The scripts themselves on a CPU, tiny shapes. 5 steps: the figures skip the first 3 logged steps
# (common.measured), so 2 remain to time, as on a GPU; a CPU step of the smoke shapes takes seconds.
[ -n "${LEASE_SMOKE:-}" ] && smoke=(--smoke) && steps=5
# The suite starts cases while its share lasts and leaves the throughput comparison 150 s; with no
# throughput case it has the whole allowance (a case takes 40-120 s, so none starts in the last 90 s).
if [ ${#tput[@]} -gt 0 ]; then share=$(( total * 45 / 100 )); reserve=150; else share=$(( total - 90 )); reserve=20; fi
suite_args=("${smoke[@]}" --out "$work/suite" --results "$out" --steps $steps --budget-s $(( share - (total - $(left)) )))
[ ${#cases[@]} -gt 0 ] && suite_args+=(--cases "${cases[@]}")
timeout $(( $(left) - reserve )) python3 bench/gpu/suite.py "${suite_args[@]}"
echo "[lease] suite: exit $? at $(( $(date +%s) - start ))s"

wait $pytest_pid
if [ ${#tput[@]} -gt 0 ] && [ "$(left)" -gt 120 ]; then
  timeout $(( $(left) - 25 )) python3 bench/gpu/throughput.py "${smoke[@]}" --out "$work/throughput" --results "$out" \
    --steps $steps --budget-s $(( $(left) - 130 )) --cases "${tput[@]}"
  echo "[lease] throughput: exit $? at $(( $(date +%s) - start ))s"
fi
cp "$work/deepspeed-install.txt" "$work/suite/" 2>/dev/null
(cd "$work" && tar czf "$out/logs.tar.gz" --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' \
   --exclude='data' --exclude='base_model' $(ls -d suite throughput 2>/dev/null)) 2>/dev/null
echo "[lease] done at $(( $(date +%s) - start ))s"
