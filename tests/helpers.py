"""Tiny batch and model builders shared by the model-side tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from lab.model.heads import head_config
from lab.model.mtp import MTPModel
from lab.model.mtp import build_model as build_mtp_model
from lab.nn.blocks import ModelConfig

PAD = 0
VOCAB = 37
D_MODEL = 16


def make_batch(tokens, segment_ids, active=None) -> dict:
    """Batch dict from token and segment rows; position_ids restart at every document occurrence."""
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    segment_ids = torch.as_tensor(segment_ids, dtype=torch.long)
    active = segment_ids >= 0 if active is None else torch.as_tensor(active, dtype=torch.bool)
    positions = torch.zeros_like(tokens)
    for b in range(tokens.shape[0]):
        for t in range(1, tokens.shape[1]):
            same = segment_ids[b, t] == segment_ids[b, t - 1] and segment_ids[b, t] >= 0
            positions[b, t] = positions[b, t - 1] + 1 if same else 0
    return {"tokens": tokens, "active": active, "segment_ids": segment_ids, "position_ids": positions}


def packed_batch(seed: int = 0) -> dict:
    """Two rows of S=12: row 0 = doc (7 tokens) + doc (5 tokens); row 1 = doc (8 tokens) + 4 pads."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, VOCAB, (2, 12), generator=g)
    segments = torch.tensor([[0] * 7 + [1] * 5, [0] * 8 + [-1] * 4])
    tokens[segments < 0] = PAD
    return make_batch(tokens, segments)


def short_docs_batch(seed: int = 0) -> dict:
    """S=12, every document ≤ 4 tokens: horizon 4 (and DeepSeek depth 3) has zero valid rows."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, VOCAB, (2, 12), generator=g)
    segments = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, -1], [0, 0, 0, 1, 1, 1, 1, 2, 2, -1, -1, -1]])
    tokens[segments < 0] = PAD
    return make_batch(tokens, segments)


def model_config(n_layers: int = 2, tie: bool = True, vocab: int = VOCAB, d_model: int = D_MODEL) -> ModelConfig:
    # init_std 0.2 (not 0.02) so every path carries gradients well above rounding noise.
    return ModelConfig(vocab_size=vocab, d_model=d_model, n_layers=n_layers, n_heads=2, mlp_ratio=2, tie_embeddings=tie, init_std=0.2)


def hf_llama_config(vocab: int = VOCAB, d_model: int = D_MODEL, n_layers: int = 2, tie: bool = False) -> dict:
    """A tiny transformers Llama (random weights) as `model.config`."""
    return {"model_type": "llama", "vocab_size": vocab, "hidden_size": d_model, "intermediate_size": 2 * d_model,
            "num_hidden_layers": n_layers, "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": tie,
            "initializer_range": 0.2}


def build_model(name: str, k: int = 1, *, seed: int = 0, layers: int = 2, tie: bool = True, trunk: str = "gpt", **head) -> MTPModel:
    """A tiny MTPModel with `layers` = model.n_layers; `head` holds extra head-config fields (depth, trunk_grad, ...).

    `compute_match` defaults to `next_token_path` here (not the config's `blocks`), so that
    2-layer models can carry K block heads. `trunk="hf"`: a tiny transformers Llama of the same
    width, vocabulary and depth is the trunk (its layers are never dropped: compute_match none).
    """
    torch.manual_seed(seed)
    if trunk == "hf":
        from lab.model.mtp import build_model as build

        return build({"name": "hf", "config": hf_llama_config(n_layers=layers, tie=tie)}, {"name": name, "k": k, **head, "compute_match": "none"})
    return MTPModel(model_config(layers, tie), head_config({"name": name, "k": k, "compute_match": "next_token_path", **head}))


def horizon_sums(horizons) -> list[torch.Tensor]:
    """S_k: sum cross-entropy of each horizon over its valid rows, from full logits."""
    sums = []
    for h in horizons:
        logits = F.linear(h.norm(h.hidden), h.weight)  # [B, S-k, V]
        sums.append(F.cross_entropy(logits[h.mask], h.labels[h.mask], reduction="sum"))
    return sums


def grads(model) -> dict[str, torch.Tensor]:
    """Every parameter's gradient by name (zeros where autograd left None)."""
    return {n: (torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()) for n, p in model.named_parameters()}


def loss_and_grads(model, batch, weights=None):
    """(Σ_k w_k S_k, grads) for one fresh backward."""
    model.zero_grad(set_to_none=True)
    sums = horizon_sums(model(batch))
    weights = [1.0] * len(sums) if weights is None else weights
    loss = sum(w * s for w, s in zip(weights, sums))
    loss.backward()
    return loss.detach(), grads(model)


def assert_close_rel(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-5, what: str = "") -> None:
    """|a-b|_max ≤ rtol·|a|_max + 1e-8: a tolerance relative to each tensor's scale."""
    err, scale = (a - b).abs().max().item() if a.numel() else 0.0, a.abs().max().item() if a.numel() else 0.0
    assert err <= rtol * scale + 1e-8, f"{what}: max diff {err:.3e} vs scale {scale:.3e}"


def bigram_model(vocab: int, next_of: dict[int, int]):
    """A real ntp MTPModel whose greedy next token is next_of[current token]: the blocks add nothing
    (zero output projections), the embedding is one-hot and the unembedding maps x to next_of[x]."""
    model = build_mtp_model({"vocab_size": vocab, "d_model": vocab + (vocab % 2), "n_heads": 1, "n_layers": 1, "tie_embeddings": False},
                        {"name": "ntp", "k": 1})
    with torch.no_grad():
        for block in model.trunk.blocks:
            block.attn.proj.weight.zero_()
            block.mlp.down.weight.zero_()
        model.trunk.embed.weight.zero_()
        model.trunk.embed.weight[:, :vocab] = torch.eye(vocab)
        model.trunk.unembed.zero_()
        for token, following in next_of.items():
            model.trunk.unembed[following, token] = 1.0
    return model


def committed_kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (K, V) of a decoding cache's committed rows only, [B, H, committed, hd] each: the harness's own
    StackCache (keys/values lists) or the transformers trunk's (a DynamicCache in `.dynamic`)."""
    layers = [(layer.keys, layer.values) for layer in cache.dynamic.layers] if hasattr(cache, "dynamic") else zip(cache.keys, cache.values)
    return [(k[:, :, : cache.committed], v[:, :, : cache.committed]) for k, v in layers]


class float64_throughout(TorchFunctionMode):
    """`with float64_throughout():` every float32 a computation asks for is float64 instead (`dtype=torch.float32`
    or `torch.float` anywhere in a call's arguments, `Tensor.float()`), so a `.double()` model runs in float64 end to end.

    Some code asks for float32 whatever the model's dtype: transformers' RMSNorms, rotary cos/sin and eager
    softmax, the glm4_moe/deepseek_v3 routers (`F.linear(x.type(torch.float32), weight.type(torch.float32))`), and
    lab.nn.blocks.rotary_angles. A float32 matmul sums in an order its BLAS kernel picks from the shape and the CPU
    (AVX2 or AVX-512, Intel or AMD), so a 1-row cached pass and an n-row full forward differ by ~1e-7 relative in the
    router logits and up to ~5e-9 in the output logits (glm4_moe: 3.8e-10 on an AMD EPYC, 5.2e-9 on an Intel Xeon):
    a 1e-9 test then passes on one CPU and fails on another. Inside this mode the same code runs, only in float64, and
    two code paths agree to float64 rounding (~1e-16 there) on any CPU. For float64 models only: it would turn a float32
    model's pieces into float64 too.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        elif any(a is torch.float32 for a in args):
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        if not kwargs:
            return func(*args)
        if any(v is torch.float32 for v in kwargs.values()):
            kwargs = {k: torch.float64 if v is torch.float32 else v for k, v in kwargs.items()}
        return func(*args, **kwargs)
