"""Decoding engines: the streaming procedure for each kind of model, the acceptance rules and the batched fast path."""
