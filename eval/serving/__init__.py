"""Streaming generation served on vLLM: typing sessions whose drafts vLLM verifies as speculative proposals.

- `proposer`: the custom speculative proposer vLLM loads (`method: custom_class`), and the board of live
  requests' drafts it reads; runs in the vLLM environment.
- `engine_worker`: the vLLM engine loop, in the vLLM environment; `engine`: its client, in this one.
- `sessions`: typing sessions, background drafting and its scheduling; `api`: the OpenAI-compatible
  HTTP server (`python -m eval.serve`); `page`: the live page's routes (`python -m eval.live`).
"""
