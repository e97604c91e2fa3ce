"""train/refusion_objective.py: the slot layout, the loss, and `objective: refusion` through train/sft.py."""

from __future__ import annotations

import contextlib
import math
import shutil
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset, DatasetDict
from safetensors.torch import load_file
from test_train_support import ONE_PROCESS, humaneval_dialogues, launch, step_losses, tiny_overrides

import train.refusion_objective as refusion
from headstart.models import load_model
from headstart.prompts import INCOMPLETE_REQUEST_SYSTEM, detect_family, render_prompt
from headstart.refusion import MASK_TOKEN, mask_token_id
from headstart.run_dir import MARK
from train.config import RecipeValueError
from train.refusion_objective import RefusionCollator, RefusionTrainer, SlotDraw, draw_slots, lay_out, weighted_token_losses
from train.relaunch import check_run_dir
from train.sft import parse_recipe
from train.splits import load_data, training_family
from train.tokenization import IGNORE_INDEX, tokenize_dataset

X = IGNORE_INDEX
MASK, PAD = 99, 0

# Two hand-worked examples. (1) prompt 11 12 13, answer 21..27 (A = 7), slots of 3:
# s0 = 21 22 23 (positions 3-5), s1 = 24 25 26 (6-8), s2 = 27 (9); s1 masked with p = 0.5,
# clean slots laid out as s2 then s0. Clean targets: 22 and 23 (s2 has one token, so none):
# weight 1 each (a clean target's term); each masked token weighs 1 / (p A) = 2/7.
FIRST = {"prompt_ids": [11, 12, 13], "draft_ids": [], "answer_ids": [21, 22, 23, 24, 25, 26, 27]}
FIRST_DRAW = SlotDraw(slot_size=3, p=0.5, masked=(False, True, False), clean_order=(2, 0))
FIRST_LAID_OUT = {
    "input_ids": [11, 12, 13, 27, 21, 22, 23, MASK, MASK, MASK],
    "position_ids": [0, 1, 2, 9, 3, 4, 5, 6, 7, 8],
    "labels": [X, X, X, X, 22, 23, X, 24, 25, 26],
    "loss_weights": [0, 0, 0, 0, 1, 1, 0, 2 / 7, 2 / 7, 2 / 7],
}
# (2) prompt 11, draft 31 32 (committed: positions 1-2, no target), answer 21..24 (A = 4) at
# positions 3-6, slots of 2: s0 = 21 22 masked with p = 0.25 (weight 1 / (0.25 x 4) = 1), s1 clean.
SECOND = {"prompt_ids": [11], "draft_ids": [31, 32], "answer_ids": [21, 22, 23, 24]}
SECOND_DRAW = SlotDraw(slot_size=2, p=0.25, masked=(True, False), clean_order=(1,))
SECOND_LAID_OUT = {
    "input_ids": [11, 31, 32, 23, 24, MASK, MASK],
    "position_ids": [0, 1, 2, 5, 6, 3, 4],
    "labels": [X, X, X, 24, X, 21, 22],
    "loss_weights": [0, 0, 0, 1, 0, 1, 1],
}


def _fixed_draws(monkeypatch, *draws: SlotDraw) -> None:
    queue = list(draws)
    monkeypatch.setattr(refusion, "draw_slots", lambda *args, **kwargs: queue.pop(0))


def test_layout_labels_positions_and_weights_by_hand():
    first = lay_out(FIRST["prompt_ids"], FIRST["answer_ids"], FIRST_DRAW, MASK)
    second = lay_out(SECOND["prompt_ids"], SECOND["answer_ids"], SECOND_DRAW, MASK, SECOND["draft_ids"])
    for row, expected in ((first, FIRST_LAID_OUT), (second, SECOND_LAID_OUT)):
        assert {k: v for k, v in row.items() if k != "loss_weights"} == {
            k: v for k, v in expected.items() if k != "loss_weights"
        }
        assert row["loss_weights"] == pytest.approx(expected["loss_weights"])


def test_collator_pads_a_batch_and_weighs_each_target_by_its_share_of_the_loss(monkeypatch):
    _fixed_draws(monkeypatch, FIRST_DRAW, SECOND_DRAW)
    batch = RefusionCollator(mask_token_id=MASK, pad_token_id=PAD)([FIRST, SECOND])
    pad = 3
    expected = {
        "input_ids": [FIRST_LAID_OUT["input_ids"], SECOND_LAID_OUT["input_ids"] + [PAD] * pad],
        "attention_mask": [[1] * 10, [1] * 7 + [0] * pad],
        "position_ids": [FIRST_LAID_OUT["position_ids"], SECOND_LAID_OUT["position_ids"] + [7, 8, 9]],
        "labels": [FIRST_LAID_OUT["labels"], SECOND_LAID_OUT["labels"] + [X] * pad],
    }
    assert set(batch) == {*expected, "loss_weights"}
    for key, value in expected.items():
        assert batch[key].tolist() == value, key
    # The default (upstream's): the batch's 3 clean targets share the clean mean, 1/3 each; a masked
    # token's 1 / (p A) is divided by the 2 examples.
    third = 1 / 3
    expected_shares = [[0, 0, 0, 0, third, third, 0, 1 / 7, 1 / 7, 1 / 7], [0, 0, 0, third, 0, 1 / 2, 1 / 2] + [0.0] * pad]
    torch.testing.assert_close(batch["loss_weights"], torch.tensor(expected_shares))


def test_collator_cuts_to_max_length_from_the_end(monkeypatch):
    _fixed_draws(monkeypatch, SlotDraw(slot_size=2, p=0.5, masked=(False,), clean_order=(0,)))
    batch = RefusionCollator(mask_token_id=MASK, pad_token_id=PAD, max_length=5)([SECOND])
    # prompt 11, draft 31 32, then the first 2 answer tokens: one clean slot 21 22.
    assert batch["input_ids"].tolist() == [[11, 31, 32, 21, 22]]
    assert batch["labels"].tolist() == [[X, X, X, 22, X]]
    assert batch["loss_weights"].tolist() == [[0, 0, 0, 1, 0]]


def test_draws_are_seeded_and_cover_every_answer_token():
    examples = [{"prompt_ids": [1] * 5, "draft_ids": [], "answer_ids": list(range(100, 100 + n))} for n in (1, 7, 40, 90)]
    make = lambda: RefusionCollator(MASK, PAD, eps=1e-3, seed=3)  # noqa: E731
    first, again = make()(examples), make()(examples)
    for key in first:
        assert torch.equal(first[key], again[key]), key
    for row, example in enumerate(examples):
        n, answer = len(example["answer_ids"]), example["answer_ids"]
        ids, positions, labels = (first[k][row, 5 : 5 + n].tolist() for k in ("input_ids", "position_ids", "labels"))
        assert sorted(positions) == list(range(5, 5 + n))  # every answer position once
        for token, position, label in zip(ids, positions, labels):
            if token == MASK:
                assert label == answer[position - 5]
            else:
                assert token == answer[position - 5]
    draws = [draw_slots(64, (4, 8), 0.1, torch.Generator().manual_seed(s)) for s in range(200)]
    assert {d.slot_size for d in draws} == {4, 8} and all(0.1 <= d.p <= 1 for d in draws)


def test_per_example_loss_equals_a_direct_computation(monkeypatch):
    """`refusion.clean_average: example`, headstart's earlier form, worked per example by hand."""
    _fixed_draws(monkeypatch, FIRST_DRAW, SECOND_DRAW)
    batch = RefusionCollator(mask_token_id=MASK, pad_token_id=PAD, clean_average="example")([FIRST, SECOND])
    logits = torch.randn(2, 10, 100, generator=torch.Generator().manual_seed(0))

    def ce(b: int, j: int, target: int) -> float:
        return -torch.log_softmax(logits[b, j], dim=-1)[target].item()

    per_example = []
    for b, (p, answer_length) in enumerate(((0.5, 7), (0.25, 4))):
        clean, masked = [], 0.0
        for j in range(10):
            label = batch["labels"][b, j].item()
            if label == X:
                continue
            if batch["input_ids"][b, j].item() == MASK:
                masked += ce(b, j, label) / p
            else:
                clean.append(ce(b, j, label))
        per_example.append(sum(clean) / len(clean) + masked / answer_length)
    expected = sum(per_example) / len(per_example)
    actual = weighted_token_losses(logits, batch["labels"], batch["loss_weights"]).sum()
    assert actual.item() == pytest.approx(expected, rel=1e-5)


# Four examples of different prompt, draft and answer lengths and different draws: (3) answer of
# 12 tokens in slots of 4, the first masked (p = 0.8), the others clean; (4) answer of 5 tokens
# in slots of 2, all masked (p = 0.9): no clean target.
THIRD = {"prompt_ids": [11, 12], "draft_ids": [], "answer_ids": list(range(40, 52))}
THIRD_DRAW = SlotDraw(slot_size=4, p=0.8, masked=(True, False, False), clean_order=(2, 1))
FOURTH = {"prompt_ids": [14], "draft_ids": [], "answer_ids": [61, 62, 63, 64, 65]}
FOURTH_DRAW = SlotDraw(slot_size=2, p=0.9, masked=(True, True, True), clean_order=())
MIXED = [FIRST, SECOND, THIRD, FOURTH]
MIXED_DRAWS = (FIRST_DRAW, SECOND_DRAW, THIRD_DRAW, FOURTH_DRAW)


def _trainer_loss(batch: dict[str, torch.Tensor], logits: torch.Tensor) -> tuple[float, dict[str, float]]:
    """`RefusionTrainer.compute_loss` on `batch` with a model that returns `logits`: the loss and
    the logged parts."""
    trainer = SimpleNamespace(
        data_collator=SimpleNamespace(mask_token_id=MASK), model=SimpleNamespace(training=True),
        _metrics={"train": defaultdict(list)}, accelerator=SimpleNamespace(gather_for_metrics=lambda value: value),
    )
    model = lambda **inputs: SimpleNamespace(logits=logits)  # noqa: E731
    loss = RefusionTrainer.compute_loss(trainer, model, dict(batch))
    return loss.item(), {name: values[-1] for name, values in trainer._metrics["train"].items()}


def _upstream_parts(batch: dict[str, torch.Tensor], logits: torch.Tensor, p: list[float], lengths: list[int]):
    """ML-GSAI/ReFusion's loss, as its `Qwen3ForCausalLM.forward` writes it: cross-entropy mean over
    every non-masked position's target (the prompt's and a slot's last token have none), plus the
    masked tokens' CE / p / A summed and divided by the examples."""
    flat, labels = logits.flatten(0, 1), batch["labels"].flatten()
    masked = (batch["input_ids"] == MASK).flatten()
    width = batch["labels"].shape[1]
    p_mask = torch.tensor(p).repeat_interleave(width)
    answer_lengths = torch.tensor(lengths, dtype=torch.float32).repeat_interleave(width)
    ar = F.cross_entropy(flat[~masked], labels[~masked], ignore_index=IGNORE_INDEX, reduction="mean")
    mdm = F.cross_entropy(flat[masked], labels[masked], ignore_index=IGNORE_INDEX, reduction="none") / p_mask[masked]
    return ar.item(), (mdm / answer_lengths[masked]).sum().item() / len(lengths)


def _per_example(batch: dict[str, torch.Tensor], logits: torch.Tensor, p: list[float], lengths: list[int]) -> float:
    """headstart's earlier loss: per example, mean CE over its clean targets (0 without any) + sum
    of CE / p over its masked tokens / A; then the mean over the examples."""
    total = 0.0
    for b in range(len(lengths)):
        labels, masked = batch["labels"][b], batch["input_ids"][b] == MASK
        ce = F.cross_entropy(logits[b], labels, ignore_index=IGNORE_INDEX, reduction="none")
        clean = (labels != IGNORE_INDEX) & ~masked
        total += (ce[clean].mean().item() if clean.any() else 0.0) + ce[masked].sum().item() / p[b] / lengths[b]
    return total / len(lengths)


def test_default_loss_is_upstreams_and_example_is_the_per_example_mean(monkeypatch):
    p, lengths = [d.p for d in MIXED_DRAWS], [len(e["answer_ids"]) for e in MIXED]
    losses = {}
    for clean_average in ("batch", "example"):
        _fixed_draws(monkeypatch, *MIXED_DRAWS)
        collator = RefusionCollator(mask_token_id=MASK, pad_token_id=PAD, clean_average=clean_average)
        batch = collator(MIXED)
        logits = torch.randn(*batch["input_ids"].shape, 100, generator=torch.Generator().manual_seed(1))
        loss, parts = _trainer_loss(batch, logits)
        assert weighted_token_losses(logits, batch["labels"], batch["loss_weights"]).sum().item() == pytest.approx(loss, rel=1e-6)
        assert parts["clean_loss"] + parts["masked_loss"] == pytest.approx(loss, rel=1e-6)
        if clean_average == "batch":
            ar, mdm = _upstream_parts(batch, logits, p, lengths)
            assert loss == pytest.approx(ar + mdm, rel=1e-5)
            assert (parts["clean_loss"], parts["masked_loss"]) == pytest.approx((ar, mdm), rel=1e-5)
        else:
            assert loss == pytest.approx(_per_example(batch, logits, p, lengths), rel=1e-5)
        losses[clean_average] = loss
    assert abs(losses["batch"] - losses["example"]) > 0.1, losses  # the batch tells the two apart


def test_a_batch_without_clean_targets_has_a_zero_clean_term(monkeypatch):
    """Upstream's clean mean is NaN there (a mean over nothing); ours is 0, the masked term alone."""
    _fixed_draws(monkeypatch, FOURTH_DRAW)
    batch = RefusionCollator(mask_token_id=MASK, pad_token_id=PAD)([FOURTH])
    logits = torch.randn(*batch["input_ids"].shape, 100, generator=torch.Generator().manual_seed(2))
    loss, parts = _trainer_loss(batch, logits)
    assert parts["clean_loss"] == 0 and loss == pytest.approx(_upstream_parts(batch, logits, [0.9], [5])[1], rel=1e-5)


@pytest.fixture()
def tiny_refusion(tiny_refusion_dir):
    """A fresh copy of the tiny Qwen3 with the two ReFusion tokens, and its tokenizer."""
    loaded = load_model(str(tiny_refusion_dir), dtype=torch.float32, device="cpu")
    return loaded.model, loaded.tokenizer


def _batch(tokenizer, n: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    examples = []
    for row in humaneval_dialogues(n):
        prompt = render_prompt(tokenizer, row["messages"][:-1])
        examples.append({
            "prompt_ids": tokenizer(prompt, add_special_tokens=False)["input_ids"],
            "answer_ids": tokenizer(row["messages"][-1]["content"], add_special_tokens=False)["input_ids"][:48],
        })
    collator = RefusionCollator(
        mask_token_id(tokenizer), tokenizer.pad_token_id, slot_sizes=(4, 8), seed=seed
    )
    return collator(examples)


def test_causal_attention_over_the_layout(tiny_refusion):
    """Every laid-out token sees all tokens before it in the layout, whatever their position
    ids, and none after it. Run as in training (no cache): there, without the explicit
    attention mask, transformers would split the sequence into packed documents at the jumps."""
    model, tokenizer = tiny_refusion
    batch = _batch(tokenizer, n=1)
    assert (batch["position_ids"][0].diff() != 1).any()  # the layout jumps
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}

    def logits(input_ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(**dict(inputs, input_ids=input_ids), use_cache=False).logits[0]

    reference, changed = logits(inputs["input_ids"]), inputs["input_ids"].clone()
    changed[0, 0] = 5
    assert (logits(changed)[-1] - reference[-1]).abs().max() > 1e-4  # the last token sees the first
    changed = inputs["input_ids"].clone()
    changed[0, -1] = 5
    torch.testing.assert_close(logits(changed)[:-1], reference[:-1])  # nothing sees the last


def test_a_few_steps_lower_the_loss(tiny_refusion):
    model, tokenizer = tiny_refusion
    model.train()
    batch = _batch(tokenizer)
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss = weighted_token_losses(model(**inputs, use_cache=False).logits, batch["labels"], batch["loss_weights"]).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.7 * losses[0], losses


@pytest.mark.parametrize(
    "override, key",
    [
        ("refusion.slot_sizes=[4,0]", "refusion.slot_sizes"),
        ("refusion.slot_sizes=[]", "refusion.slot_sizes"),
        ("refusion.eps=0", "refusion.eps"),
        ("refusion.eps=1.5", "refusion.eps"),
        ("training.packing=true", "training.packing"),
        ("training.dataloader_num_workers=2", "training.dataloader_num_workers"),
        ("refusion.clean_average=mean", "refusion.clean_average 'mean': use batch or example"),
        ("refusion.over_long=truncate", "refusion.over_long 'truncate': use skip or cut"),
    ],
)
def test_bad_refusion_setting_names_the_key(override, key):
    with pytest.raises(RecipeValueError, match=key.replace(".", r"\.")):
        parse_recipe(["recipe=smollm2_refusion", override])


def test_refusion_defaults_follow_upstream():
    recipe, _ = parse_recipe(["recipe=smollm2_refusion"])
    assert (recipe.refusion.clean_average, recipe.refusion.over_long) == ("batch", "skip")
    assert parse_recipe(["recipe=smollm2_refusion", "refusion.clean_average=example", "refusion.over_long=cut"])[0].refusion \
        == type(recipe.refusion)(clean_average="example", over_long="cut")


def test_refusion_recipes_parse():
    for name in ("refusion_prefix_to_answer", "refusion_draft_refinement", "smollm2_refusion"):
        recipe, _ = parse_recipe([f"recipe={name}"])
        assert recipe.objective == "refusion" and list(recipe.refusion.slot_sizes) == [4, 8, 16, 32]
        assert recipe.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
        assert recipe.data.system_message == "none"  # upstream's prompt: the user turn alone


def _refusion_rows(n: int) -> list[dict]:
    """Draft-refinement rows as data_builders writes them; every other draft empty (i = 1)."""
    rows = []
    for k, row in enumerate(humaneval_dialogues(n)):
        answer = row["messages"][-1]["content"]
        rows.append({"query": row["messages"][1]["content"], "draft": "" if k % 2 else answer[: len(answer) // 2],
                     "response": answer, "source": row["source"]})
    return rows


def test_refusion_rows_tokenize_into_prompt_draft_and_answer(tiny_tokenizer):
    rows = _refusion_rows(4)
    family = detect_family(tiny_tokenizer)
    data = tokenize_dataset(Dataset.from_list(rows), tiny_tokenizer, family, "incomplete_request", "refusion")
    for row, example in zip(rows, data):
        messages = [{"role": "system", "content": INCOMPLETE_REQUEST_SYSTEM}, {"role": "user", "content": row["query"]}]
        prompt = render_prompt(tiny_tokenizer, messages)  # the prompt the evaluator renders
        assert example["prompt_ids"] == tiny_tokenizer(prompt, add_special_tokens=False)["input_ids"]
        assert tiny_tokenizer.decode(example["draft_ids"]) == row["draft"]
        assert tiny_tokenizer.decode(example["answer_ids"]) == row["response"] + "<|im_end|>\n"
    with pytest.raises(ValueError, match="objective: refusion"):
        tokenize_dataset(Dataset.from_list(rows), tiny_tokenizer, family, "incomplete_request")


def _refusion_recipe(data, model_dir, *overrides: str):
    return parse_recipe(["recipe=smollm2_refusion", f"model.name_or_path={model_dir}", f"data.path={data}",
                         "training.eval_steps=0", *overrides])[0]


def _load_refusion_data(data, model_dir, tokenizer, *overrides: str):
    """The training split as train/sft.py tokenizes it (one process; no system turn, the recipe's)."""
    state = SimpleNamespace(main_process_first=contextlib.nullcontext, is_main_process=True)
    train, _, _ = load_data(_refusion_recipe(data, model_dir, *overrides), tokenizer, state, None)
    return train


def test_over_long_rows_are_skipped_whole_or_cut(tmp_path, tiny_qwen3_dir, tiny_tokenizer, capsys):
    rows = _refusion_rows(12)
    data = tmp_path / "data"
    DatasetDict({"train": Dataset.from_list(rows)}).save_to_disk(str(data))
    family = training_family(tiny_tokenizer, _refusion_recipe(data, tiny_qwen3_dir))
    full = tokenize_dataset(Dataset.from_list(rows), tiny_tokenizer, family, None, "refusion")
    lengths = [len(r["prompt_ids"]) + len(r["draft_ids"]) + len(r["answer_ids"]) for r in full]
    limit = sorted(lengths)[len(lengths) // 2]  # about half the rows are longer
    fitting = [k for k, n in enumerate(lengths) if n <= limit]
    assert 0 < len(fitting) < len(rows)

    skipped = _load_refusion_data(data, tiny_qwen3_dir, tiny_tokenizer, f"training.max_length={limit}")
    assert skipped.to_list() == [full[k] for k in fitting]  # exactly the rows that fit, untouched
    eos = tiny_tokenizer.eos_token_id
    assert all(eos in row["answer_ids"][-2:] for row in skipped)  # each answer whole, to its EOS (ChatML: then "\n")
    assert f"dropped {len(rows) - len(fitting)} of the {len(rows)} train rows" in capsys.readouterr().out

    cut = _load_refusion_data(data, tiny_qwen3_dir, tiny_tokenizer, f"training.max_length={limit}",
                              "refusion.over_long=cut")
    assert cut.to_list() == full.to_list()  # every row kept; the collator cuts the long ones
    collator = RefusionCollator(MASK, PAD, max_length=limit)
    long = next(k for k, n in enumerate(lengths) if n > limit > n - len(full[k]["answer_ids"]))  # its answer crosses it
    answer, whole = collator.cut(cut[long])[2], full[long]["answer_ids"]
    assert 0 < len(answer) < len(whole) and answer == whole[: len(answer)] and eos not in answer  # the end is lost

    with pytest.raises(ValueError, match="no train row fits training.max_length=3"):
        _load_refusion_data(data, tiny_qwen3_dir, tiny_tokenizer, "training.max_length=3")


def test_objective_refusion_through_sft_trains_tokens_resumes_and_saves_loadable_models(tmp_path, tiny_qwen3_dir):
    rows = _refusion_rows(40)
    data = tmp_path / "data"
    DatasetDict({"train": Dataset.from_list(rows[:32]), "validation": Dataset.from_list(rows[32:])}).save_to_disk(str(data))
    out, resumed = tmp_path / "run", tmp_path / "resumed"
    settings = dict(max_steps=4, save_steps=2, eval_steps=2)
    launch(ONE_PROCESS,
           ["recipe=smollm2_refusion", *tiny_overrides(tiny_qwen3_dir, data, out, merge="true", **settings)])

    losses = step_losses(out)
    assert sorted(losses) == [1, 2, 3, 4] and all(math.isfinite(v) for v in losses.values())
    state = (out / "checkpoint-4" / "trainer_state.json").read_text()
    assert "clean_loss" in state and "masked_loss" in state and "eval_loss" in state

    # Resumed from step 2, the run lays out the same batches: same losses, same adapter.
    shutil.copytree(out / "checkpoint-2", resumed / "checkpoint-2")
    shutil.copy(out / "config.yaml", resumed / "config.yaml")  # a run directory without its recipe is refused
    shutil.copy(out / MARK, resumed / MARK)  # nor one without headstart's run record
    result = launch(ONE_PROCESS,
                    ["recipe=smollm2_refusion", *tiny_overrides(tiny_qwen3_dir, data, resumed, **settings)])
    assert f"resuming from {resumed / 'checkpoint-2'}" in result.stdout
    assert step_losses(resumed) == losses
    final = load_file(out / "adapter" / "adapter_model.safetensors")
    again = load_file(resumed / "adapter" / "adapter_model.safetensors")
    for key in final:
        torch.testing.assert_close(again[key], final[key], rtol=0, atol=0)

    # The mask and begin rows trained beside LoRA (input and, untied, output embeddings).
    weights = load_file(out / "adapter" / "adapter_model.safetensors")
    assert any("lora_A" in k for k in weights)
    token_rows = [k for k in weights if "trainable_tokens" in k]
    assert any("embed_tokens" in k for k in token_rows) and any("lm_head" in k for k in token_rows), token_rows

    peft = load_model(str(out / "adapter"), device="cpu")
    merged = load_model(str(out / "merged"), device="cpu")
    assert MASK_TOKEN in peft.tokenizer.get_vocab() and MASK_TOKEN in merged.tokenizer.get_vocab()
    batch = _batch(peft.tokenizer, n=2)
    assert (batch["input_ids"] == mask_token_id(peft.tokenizer)).any()
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    with torch.no_grad():
        expected, actual = peft.model(**inputs).logits, merged.model(**inputs).logits
    assert expected.shape[-1] == len(peft.tokenizer)  # the vocabulary was resized before the adapter
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-4)
    # The token rows move during training: checkpoint 2 holds other values than the end.
    early = load_file(out / "checkpoint-2" / "adapter_model.safetensors")
    for key in token_rows:
        assert not torch.equal(early[key], weights[key]), key


def test_every_weight_trains_with_use_peft_false_resumes_and_saves_the_model(tmp_path, tiny_qwen3_dir):
    """model.use_peft=false: no adapter; merged/ is the trained model, mask token included; every layer
    moved from the base; a run resumed from checkpoint 2 ends with the same losses and the same weights."""
    rows = _refusion_rows(24)
    data = tmp_path / "data"
    DatasetDict({"train": Dataset.from_list(rows)}).save_to_disk(str(data))
    out, resumed = tmp_path / "run", tmp_path / "resumed"
    settings = dict(max_steps=4, save_steps=2, learning_rate=1e-3)
    overrides = ["recipe=smollm2_refusion", "model.use_peft=false", "data.eval_split=null"]
    launch(ONE_PROCESS, [*overrides, *tiny_overrides(tiny_qwen3_dir, data, out, **settings)])
    assert not (out / "adapter").exists() and not list(out.glob("checkpoint-2/adapter_*"))
    trained, base = load_model(str(out / "merged"), device="cpu"), load_model(str(tiny_qwen3_dir), device="cpu")
    assert MASK_TOKEN in trained.tokenizer.get_vocab() and mask_token_id(trained.tokenizer) == len(base.tokenizer) + 1
    moved = [name for name, weight in base.model.named_parameters()
             if not torch.equal(weight, dict(trained.model.named_parameters())[name][: weight.shape[0]])]
    assert len(moved) == len(list(base.model.parameters())), "a weight did not train"

    shutil.copytree(out / "checkpoint-2", resumed / "checkpoint-2")
    shutil.copy(out / "config.yaml", resumed / "config.yaml")
    shutil.copy(out / MARK, resumed / MARK)
    launch(ONE_PROCESS, [*overrides, *tiny_overrides(tiny_qwen3_dir, data, resumed, **settings)])
    assert step_losses(resumed) == step_losses(out)
    final, again = (load_file(d / "merged" / "model.safetensors") for d in (out, resumed))
    for key in final:
        torch.testing.assert_close(again[key], final[key], rtol=0, atol=0)

    # A finished run is a run even with its checkpoints gone: a new one may not overwrite merged/.
    for checkpoint in out.glob("checkpoint-*"):
        shutil.rmtree(checkpoint)
    recipe, _ = parse_recipe([*overrides, *tiny_overrides(tiny_qwen3_dir, data, out, **settings), "run.resume=false"])
    with pytest.raises(RecipeValueError, match="a trained model"):
        check_run_dir(out, recipe)


@pytest.mark.parametrize("objective", ["distill", "sdft"])
def test_use_peft_false_is_refused_where_the_teacher_is_the_adapter_off(objective):
    with pytest.raises(RecipeValueError, match="model.use_peft=false"):
        parse_recipe([f"objective={objective}", "model.use_peft=false"])


def test_the_slot_probe_counts_every_slot_and_aligns_the_autoregressive_targets(tiny_refusion_dir):
    """benchmarks/probe_refusion.py: on the model's own greedy answer its next-token accuracy is exactly
    1 (an off-by-one in the targets would not be); one entry per slot start, one flag per offset."""
    from probe_refusion import probe_row, summary_line
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from headstart.refusion import mask_token_id

    tokenizer = AutoTokenizer.from_pretrained(tiny_refusion_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_refusion_dir, dtype=torch.float32).eval()
    prompt = tokenizer("def add(a, b):", add_special_tokens=False)["input_ids"]
    greedy = model.generate(torch.tensor([prompt]), max_new_tokens=10, min_new_tokens=10, do_sample=False)
    answer = greedy[0, len(prompt):].tolist()
    assert len(set(zip(answer, answer[1:]))) > 5  # not a repeated token: a shifted target would miss
    counts = probe_row(model, prompt, answer, mask_token_id(tokenizer), slot=4, threshold=0.6)
    assert counts["ar"] == [True] * 10
    assert len(counts["offsets"]) == len(counts["confident"]) == 2 and all(len(o) == 4 for o in counts["offsets"])
    line = summary_line("validation", [counts])
    assert line.startswith("validation: 1 rows, 2 slots; mask right by offset ") and line.endswith("AR next token right 1.000")
