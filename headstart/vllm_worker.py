"""The vLLM worker: runs inside the vLLM environment (scripts/setup_vllm.sh), token ids in, token ids out.

Started by `headstart.vllm_client.VLLMEngines` as `python headstart/vllm_worker.py`, with
the interpreter of the vLLM environment. It imports nothing from headstart (whose pins
that environment does not share) and never tokenizes: the main process encodes and
decodes with its own tokenizer, so both backends see the same ids (a multimodal model's
engine loads the tokenizer all the same, for its processor: `vllm_client.engine_args`).

Protocol, one JSON object per line: the first line read is the engine's settings
(`LLM(**settings["llm"])`, plus `env` set before vLLM is imported); it answers
{"ready": ..., "vllm": version}. Then each line is an operation and gets one answer line:
- {"op": "generate", "prompts": [[id, ...], ...], "max_tokens": [n, ...], "stop_token_ids": [...],
   "lora": null | {"name", "path"}} -> {"answers": [[id, ...], ...]} (greedy; a stop token ends
   its answer and is kept, as the transformers path keeps EOS);
- {"op": "prompt_logprobs", "prompts": [...], "starts": [k, ...], "lora": ...} ->
   {"scores": [[[logprob, rank], ...], ...]}: for every prompt token from index k on, its
   log-probability and rank (1 = the argmax) given the tokens before it;
- {"op": "shutdown"}.
A failed operation answers {"error": traceback}; the worker stays up.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def main() -> None:
    # The protocol owns the original stdout; everything vLLM prints goes to stderr.
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    settings = json.loads(sys.stdin.readline())
    os.environ.update({key: str(value) for key, value in settings.get("env", {}).items()})
    try:
        worker = Worker(settings["llm"])
        reply = {"ready": True, "vllm": worker.version}
    except Exception:  # noqa: BLE001 - the client raises it with the traceback
        worker, reply = None, {"error": traceback.format_exc()}
    _send(protocol, reply)
    if worker is None:
        return
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("op") == "shutdown":
            break
        try:
            reply = worker.run(message)
        except Exception:  # noqa: BLE001
            reply = {"error": traceback.format_exc()}
        _send(protocol, reply)


def _send(protocol, reply: dict) -> None:
    protocol.write(json.dumps(reply) + "\n")
    protocol.flush()


class Worker:
    """One vLLM engine and the two operations the evaluator and the data builders need."""

    def __init__(self, llm_settings: dict) -> None:
        import vllm
        from vllm import LLM

        self.version = vllm.__version__
        self.llm = LLM(**llm_settings)

    def run(self, message: dict) -> dict:
        """Answer one request from the client: `generate` or `prompt_logprobs`, by its "op".

        Args:
            message (dict): the request: its "op" and that operation's fields.
        """
        if message["op"] == "generate":
            return {"answers": self.generate(message)}
        if message["op"] == "prompt_logprobs":
            return {"scores": self.prompt_logprobs(message)}
        raise ValueError(f"unknown operation {message['op']!r}")

    def generate(self, message: dict) -> list[list[int]]:
        """Greedy answers to the message's prompts, each ending at a stop token (kept) or its budget.

        Args:
            message (dict): the request: "prompts" (token ids), "max_tokens" (one budget per prompt), "stop_token_ids",
                and "lora" (name and path) or None.
        """
        from vllm import SamplingParams

        stops = list(message.get("stop_token_ids") or [])
        params = [
            SamplingParams(temperature=0.0, max_tokens=budget, stop_token_ids=stops, ignore_eos=True, detokenize=False)
            for budget in message["max_tokens"]
        ]
        outputs = self._run(message, params)
        answers = []
        for output in outputs:
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            # vLLM may leave the stop token out of the ids; the transformers path keeps it.
            if completion.finish_reason == "stop" and isinstance(completion.stop_reason, int) and (
                not tokens or tokens[-1] != completion.stop_reason
            ):
                tokens.append(completion.stop_reason)
            answers.append(tokens)
        return answers

    def prompt_logprobs(self, message: dict) -> list[list[list[float]]]:
        """For each prompt, [log-probability, rank] of every token from its start on, given the tokens before it.

        Args:
            message (dict): the request: "prompts" (token ids), "starts" (one index per prompt), and "lora" (name and
                path) or None.
        """
        from vllm import SamplingParams

        # One generated token is the least vLLM computes; prompt_logprobs=1 adds the argmax beside the
        # prompt token itself, so each position carries the token's rank.
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1, detokenize=False)
        outputs = self._run(message, [params] * len(message["prompts"]))
        scores = []
        for prompt, start, output in zip(message["prompts"], message["starts"], outputs):
            positions = output.prompt_logprobs  # None at index 0, then {token_id: Logprob} per position
            scores.append([[positions[i][prompt[i]].logprob, positions[i][prompt[i]].rank] for i in range(start, len(prompt))])
        return scores

    def _run(self, message: dict, params: list) -> list:
        lora = message.get("lora")
        request = None
        if lora:
            from vllm.lora.request import LoRARequest

            request = LoRARequest(lora["name"], 1, lora["path"])
        prompts = [{"prompt_token_ids": ids} for ids in message["prompts"]]
        return self.llm.generate(prompts, params, use_tqdm=False, lora_request=request)


if __name__ == "__main__":  # the guard vLLM's engine process needs
    main()
