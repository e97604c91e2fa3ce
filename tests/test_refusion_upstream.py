"""The ReFusion engine against upstream's `generate_refusion`, token for token and forward for
forward, on the tiny random model of ReFusion-8B's architecture (a Qwen3 with ReFusion's begin
and mask tokens added).

The reference (tests/support/upstream_refusion.py) is written from a reading of upstream's
algorithm, with no KV cache: every call recomputes the whole fed sequence under an explicit 4-D
attention mask. `infill_kv=splice` is held to it as written (slots infilled together never see
each other, as upstream's KV splice makes it); `infill_kv=refeed` to it with `splice=False`.

The model runs in float64, so that the engine's cached forwards and the reference's recomputed
ones cannot fall on two sides of a threshold by rounding.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from upstream_refusion import UpstreamRefusion  # tests/support/upstream_refusion.py

from eval.benchmarks import get_benchmark
from eval.engines.decode import DecodeSpec
from eval.engines.refusion_decoding import RefusionEngine
from eval.evaluation.config import EvalConfig
from eval.evaluation.evaluator import StreamingEvaluator
from headstart.models import load_model
from headstart.refusion import mask_token_id

REQUESTS = 20
MAX_NEW_TOKENS = 32  # 8 slots of 4 or 4 of 8: whole slots in each of the 2 blocks, as upstream needs
SERIAL_BLOCKS = 2
SLOT_SIZES = (4, 8)
# (slot_threshold, token_threshold). The seeded toy is extremely peaked (see test_refusion_engine.py):
# a drafted token is either near-certain or astronomically unlikely, so token thresholds this low
# let some through. Between them: single- and multi-slot plans, whole-slot commits, infills of one
# round and of several, and EOS found by global verification and by infill. ReFusion's own slot
# threshold, 0.9, with a stricter token threshold makes an infill of almost every step, 2 to 3
# times the forwards: it runs with the slow tests.
QUICK_THRESHOLDS = ((0.5, 1e-5), (0.3, 1e-6), (0.1, 1e-7))
STRICT_THRESHOLDS = ((0.9, 1e-3),)
# A token the seeded toy often produces stands in for EOS, so that answers end early (as in
# test_refusion_engine.py).
TOY_EOS = 119
# What the reference must have seen at least once in each set of cases, or the comparison proves little.
BRANCHES = ("multi-slot plans", "whole slots", "eos in global verify", "infills", "multi-round infills",
            "eos in infill", "eos stop")


@pytest.fixture(scope="module")
def toy64(tiny_refusion_dir):
    """The toy in float64, its mask id, and two prompts per request: its third prefix S_3 (70 to
    115 tokens: short, so that the from-scratch reference is quick) and the whole request S_n
    (150 to 330 tokens)."""
    loaded = load_model(str(tiny_refusion_dir), device="cpu", dtype=torch.float64)
    assert loaded.model.dtype == torch.float64
    config = EvalConfig(model=str(tiny_refusion_dir), decode=DecodeSpec(engine="refusion", regenerate="plain"))
    evaluator = StreamingEvaluator(loaded, config)
    prompts = [evaluator.prompts(request) for request in get_benchmark("humaneval").load(limit=REQUESTS)]
    assert len(prompts) == REQUESTS
    by_kind = {"third prefix": [p[2] for p in prompts], "whole request": [p[-1] for p in prompts]}
    assert all(len(set(map(tuple, kind))) == REQUESTS for kind in by_kind.values())  # 20 different prompts
    return loaded.model, mask_token_id(loaded.tokenizer), by_kind


def engine(model, mask_id: int, size: int, slot_threshold: float, token_threshold: float, infill_kv: str) -> RefusionEngine:
    return RefusionEngine(model, mask_id, {TOY_EOS}, DecodeSpec(
        engine="refusion", regenerate="plain", max_new_tokens=MAX_NEW_TOKENS, slot_size=size, serial_blocks=SERIAL_BLOCKS,
        slot_threshold=slot_threshold, token_threshold=token_threshold, infill_kv=infill_kv))


def compare_over_the_grid(model, mask_id: int, prompts: list[list[int]],
                          thresholds: tuple[tuple[float, float], ...]) -> tuple[int, Counter]:
    """Every request at every slot size and threshold pair, in both KV variants: the engine's
    answer and forward count equal the reference's. Returns the engine decodes compared and
    the reference's branch counts (the splice variant's, plus how often the variants differ)."""
    counts: Counter[str] = Counter()
    compared = 0
    for size in SLOT_SIZES:
        for slot_threshold, token_threshold in thresholds:
            expected = {}
            for variant in ("splice", "refeed"):
                reference = UpstreamRefusion(model, mask_id, {TOY_EOS}, max_new_tokens=MAX_NEW_TOKENS, slot_size=size,
                                             serial_blocks=SERIAL_BLOCKS, slot_threshold=slot_threshold,
                                             token_threshold=token_threshold, splice=variant == "splice")
                expected[variant] = [reference.decode(prompt) for prompt in prompts]
                if variant == "splice":
                    counts += reference.counts
            counts["splice differs from refeed"] += sum(a != b for a, b in zip(expected["splice"], expected["refeed"]))
            for variant in ("splice", "refeed"):
                decoder = engine(model, mask_id, size, slot_threshold, token_threshold, variant)
                for index, prompt in enumerate(prompts):
                    result = decoder.baseline(prompt)
                    case = f"request {index}, slot_size={size}, thresholds {slot_threshold}/{token_threshold}, {variant}"
                    assert result.answer == expected[variant][index][0], case
                    assert result.forwards == expected[variant][index][1], case
                    compared += 1
    return compared, counts


@pytest.mark.parametrize(
    ("prompt_kind", "thresholds"),
    [
        pytest.param("third prefix", QUICK_THRESHOLDS, id="third-prefix-quick-thresholds"),
        # Here no EOS happens to come out of a global verification.
        pytest.param("third prefix", STRICT_THRESHOLDS, id="third-prefix-strict-thresholds",
                     marks=pytest.mark.slow),
        pytest.param("whole request", QUICK_THRESHOLDS[:1] + STRICT_THRESHOLDS, id="whole-request",
                     marks=pytest.mark.slow),
    ],
)
def test_the_engine_decodes_as_upstream_generate_refusion(toy64, prompt_kind, thresholds):
    """20 requests x slot sizes 4 and 8 x threshold pairs x both KV variants: the same answers and
    forward counts. The quick set of cases, which always runs, takes every branch of the
    algorithm at least once; each slow set, every branch it happens to reach (fixed by the seed)."""
    model, mask_id, prompts = toy64
    compared, counts = compare_over_the_grid(model, mask_id, prompts[prompt_kind], thresholds)
    assert compared == REQUESTS * len(SLOT_SIZES) * len(thresholds) * 2
    reached = BRANCHES if thresholds != STRICT_THRESHOLDS else tuple(b for b in BRANCHES if b != "eos in global verify")
    for branch in reached:
        assert counts[branch] > 0, f"the reference never took the {branch!r} branch: {dict(counts)}"
    # The variants must differ somewhere, or the splice comparison could not tell them apart.
    assert counts["splice differs from refeed"] > 0, dict(counts)


def test_the_reference_masks_are_honoured(toy64):
    """The reference's 4-D masks do what they say: rows packed into one call compute what
    separate batch rows compute, and hiding sibling infill rows from each other changes what
    later tokens compute."""
    model, mask_id, prompts = toy64
    reference = UpstreamRefusion(model, mask_id, {TOY_EOS}, max_new_tokens=MAX_NEW_TOKENS, slot_size=4,
                                 serial_blocks=SERIAL_BLOCKS, slot_threshold=0.5, token_threshold=1e-5)
    prompt = prompts["third prefix"][0]
    start = len(prompt)
    context = [(t, p, None) for p, t in enumerate(prompt)]
    rows = [[(5 + j, start + j) for j in range(4)], [(9 + j, start + 4 + j) for j in range(4)]]
    packed = reference.call(context, rows)
    tokens = torch.tensor([prompt + [t for t, _ in row] for row in rows])
    positions = torch.tensor([list(range(start)) + [p for _, p in row] for row in rows])
    with torch.no_grad():
        logits = model(input_ids=tokens, position_ids=positions, attention_mask=torch.ones_like(tokens)).logits
    torch.testing.assert_close(packed, torch.softmax(logits[:, start:].double(), dim=-1), atol=1e-12, rtol=0)
    probe = [[(mask_id, start + 8)]]
    spliced = [(t, p, (1, r)) for r, row in enumerate(rows) for t, p in row]
    causal = [(t, p, None) for row in rows for t, p in row]
    assert not torch.allclose(reference.call(context + spliced, probe), reference.call(context + causal, probe))
