"""Time to answer on the streaming server, with and without drafts, for typists replayed at once.

    python benchmarks/bench_serving.py --limit 40 --typists 1 4 16

For each server (`python -m eval.serve drafts=false`, plain vLLM greedy decoding, then
`drafts=true`, the same engine verifying the typing sessions' drafts) and each number of
typists T: T typists type the first --limit requests of each benchmark (typist j takes
requests j, j + T, ...), at --cpm characters a minute (260: the average typist). Segment S_i
reaches the server when its last character is typed (`complete: true`: the benchmark's own
segmentation, PROTOCOL.md); the request is submitted when its last character is typed, and the
time to answer runs from submission to the last token. Typists start spread over one average
request's typing time, and begin their next request at once.

Stretches when every typist waits and the server is idle (nothing decoding, no request in
flight) are skipped: nothing on the server changes in them (a session expires after
minutes; none does here). `--real-time` waits them out instead.

Prints, per benchmark and T: time to answer (median, p90) on each server, the median of the
per-request speedups, the share of answers identical token for token to the server without
drafts, accepted tokens per verification, and the drafting work (draft tokens and engine
steps, drafts made stale or paused). Records go to --output as they finish (a rerun resumes).
Last line: `serving: identical A/B; time-to-answer speedup median X.XXx` for the first
benchmark at the smallest T.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from omegaconf import OmegaConf

from eval.benchmarks import get_benchmark
from eval.benchmarks.base import Request
from eval.evaluation.typing_sim import AVERAGE_TYPIST_CPM
from eval.reporting.tables import markdown_rows
from headstart.files import read_jsonl
from headstart.paths import RECIPES_DIR

REPO = Path(__file__).resolve().parents[1]  # the checkout this benchmark runs from (benchmarks are not installed)

# The vendored data of each benchmark (the CPU suite's recipe: one home for the local paths).
SUITE_RECIPE = RECIPES_DIR / "eval" / "suite_smollm2.yaml"
SERVERS = ("plain", "drafts")


def local_data_paths() -> dict[str, str]:
    return dict(OmegaConf.load(SUITE_RECIPE).data_paths)


@dataclass
class Timeline:
    """Wall clock, less the idle stretches skipped."""

    skipped: float = 0.0

    def now(self) -> float:
        return time.monotonic() + self.skipped


class Replay:
    """T typists against one server; waits are skipped while everyone waits and the server is idle."""

    def __init__(self, client: httpx.AsyncClient, real_time: bool) -> None:
        self.client, self.real_time = client, real_time
        self.clock = Timeline()
        self.wakeups: list[float] = []
        self.in_flight = 0
        self.posts = 0  # requests sent so far
        self.typing = 0  # typists not yet done

    async def wait_until(self, moment: float) -> None:
        self.wakeups.append(moment)
        try:
            while self.clock.now() < moment:
                await asyncio.sleep(min(0.05, moment - self.clock.now()))
                if not self.real_time and self._all_waiting():
                    posts = self.posts
                    # Skip only if no typist posted while the server was asked (a text may have started a draft).
                    if await self._server_idle() and self._all_waiting() and self.posts == posts:
                        self.clock.skipped += max(0.0, min(self.wakeups) - self.clock.now())
        finally:
            self.wakeups.remove(moment)

    def _all_waiting(self) -> bool:
        """Every typist waits (none has a request in flight): checked again after the server is asked,
        since a typist may have woken meanwhile."""
        return self.in_flight == 0 and len(self.wakeups) == self.typing and min(self.wakeups) > self.clock.now()

    async def _server_idle(self) -> bool:
        stats = (await self.client.get("/v1/headstart/stats")).json()
        return not (stats["answers_in_flight"] or stats["drafting"] or stats["waiting_to_draft"])

    async def post(self, path: str, body: dict) -> dict:
        self.in_flight += 1
        self.posts += 1
        try:
            reply = await self.client.post(path, json=body, timeout=None)
        finally:
            self.in_flight -= 1
        data = reply.json()
        if reply.status_code != 200:
            raise RuntimeError(f"{path}: {reply.status_code} {data}")
        return data


async def type_request(replay: Replay, request: Request, start: float, cpm: float, max_tokens: int,
                       drafts: bool) -> dict[str, Any]:
    """Type one request from `start` on; submit it; the record."""
    gap, typed, moments = 60.0 / cpm, 0, []
    for segment in request.segments:
        typed += len(segment)
        moments.append(start + typed * gap)
    session = None
    if drafts:
        session = (await replay.post("/v1/sessions", {"messages": request.history, "max_tokens": max_tokens}))["id"]
    for index, moment in enumerate(moments[:-1]):
        await replay.wait_until(moment)
        if session:
            await replay.post(f"/v1/sessions/{session}/text",
                              {"text": "".join(request.segments[: index + 1]), "complete": True})
    await replay.wait_until(moments[-1])
    submitted = replay.clock.now()
    body = {"messages": [*request.history, {"role": "user", "content": request.text}], "max_tokens": max_tokens}
    answer = await replay.post("/v1/chat/completions", body | ({"session": session} if session else {}))
    extension = answer["headstart"]
    return {"request_id": request.request_id, "time_to_answer": replay.clock.now() - submitted,
            "token_ids": extension["token_ids"], "engine_steps": extension["engine_steps"],
            "proposed": extension["proposed"], "accepted": extension["accepted"],
            "verifications": extension["verifications"], "finished_at": replay.clock.now()}


async def run_typists(url: str, requests: list[Request], typists: int, cpm: float, max_tokens: int, drafts: bool,
                      real_time: bool, done: dict[str, dict], write) -> dict[str, Any]:
    """Every request not in `done`, typed by `typists` typists; the server's drafting work over the run."""
    async with httpx.AsyncClient(base_url=url, timeout=None) as client:
        replay = Replay(client, real_time)
        before = (await client.get("/v1/headstart/stats")).json()
        mean_typing = statistics.mean(len(r.text) for r in requests) * 60.0 / cpm
        lanes = [[r for r in requests[j::typists] if r.request_id not in done] for j in range(typists)]
        replay.typing = sum(1 for lane in lanes if lane)
        origin = replay.clock.now()

        async def typist(j: int, lane: list[Request]) -> None:
            start = origin + j * mean_typing / typists
            try:
                for request in lane:
                    record = await type_request(replay, request, start, cpm, max_tokens, drafts)
                    write(record)
                    start = replay.clock.now()
            finally:
                replay.typing -= 1

        await asyncio.gather(*(typist(j, lane) for j, lane in enumerate(lanes) if lane))
        after = (await client.get("/v1/headstart/stats")).json()
    work = {key: after[key] - before[key] for key in ("drafts_started", "draft_tokens", "draft_steps", "stale", "paused")}
    return work | {"skipped_seconds": replay.clock.skipped}


class ServerProcess:
    """`python -m eval.serve` on a free port, until closed."""

    def __init__(self, args: argparse.Namespace, drafts: bool, port: int) -> None:
        command = [sys.executable, "-m", "eval.serve", f"model={args.model}", f"drafts={str(drafts).lower()}",
                   f"port={port}", f"decode.max_new_tokens={args.max_tokens}",
                   f"speculative_tokens={args.speculative_tokens}", f"max_drafting={args.max_drafting}", *args.serve]
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(command, cwd=REPO)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited (code {self.process.returncode}): {' '.join(command)}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.close()
        raise RuntimeError("the server did not start in 10 minutes")

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def summarise(plain: list[dict], drafts: list[dict], work: dict[str, Any]) -> dict[str, Any]:
    by_id = {r["request_id"]: r for r in plain}
    pairs = [(by_id[r["request_id"]], r) for r in drafts if r["request_id"] in by_id]
    speedups = [p["time_to_answer"] / d["time_to_answer"] for p, d in pairs]
    verifications = sum(d["verifications"] for _, d in pairs)
    return {
        "n": len(pairs), "identical": sum(p["token_ids"] == d["token_ids"] for p, d in pairs),
        "plain_median": statistics.median(p["time_to_answer"] for p, _ in pairs),
        "plain_p90": percentile([p["time_to_answer"] for p, _ in pairs], 0.9),
        "drafts_median": statistics.median(d["time_to_answer"] for _, d in pairs),
        "drafts_p90": percentile([d["time_to_answer"] for _, d in pairs], 0.9),
        "speedup_median": statistics.median(speedups), "slower": sum(s < 1 for s in speedups),
        "steps_plain": statistics.median(p["engine_steps"] for p, _ in pairs),
        "steps_drafts": statistics.median(d["engine_steps"] for _, d in pairs),
        "accepted_per_verification": sum(d["accepted"] for _, d in pairs) / verifications if verifications else 0.0,
        **{f"work_{key}": value for key, value in work.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=40, help="requests per benchmark")
    parser.add_argument("--typists", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--benchmarks", nargs="+", default=["humaneval", "mbpp", "chat"])
    parser.add_argument("--cpm", type=float, default=AVERAGE_TYPIST_CPM, help="characters a minute")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--speculative-tokens", type=int, default=8)
    parser.add_argument("--max-drafting", type=int, default=4)
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--real-time", action="store_true", help="wait out idle stretches too")
    parser.add_argument("--output", default="outputs/bench/serving")
    parser.add_argument("--serve", nargs="*", default=[], help="more `python -m eval.serve` overrides")
    args = parser.parse_args()

    paths = local_data_paths()
    requests = {name: get_benchmark(name, paths.get(name)).load(args.limit) for name in args.benchmarks}
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    runs: dict[tuple[str, str, int], list[dict]] = {}
    works: dict[tuple[str, int], dict] = {}
    for server_name in SERVERS:
        server = None
        try:
            for benchmark, typists in [(b, t) for b in args.benchmarks for t in sorted(args.typists)]:
                path = output / f"{server_name}-{benchmark}-T{typists}.jsonl"
                done = {r["request_id"]: r for r in read_jsonl(path)} if path.is_file() else {}
                work_path = path.with_suffix(".work.json")
                if len(done) < len(requests[benchmark]):
                    server = server or ServerProcess(args, server_name == "drafts", args.port)
                    with path.open("a") as sink:
                        def write(record: dict, sink=sink) -> None:
                            sink.write(json.dumps(record) + "\n")
                            sink.flush()
                        work = asyncio.run(run_typists(server.url, requests[benchmark], typists, args.cpm,
                                                       args.max_tokens, server_name == "drafts", args.real_time,
                                                       done, write))
                    work_path.write_text(json.dumps(work))
                    print(f"{server_name} {benchmark} T={typists}: done", flush=True)
                runs[(server_name, benchmark, typists)] = list(read_jsonl(path))
                works[(benchmark, typists)] = json.loads(work_path.read_text()) if work_path.is_file() else {}
        finally:
            if server:
                server.close()
    print_table(args, runs, works)


def print_table(args: argparse.Namespace, runs: dict[tuple[str, str, int], list[dict]],
                works: dict[tuple[str, int], dict]) -> None:
    """The side-by-side table of every benchmark and typist count, then the first benchmark's line."""
    rows, first = [], None
    for benchmark in args.benchmarks:
        for typists in sorted(args.typists):
            s = summarise(runs[("plain", benchmark, typists)], runs[("drafts", benchmark, typists)],
                          works[(benchmark, typists)])
            first = first or s
            rows.append([benchmark, str(typists), str(s["n"]), f"{s['identical']}/{s['n']}",
                         f"{s['plain_median']:.2f} / {s['plain_p90']:.2f}", f"{s['drafts_median']:.2f} / {s['drafts_p90']:.2f}",
                         f"{s['speedup_median']:.2f}x", f"{s['plain_median'] / s['drafts_median']:.2f}x", str(s["slower"]),
                         f"{s['steps_plain']:g} / {s['steps_drafts']:g}", f"{s['accepted_per_verification']:.2f}",
                         f"{s.get('work_draft_tokens', 0)} / {s.get('work_draft_steps', 0)}",
                         f"{s.get('work_stale', 0)} / {s.get('work_paused', 0)}"])
    print(markdown_rows(["benchmark", "typists", "n", "identical", "plain s med / p90", "drafts s med / p90",
                          "speedup med", "ratio of medians", "slower", "steps plain / drafts (med)",
                          "accepted / verification", "draft tokens / steps", "stale / paused"], rows))
    print(f"serving: identical {first['identical']}/{first['n']}; time-to-answer speedup median {first['speedup_median']:.2f}x")


if __name__ == "__main__":
    main()
