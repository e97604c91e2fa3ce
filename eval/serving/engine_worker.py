"""The serving engine loop: runs in the vLLM environment, token ids in, token ids out.

Started by `eval.serving.engine.ServingEngine` as `python -m eval.serving.engine_worker` with
the vLLM environment's interpreter. One vLLM `LLMEngine` runs in this process with its engine
core and model runner (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, the "uni" executor), so the
speculative proposer (eval.serving.proposer) reads the board this loop posts drafts on.

Protocol, one JSON object per line. The first line read holds the settings: `llm` (LLMEngine's
arguments), `env` (set before vLLM is imported), `policy` (the lookup policy's fields, or null)
and `eos_token_ids`; it answers {"ready": true, "vllm": version}. Then, in any order:
- {"op": "add", "id", "prompt": [ids], "max_tokens": n, "sources": null | {"held": [ids],
   "earlier": [[ids], ...], "policy": {...} (optional: this request's lookup policy)}}: greedy
   decoding; `sources` null proposes nothing;
- {"op": "abort", "id"}: stop that request (it answers with a finished event, "reason": "abort");
- {"op": "shutdown"}.
Each engine step writes one event per request it advanced: {"id", "tokens": [new ids],
"finished": bool}, and the finished event adds "reason" ("stop", "length" or "abort"), "steps"
(engine steps that gave it tokens) and the proposer's counts ("proposed", "accepted",
"verifications"). A request that cannot be added answers {"id", "finished": true, "error"}.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import traceback


def main() -> None:
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")  # vLLM's prints go to stderr, not the protocol
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    settings = json.loads(sys.stdin.readline())
    os.environ.update({key: str(value) for key, value in settings.get("env", {}).items()})
    try:
        loop = EngineLoop(settings, protocol)
    except Exception:  # noqa: BLE001 - the client raises it with the traceback
        _send(protocol, {"error": traceback.format_exc()})
        return
    _send(protocol, {"ready": True, "vllm": loop.version})
    loop.run()


def _send(protocol, message: dict) -> None:
    protocol.write(json.dumps(message) + "\n")
    protocol.flush()


class EngineLoop:
    """Ops from stdin are applied between engine steps, in the thread that steps the engine."""

    def __init__(self, settings: dict, protocol) -> None:
        import vllm
        from vllm import EngineArgs, LLMEngine

        from eval.engines.lookup_policy import LookupPolicy
        from eval.serving.proposer import BOARD

        policy = settings.get("policy")
        BOARD.policy = LookupPolicy(**policy) if policy else None
        BOARD.eos_token_ids = set(settings["eos_token_ids"])
        self.board = BOARD
        self.stops = sorted(BOARD.eos_token_ids)
        self.version = vllm.__version__
        self.engine = LLMEngine.from_engine_args(EngineArgs(**settings["llm"]))
        self.protocol = protocol
        self.inbox: queue.Queue[dict | None] = queue.Queue()
        self.steps: dict[str, int] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            self.inbox.put(json.loads(line))
        self.inbox.put(None)  # the client went away

    def run(self) -> None:
        while True:
            busy = self.engine.has_unfinished_requests()
            try:
                while True:
                    message = self.inbox.get(block=not busy)
                    if message is None or message.get("op") == "shutdown":
                        return
                    self._apply(message)
                    busy = self.engine.has_unfinished_requests()
            except queue.Empty:
                pass
            if busy:
                self._step()

    def _apply(self, message: dict) -> None:
        request_id = message.get("id")
        try:
            if message["op"] == "add":
                self._add(request_id, message)
            elif message["op"] == "abort":
                if request_id in self.steps:
                    self.engine.abort_request([request_id])
                    self._finish(request_id, [], "abort")
            else:
                raise ValueError(f"unknown operation {message['op']!r}")
        except Exception as error:  # noqa: BLE001 - that request fails; the engine serves on
            self.board.remove(request_id)
            self.steps.pop(request_id, None)
            _send(self.protocol, {"id": request_id, "finished": True, "error": f"{type(error).__name__}: {error}",
                                  "tokens": []})

    def _add(self, request_id: str, message: dict) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(temperature=0.0, max_tokens=message["max_tokens"], stop_token_ids=self.stops,
                                ignore_eos=True, detokenize=False, output_kind=RequestOutputKind.DELTA)
        self.board.post(request_id, message["prompt"], message["max_tokens"], message.get("sources"))
        self.engine.add_request(request_id, {"prompt_token_ids": message["prompt"]}, params)
        self.steps[request_id] = 0

    def _step(self) -> None:
        for output in self.engine.step():
            request_id = output.request_id
            if request_id not in self.steps:  # aborted while this step ran
                continue
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            self.steps[request_id] += 1
            if not output.finished:
                _send(self.protocol, {"id": request_id, "tokens": tokens, "finished": False})
                continue
            # vLLM may leave the stop token out of the ids; the evaluator's answers keep it.
            if completion.finish_reason == "stop" and isinstance(completion.stop_reason, int) and (
                not tokens or tokens[-1] != completion.stop_reason
            ):
                tokens.append(completion.stop_reason)
            self._finish(request_id, tokens, completion.finish_reason or "stop")

    def _finish(self, request_id: str, tokens: list[int], reason: str) -> None:
        event = {"id": request_id, "tokens": tokens, "finished": True, "reason": reason,
                 "steps": self.steps.pop(request_id), **self.board.remove(request_id)}
        _send(self.protocol, event)


if __name__ == "__main__":  # the guard vLLM's engine process needs
    main()
