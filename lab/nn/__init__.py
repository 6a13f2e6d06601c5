"""Tensor building blocks: the GPT's blocks and config, transformers' native decoder layers, MoE routers,
draft vocabularies, LoRA adapters, FLOP counts.

The lowest layer that holds modules: the decoding core (lab.decode_core), the heads (lab.model.heads) and
the MTP model (lab.model) are written against it, and nothing here imports any of them.
"""
