"""The streaming evaluator: one request streamed through the configured engine
(S_1..S_n), its baselines decoded from scratch, and the record of both."""

from __future__ import annotations

import sys
from functools import partial
from types import EllipsisType
from typing import Any

from tqdm import tqdm

from eval.benchmarks import BENCHMARKS, Request
from eval.engines.ar import AREngine
from eval.engines.base import StreamingEngine, UpdateResult
from eval.engines.bidirectional import BidirectionalEngine
from eval.engines.decode import AR_ENGINES, DecodeSpec
from eval.engines.fast_path import (
    Drafter,
    Drafting,
    TransformersDrafter,
    counted_results,
    final_update,
    greedy_drafting,
    round_drafts,
)
from eval.engines.refusion_decoding import RefusionEngine
from eval.engines.tokens import AnswerEnd, common_prefix_length
from eval.engines.width_measure import use_auto_table
from eval.evaluation.config import EvalConfig
from eval.evaluation.degenerate import DegenerateCheck
from headstart.completion import CompletionFrame
from headstart.models import LoadedModel, dtype_name, model_prompt_family
from headstart.prompts import Family, build_messages, encode_prompt, resolve_system_message
from headstart.refusion import mask_token_id
from headstart.segment import prefixes
from headstart.vllm_client import needed_model_len


class StreamingEvaluator:
    """Evaluates requests one at a time with the configured engine, baseline included."""

    def __init__(self, loaded: LoadedModel, config: EvalConfig, requests: list[Request] | None = None,
                 untimed: set[str] = frozenset(), system: str | None | EllipsisType = ...) -> None:
        """
        Args:
            loaded (LoadedModel): the model and tokenizer.
            config (EvalConfig): the run's settings.
            requests (list[Request] | None): what it will evaluate, for the drafting cache vLLM reserves
                (None: the model's context).
            untimed (set[str]): the ids of requests counted from batched greedy drafts, not timed (count mode, `timed_every`).
            system (str | None | EllipsisType): the system message the run resolved (None: no system turn);
                `...`: resolved here from `config.system_prompt`.
        """
        # A base model asked for chat is refused here, before any request; never wrapped in a format it never saw.
        self.family = model_prompt_family(loaded.tokenizer, config.prompt_format, config.model, config.adapter)
        self.frame = BENCHMARKS[config.benchmark].completion
        check_completion_format(self.family, config)
        self.loaded = loaded
        self.untimed = untimed
        self.config = config
        self.decode = config.decode
        use_auto_table(self.decode, config.model, loaded.model)
        # The fast path batches AR drafting across requests: AR decoding only.
        self.fast = self.decode.fast
        self.end = answer_end(loaded, self.family, self.frame)
        self.engine = build_engine(loaded, self.decode, self.end)
        if system is ...:
            system = resolve_system_message(config.system_prompt, config.adapter or config.model)
        self.system = system
        eos = self.engine.eos_token_ids
        self.degenerate = DegenerateCheck(loaded.tokenizer, eos, self.decode.max_new_tokens)
        self.drafter = build_drafter(loaded, config, eos, self.needed_model_len(requests)) if self.fast else None

    def close(self) -> None:
        """Stop the drafting engines (vLLM's processes); the transformers model stays loaded."""
        if self.drafter:
            self.drafter.close()

    def prompts(self, request: Request) -> list[list[int]]:
        """Token ids of the templated prompt after each segment S_1..S_n.

        Args:
            request (Request): the request.
        """
        return [
            encode_prompt(self.loaded.tokenizer, build_messages(known, request.history, self.system), self.family,
                          self.frame)
            for known in prefixes(request.segments)
        ]

    def needed_model_len(self, requests: list[Request] | None) -> int | None:
        """The longest prompt + answer vLLM drafting is sent, over every prefix (BPE can spend more
        tokens on a prefix than on the whole request); None without requests, or when drafting is
        not on vLLM.

        Args:
            requests (list[Request] | None): the requests the run evaluates.
        """
        if not requests or self.config.backend != "vllm":
            return None
        longest = max(len(prompt) for request in requests for prompt in self.prompts(request))
        return needed_model_len(longest, self.decode.max_new_tokens)

    def warm_up(self, request: Request) -> None:
        """An untimed prefill and one-token step, so that wall clock is measured on a warm model
        (a step's kernels, not only a prefill's, have run before the first timed baseline).

        Args:
            request (Request): the request whose whole prompt is prefilled.
        """
        state = self.engine.new_state()
        logits = self.engine.forward(state, self.prompts(request)[-1], phase=None)
        self.engine.forward(state, [int(logits[-1].argmax())], phase=None)

    def evaluate(self, request: Request) -> dict[str, Any]:
        """Stream one request and decode its baseline; the record of both.

        Args:
            request (Request): the request.
        """
        return self.evaluate_many([request])[0]

    def evaluate_many(self, requests: list[Request]) -> list[dict[str, Any]]:
        """Records of several requests; the fast path decodes all their drafts in one batch.

        Args:
            requests (list[Request]): the requests, in order (one group of `request_groups`).
        """
        if not self.fast:
            return [self._evaluate_stepwise(request) for request in requests]
        prompts = [self.prompts(request) for request in requests]
        counted = [request.request_id in self.untimed for request in requests]
        records = []
        for request, request_prompts, drafting in zip(requests, prompts, self.drafts(prompts, counted)):
            if drafting.counted:
                baseline, lookup, final = counted_results(request_prompts, drafting, self.decode, self.engine.eos_token_ids)
            else:
                final = final_update(self.engine, request_prompts, drafting)
                baseline, lookup = self._baselines(request_prompts[-1])
                warn_on_disagreement(request, drafting, baseline)
            records.append(self._record(request, baseline, lookup, final, drafting))
        return records

    def drafts(self, prompts: list[list[list[int]]], counted: list[bool]) -> list[Drafting]:
        """Each request's drafts D_1..D_{n-1} and their forwards, batched across requests; under
        greedy, every request also gets D_n = greedy(S_n) in the same batch: a request counted,
        not timed, is counted from it, a timed one measures the drafter's agreement with it.

        Args:
            prompts (list[list[list[int]]]): each request's prompt ids after each segment S_1..S_n.
            counted (list[bool]): per request, whether it is counted from its drafts rather than timed.
        """
        decode, eos = self.decode, self.engine.eos_token_ids
        if not decode.rule.lossless:
            return round_drafts(self.drafter, [p[:-1] for p in prompts], decode, eos)
        answers = self.drafter.greedy([p for request in prompts for p in request], decode.max_new_tokens)
        results = []
        for request_prompts, whole in zip(prompts, counted):
            request_answers, answers = answers[: len(request_prompts)], answers[len(request_prompts) :]
            final = request_answers.pop()
            results.append(greedy_drafting(request_answers, request_prompts, decode, eos, final, counted=whole))
        return results

    def _evaluate_stepwise(self, request: Request) -> dict[str, Any]:
        prompts = self.prompts(request)
        stream = self.engine.stream(prompts)
        drafting = Drafting([step.answer for step in stream.steps[:-1]], stream.drafting_forwards)
        return self._record(request, *self._baselines(prompts[-1]), stream.final, drafting)

    def request_groups(self, requests: list[Request]) -> list[list[Request]]:
        """Consecutive requests whose drafts fit one fast-path batch (one each when stepwise).

        Args:
            requests (list[Request]): the requests left to evaluate, in order.
        """
        if not self.fast:
            return [[request] for request in requests]
        # Greedy decodes every prefix of a group in one batch, S_n included; other rules one per request per round.
        def width(request: Request) -> int:
            return len(request.segments) if self.decode.rule.lossless else 1

        groups: list[list[Request]] = [[]]
        for request in requests:
            if groups[-1] and sum(map(width, groups[-1])) + width(request) > self.config.fast_batch_size:
                groups.append([])
            groups[-1].append(request)
        return [group for group in groups if group]

    def _engine_label(self, drafting: Drafting) -> str:
        """What computed the record: 'counted' (from batched greedy drafts, untimed), 'fast', 'stepwise' or a diffusion engine."""
        if drafting.counted:
            return "counted"
        return "fast" if self.fast else ("stepwise" if self.decode.engine in AR_ENGINES else self.decode.engine)

    def _baselines(self, prompt_ids: list[int]) -> tuple[UpdateResult, UpdateResult | None]:
        """S_n decoded from scratch: plain greedy, and the lookup decoder with the
        request as its only source (when regenerating by lookup)."""
        lookup = self.engine.lookup_baseline(prompt_ids) if self.decode.lookup else None
        return self.engine.baseline(prompt_ids), lookup

    def _record(self, request: Request, baseline: UpdateResult, lookup: UpdateResult | None,
                final: UpdateResult, drafting: Drafting) -> dict[str, Any]:
        base_answer, stream_answer = self.end.text(baseline.answer), self.end.text(final.answer)
        record = {
            "request_id": request.request_id,
            "segments": request.segments,
            "n_segments": len(request.segments),
            "base_answer": base_answer,
            "stream_answer": stream_answer,
            "base_tokens": len(baseline.answer),
            "stream_tokens": len(final.answer),
            "draft_tokens": final.draft_length,
            "accepted_tokens": final.accepted,
            # What each answer shows of degenerate output (eval/evaluation/degenerate.py): [] for none.
            "base_degenerate": self.degenerate.reasons(baseline.answer),
            "stream_degenerate": self.degenerate.reasons(final.answer),
            **identity_fields(baseline, final, drafting),
            "baseline_forwards": baseline.forwards,
            "residual_forwards": final.forwards,
            "drafting_forwards": drafting.forwards,
            "baseline_seconds": baseline.seconds,
            "residual_seconds": final.seconds,
            "min_residual_forwards": self.engine.min_residual_forwards,
            "engine": self._engine_label(drafting),
            "drafting_backend": self.config.backend if self.fast else "transformers",
            "dtype": dtype_name(self.loaded.model.dtype),  # what every number was computed in (a resume must match)
        }
        if self.config.typing:  # what eval.evaluation.typing_sim re-derives drafts and costs from
            record |= {"prompt_token_ids": self.prompts(request), "eos_token_ids": sorted(self.engine.eos_token_ids)}
        if self.config.record_tokens or self.config.typing:
            record |= {"draft_token_ids": drafting.drafts, "base_token_ids": baseline.answer,
                       "stream_token_ids": final.answer}
        if lookup:
            record |= {
                "lookup_baseline_forwards": lookup.forwards,
                "lookup_baseline_seconds": lookup.seconds,
                "lookup_baseline_identical": None if drafting.counted else lookup.answer == baseline.answer,
            }
        return record


def identity_fields(baseline: UpdateResult, final: UpdateResult, drafting: Drafting) -> dict[str, Any]:
    """What a record says of identity: whether its answers were compared token for token (a counted
    request's are both the drafter's D_n: not compared, None), where a compared streamed answer departs
    from the baseline (a near-tie flipped in bf16), and, for a timed request on the greedy fast path,
    whether the drafter's batched D_n is the batch-1 baseline.

    Args:
        baseline (UpdateResult): S_n decoded from scratch at batch 1.
        final (UpdateResult): the streamed answer's final update.
        drafting (Drafting): the request's drafts (and, under greedy, the drafter's D_n).
    """
    if drafting.counted:
        return {"identical": None, "identical_measured": False, "first_difference": None, "drafter_identical": None}
    identical = baseline.answer == final.answer
    return {
        "identical": identical,
        "identical_measured": True,
        "first_difference": None if identical else common_prefix_length(baseline.answer, final.answer),
        "drafter_identical": None if drafting.answer is None else drafting.answer == baseline.answer,
    }


def warn_on_disagreement(request: Request, drafting: Drafting, baseline: UpdateResult) -> None:
    """Say so, naming the request, when the drafter's D_n (batched greedy) is not the batch-1 baseline:
    a count-mode run's counted requests assume they agree.

    Args:
        request (Request): the request, named in the warning.
        drafting (Drafting): the request's drafts, with the drafter's D_n.
        baseline (UpdateResult): S_n decoded from scratch at batch 1.
    """
    if drafting.answer is not None and drafting.answer != baseline.answer:
        departs = common_prefix_length(drafting.answer, baseline.answer)
        tqdm.write(f"warning: request {request.request_id}: the drafter's answer to S_n differs from the batch-1 greedy "
                   f"baseline from token {departs} on ({len(drafting.answer)} vs {len(baseline.answer)} tokens); count "
                   "mode's counted requests assume they agree", file=sys.stderr)


def build_drafter(loaded: LoadedModel, config: EvalConfig, eos: set[int], needed_len: int | None = None) -> Drafter:
    """What the fast path drafts on: the loaded model, or vLLM engines on the same weights
    (`backend=vllm`; the timed residual phase and the baselines stay on the loaded model).

    Args:
        loaded (LoadedModel): the loaded model and tokenizer.
        config (EvalConfig): the run's settings.
        eos (set[int]): the token ids that end an answer.
        needed_len (int | None): the longest prompt + answer vLLM drafting is sent, in tokens; None: the model's context.
    """
    if config.backend == "vllm":
        from eval.engines.vllm_drafter import VLLMDrafter

        return VLLMDrafter.start(config.model, config.adapter, config.vllm, config.dtype, str(loaded.model.device), eos,
                                 needed_len)
    return TransformersDrafter(loaded.model, loaded.tokenizer.pad_token_id, eos, config.fast_batch_size)


def answer_end(loaded: LoadedModel, family: Family, frame: CompletionFrame) -> AnswerEnd:
    """What ends an answer: the model's end tokens, and in the completion format the frame's stop strings.

    Args:
        loaded (LoadedModel): the loaded model and tokenizer.
        family (Family): the prompt format's family.
        frame (CompletionFrame): the benchmark's completion frame.
    """
    stop = frame.stop if family == "completion" else ()
    return AnswerEnd(loaded.eos_token_ids, stop, partial(loaded.tokenizer.decode, skip_special_tokens=True))


def check_completion_format(family: Family, config: EvalConfig) -> None:
    """The completion format's stop strings are applied by the autoregressive engines, untimed typing aside.

    Args:
        family (Family): the prompt format's family.
        config (EvalConfig): the run's settings.
    """
    if family != "completion":
        return
    if config.decode.engine not in AR_ENGINES:
        raise ValueError(f"prompt_format=completion needs an autoregressive engine, not decode.engine={config.decode.engine}")
    if config.typing is not None:
        raise ValueError("typing simulation re-derives answers without stop strings: not with prompt_format=completion")


def build_engine(loaded: LoadedModel, decode: DecodeSpec, end: AnswerEnd | None = None) -> StreamingEngine:
    """The decoder `decode.engine` names; the diffusion decoders need the mask token
    (a clear error from `mask_token_id` when the model lacks it).

    Args:
        loaded (LoadedModel): the loaded model and tokenizer.
        decode (DecodeSpec): the decode settings.
        end (AnswerEnd | None): what ends an answer; None: the model's end tokens.
    """
    eos = end if end is not None else loaded.eos_token_ids
    if decode.engine == "refusion":
        return RefusionEngine(loaded.model, mask_token_id(loaded.tokenizer), eos, decode)
    if decode.engine == "bidirectional":
        return BidirectionalEngine(loaded.model, mask_token_id(loaded.tokenizer), eos, decode)
    return AREngine(loaded.model, eos, decode)
