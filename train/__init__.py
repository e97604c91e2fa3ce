"""Training: LoRA adapters on prefix-to-answer data (`train/sft.py`), with TRL's SFT loss
or the ReFusion slot objective (`train/refusion_objective.py`)."""
