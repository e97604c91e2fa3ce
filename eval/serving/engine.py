"""The serving engine from this process: `eval.serving.engine_worker` in the vLLM environment,
requests in, token events out, one asyncio queue per request.

The worker is one vLLM engine whose speculative proposer reads the drafts posted with each
request (eval.serving.proposer). This process keeps its pins and its tokenizer, as the
evaluator's vLLM drafter does: only token ids cross the pipe.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from dataclasses import asdict
from typing import Any

from eval.engines.lookup_policy import LookupPolicy
from headstart.vllm_client import VLLMEngines, VLLMModel, engine_args, engine_gpu_memory, start_worker, vllm_unavailable
from headstart.vllm_settings import VLLMSettings, vllm_python

PROPOSER = "eval.serving.proposer.DraftProposer"


def serving_engine_args(model_dir: str, settings: VLLMSettings, dtype: str, needed_model_len: int | None,
                        speculative_tokens: int, device: str = "cpu") -> dict:
    """LLMEngine's arguments: `engine_args` (the evaluator's), with the draft proposer when
    `speculative_tokens` > 0, and the model runner in the worker's own process (the "uni"
    executor), where the proposer reads the board the worker posts drafts on.

    Args:
        model_dir (str): the base directory vLLM loads.
        settings (VLLMSettings): the run's vLLM settings.
        dtype (str): the dtype name the engine computes in.
        needed_model_len (int | None): the longest prompt and answer a request may send, or None.
        speculative_tokens (int): the most draft tokens verified per step; 0: no proposer.
        device (str): the device the engine runs on.
    """
    if speculative_tokens and settings.tensor_parallel_size > 1:
        raise ValueError("drafts need vLLM's model runner in the engine loop's process, and tensor_parallel_size > 1 "
                         "runs it in others: serve with vllm.tensor_parallel_size=1 (a model that fits one GPU), or "
                         "drafts=false for plain vLLM serving")
    gpu_memory = engine_gpu_memory(0, settings) if device.startswith("cuda") else None
    llm = engine_args(VLLMModel(model_dir), settings, dtype, needed_model_len, gpu_memory)
    # "uni": the model runner in this worker's process. No async scheduling on either server: vLLM turns it
    # off for a custom proposer, and the server without drafts must be the same engine less the drafts.
    llm |= {"distributed_executor_backend": "uni", "async_scheduling": False}
    if speculative_tokens:
        llm["speculative_config"] = {"method": "custom_class", "model": PROPOSER,
                                     "num_speculative_tokens": speculative_tokens}
    return llm


class ServingEngine:
    """One engine worker. `add` returns the queue its events arrive on (see engine_worker)."""

    def __init__(self, llm: dict, settings: VLLMSettings, policy: LookupPolicy | None, eos_token_ids: set[int],
                 device: str) -> None:
        reason = vllm_unavailable(settings, device)
        if reason:
            raise RuntimeError(f"serving needs vLLM: {reason}")
        gpus = 1 if device.startswith("cuda") else 0
        first = {"llm": llm, "policy": asdict(policy) if policy else None, "eos_token_ids": sorted(eos_token_ids)}
        env = {"VLLM_ENABLE_V1_MULTIPROCESSING": 0}
        self.process = start_worker([str(vllm_python(settings)), "-m", "eval.serving.engine_worker"], settings, first,
                                    gpus, env=env)
        ready = self._read_line()
        if "error" in ready:
            self.close()
            raise RuntimeError(f"the serving engine failed to start:\n{ready['error']}")
        self.version = ready["vllm"]
        self.queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self.lock = threading.Lock()
        self.dead: str | None = None  # why the worker stopped, once it has
        self.reader = threading.Thread(target=self._route, daemon=True)
        self.reader.start()

    def _read_line(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            return {"error": f"the engine worker exited (code {self.process.wait()}); its log is above"}
        return json.loads(line)

    def _route(self) -> None:
        """Every event to its request's queue, in this reader thread; at the worker's end (or a line
        that cannot be read), an error to every waiting request, and `add` refuses from then on."""
        while True:
            try:
                event = self._read_line()
            except ValueError as error:
                event = {"error": f"unreadable line from the engine worker: {error}"}
            if "id" not in event:  # the worker is gone
                with self.lock:
                    self.dead, waiting, self.queues = event.get("error", "the engine worker stopped"), self.queues, {}
                for target in waiting.values():
                    self._deliver(target, {"finished": True, "tokens": [], "error": self.dead})
                return
            with self.lock:
                target = self.queues.pop(event["id"], None) if event["finished"] else self.queues.get(event["id"])
            if target:
                self._deliver(target, event)

    @staticmethod
    def _deliver(target: tuple[asyncio.AbstractEventLoop, asyncio.Queue], event: dict) -> None:
        try:
            target[0].call_soon_threadsafe(target[1].put_nowait, event)
        except RuntimeError:  # that request's event loop has closed (its client went away): nobody waits
            pass

    def add(self, request_id: str, prompt: list[int], max_tokens: int, sources: dict[str, Any] | None) -> asyncio.Queue:
        """Start greedy decoding of `prompt`; `sources` (held draft, earlier drafts) feed the proposer, None proposes
        nothing. Call from the event loop the queue belongs to.

        Args:
            request_id (str): the request's id.
            prompt (list[int]): the prompt's token ids.
            max_tokens (int): the most tokens the answer may have.
            sources (dict[str, Any] | None): the drafts the proposer reads, or None for no proposals.
        """
        events: asyncio.Queue = asyncio.Queue()
        with self.lock:
            if self.dead:
                raise RuntimeError(f"the serving engine has stopped: {self.dead}")
            self.queues[request_id] = (asyncio.get_running_loop(), events)
        self._send({"op": "add", "id": request_id, "prompt": prompt, "max_tokens": max_tokens, "sources": sources})
        return events

    def abort(self, request_id: str) -> None:
        """Stop a request; its queue gets a finished event with reason "abort" (none if it had finished).

        Args:
            request_id (str): the request's id.
        """
        self._send({"op": "abort", "id": request_id})

    def _send(self, message: dict) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"the serving engine exited (code {self.process.returncode})")
        VLLMEngines._write(self.process, message)

    def close(self) -> None:
        """Stop the worker."""
        if self.process.poll() is None:
            try:
                VLLMEngines._write(self.process, {"op": "shutdown"})
                self.process.stdin.close()
                self.process.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
