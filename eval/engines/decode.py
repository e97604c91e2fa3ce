"""How answers are decoded and drafts verified: one home for the decode settings.

`DecodeSpec` is composed into every config that evaluates (`python -m eval`, the
suite, before/after, the verifier check) as its `decode` section, e.g.
`decode.acceptance=threshold:0.9 decode.regenerate=plain`. It is validated when
the config is built, before any model loads, and the engines read it directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eval.engines.acceptance import AcceptanceRule
from eval.engines.lookup_policy import CHOICES, MATCHES, OCCURRENCES, LookupPolicy
from eval.engines.width_table import AUTO, WidthCost
from headstart.config import check_range

AR_ENGINES = ("auto", "fast", "stepwise")  # the same numbers; auto = fast
DIFFUSION_ENGINES = ("refusion", "bidirectional")
ENGINES = AR_ENGINES + DIFFUSION_ENGINES
REGENERATE_MODES = ("plain", "lookup")
# How a timed phase is clocked on CUDA (eval.engines.clock); here, torch-free, for the config.
TIMING_MODES = ("sync", "events")
# Settings that change the numbers, beyond acceptance, max_new_tokens and regenerate.
LOOKUP_KEYS = ("lookup_match", "lookup_ngram", "lookup_min_ngram", "lookup_block", "lookup_max_block", "lookup_tree",
               "lookup_realign", "lookup_occurrence")
INFILL_KV_MODES = ("splice", "refeed")
DRAFT_END_MODES = ("decode", "verify")
# Upper bounds of the numeric settings, typo guards checked before any model loads: a longer answer
# than any benchmark's, a wider proposal than the width-cost tables measure (256 tokens), a tree of
# more branches than the widest studied here (128), an n-gram longer than any match found here.
MOST_NEW_TOKENS = 32_768
WIDEST_PROPOSAL = 256
MOST_BRANCHES = 256
LONGEST_NGRAM = 64
MOST_DIFFUSION_STEPS = 4_096
DIFFUSION_KEYS = {
    "refusion": ("engine", "slot_size", "serial_blocks", "slot_threshold", "token_threshold", "draft_in_context",
                 "infill_kv", "draft_end"),
    "bidirectional": ("engine", "diffusion_steps"),
}


@dataclass
class DecodeSpec:
    """Decoder, acceptance rule, answer length and regeneration mode of an evaluation,
    and the clock of its timed phases."""

    engine: str = field(
        default="auto",
        metadata={"help": "AR: 'stepwise', or 'fast'/'auto' (drafting batched across requests; same numbers); 'refusion' (slot "
                          "plan-and-infill) or 'bidirectional' (full-attention control)."},
    )
    acceptance: str = field(default="greedy", metadata={"help": "Acceptance rule: 'greedy' (lossless) or 'threshold:TAU'."})
    max_new_tokens: int = field(default=256, metadata={"help": "Answer length cap, the same for baselines and stream."})
    regenerate: str = field(
        default="lookup",
        metadata={"help": "After the accepted prefix: 'lookup' (blocks proposed by n-gram lookup in the held draft, earlier "
                          "drafts and the request, verified in one forward; lossless) or 'plain' (one token per forward, the "
                          "paper's procedure). AR engines only."},
    )
    lookup_match: str = field(
        default="ngram",
        metadata={"help": "lookup: 'ngram' (the first source holding the answer's last n tokens, n = lookup_ngram down to "
                          "lookup_min_ngram) or 'longest' (the occurrence with the longest matching context in any source, "
                          "a suffix automaton; ties by source order)."},
    )
    lookup_ngram: int = field(
        default=3,
        metadata={"help": "lookup: longest n-gram matched (the answer's last n tokens), tried down to 1."},
    )
    lookup_min_ngram: int = field(
        default=1,
        metadata={"help": "lookup: shortest n-gram that may propose (a 1-gram match is often wrong, and a wide forward costs "
                          "more than a step on a CPU)."},
    )
    lookup_block: int = field(
        default=8,
        metadata={"help": "lookup: most tokens proposed per forward (8: the fastest median wall clock on this CPU, "
                          "benchmarks/bench_lookup_policy.py)."},
    )
    lookup_max_block: int = field(
        default=0,
        metadata={"help": "lookup_match=longest: propose twice the matched context's length, from lookup_block up to this "
                          "many tokens (0: always lookup_block)."},
    )
    lookup_tree: int = field(
        default=1,
        metadata={"help": "lookup_match=longest: distinct continuations verified in one forward as a token tree, best "
                          "matching context first (1: one chain; eval/engines/token_tree.py)."},
    )
    lookup_realign: int = field(
        default=0,
        metadata={"help": "lookup_tree > 1: after the context matches, branches that resume a source where the answer's "
                          "last 1..N tokens broke from it, 0..N+1 tokens on (an inserted or renamed token; 0: none)."},
    )
    lookup_occurrence: str = field(
        default="first",
        metadata={"help": "lookup: which occurrence of the n-gram in a source proposes ('first' or 'last')."},
    )
    lookup_choice: str = field(
        default="fixed",
        metadata={"help": "lookup: 'fixed' (verify the proposal lookup_block, lookup_max_block and lookup_tree give) or 'cost' "
                          "(per forward, the tree size and block length up to those with the most tokens per second under "
                          "decode.width_cost, judged on the update's earlier forwards; eval/engines/cost_choice.py)."},
    )
    width_cost: str = field(
        default="",
        metadata={"help": "Seconds of a forward by its width (eval/engines/width_table.py): a table file (python -m "
                          "eval.width_cost writes one), 'auto' (this machine's for the model, measured once into "
                          "outputs/width_cost/), or '' (none: every forward costs a step). For lookup_choice=cost and the "
                          "typing simulation."},
    )
    # ReFusion's slot size and thresholds default to its generate(), the 4 serial
    # blocks to its HumanEval evaluation (which also uses slot_size 32, token_threshold 0.4).
    slot_size: int = field(
        default=8,
        metadata={"help": "refusion: tokens per slot; the answer buffer is max_new_tokens rounded up to whole slots."},
    )
    serial_blocks: int = field(
        default=4,
        metadata={"help": "refusion: the answer buffer is split into this many blocks, decoded in turn."},
    )
    slot_threshold: float = field(
        default=0.9,
        metadata={"help": "refusion: slots whose first-token probability exceeds this are drafted together (else the most "
                          "confident one)."},
    )
    token_threshold: float = field(
        default=0.9,
        metadata={"help": "refusion: a drafted slot token is kept when its causal probability exceeds this."},
    )
    draft_in_context: bool = field(
        default=False,
        metadata={"help": "refusion: the held draft also precedes the answer as context while it is decoded (models trained "
                          "on draft-refinement rows); the verification pass never sees it."},
    )
    infill_kv: str = field(
        default="splice",
        metadata={"help": "refusion: 'splice' (upstream's generate: each infilled slot keeps the KV of its own batch row, so "
                          "slots infilled together never see each other) or 'refeed' (an earlier headstart variant: infilled "
                          "tokens are fed again, in order, at the next forward)."},
    )
    draft_end: str = field(
        default="decode",
        metadata={"help": "refusion: 'decode' (the held draft is verified without its EOS, so the answer's end is always "
                          "decoded: 3 residual forwards at least, as the paper counts ReFusion-8B) or 'verify' (a fully "
                          "accepted draft ends with its EOS: 1 forward at least)."},
    )
    diffusion_steps: int = field(
        default=64,
        metadata={"help": "bidirectional: denoising steps (forwards) for a full answer buffer; a residue takes its share."},
    )
    timing: str = field(
        default="sync",
        metadata={"help": "Wall clock of a timed phase on CUDA (eval.engines.clock): 'sync' (synchronize, then the host clock) "
                          "or 'events' (CUDA events on the stream); the host clock off CUDA."},
    )

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"decode.engine must be one of {', '.join(ENGINES)}, not {self.engine!r}")
        self._check_ranges()
        if self.regenerate not in REGENERATE_MODES:
            raise ValueError(f"decode.regenerate must be one of {', '.join(REGENERATE_MODES)}, not {self.regenerate!r}")
        if self.regenerate == "lookup" and self.engine not in AR_ENGINES:
            raise ValueError(f"decode.regenerate=lookup needs an autoregressive engine; engine={self.engine} "
                             "regenerates by its own decoding: add decode.regenerate=plain")
        if self.lookup_match not in MATCHES:
            raise ValueError(f"decode.lookup_match must be one of {', '.join(MATCHES)}, not {self.lookup_match!r}")
        if self.lookup_max_block and self.lookup_max_block < self.lookup_block:
            raise ValueError(f"decode.lookup_max_block={self.lookup_max_block} must be >= decode.lookup_block "
                             f"({self.lookup_block}); 0 turns it off")
        self._check_companions()
        if self.lookup_occurrence not in OCCURRENCES:
            raise ValueError(f"decode.lookup_occurrence must be one of {', '.join(OCCURRENCES)}, not {self.lookup_occurrence!r}")
        if self.infill_kv not in INFILL_KV_MODES:
            raise ValueError(f"decode.infill_kv must be one of {', '.join(INFILL_KV_MODES)}, not {self.infill_kv!r}")
        if self.draft_end not in DRAFT_END_MODES:
            raise ValueError(f"decode.draft_end must be one of {', '.join(DRAFT_END_MODES)}, not {self.draft_end!r}")
        if self.timing not in TIMING_MODES:
            raise ValueError(f"decode.timing must be one of {', '.join(TIMING_MODES)}, not {self.timing!r}")
        if self.lookup_choice not in CHOICES:
            raise ValueError(f"decode.lookup_choice must be one of {', '.join(CHOICES)}, not {self.lookup_choice!r}")
        if self.lookup_choice == "cost" and not self.width_cost:
            raise ValueError("decode.lookup_choice=cost chooses by the width-cost table: set decode.width_cost (a table "
                             "file, or auto)")
        self._rule = AcceptanceRule.parse(self.acceptance)
        self._width_table = WidthCost.load(self.width_cost) if self.width_cost not in ("", AUTO) else None
        self._policy: LookupPolicy | None = None

    def _check_ranges(self) -> None:
        check_range("decode.max_new_tokens", self.max_new_tokens, 1, MOST_NEW_TOKENS)
        check_range("decode.lookup_ngram", self.lookup_ngram, 1, LONGEST_NGRAM)
        check_range("decode.lookup_min_ngram", self.lookup_min_ngram, 1, self.lookup_ngram)
        check_range("decode.lookup_block", self.lookup_block, 1, WIDEST_PROPOSAL)
        check_range("decode.lookup_max_block", self.lookup_max_block, 0, WIDEST_PROPOSAL)
        check_range("decode.lookup_tree", self.lookup_tree, 1, MOST_BRANCHES)
        check_range("decode.lookup_realign", self.lookup_realign, 0, LONGEST_NGRAM)
        check_range("decode.slot_size", self.slot_size, 1, WIDEST_PROPOSAL)
        check_range("decode.serial_blocks", self.serial_blocks, 1, MOST_NEW_TOKENS)
        check_range("decode.diffusion_steps", self.diffusion_steps, 1, MOST_DIFFUSION_STEPS)

    def _check_companions(self) -> None:
        """A setting that works only beside another's value: the error names the companion to set."""
        missing = [
            (self.lookup_max_block > 0 and self.lookup_match != "longest", "lookup_max_block", "decode.lookup_match=longest"),
            (self.lookup_tree > 1 and self.lookup_match != "longest", "lookup_tree", "decode.lookup_match=longest"),
            (self.lookup_realign > 0 and self.lookup_tree == 1, "lookup_realign",
             "decode.lookup_tree above 1 (its candidates are tree branches)"),
        ]
        for is_missing, key, companion in missing:
            if is_missing:
                raise ValueError(f"decode.{key}={getattr(self, key)} needs the companion setting {companion}; set it, "
                                 f"or leave decode.{key} out")

    @property
    def rule(self) -> AcceptanceRule:
        """The parsed acceptance rule."""
        return self._rule

    @property
    def width_table(self) -> WidthCost | None:
        """The width-cost table: the file's, or `auto`'s once `use_width_table` gave it; None without one."""
        if self.width_cost == AUTO and self._width_table is None:
            raise ValueError("decode.width_cost=auto is measured when the model loads (eval.engines.width_measure.resolve); "
                             "it has not been yet")
        return self._width_table

    @property
    def resolved_width_table(self) -> WidthCost | None:
        """The table as it stands: None where `auto` has not been resolved yet (or there is none)."""
        return self._width_table

    def use_width_table(self, table: WidthCost | None) -> None:
        """Set the table `width_cost=auto` resolved to, once the model has loaded.

        Args:
            table (WidthCost | None): the resolved table, or None.
        """
        self._width_table, self._policy = table, None

    def chain_lookup(self) -> LookupPolicy | None:
        """`lookup` for an engine that verifies one chain of proposed tokens per step (vLLM's speculative
        decoding, eval.serve): token trees and the cost choice are refused."""
        if self.regenerate == "lookup" and (self.lookup_tree > 1 or self.lookup_choice != "fixed"):
            raise ValueError("vLLM verifies one chain of proposed tokens per step: decode.lookup_tree must be 1 and "
                             "decode.lookup_choice fixed")
        return self.lookup

    @property
    def lookup(self) -> LookupPolicy | None:
        """The proposal policy of `regenerate=lookup`; None for plain regeneration."""
        if self.regenerate != "lookup":
            return None
        if self._policy is None:  # built once: the chooser's costs are a table lookup per width
            costs = ()
            if self.lookup_choice == "cost":
                widest = 1 + self.lookup_tree * max(self.lookup_block, self.lookup_max_block)
                costs = tuple(self.width_table.relative(width) for width in range(1, widest + 1))
            self._policy = LookupPolicy(self.lookup_ngram, self.lookup_block, self.lookup_occurrence, self.lookup_min_ngram,
                                        match=self.lookup_match, max_block=self.lookup_max_block, tree=self.lookup_tree,
                                        realign=self.lookup_realign, choice=self.lookup_choice, costs=costs)
        return self._policy

    @property
    def fast(self) -> bool:
        """Whether drafting is batched across requests (AR engines but `stepwise`)."""
        return self.engine in ("auto", "fast")

    def result_keys(self) -> tuple[str, ...]:
        """The settings a resumed run must share with the results it continues."""
        keys = ("acceptance", "max_new_tokens", "regenerate", "timing")
        if self.regenerate == "lookup":
            keys += LOOKUP_KEYS + (("lookup_choice", "width_cost") if self.lookup_choice == "cost" else ())
        return keys + DIFFUSION_KEYS.get(self.engine, ())


def decode_label(decode: DecodeSpec) -> str:
    """A short name of the decode settings for titles: acceptance rule and regeneration.

    Args:
        decode (DecodeSpec): the decode settings.
    """
    return f"{decode.acceptance}, regenerate={decode.regenerate}"
