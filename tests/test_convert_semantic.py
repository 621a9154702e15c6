"""Semantic check: a pure-PyTorch Llama forward written against TensorRT-LLM's names and per-rank layout.

It reads the converted rank files and computes exactly what a tensor-parallel TensorRT-LLM engine does
(column-parallel qkv/fc/gate/lm_head, row-parallel dense/proj summed across ranks = the all-reduce,
vocab-parallel embedding summed across ranks), then compares logits with the Hugging Face model. This
proves the name map, the qkv fusion, the fc/gate swap, the KV-head replication and the vocab padding.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from convert_fixtures import make_spec
from safetensors import safe_open

from trtspec.convert.core import convert
from trtspec.convert.modes import ConvertOptions


def load_ranks(d: Path) -> tuple[dict, list[dict[str, torch.Tensor]]]:
    cfg = json.loads((d / "config.json").read_text())
    ranks = []
    for r in range(cfg["mapping"]["world_size"]):
        with safe_open(str(d / f"rank{r}.safetensors"), framework="pt") as f:
            ranks.append({k: f.get_tensor(k) for k in f.keys()})
    return cfg, ranks


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, pos, theta):  # x [T, n, d]; rope_gpt_neox == HF rotate_half
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos[:, None].double() * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1).float()[:, None], torch.cat([ang.sin()] * 2, -1).float()[:, None]
    a, b = x.chunk(2, -1)
    return x * cos + torch.cat([-b, a], -1) * sin


def tp_decoder_layer(
    stage: list[dict], pre: str, x: torch.Tensor, pos: torch.Tensor, cfg: dict, input_norm: bool = True
) -> torch.Tensor:
    """One Llama layer over the tp ranks of a stage, with TensorRT-LLM's names and splits."""
    tp = len(stage)
    eps, nh, nkv, d = cfg["norm_epsilon"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_size"]
    nh_r, nkv_r = nh // tp, max(nkv // tp, 1)
    T = x.shape[0]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    h = rms(x, stage[0][pre + "input_layernorm.weight"], eps) if input_norm else x
    attn = torch.zeros_like(x)
    for rk in stage:
        qkv = h @ rk[pre + "attention.qkv.weight"].T
        q, k, v = qkv.split([nh_r * d, nkv_r * d, nkv_r * d], dim=-1)
        q, k, v = q.view(T, nh_r, d), k.view(T, nkv_r, d), v.view(T, nkv_r, d)
        q, k = rope(q, pos, cfg["rotary_base"]), rope(k, pos, cfg["rotary_base"])
        k, v = k.repeat_interleave(nh_r // nkv_r, 1), v.repeat_interleave(nh_r // nkv_r, 1)
        s = torch.einsum("qhd,khd->hqk", q, k) / d**0.5
        o = torch.einsum("hqk,khd->qhd", s.masked_fill(~causal, float("-inf")).softmax(-1), v)
        attn += o.reshape(T, nh_r * d) @ rk[pre + "attention.dense.weight"].T  # row parallel: all-reduce
    x = x + attn
    h = rms(x, stage[0][pre + "post_layernorm.weight"], eps)
    mlp = torch.zeros_like(x)
    for rk in stage:
        a = F.silu(h @ rk[pre + "mlp.fc.weight"].T) * (h @ rk[pre + "mlp.gate.weight"].T)
        mlp += a @ rk[pre + "mlp.proj.weight"].T
    return x + mlp


def trt_forward(cfg: dict, ranks: list[dict], ids: torch.Tensor, medusa: bool = False):
    tp, pp = cfg["mapping"]["tp_size"], cfg["mapping"]["pp_size"]
    V, H, eps = cfg["vocab_size"], cfg["hidden_size"], cfg["norm_epsilon"]
    T = ids.shape[0]
    pos = torch.arange(T)
    stage0 = [ranks[t] for t in range(tp)]
    if not cfg["use_parallel_embedding"]:
        x = stage0[0]["transformer.vocab_embedding.weight"][ids]
    elif cfg["embedding_sharding_dim"] == 0:
        x = torch.zeros(T, H)
        for t, rk in enumerate(stage0):  # each rank looks up its vocab slice, the rest is masked, then summed
            w = rk["transformer.vocab_embedding.weight"]
            lo = t * w.shape[0]
            local = ids - lo
            hit = (local >= 0) & (local < w.shape[0])
            x += torch.where(hit[:, None], w[local.clamp(0, w.shape[0] - 1)], 0.0)
    else:
        x = torch.cat([rk["transformer.vocab_embedding.weight"][ids] for rk in stage0], dim=-1)
    for p in range(pp):
        stage = [ranks[p * tp + t] for t in range(tp)]
        n_local = len({k.split(".")[2] for k in stage[0] if k.startswith("transformer.layers.")})
        for i in range(n_local):
            x = tp_decoder_layer(stage, f"transformer.layers.{i}.", x, pos, cfg)
    last = [ranks[(pp - 1) * tp + t] for t in range(tp)]
    h = rms(x, last[0]["transformer.ln_f.weight"], eps)
    logits = torch.cat([h @ rk["lm_head.weight"].T for rk in last], dim=-1)[:, :V]
    if not medusa:
        return logits
    heads = []
    for k in range(cfg["num_medusa_heads"]):
        z = h
        for l in range(cfg["num_medusa_layers"]):
            pre = f"medusa_heads.{k}.medusa_layers.{l}.linear."
            z = z + F.silu(torch.cat([z @ rk[pre + "weight"].T + rk[pre + "bias"] for rk in last], -1))
        heads.append(torch.cat([z @ rk[f"medusa_heads.{k}.lm_head.weight"].T for rk in last], -1)[:, :V])
    return logits, heads


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("semantic")


@pytest.mark.parametrize(
    "tp,pp,emb", [(1, 1, None), (2, 1, None), (4, 1, None), (2, 2, None), (2, 1, 1), (4, 1, False)]
)
def test_logits_match_hugging_face(root, tp, pp, emb):
    from transformers import AutoModelForCausalLM

    spec = make_spec(root, "none")
    out = root / f"tp{tp}-pp{pp}-emb{emb}"
    opts = ConvertOptions(
        tp_size=tp,
        pp_size=pp,
        use_parallel_embedding=emb is not False,
        embedding_sharding_dim=emb if isinstance(emb, int) and emb is not False else 0,
    )
    convert(spec, out, opts)
    cfg, ranks = load_ranks(out)
    ids = torch.tensor([1, 5, 9, 96, 40, 3, 77, 12])
    hf = AutoModelForCausalLM.from_pretrained(spec.target.path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
    got = trt_forward(cfg, ranks, ids)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)


def test_medusa_heads_match_their_definition(root):
    """Medusa head logits from the engine names equal the FasterDecoding formula on the source tensors."""
    from transformers import AutoModelForCausalLM

    spec = make_spec(root, "medusa-own-lm-head")
    out = root / "medusa-tp2"
    convert(spec, out, ConvertOptions(tp_size=2))
    cfg, ranks = load_ranks(out)
    ids = torch.tensor([1, 7, 30, 2, 60])
    hf = AutoModelForCausalLM.from_pretrained(spec.target.path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        out_hf = hf(ids[None], output_hidden_states=True)
    h = out_hf.hidden_states[-1][0]  # after the final norm
    logits, heads = trt_forward(cfg, ranks, ids, medusa=True)
    torch.testing.assert_close(logits, out_hf.logits[0], atol=2e-4, rtol=1e-4)
    D = spec.drafter.tensors
    for k, got in enumerate(heads):
        z = h + F.silu(h @ D.load(f"heads.{k}.res.0.weight").T + D.load(f"heads.{k}.res.0.bias"))
        torch.testing.assert_close(got, z @ D.load(f"heads.{k}.lm_head.weight").T, atol=2e-4, rtol=1e-4)


def test_eagle_net_matches_the_reference_eagle_head(root):
    """EAGLE net 0 from the engine names (fc on cat[emb, h], layer 0 without input norm, lm_head) equals
    trtspec's reference EagleHead loaded from the source heads."""
    from trtspec.models.heads import EagleHead

    spec = make_spec(root, "eagle")
    out = root / "eagle-tp2"
    convert(spec, out, ConvertOptions(tp_size=2))
    cfg, ranks = load_ranks(out)
    net_cfg = cfg["eagle_net_config"]
    T, H, V = 6, cfg["hidden_size"], cfg["vocab_size"]
    g = torch.Generator().manual_seed(3)
    ids, h = torch.randint(0, V, (T,), generator=g), torch.randn(T, H, generator=g)
    pos = torch.arange(T)
    pre = "eagle_nets.0."
    emb = torch.cat([rk[pre + "drafter.vocab_embedding.weight"] for rk in ranks])[:V][ids]
    x = torch.cat(
        [torch.cat([emb, h], -1) @ rk[pre + "drafter.fc.weight"].T + rk[pre + "drafter.fc.bias"] for rk in ranks], -1
    )
    x = tp_decoder_layer(ranks, pre + "drafter.layers.0.", x, pos, net_cfg, input_norm=False)
    got = torch.cat([x @ rk[pre + "lm_head.weight"].T for rk in ranks], -1)[:, :V]

    head = EagleHead(spec.drafter.arch, fc_bias=False)
    D = spec.drafter.tensors
    missing, unexpected = head.load_state_dict({k: D.load(k) for k in D}, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    T_emb = spec.target.tensors.load("model.embed_tokens.weight")[ids]
    cache = head.new_cache(1, 16)
    with torch.no_grad():
        _, want = head(
            T_emb[None],
            h[None],
            pos[None],
            cache,
            torch.ones(T, T, dtype=torch.bool).tril()[None],
            spec.target.tensors.load("lm_head.weight"),
        )
    torch.testing.assert_close(got, want[0], atol=2e-4, rtol=1e-4)


SMOLLM2 = Path(__file__).resolve().parent.parent / ".cache" / "smollm2"


@pytest.mark.slow
@pytest.mark.skipif(not (SMOLLM2 / "config.json").exists(), reason="run scripts/prepare_smollm2.py first")
def test_real_model_smollm2_tp3(tmp_path):
    """A real checkpoint: SmolLM2-135M (30 layers, 9 heads, 3 KV heads, tied embeddings) at tp=3."""
    from transformers import AutoModelForCausalLM

    from trtspec.load import load_spec_model

    spec = load_spec_model(SMOLLM2)
    out = tmp_path / "smollm2-tp3"
    convert(spec, out, ConvertOptions(tp_size=3))
    cfg, ranks = load_ranks(out)
    assert cfg["tie_word_embeddings"] is True and cfg["vocab_size"] == 49152
    ids = torch.tensor([1, 504, 3458, 314, 253, 1345, 30, 2])
    hf = AutoModelForCausalLM.from_pretrained(SMOLLM2, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
    got = trt_forward(cfg, ranks, ids)
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
