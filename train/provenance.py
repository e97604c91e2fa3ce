"""Who wrote the training answers: self-distillation data must be the trained model's own."""

from __future__ import annotations

from pathlib import Path

from datasets import Dataset

from headstart.files import read_text

ANSWER_MODEL = "answer_model"


def same_model(a: str, b: str) -> bool:
    """Whether two model names denote the same model: equal, or the same repository/directory
    name (a hub id and its local copy), an embedded alias, its GGUF file and the directory
    `headstart.models.resolve_model_dir` converts that file into all alike.

    Args:
        a (str): a model's name or path.
        b (str): another model's name or path.
    """
    return a.strip().rstrip("/").lower() == b.strip().rstrip("/").lower() or model_key(a) == model_key(b)


def model_key(name: str) -> str:
    """What identifies a model across its spellings: the GGUF stem for an embedded alias, a .gguf
    file or its converted directory; else the last part of a hub id or path (lower case).

    Args:
        name (str): a model's name or path.
    """
    from headstart.models import EMBEDDED_MODELS, converted_gguf_stem

    name = name.strip().rstrip("/")
    if name.lower() in EMBEDDED_MODELS:
        return Path(EMBEDDED_MODELS[name.lower()].filename).stem.lower()
    path = Path(name).expanduser()
    return (converted_gguf_stem(path) or path.name.lower().removesuffix(".gguf")).lower()


def answer_models(dataset: Dataset, path: str) -> set[str] | None:
    """Which models wrote the rows' answers: the `answer_model` column (data_builders writes it;
    empty for a corpus's own answers), else, for a build that predates it, the `model` of its
    config.yaml when its rows say `answer_kind: self`. None: the data does not say.

    Args:
        dataset (Dataset): the training rows.
        path (str): where the data was loaded from (its config.yaml is read).
    """
    if ANSWER_MODEL in dataset.column_names:
        return {m for m in dataset.unique(ANSWER_MODEL) if m}
    if "answer_kind" in dataset.column_names and "self" in dataset.unique("answer_kind"):
        config = Path(path).expanduser() / "config.yaml"
        if config.is_file():
            from omegaconf import OmegaConf

            model = OmegaConf.create(read_text(config)).get("model")  # an undecodable one is named
            return {str(model)} if model else None
        return None
    if "answer_kind" in dataset.column_names:
        return set()  # corpus answers only
    return None


def check_answer_models(dataset: Dataset, path: str, model: str, allowed: bool) -> list[str]:
    """Refuse answers written by another model than the one trained (self-distillation data of
    another model is distillation from it), unless `data.answers_from_other_model`; returns notes.

    Args:
        dataset (Dataset): the training rows.
        path (str): where the data was loaded from.
        model (str): the model trained.
        allowed (bool): `data.answers_from_other_model`: another model's answers are accepted, with a note.
    """
    writers = answer_models(dataset, path)
    if writers is None:
        return [f"note: {path} does not say which model wrote its answers (no `{ANSWER_MODEL}` column)"]
    others = sorted(w for w in writers if not same_model(w, model))
    if not others:
        return []
    if allowed:
        return [f"note: training {model} on answers written by {', '.join(others)} (data.answers_from_other_model=true)"]
    raise ValueError(
        f"{path} holds answers written by {', '.join(others)}, not by the model trained here ({model}): that is "
        f"distillation from another model, not self-distillation. Build this model's own data (e.g. "
        f"`python -m data_builders recipe=lmsys_prefix_<model>` or `model={model}`), or set "
        f"data.answers_from_other_model=true to train on them anyway"
    )
