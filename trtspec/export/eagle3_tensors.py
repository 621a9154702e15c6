"""The EAGLE-3 tensors both EAGLE-3 layouts write (Llama-draft and speculators): they differ in the
decoder layer's prefix and the config, not in the tensors."""

from __future__ import annotations

import torch

from trtspec.errors import CheckpointError
from trtspec.export.base import ExportOptions, drafter_tensors
from trtspec.spec import SpecModel


def eagle3_tensors(spec: SpecModel, opts: ExportOptions, layer_prefix: str) -> dict[str, torch.Tensor]:
    """fc, the layer under ``layer_prefix``, norm, lm_head [V_d, H], and when V_d != V the vocab maps:
    ``d2t`` int64 [V_d] (target = draft + d2t; TensorRT-LLM requires it then) and ``t2d`` bool [V]
    (rebuilt from d2t: loaders skip it, speculators keeps it)."""
    state = drafter_tensors(spec, opts.dtype)
    out = {(layer_prefix + k[len("layer.") :] if k.startswith("layer.") else k): v for k, v in state.items()}
    V, Vd = spec.target.arch.vocab_size, int(spec.drafter.config["draft_vocab_size"])
    if Vd != V:
        d2t = out["d2t"].to(torch.int64)
        used = torch.arange(Vd) + d2t
        if used.min() < 0 or used.max() >= V or used.unique().numel() != Vd:
            raise CheckpointError("d2t maps draft ids outside the target vocabulary or twice", spec.drafter.path)
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[used] = True
        out["d2t"], out["t2d"] = d2t, t2d
    return out


def aux_layer_ids(spec: SpecModel) -> list[int]:
    """The target layers whose input residual stream feeds fc (vLLM indexing), refused when two coincide:
    vLLM captures a set of layers, so a repeated id would feed fc fewer features than it was trained on."""
    aux = [int(i) for i in spec.drafter.config["aux_layers"]]
    if len(set(aux)) != len(aux):
        raise CheckpointError(
            f"EAGLE-3 aux layers {aux} repeat a layer; vLLM captures each layer once",
            spec.drafter.path,
            "the default (2, L//2, L-3) repeats below 7 target layers: set distinct eagle_aux_hidden_state_layer_ids",
        )
    return aux
