"""vLLM logits processors for the branch bias (imports vLLM; install the ``vllm`` extra).

Register by fully qualified name when starting vLLM, and pick the class for the model
runner vLLM uses (``recjudge serve`` and the ``vllm`` backend do this for you):

* V1 model runner (``VLLM_USE_V2_MODEL_RUNNER=0``; the only one on CPU builds without a
  Triton CPU backend): ``recjudge.decoding.vllm:BranchBiasV1``
  (an ``AdapterLogitsProcessor``: vLLM hands it each request's output ids and logits row).
* Model Runner V2 (``VLLM_USE_V2_MODEL_RUNNER=1``): ``recjudge.decoding.vllm:BranchBiasV2``.

Both run after vLLM's grammar mask (structured outputs) and before temperature/top-p/top-k,
the same order as in the transformers engine, and act only on requests whose
``SamplingParams.extra_args`` hold a recjudge payload (``vllm_xargs`` over HTTP). Both
modify logits in place. Speculative decoding is refused: a draft row would be biased
without the request's committed state.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor
from vllm.v1.worker.gpu.sample.logits_processor.interface import (
    LogitsProcessor as V2LogitsProcessor,
)

from recjudge.decoding._compile import GRAMMARS
from recjudge.decoding._remote import BiasPayload, RequestBias
from recjudge.llm import PROCESSORS, SPEC_DECODE_ERROR

__all__ = ["SPEC_DECODE_ERROR", "BranchBiasV1", "BranchBiasV2", "processor_fqcn"]


def processor_fqcn(v2: bool) -> str:
    """The name to pass to ``logits_processors`` / ``--logits-processors``."""
    return PROCESSORS[v2]


def _token_table(vllm_config: Any) -> Any:
    """The token byte table for the served model's tokenizer (built once per process)."""
    # transformers loads with a model, not with this module
    from transformers import AutoTokenizer  # noqa: PLC0415

    mc = vllm_config.model_config
    if vllm_config.speculative_config is not None:
        raise ValueError(SPEC_DECODE_ERROR)
    tok = AutoTokenizer.from_pretrained(
        mc.tokenizer, revision=mc.tokenizer_revision, trust_remote_code=mc.trust_remote_code
    )
    return GRAMMARS.table(tok, mc.get_vocab_size())


class BranchBiasV1(AdapterLogitsProcessor):
    """The branch bias for vLLM's V1 model runner (per-request adapter)."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(vllm_config, device, is_pin_memory)
        self.table = _token_table(vllm_config)

    @classmethod
    def validate_params(cls, params: Any) -> None:
        BiasPayload.from_extra_args(params.extra_args)

    def is_argmax_invariant(self) -> bool:
        return False  # the bias can flip the greedy choice

    def new_req_logits_processor(self, params: Any) -> Any:
        payload = BiasPayload.from_extra_args(params.extra_args)
        if payload is None:
            return None
        state = RequestBias(payload, self.table)

        def apply(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
            return state.process(output_ids, logits)

        return apply


class BranchBiasV2(V2LogitsProcessor):
    """The branch bias for vLLM's Model Runner V2 (batch-level, state per request slot)."""

    def __init__(self, vllm_config: Any, req_states: Any) -> None:
        super().__init__(vllm_config, req_states)
        self.table = _token_table(vllm_config)
        self.req_states = req_states
        self.slots: dict[int, RequestBias] = {}

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        BiasPayload.from_extra_args(sampling_params.extra_args)

    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        payload = BiasPayload.from_extra_args(sampling_params.extra_args)
        if payload is None:
            self.slots.pop(req_idx, None)  # the slot may hold a previous request's state
            return False
        self.slots[req_idx] = RequestBias(payload, self.table)
        return True

    def _output_ids(self, slot: int) -> list[int]:
        rs = self.req_states
        start = int(rs.prompt_len.np[slot])
        end = int(rs.total_len.gpu[slot])
        return [int(t) for t in rs.all_token_ids.gpu[slot, start:end].tolist()]

    def apply(self, logits: torch.Tensor, ctx: Any) -> torch.Tensor:
        if not self.slots:
            return logits
        rows = ctx.expanded_idx_mapping.tolist()
        if len(rows) != len(ctx.idx_mapping_np):
            raise RuntimeError(SPEC_DECODE_ERROR)
        for row, slot in enumerate(rows):
            state = self.slots.get(int(slot))
            if state is not None:
                state.process(self._output_ids(int(slot)), logits[row])
        return logits
