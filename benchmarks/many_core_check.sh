#!/usr/bin/env bash
# The checks that need a machine of many cores (the GPU machine's 16), in one go, from the
# repository root:
#
#     bash benchmarks/many_core_check.sh OUTDIR [WORKERS]
#
# 1. one NVML tick per GPU on the real driver, after the collector stopped calling
#    nvmlDeviceGetSamples at close ticks (probe_nvml_fields.py; skipped without a GPU);
# 2. the cluster-day (1 024 GPUs, 24 copies of a simulated hour, GPUs sampled once a second:
#    bench_analyze_scale.py, its host files written WORKERS at a time);
# 3. `analyze --json` of it on WORKERS workers: the first (which keeps the merged form file by
#    file) and then from the kept form (bench_analyze_parallel.py --kept-only --first);
# 4. from the kept form on 8 and on 4 workers, for the per-core slope;
# 5. stretch by stretch (`--by-steps 24`) on WORKERS workers, the path within 2 GB;
# 6. where the time of `analyze` from the kept form goes on WORKERS workers
#    (bench_parts_parent.py: reading, making the parts, the parts' calls, the parent alone),
#    the parent's stacks recorded by py-spy where it is installed (parent.txt, raw).
#
# STEPS="2 3 6" runs those steps alone (1-5 by default; the machine's figures always).
# Figures land in OUTDIR. Each step has its own time limit, so one that runs long costs only
# its own figures. Not run in CI.
set -u
out=${1:?usage: many_core_check.sh OUTDIR [WORKERS]}
workers=${2:-16}
# a smaller run to try the script on first: GPUS=64 HOURS=2 bash ...
gpus=${GPUS:-1024}
hours=${HOURS:-24}
steps=" ${STEPS:-1 2 3 4 5} "
want() { [[ "$steps" == *" $1 "* ]]; }
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
day=/tmp/gpuprof-day-many
step() { echo "== $(date +%T) $*"; }

step "machine"
nproc
free -g | head -2
$py -c "import sys, pandas, pyarrow, numpy; print(sys.version.split()[0], 'pandas', pandas.__version__, 'pyarrow', pyarrow.__version__, 'numpy', numpy.__version__)"
$py setup.py -q build_ext --inplace >"$out/build.txt" 2>&1
echo "build rc=$?"

if want 1; then
step "1. one NVML tick per GPU"
if command -v nvidia-smi >/dev/null; then
  timeout 60 $py benchmarks/probe_nvml_fields.py --seconds 6 --out "$out/nvml_fields.json" \
    >/dev/null 2>"$out/nvml_fields.err"
  echo "rc=$?"
fi
fi

if want 2; then
step "2. write the cluster-day"
timeout 240 $py benchmarks/bench_analyze_scale.py --gpus "$gpus" --hours "$hours" --interval 1 \
  --write-only --dir "$day" --jobs "$workers" 2>&1 | tee "$out/write.txt"
du -sh "$day/${hours}h"
fi

if want 3; then
step "3. analyze: first, then kept, on $workers workers"
timeout 300 $py benchmarks/bench_analyze_parallel.py --run "$day/${hours}h" --kept-only --first \
  --workers "$workers" --repeats 1 --dir /tmp/gpuprof-par-many \
  --save-json "$out/day.json" 2>&1 | tee "$out/analyze_$workers.txt"
fi

if want 4; then
step "4. analyze from the kept form on 8 and 4 workers"
timeout 200 $py benchmarks/bench_analyze_parallel.py --run "$day/${hours}h" --kept-only \
  --workers 8 4 --repeats 1 --dir /tmp/gpuprof-par-many \
  --save-json "$out/day_8.json" 2>&1 | tee "$out/analyze_8_4.txt"
fi

if want 5; then
step "5. stretch by stretch on $workers workers"
timeout 200 $py benchmarks/bench_analyze_steps.py --dir "$day/${hours}h" --steps --by-steps 24 \
  --no-whole --workers "$workers" --repeats 1 2>&1 | tee "$out/by_steps.txt"
fi

if want 6; then
step "6. where the time of analyze from the kept form goes, on $workers workers"
if command -v py-spy >/dev/null; then  # its figures as the benchmark's parent prints them
  timeout 200 py-spy record --nonblocking --format raw --rate 40 -o "$out/parent.txt" -- \
    "$(command -v "$py")" benchmarks/bench_parts_parent.py "$day/${hours}h" \
    --workers "$workers" --inner 2>&1 | tee "$out/parent.log"
else
  timeout 200 $py benchmarks/bench_parts_parent.py "$day/${hours}h" --workers "$workers" 2>&1 \
    | tee "$out/parent.log"
fi
fi

for f in "$out"/day*.json; do [ -f "$f" ] && sha256sum "$f"; done
step "done"
