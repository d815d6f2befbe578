"""Plain PyTorch, also every framework's fallback: its rows of the knob catalogue and how the
simulator spells its settings."""

from __future__ import annotations

from gpuprof.frameworks._knob import (
    _EVAL,
    _K,
    _LEN,
    _SAVE,
    _UNUSED,
    _WORKERS,
    KnobEntry,
)

KNOBS: tuple[KnobEntry, ...] = (
    _K("pytorch", "update_bound", "compile", "torch.compile", "", "set", True, None, 0.3,
       "The update turns little of the GPU's peak into model FLOPs; torch.compile fuses the "
       "small kernels of a thin micro-batch (and check offload and gradient checkpointing, "
       "listed in the evidence, are needed)."),
    _K("pytorch", "rollout_bound", "batch", "generation_batch_size", "", "multiply", 2, None,
       0.4,
       "{knob}={current}: each decode step reads all weights for few sequences; {suggested} "
       "shares those reads over more tokens (or generate with an inference engine such as "
       "vLLM, whose paged KV cache batches continuously)."),
    _K("pytorch", "unused_gpu", "gpus", "nproc_per_node", "", "gpus_per_host", 1, 1, 0.9,
       _UNUSED),
    _K("pytorch", "idle_allocation", "timeout", "init_process_group.timeout", "", "set",
       "timedelta(minutes=10)", None, 0.5,
       "The job held its GPUs idle for minutes with nothing running: a hung collective or a "
       "wait on storage or a service. A collective timeout of {suggested} (with "
       "TORCH_NCCL_ASYNC_ERROR_HANDLING=1) makes a hang fail fast instead of holding the "
       "allocation; the evidence intervals show when it happened."),
    _K("pytorch", "reshard_idle", "bucket", "weight_sync_bucket_mb", "", "multiply", 4, 64, 0.4,
       "{knob}={current}: a hand-written weight sync that sends tensors one by one pays a "
       "launch and sync per tensor; flatten them into {suggested} MB buckets."),
    _K("pytorch", "pipeline_bubble", "async", "async_rollout", "", "set", True, False, 0.4,
       "{knob}={current}: generation and training GPUs take turns; overlapping the next "
       "rollout with the current update ({suggested}, one step off-policy) fills the bubble."),
    _K("pytorch", "dataloader_starvation", "workers", "num_workers", "", "workers", 4, 0, 0.7,
       _WORKERS),
    _K("pytorch", "dataloader_starvation", "pin_memory", "pin_memory", "", "set", True, False,
       0.1,
       "DataLoader {knob}={current}: host-to-device copies go through pageable memory; "
       "{suggested} allows asynchronous copies (with .to(device, non_blocking=True))."),
    _K("pytorch", "reward_bound", "reward_workers", "ProcessPoolExecutor.max_workers", "",
       "workers", 4, 1, 0.5,
       "Reward scoring runs on one CPU core while every GPU waits; score the batch in a "
       "process pool of {suggested} workers (or overlap it with the log-prob pass)."),
    _K("pytorch", "generation_tail", "max_len", "max_new_tokens", "", "cap_length", 4, None,
       0.4, _LEN),
    _K("pytorch", "memory_headroom", "batch", "batch_size", "", "multiply", 2, None, 0.4,
       "{knob}={current}: peak memory stays well below the GPU's; {suggested} uses it for "
       "more samples per step."),
    _K("pytorch", "offload_thrash", "offload", "CPUOffload.offload_params", "", "set", False,
       False, 0.6,
       "FSDP {knob}={current}: parameters cross PCIe every step; {suggested} keeps them on "
       "the GPU when memory allows."),
    _K("pytorch", "comm_bound", "bucket", "DistributedDataParallel.bucket_cap_mb", "",
       "multiply", 4, 25, 0.3,
       "{knob}={current}: many small all-reduces; {suggested} MB buckets use the links "
       "better and overlap with backward."),
    _K("pytorch", "comm_bound", "grad_accum", "gradient_accumulation_steps", "", "multiply", 2,
       1, 0.3,
       "{knob}={current}: gradients are reduced every micro-batch; {suggested} steps with "
       "no_sync() between reductions halve the traffic per sample."),
    _K("pytorch", "host_bound", "compile", "torch.compile.mode", "", "set", "reduce-overhead",
       None, 0.5,
       "The GPU waits on Python and kernel launches; torch.compile(mode='{suggested}') fuses "
       "kernels and replays them as CUDA graphs."),
    _K("pytorch", "host_bound", "batch", "batch_size", "", "multiply", 2, None, 0.3,
       "{knob}={current}: small batches leave the GPU waiting on launches; {suggested} "
       "amortises them."),
    _K("pytorch", "imbalance", "balance", "batch_sampler", "", "set", "token-balanced", None,
       0.4,
       "Ranks get batches of uneven token counts and the rest wait for the straggler; a "
       "{suggested} sampler gives every rank a similar token count."),
    _K("pytorch", "throttling", "power", "nvidia-smi --power-limit", "", "set",
       "the board's default limit", None, 0.5,
       "Clocks drop under power or thermal limits; restore {suggested} and check the node's "
       "cooling (the throttled GPUs are in the evidence)."),
    _K("pytorch", "phantom_util", "reset", "nvidia-smi --gpu-reset -i", "", "set",
       "the GPUs in the evidence", None, 0.9,
       "These GPUs read busy with no memory and no process: a stuck context or engine left "
       "by a killed job, not work. Reset {suggested} once nothing runs on them (stop "
       "nvidia-persistenced first, or reboot the node if the reset is refused), check "
       "`journalctl -k | grep Xid`, and drain the node until they read 0 %."),
    _K("pytorch", "hot_gpu", "cooling", "node cooling (fans, airflow)", "", "set",
       "inspected", None, 0.6,
       "One GPU runs far hotter than its peers at the same load, so its clocks drop and "
       "every rank waits for it: have its fans, heat sink and airflow {suggested} (`nvidia-smi "
       "-q -d TEMPERATURE,PERFORMANCE` shows its slowdown temperature and clock-event "
       "reasons), or move the job off that GPU."),
    _K("pytorch", "power_cap", "power", "nvidia-smi -pl", "", "set",
       "the board's default limit", None, 0.5,
       "The GPUs sit at their power limit and the SW power cap holds their clocks down; "
       "`nvidia-smi -q -d PERFORMANCE,POWER` shows the limit and the cap. Where the limit "
       "was lowered, restore {suggested}; at the default, the work is power-bound "
       "(lower precision or fewer wasted FLOPs help, a higher limit needs the rack's budget)."),
    _K("pytorch", "periodic_stall", "save", "save_every", "", "less_often", 4, None, 0.5,
       _SAVE),
    _K("pytorch", "periodic_stall", "eval", "eval_every", "", "less_often", 4, None, 0.3,
       _EVAL),
    _K("pytorch", "idle_unattributed", "logging", "log_every", "", "multiply_in_step", 10, 1, 0.3,
       "{knob}={current}: per-step logging calls .item() and syncs the GPU; every {suggested} "
       "steps does it less often (wrap unexplained code in a gpuprof phase to find the rest)."),
)  # fmt: skip
"""The knob catalogue's rows for this framework (see `gpuprof.analyzers.knobs`)."""


SIM_FLAGS: dict[str, str] = {
    "train_batch_size": "batch_size",
    "max_response_length": "max_new_tokens",
    "dataloader_num_workers": "num_workers",
    "save_freq": "save_every",
}
"""The simulator's generic settings → this framework's flag."""


SIM_ENTRY: tuple[str, ...] = ("torchrun", "train_grpo.py")
"""The start of the launch command the simulator writes."""
