"""How well a slot decoder predicts masked slots, teacher-forced: the probe behind a ReFusion run's
tokens per forward, cheaper than decoding.

    python benchmarks/probe_refusion.py outputs/train/smollm2_refusion_full/merged --rows 8

For the first ROWS rows of each split of the training data (`--data`, a saved dataset with `query`
and `response`, tokenized as training tokenizes it), at every answer offset t that starts a slot
(multiples of --slot-size), the prompt and answer[:t] are fed clean and SLOT mask tokens after them
at positions t..t+SLOT-1, as the decoder's planning forward feeds an undecided slot. Printed per
split: how often the mask's argmax is the answer's token at each offset in the slot, how often the
first mask's confidence passes the slot threshold (the plan's test), how often the whole slot is
right, and the same model's autoregressive next-token accuracy on the same answers (what the mask
at offset 0 could reach: it predicts the same token from the same context).
"""

from __future__ import annotations

import argparse

import torch
from datasets import load_from_disk

from headstart.prompts import detect_family
from headstart.refusion import mask_token_id
from train.tokenization import tokenize_parts


@torch.inference_mode()
def probe_row(model, prompt: list[int], answer: list[int], mask: int, slot: int, threshold: float) -> dict[str, list]:
    """Per slot start: which offsets the masks got right, and whether the first one passed `threshold`;
    and per answer token whether greedy next-token prediction gets it."""
    logits = model(torch.tensor([prompt + answer])).logits[0, len(prompt) - 1 : -1]
    counts = {"offsets": [], "confident": [], "ar": (logits.argmax(-1) == torch.tensor(answer)).tolist()}
    for start in range(0, len(answer) - slot + 1, slot):
        masked = model(torch.tensor([prompt + answer[:start] + [mask] * slot])).logits[0, -slot:].softmax(-1)
        confidence, predicted = masked.max(-1)
        counts["offsets"].append([int(predicted[j]) == answer[start + j] for j in range(slot)])
        counts["confident"].append(float(confidence[0]) > threshold)
    return counts


def summary_line(split: str, rows: list[dict[str, list]]) -> str:
    offsets = [o for row in rows for o in row["offsets"]]
    confident = [c for row in rows for c in row["confident"]]
    ar = [a for row in rows for a in row["ar"]]
    by_offset = " ".join(f"{sum(o[j] for o in offsets) / len(offsets):.3f}" for j in range(len(offsets[0])))
    return (f"{split}: {len(rows)} rows, {len(offsets)} slots; mask right by offset {by_offset}; first mask confident "
            f"{sum(confident) / len(confident):.3f}; whole slot right {sum(all(o) for o in offsets) / len(offsets):.3f}; "
            f"AR next token right {sum(ar) / len(ar):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a slot decoder's directory (a model with the mask token)")
    parser.add_argument("--data", default="outputs/data/smollm2_refusion_self", help="the saved training dataset")
    parser.add_argument("--rows", type=int, default=8, help="rows per split")
    parser.add_argument("--slot-size", type=int, default=4)
    parser.add_argument("--slot-threshold", type=float, default=0.6)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    mask, family = mask_token_id(tokenizer), detect_family(tokenizer)
    data = load_from_disk(args.data)
    for split in data:
        rows = []
        for example in data[split].select(range(min(args.rows, len(data[split])))):
            parts = tokenize_parts(example, tokenizer, family, None)  # no system turn: the ReFusion recipes'
            rows.append(probe_row(model, parts["prompt_ids"], parts["answer_ids"], mask, args.slot_size,
                                  args.slot_threshold))
        print(summary_line(split, rows), flush=True)


if __name__ == "__main__":
    main()
