"""trtspec's TensorRT-LLM 1.2 model classes for the modes the stock classes cannot express.

Loaded only on a GPU machine, by ``trtllm-build --model_cls_file <this file> --model_cls_name <class>``
(or by trtspec.engine.trtllm); importing it needs tensorrt_llm and tensorrt. Nothing in the CPU test suite
imports it. The classes only add modules on top of TensorRT-LLM's own, so the checkpoint names stay
TensorRT-LLM's (see trtspec/convert/names.py and modes.py for the extra tensors).

- ``TrtspecMtpLinearForCausalLM``: MedusaForCausalLM whose heads first RMSNorm the hidden state with
  per-head weights (``medusa_rmsnorm_heads.weight`` [K, H]) through trtspec's RmsNormHeads plugin:
  creator ``TrtspecRmsNormHeads`` version ``1`` namespace ``trtspec``; inputs (hidden [T, H], weight
  [K, H]); plugin fields ``eps`` (float32) and ``layout`` (int32, 0 = head-major); output 0 = [K, T, H]
  (plugins/trt/rmsnorm_heads_plugin.cpp). One plugin call serves all K heads (one read of the hidden state).
- ``TrtspecMtpSingleForCausalLM``: EagleForCausalLM whose nets are DeepSeek-style MTP modules:
  ``fc(cat[enorm(emb), hnorm(h)])`` -> one decoder layer *with* its input_layernorm -> ``final_norm`` ->
  shared lm_head, feeding the pre-norm state back. Heads trained without RMSNorm have none of the three
  norms; config.json's ``trtspec_mtp_norms`` lists the ones the checkpoint holds, and only those are
  created (a created-but-absent parameter makes ``from_checkpoint`` fail).

Signatures used here are TensorRT-LLM 1.2.1's (tests/test_trtllm_conformance.py checks every call and
base class of this file against the recorded signatures): ``EagleNet(config, logits_dtype)``,
``MedusaHead(num_layers, hidden_size, vocab_size, hidden_act, dtype, mapping)``,
``RmsNorm(normalized_shape, num_groups=1, eps=1e-06, ...)`` (eps by keyword), ``ColumnLinear(in, out,
bias, dtype, tp_group, tp_size, gather_output)``.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import tensorrt as trt
from tensorrt_llm._common import default_net, default_trtnet
from tensorrt_llm.functional import Tensor, _create_tensor, cast, concat, gather_last_token_logits, select, split
from tensorrt_llm.layers import ColumnLinear, RmsNorm
from tensorrt_llm.models.eagle.model import EagleForCausalLM, EagleNet
from tensorrt_llm.models.medusa.model import MedusaForCausalLm, MedusaHead
from tensorrt_llm.module import Module, ModuleList
from tensorrt_llm.parameter import Parameter

PLUGIN_CREATOR, PLUGIN_VERSION, PLUGIN_NAMESPACE = "TrtspecRmsNormHeads", "1", "trtspec"
#: config.json keys written by trtspec/convert/modes.py (trtspec/convert/names.py)
RMSNORM_HEADS_EPS_KEY = "trtspec_rmsnorm_heads_eps"
MTP_NORMS_KEY = "trtspec_mtp_norms"
LAYOUT_HEAD_MAJOR = 0  # TRTSPEC_LAYOUT_HEAD_MAJOR in plugins/include/trtspec_kernels.h: out[k][t][h]


def _load_plugin_library() -> None:
    lib = os.environ.get("TRTSPEC_PLUGIN_LIBRARY")
    if lib:
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)


def rmsnorm_heads(x: Tensor, weight: Tensor, num_heads: int, eps: float) -> Tensor:
    """[T, H] x [K, H] -> [K, T, H] through the TrtspecRmsNormHeads plugin (IPluginV3)."""
    registry = trt.get_plugin_registry()
    creator = registry.get_creator(PLUGIN_CREATOR, PLUGIN_VERSION, PLUGIN_NAMESPACE)
    if creator is None:
        raise RuntimeError(
            f"TensorRT plugin {PLUGIN_NAMESPACE}::{PLUGIN_CREATOR} v{PLUGIN_VERSION} not registered; "
            "set TRTSPEC_PLUGIN_LIBRARY to libtrtspec_plugins.so"
        )
    fields = trt.PluginFieldCollection(
        [  # K comes from the weight's shape
            trt.PluginField("eps", np.array([eps], np.float32), trt.PluginFieldType.FLOAT32),
            trt.PluginField("layout", np.array([LAYOUT_HEAD_MAJOR], np.int32), trt.PluginFieldType.INT32),
        ]
    )
    plugin = creator.create_plugin("trtspec_rmsnorm_heads", fields, trt.TensorRTPhase.BUILD)
    layer = default_trtnet().add_plugin_v3([x.trt_tensor, weight.trt_tensor], [], plugin)
    return _create_tensor(layer.get_output(0), layer)


class RmsNormHeads(Module):
    """Holds ``medusa_rmsnorm_heads.weight`` and computes the K normed copies once per hidden state."""

    def __init__(self, num_heads: int, hidden_size: int, eps: float, dtype):
        super().__init__()
        self.num_heads, self.eps = num_heads, eps
        self.weight = Parameter(shape=(num_heads, hidden_size), dtype=dtype)
        object.__setattr__(self, "_cache", {})

    def forward(self, x: Tensor) -> Tensor:
        key = id(x)
        if key not in self._cache:  # network definition time: one plugin layer shared by the K heads
            self._cache[key] = (x, rmsnorm_heads(x, self.weight.value, self.num_heads, self.eps))
        return self._cache[key][1]


class NormedMedusaHead(MedusaHead):
    """A MedusaHead (same parameter names) that reads its slice of the RmsNormHeads output."""

    def forward(self, x):
        normed = select(self._norms(x), 0, self._index)
        return super().forward(normed)


class TrtspecMtpLinearForCausalLM(MedusaForCausalLm):
    def __init__(self, config):
        _load_plugin_library()
        super().__init__(config)
        inner = self.model
        # the heads' own epsilon (they were trained with it), not the target's norm_epsilon
        eps = float(getattr(config, RMSNORM_HEADS_EPS_KEY, config.norm_epsilon))
        norms = RmsNormHeads(config.num_medusa_heads, config.hidden_size, eps, config.dtype)
        inner.medusa_rmsnorm_heads = norms
        heads = []
        for k in range(config.num_medusa_heads):
            head = NormedMedusaHead(
                num_layers=config.num_medusa_layers,
                hidden_size=config.hidden_size,
                vocab_size=inner.medusa_heads[k].lm_head.out_features * config.mapping.tp_size,
                hidden_act=config.hidden_act,
                dtype=config.dtype,
                mapping=config.mapping,
            )
            object.__setattr__(head, "_norms", norms)  # not registered twice as a parameter owner
            object.__setattr__(head, "_index", k)
            heads.append(head)
        inner.medusa_heads = ModuleList(heads)


class NormedInputFc(ColumnLinear):
    """The drafter's ``fc`` (same parameters, ``drafter.fc.weight`` / ``.bias``) that RMSNorms the embedding
    half of its input, ``cat[emb, h]``, before the projection.

    Why here and not on the embedding: TensorRT-LLM rebuilds every Embedding when it parallelizes the
    vocabulary (``parallelize_embedding`` creates a new instance from its init parameters), which drops
    anything attached to the old one; ``fc`` is a ColumnLinear that no optimization pass replaces."""

    def __init__(self, hidden_size: int, enorm: RmsNorm, config):
        super().__init__(
            2 * hidden_size,
            hidden_size,
            bias=True,
            dtype=config.dtype,
            tp_group=config.mapping.tp_group,
            tp_size=config.mapping.tp_size,
            gather_output=True,
        )
        self._hidden = hidden_size
        object.__setattr__(self, "_enorm", enorm)  # owned (and named) by MtpNet: eagle_nets.{i}.enorm.weight

    def forward(self, x, *args, **kwargs):
        emb, hidden = split(x, [self._hidden, self._hidden], dim=-1)
        return super().forward(concat([self._enorm(emb), hidden], dim=-1), *args, **kwargs)


class MtpNet(EagleNet):
    """One MTP module in EagleNet's place: fc(cat[enorm(emb), hnorm(h)]) -> layer -> final_norm -> lm_head."""

    def __init__(self, config, logits_dtype, norms=("enorm", "hnorm", "final_norm")):
        config.use_input_layernorm_in_first_layer = True
        super().__init__(config, logits_dtype)
        self._logits_dtype = logits_dtype
        self._norms = tuple(norms)
        for name in self._norms:
            setattr(
                self, name, RmsNorm(normalized_shape=config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)
            )
        if "enorm" in self._norms:
            self.drafter.fc = NormedInputFc(config.hidden_size, self.enorm, config)

    def forward(
        self,
        input_ids,
        position_ids=None,
        hidden_states=None,
        last_token_indices=None,
        spec_decoding_params=None,
        kv_cache_params=None,
        attention_params=None,
    ):
        if "hnorm" in self._norms:
            hidden_states = self.hnorm(hidden_states)
        hidden_states, cache = self.drafter(
            input_ids,
            position_ids=position_ids,
            use_cache=True,
            spec_decoding_params=spec_decoding_params,
            kv_cache_params=kv_cache_params,
            attention_params=attention_params,
            hidden_states_for_embed=hidden_states,
        )
        if self.config.mapping.is_last_pp_rank():
            hidden_states = gather_last_token_logits(
                hidden_states, last_token_indices, default_net().plugin_config.remove_input_padding
            )
            normed = self.final_norm(hidden_states) if "final_norm" in self._norms else hidden_states
            return cast(self.lm_head(normed), self._logits_dtype), hidden_states, cache
        return None, hidden_states, cache


class TrtspecMtpSingleForCausalLM(EagleForCausalLM):
    def __init__(self, config):
        super().__init__(config)
        net_config = config.eagle_net_config
        norms = tuple(getattr(config, MTP_NORMS_KEY, ("enorm", "hnorm", "final_norm")))
        self.eagle_nets = ModuleList(
            [MtpNet(net_config, config.logits_dtype, norms) for _ in range(self.num_eagle_layers)]
        )
