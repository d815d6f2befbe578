#!/usr/bin/env bash
# The checks that need a real NVIDIA GPU, in one go, from the repository root:
#
#     bash benchmarks/real_gpu_check.sh OUTDIR
#
# 1. what the NVML collector reads from the real driver (probe_nvml_fields.py);
# 2. how late NVML's utilisation and GPM's SM activity see work (probe_nvml_lag.py);
# 3. `gpuprof watch` of the GRPO example on the GPU, with `nvidia-smi --query-gpu` logging
#    beside it at 100 ms; then `analyze` (text and JSON), `report`, and `import` of the
#    nvidia-smi log, so the live collector and nvidia-smi can be compared on the same run;
# 4. the step-time overhead of watching that run (bench_watch_overhead.py --real-nvml).
#
# Everything lands in OUTDIR (the run directory as gpurun.tgz). Each step has its own time
# limit, so one that hangs costs only its own figures. Not run in CI.
set -u
out=${1:?usage: real_gpu_check.sh OUTDIR}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
example="examples/grpo_tiny.py --device cuda --d-model 1024 --layers 8 --heads 16
  --batch-size 64 --group-size 8 --num-digits 8 --max-new-tokens 16 --reward-cost 0.05"

step() { echo "== $(date +%T) $*"; }

step "machine"
nvidia-smi -q >"$out/nvidia-smi-q.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max \
  --format=csv
$py -c "import torch, pynvml; print('torch', torch.__version__, torch.cuda.is_available())"

step "1. NVML fields"
timeout 60 $py benchmarks/probe_nvml_fields.py --seconds 12 --out "$out/nvml_fields.json" \
  >/dev/null 2>"$out/nvml_fields.err"
echo "rc=$?"

step "2. NVML lag"
timeout 60 $py benchmarks/probe_nvml_lag.py --bursts 6 >"$out/nvml_lag.txt" 2>&1
echo "rc=$?"
tail -5 "$out/nvml_lag.txt"

step "3. watch the GRPO example on the GPU"
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,utilization.memory,memory.used,memory.total,power.draw,clocks.sm,temperature.gpu \
  --format=csv -lms 100 >"$out/nvidia-smi.csv" 2>&1 &
smi=$!
rm -rf /tmp/gpurun /tmp/smirun
# shellcheck disable=SC2086
timeout 240 $py -m gpuprof watch -o /tmp/gpurun -- $py $example --steps 40 >"$out/watch.txt" 2>&1
echo "watch rc=$?"
kill "$smi"
tail -25 "$out/watch.txt"
timeout 120 $py -m gpuprof analyze /tmp/gpurun --json >"$out/analyze.json" 2>"$out/analyze.err"
echo "analyze --json rc=$?"
timeout 120 $py -m gpuprof analyze /tmp/gpurun >"$out/analyze.txt" 2>&1
timeout 120 $py -m gpuprof report /tmp/gpurun -o "$out/report.html" >"$out/report.txt" 2>&1
echo "report rc=$?"
timeout 120 $py -m gpuprof import "$out/nvidia-smi.csv" -o /tmp/smirun >"$out/import.txt" 2>&1
echo "import rc=$?"
timeout 120 $py -m gpuprof analyze /tmp/smirun --json >"$out/smi_analyze.json" 2>&1
tar czf "$out/gpurun.tgz" -C /tmp gpurun

step "4. overhead of watching it"
# shellcheck disable=SC2086
timeout 300 $py benchmarks/bench_watch_overhead.py --real-nvml --pairs 3 --steps 20 \
  --example-args "$(echo $example | cut -d' ' -f2-)" >"$out/overhead.txt" 2>&1
echo "rc=$?"
cat "$out/overhead.txt"
step "done"
