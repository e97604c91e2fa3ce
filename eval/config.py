"""The evaluator's settings: one recipe under recipes/eval/, overridable per key."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EvalConfig:
    """Streaming evaluation of one model on one benchmark."""

    model: str = field(default="smollm2", metadata={"help": "Model: embedded name, hub id, local dir, .gguf or adapter dir."})
    adapter: str | None = field(default=None, metadata={"help": "Optional LoRA adapter directory applied to `model`."})
    benchmark: str = field(default="humaneval", metadata={"help": "Benchmark name (see eval.benchmarks.BENCHMARKS)."})
    data_path: str | None = field(default=None, metadata={"help": "Local copy of the benchmark data instead of its default source."})
    limit: int | None = field(default=None, metadata={"help": "Evaluate only the first N requests (with n >= 2 segments)."})
    acceptance: str = field(default="greedy", metadata={"help": "Acceptance rule: 'greedy' (lossless) or 'threshold:TAU'."})
    max_new_tokens: int = field(default=256, metadata={"help": "Answer length cap, the same for baseline and stream."})
    engine: str = field(default="auto", metadata={"help": "AR: 'stepwise', or 'fast'/'auto' (drafting batched across requests; same numbers); 'refusion' (slot plan-and-infill) or 'bidirectional' (full-attention control)."})
    system_prompt: str = field(default="model", metadata={"help": "'model' (the template's own), 'incomplete' (adapted models) or literal text."})
    slot_size: int = field(default=8, metadata={"help": "refusion: tokens per slot; the answer buffer is max_new_tokens rounded up to whole slots."})
    serial_blocks: int = field(default=4, metadata={"help": "refusion: the answer buffer is split into this many blocks, decoded in turn."})
    slot_threshold: float = field(default=0.9, metadata={"help": "refusion: slots whose first-token probability exceeds this are drafted together (else the most confident one)."})
    token_threshold: float = field(default=0.9, metadata={"help": "refusion: a drafted slot token is kept when its causal probability exceeds this."})
    draft_in_context: bool = field(default=False, metadata={"help": "refusion: the held draft also precedes the answer as context (models trained on draft-refinement rows)."})
    diffusion_steps: int = field(default=64, metadata={"help": "bidirectional: denoising steps (forwards) for a full answer buffer; a residue takes its share."})
    fast_batch_size: int = field(default=32, metadata={"help": "Fast path batch: prefixes decoded together (greedy), or requests per round (other rules)."})
    sandbox_cpu_seconds: int | None = field(default=None, metadata={"help": "CPU-time limit of each executed program; default the benchmark's own."})
    device: str | None = field(default=None, metadata={"help": "Torch device; default cuda when available, else cpu."})
    dtype: str | None = field(default=None, metadata={"help": "Torch dtype name; default bfloat16 on GPU, float32 on CPU."})
    benchmarks: list[str] = field(default_factory=list, metadata={"help": "Suite: benchmarks run in turn into one report (empty: just `benchmark`)."})
    data_paths: dict[str, str] = field(default_factory=dict, metadata={"help": "Suite: local data per benchmark name (the suite's `data_path`s)."})
    acceptances: list[str] = field(default_factory=list, metadata={"help": "Suite: acceptance rules run in turn (empty: just `acceptance`)."})
    report_only: bool = field(default=False, metadata={"help": "Suite: rebuild the report from the results already written (requests every rule has finished); compute nothing."})
    output_dir: str | None = field(default=None, metadata={"help": "Where results.jsonl and summary.json go; default outputs/eval/<benchmark>-<model>-<acceptance>."})
