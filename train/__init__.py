"""Training: SFT of LoRA adapters on prefix-to-answer data (`train/sft.py`)."""
